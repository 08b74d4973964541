#include "cli/model_options.h"

#include <chrono>
#include <cstdio>

#include "base/error.h"
#include "cli/command.h"

namespace lily::cli {

void ModelOptions::add_to(CLI::App& app) {
  app.add_option("-m,--model", model_dir,
                 "Model directory (config.json + safetensors); default: the embedded lily-tiny");
  app.add_option("--backend", backend,
                 "cpu (the fast CPU path), reference (the fp32 CPU reference), cuda, or auto (cuda where a GPU is "
                 "visible, else cpu)")
      ->check(CLI::IsMember({"auto", "cpu", "reference", "cuda"}));
  app.add_option("--quantize", quantize, "Quantize bf16 weights at load: none or q4")
      ->check(CLI::IsMember({"none", "q4"}));
  app.add_option("--mtp", mtp_dir,
                 "Read the MTP head (mtp.*, for speculative decoding) from this directory: the Hugging Face "
                 "checkpoint beside an mlx-community model, which drops it (bf16 unless --quantize q4)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--device-profile", device_profile,
                 "CUDA: the card the kernel plan decides for: device (this GPU, the portable kernels allowed: "
                 "they have not run yet), or sm80, sm86, sm89, sm90, sm120 (that card's compute capability, SMs and "
                 "shared-memory limit on this GPU); default: this GPU, the Hopper path only (docs/gpus.md)")
      ->check(CLI::IsMember({"device", "sm80", "sm86", "sm89", "sm90", "sm120"}));
  app.add_option("--gpu-memory", gpu_memory_gb,
                 "CUDA: the most device memory lily may plan for, GB (to share a card, or to try a 24 GB budget on "
                 "a larger one); a context that does not fit is refused, saying what would")
      ->check(CLI::Range(1.0, 4096.0));
}

LoadOptions ModelOptions::load_options() const {
  LoadOptions options;
  options.quantize_bits = quantize == "q4" ? 4 : 0;
  options.mtp_dir = mtp_dir;
  return options;
}

std::string ModelOptions::resolved_model_dir() const { return model_dir.empty() ? default_model_dir() : model_dir; }

std::unique_ptr<Engine> ModelOptions::load_engine(int64_t planned_context) const {
  EngineOptions options;
  options.model_dir = resolved_model_dir();
  options.backend = backend;
  options.quantize_bits = quantize == "q4" ? 4 : 0;
  options.mtp_dir = mtp_dir;
  options.device_profile = device_profile;
  options.gpu_memory_gb = gpu_memory_gb;
  options.planned_context = planned_context;
  auto t0 = std::chrono::steady_clock::now();
  std::fprintf(stderr, "loading %s ...\n", options.model_dir.c_str());
  auto engine = Engine::load(options);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::fprintf(stderr, "loaded %s (%s layout, %.2f GB of weights) on %s in %.1f s\n", options.model_dir.c_str(),
               to_string(engine->weights().layout).c_str(), double(engine->weights().weight_bytes()) / 1e9,
               engine->backend().name().c_str(), s);
  return engine;
}

std::vector<int32_t> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  std::string token;
  auto flush = [&] {
    if (token.empty()) return;
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(token, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != token.size() || v < 0 || v > INT32_MAX) fail("\"{}\" is not a token id", token);
    ids.push_back(int32_t(v));
    token.clear();
  };
  for (char ch : text) {
    if (ch == ',' || ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r') flush();
    else token += ch;
  }
  flush();
  return ids;
}

}  // namespace lily::cli
