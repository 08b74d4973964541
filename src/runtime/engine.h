// engine.h: a loaded model ready to run: weights + the chosen backend + generation defaults.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "model/weights.h"

namespace lily {

struct EngineOptions {
  std::string model_dir;
  std::string backend = "auto";  // auto | cpu | cuda
  int quantize_bits = 0;         // 0: as stored; 4: quantize plain weights at load (--quantize q4)
};

class Engine {
 public:
  static std::unique_ptr<Engine> load(const EngineOptions& options);

  Backend& backend() { return *backend_; }
  const ModelWeights& weights() const { return *weights_; }
  const ModelConfig& config() const { return weights_->config; }
  const GenerationConfig& generation_config() const { return weights_->generation; }
  const std::string& model_dir() const { return weights_->model_dir; }

 private:
  std::shared_ptr<const ModelWeights> weights_;
  std::unique_ptr<Backend> backend_;
};

// Names of the backends this build can run ("cpu", and "cuda" where compiled in and a GPU is present).
bool cuda_backend_available();

}  // namespace lily
