// engine.h: a loaded model ready to run: weights + the chosen backend + generation defaults,
// and the model's tokenizer when it has one (find_tokenizer).
//
// Loading refuses, before the backend is built, what cannot run: the formats lily does not read
// (load_model names them: FP8 / AWQ / GPTQ / compressed-tensors / NVFP4 checkpoints) and a
// tokenizer whose ids do not fit the model's vocabulary (an id >= vocab_size has no embedding
// row, and the backends index embed_tokens and the logits with it).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace lily {

struct EngineOptions {
  std::string model_dir;
  std::string backend = "auto";     // auto | cpu (fast) | reference (fp32 CPU) | cuda
  int quantize_bits = 0;            // 0: as stored; 4: quantize plain weights at load (--quantize q4)
  std::string mtp_dir = {};         // the MTP head from this directory (--mtp; LoadOptions::mtp_dir)
  std::string device_profile = {};  // CUDA: CudaBackendOptions::device_profile (--device-profile)
  double gpu_memory_gb = 0;         // CUDA: a cap on the device memory, GB (--gpu-memory; 0: none)
  int64_t planned_context = 0;      // CUDA: the context to be held (--ctx-size), for the cap's prefill chunk
};

class Engine {
 public:
  static std::unique_ptr<Engine> load(const EngineOptions& options);

  Backend& backend() { return *backend_; }
  const ModelWeights& weights() const { return *weights_; }
  const ModelConfig& config() const { return weights_->config; }
  const GenerationConfig& generation_config() const { return weights_->generation; }
  const std::string& model_dir() const { return weights_->model_dir; }
  // The model's tokenizer (find_tokenizer), read and checked at load; nullptr when it has none
  // (a checkpoint used with token ids only: lily logits, generate).
  const Tokenizer* tokenizer() const { return tokenizer_ ? &*tokenizer_ : nullptr; }

 private:
  std::shared_ptr<const ModelWeights> weights_;
  std::optional<Tokenizer> tokenizer_;
  std::unique_ptr<Backend> backend_;
};

// A model's tokenizer and where it was read from (a tokenizer.json, or the GGUF file).
struct ModelTokenizer {
  Tokenizer tokenizer;
  std::string source;
};

// The tokenizer of the model at `path` (what -m names: a model directory, a GGUF file, a directory
// holding one GGUF or the first shard of a split set), read without its weights: tokenizer.json
// in the model directory (the GGUF file's directory) wins, else a GGUF's own vocabulary
// (tokenizer.ggml.*); nullopt when there is neither. The one lookup every command uses.
std::optional<ModelTokenizer> find_model_tokenizer(const std::string& path);

// find_model_tokenizer(path), or a lily::Error naming `path` and the two places looked in.
ModelTokenizer load_model_tokenizer(const std::string& path);

// The tokenizer of loaded weights (find_model_tokenizer of weights.model_dir), checked against
// the model's vocabulary (check_tokenizer_fits).
std::optional<Tokenizer> find_tokenizer(const ModelWeights& weights);

// Throws lily::Error, naming both numbers, when `tokenizer` defines ids the model has no rows
// for (tokenizer.vocab_size() > config.vocab_size). `what` names the tokenizer in the message.
void check_tokenizer_fits(const Tokenizer& tokenizer, const ModelConfig& config, const std::string& what);

// Whether the CUDA backend can run: compiled into this build and a GPU visible. --backend auto
// picks it then, the CPU backend otherwise.
bool cuda_backend_available();

}  // namespace lily
