// model_options.h: the options every model-running subcommand shares (-m, --backend, --quantize,
// --mtp).
#pragma once

#include <CLI/CLI.hpp>

#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint/load.h"
#include "runtime/engine.h"

namespace lily::cli {

struct ModelOptions {
  std::string model_dir;
  std::string backend = "auto";
  std::string quantize = "none";
  std::string mtp_dir;         // --mtp: the MTP head from another directory (LoadOptions::mtp_dir)
  std::string device_profile;  // --device-profile: CUDA (EngineOptions::device_profile)
  double gpu_memory_gb = 0;    // --gpu-memory: CUDA (EngineOptions::gpu_memory_gb)

  void add_to(CLI::App& app);
  // Prints progress on stderr. planned_context: the context the command will hold (--ctx-size;
  // under --gpu-memory the prefill chunk leaves room for it).
  std::unique_ptr<Engine> load_engine(int64_t planned_context = 0) const;
  LoadOptions load_options() const;  // --quantize and --mtp, for load_model
  std::string resolved_model_dir() const;
};

// "1,2,3" or "1 2 3" -> ids; throws lily::Error naming the bad entry.
std::vector<int32_t> parse_id_list(const std::string& text);

}  // namespace lily::cli
