// fuzz_config.cpp: config.json and generation_config.json as src/model reads them
// (parse_json_limited, parse_model_config, parse_generation_config).
//
// Input: the bytes of one JSON file; both readers get it. A finding: a crash, a sanitizer report,
// a leak, or any exception other than lily::Error (every refusal is a lily::Error naming the field).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "base/error.h"
#include "model/config.h"
#include "model/json_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nlohmann::json doc;
  try {
    doc = lily::parse_json_limited(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const lily::Error&) {
    return 0;
  }
  try {
    const lily::ModelConfig c = lily::parse_model_config(doc);
    // A config that passes must give sizes the loader can multiply without overflow.
    (void)c.linear_conv_dim();
    (void)c.attention_q_width();
    (void)c.num_layers_of(lily::LayerKind::full_attention);
    if (c.quantization)
      for (const auto& [path, spec] : c.quantization->overrides) (void)c.quantization->for_module(path);
  } catch (const lily::Error&) {
  }
  try {
    (void)lily::parse_generation_config(doc);
  } catch (const lily::Error&) {
  }
  return 0;
}
