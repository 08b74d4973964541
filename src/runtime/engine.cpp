#include "runtime/engine.h"

#include <filesystem>

#include "backend/cpu_fast/cpu_fast.h"
#include "base/error.h"
#include "base/log.h"
#include "model/checkpoint/load.h"
#include "model/gguf_file.h"
#include "model/gguf_vocabulary.h"
#ifdef LILY_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

namespace lily {

#ifndef LILY_HAVE_CUDA
bool cuda_backend_available() { return false; }
#endif

void check_tokenizer_fits(const Tokenizer& tokenizer, const ModelConfig& config, const std::string& what) {
  if (tokenizer.vocab_size() > config.vocab_size)
    fail("{} defines {} token ids (0..{}), but the model's vocab_size is {}: ids from {} on have no embedding "
         "row; the tokenizer belongs to another model",
         what, tokenizer.vocab_size(), tokenizer.vocab_size() - 1, config.vocab_size, config.vocab_size);
}

std::optional<ModelTokenizer> find_model_tokenizer(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{} does not exist (-m names a model directory or a GGUF file)", path);
  const fs::path dir = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  const std::string json = (dir / "tokenizer.json").string();
  if (fs::exists(json, ec)) return ModelTokenizer{Tokenizer::load(json), json};
  if (!is_gguf_model(path)) return std::nullopt;
  const GgufModel gguf(path);
  const std::string file = gguf.paths().front();
  std::optional<GgmlVocabulary> vocabulary = with_context(file, [&] { return gguf_vocabulary(gguf.metadata()); });
  if (!vocabulary) return std::nullopt;
  return ModelTokenizer{Tokenizer::from_ggml(*vocabulary, file), "the tokenizer of " + file};
}

ModelTokenizer load_model_tokenizer(const std::string& path) {
  std::optional<ModelTokenizer> found = find_model_tokenizer(path);
  if (!found)
    fail("{} has no tokenizer: no tokenizer.json in its directory, and no GGUF with tokenizer.ggml.* metadata", path);
  return std::move(*found);
}

std::optional<Tokenizer> find_tokenizer(const ModelWeights& weights) {
  std::optional<ModelTokenizer> found = find_model_tokenizer(weights.model_dir);
  if (!found) return std::nullopt;
  check_tokenizer_fits(found->tokenizer, weights.config, found->source);
  return std::move(found->tokenizer);
}

namespace {
// Whether the CUDA backend runs here under the options' device profile (cuda_backend.h).
bool cuda_runs(const EngineOptions& options) {
#ifdef LILY_HAVE_CUDA
  return options.device_profile.empty() ? cuda_backend_available() : cuda_backend_runs(options.device_profile);
#else
  return false;
#endif
}
}  // namespace

std::unique_ptr<Engine> Engine::load(const EngineOptions& options) {
  std::string backend = options.backend;
  if (backend == "auto") backend = cuda_runs(options) ? "cuda" : "cpu";
  if (backend != "cpu" && backend != "reference" && backend != "cuda")
    fail("unknown backend \"{}\" (choose cpu, reference, cuda or auto)", backend);
  if (backend == "cuda" && !cuda_runs(options))
    fail("--backend cuda: this build has no CUDA backend, no GPU is visible, or the GPU is not a Hopper card "
         "(H100 / H200: the kernels that have run; --device-profile device tries the portable ones)");

  LoadOptions load_options;
  load_options.quantize_bits = options.quantize_bits;
  load_options.mtp_dir = options.mtp_dir;
  auto engine = std::unique_ptr<Engine>(new Engine());
  engine->weights_ = load_model(options.model_dir, load_options);
  engine->tokenizer_ = find_tokenizer(*engine->weights_);
#ifdef LILY_HAVE_CUDA
  if (backend == "cuda") {
    CudaBackendOptions cuda_options = CudaBackendOptions::from_environment();
    if (!options.device_profile.empty()) cuda_options.device_profile = options.device_profile;
    if (options.gpu_memory_gb > 0) cuda_options.gpu_memory_bytes = uint64_t(options.gpu_memory_gb * 1e9);
    cuda_options.planned_context = options.planned_context;
    engine->backend_ = make_cuda_backend(engine->weights_, cuda_options);
    return engine;
  }
#endif
  // cpu: the fast CPU path; reference: the fp32 reference it is tested against.
  engine->backend_ = backend == "reference" ? make_cpu_backend(engine->weights_)
                                            : make_cpu_fast_backend(engine->weights_);
  return engine;
}

}  // namespace lily
