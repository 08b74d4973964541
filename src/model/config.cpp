#include "model/config.h"

#include <cmath>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "model/json_file.h"

namespace lily {

using nlohmann::json;

namespace {

std::string type_name(const json& v) { return v.type_name(); }

const json& require(const json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) fail("config.json: missing field '{}'", field);
  return *it;
}

// Sizes are bounded so that every product of them the loader and the backends form (heads x
// head_dim, 2 x key dim + value dim, ...) fits an int: 2^20 is far above the model's sizes.
constexpr int kMaxSize = 1 << 20;

int require_int(const json& obj, const char* field, int min_value = 1, int max_value = kMaxSize) {
  const json& v = require(obj, field);
  if (!v.is_number_integer())
    fail("config.json: field '{}' must be an integer, found {} ({})", field, v.dump(), type_name(v));
  // Unsigned values above 2^63 read as negative through get<long long>().
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(max_value))
    fail("config.json: field '{}' = {} is out of range ({}..{})", field, v.dump(), min_value, max_value);
  long long x = v.get<long long>();
  if (x < min_value || x > max_value)
    fail("config.json: field '{}' = {} is out of range ({}..{})", field, x, min_value, max_value);
  return int(x);
}

double require_number(const json& obj, const char* field) {
  const json& v = require(obj, field);
  if (!v.is_number()) fail("config.json: field '{}' must be a number, found {}", field, v.dump());
  return v.get<double>();
}

// An optional field of type T (bool, std::string, float or int). A value of another type, or a
// number T cannot hold, is an error naming the field (nlohmann's get<int>() of 1e300 is
// undefined behaviour, and get<bool>() of a number a json::exception).
template <typename T>
std::optional<T> optional_field(const json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return std::nullopt;
  const json& v = *it;
  if constexpr (std::is_same_v<T, bool>) {
    if (v.is_boolean()) return v.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (v.is_string()) return v.get<std::string>();
  } else if constexpr (std::is_floating_point_v<T>) {
    if (v.is_number() && std::isfinite(v.get<double>()) && std::fabs(v.get<double>()) <= 1e30)
      return T(v.get<double>());
  } else {
    static_assert(std::is_same_v<T, int>);
    if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT32_MAX)) &&
        v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX)
      return int(v.get<int64_t>());
  }
  fail("field '{}' has the wrong type or is out of range: {}", field, v.dump());
}

void expect_value(bool ok, const char* field, const json& found, const char* supported) {
  if (!ok) fail("config.json: unsupported {} = {} (lily supports {})", field, found.dump(), supported);
}

std::vector<LayerKind> parse_layer_types(const json& text, int num_layers) {
  std::vector<LayerKind> kinds;
  if (auto it = text.find("layer_types"); it != text.end() && !it->is_null()) {
    if (!it->is_array()) fail("config.json: field 'layer_types' must be a list, found {}", it->dump());
    for (const json& t : *it) {
      if (t == "linear_attention") kinds.push_back(LayerKind::linear_attention);
      else if (t == "full_attention") kinds.push_back(LayerKind::full_attention);
      else fail("config.json: unsupported layer type {} in 'layer_types'", t.dump());
    }
    if (int(kinds.size()) != num_layers)
      fail("config.json: 'layer_types' has {} entries but num_hidden_layers = {}", kinds.size(), num_layers);
    return kinds;
  }
  int interval = require_int(text, "full_attention_interval");
  for (int i = 0; i < num_layers; ++i)
    kinds.push_back((i + 1) % interval == 0 ? LayerKind::full_attention : LayerKind::linear_attention);
  return kinds;
}

// RoPE: transformers 5 writes `rope_parameters`; older files `rope_theta` + `rope_scaling`.
void parse_rope(const json& text, ModelConfig& c) {
  json rope = json::object();
  if (auto it = text.find("rope_parameters"); it != text.end() && !it->is_null()) {
    if (!it->is_object()) fail("config.json: 'rope_parameters' must be an object, found {}", it->dump());
    rope = *it;
  }
  if (auto it = text.find("rope_scaling"); it != text.end() && !it->is_null()) {
    if (!it->is_object()) fail("config.json: 'rope_scaling' must be an object, found {}", it->dump());
    // Some exports keep the (m)rope description here; only the default type is supported.
    for (auto& [k, v] : it->items())
      if (!rope.contains(k)) rope[k] = v;
  }
  if (auto it = rope.find("rope_type"); it != rope.end() && !it->is_null())
    expect_value(*it == "default" || *it == "mrope", "rope_type", *it, "\"default\" (no rope scaling)");
  if (auto it = rope.find("type"); it != rope.end() && !it->is_null())
    expect_value(*it == "default" || *it == "mrope", "rope_scaling.type", *it, "\"default\" (no rope scaling)");
  if (auto it = rope.find("factor"); it != rope.end() && !it->is_null())
    expect_value(it->is_number() && it->get<double>() == 1.0, "rope factor", *it, "no rope scaling");

  double theta = rope.contains("rope_theta") ? require_number(rope, "rope_theta") : require_number(text, "rope_theta");
  if (!(theta > 1.0) || !std::isfinite(theta)) fail("config.json: rope_theta = {} must be > 1", theta);
  c.rope_theta = float(theta);

  double factor = rope.contains("partial_rotary_factor")   ? require_number(rope, "partial_rotary_factor")
                  : text.contains("partial_rotary_factor") ? require_number(text, "partial_rotary_factor")
                                                           : 1.0;
  double rotary = factor * c.head_dim;
  if (!(factor > 0 && factor <= 1) || rotary != std::floor(rotary) || int(rotary) % 2 != 0)
    fail("config.json: partial_rotary_factor = {} gives {} rotary dims of head_dim {}; need an even whole number",
         factor, rotary, c.head_dim);
  c.rotary_dim = int(rotary);
}

std::optional<QuantSpec> parse_quant_spec(const json& v, const std::string& where) {
  if (v.is_boolean()) {
    if (!v.get<bool>()) return std::nullopt;
    fail("config.json: quantization entry '{}' = true is not a quantization spec", where);
  }
  if (!v.is_object()) fail("config.json: quantization entry '{}' must be an object, found {}", where, v.dump());
  QuantSpec q;
  q.group_size = require_int(v, "group_size");
  q.bits = require_int(v, "bits");
  if (q.bits != 2 && q.bits != 4 && q.bits != 8)
    fail("config.json: quantization '{}' bits = {} (lily supports 2, 4, 8)", where, q.bits);
  if (q.group_size != 32 && q.group_size != 64 && q.group_size != 128)
    fail("config.json: quantization '{}' group_size = {} (lily supports 32, 64, 128)", where, q.group_size);
  if (auto it = v.find("mode"); it != v.end() && !it->is_null() && *it != "affine")
    fail("config.json: quantization '{}' mode = {} (lily supports \"affine\")", where, it->dump());
  return q;
}

// Parts of a multimodal checkpoint lily never loads (spec §5a, §5b): the vision tower (mlx-vlm
// calls it vision_tower, HF model.visual), audio, projectors, and the MTP head. Their
// quantization entries are not lily's to validate: mlx-vlm may give them a scheme lily has no
// kernel for (6 bits, mxfp4) without that touching the text model.
bool lily_never_loads(const std::string& module_path) {
  static const char* const kPrefixes[] = {"vision_tower",
                                          "model.visual",
                                          "visual",
                                          "audio_tower",
                                          "model.audio_tower",
                                          "multi_modal_projector",
                                          "model.multi_modal_projector",
                                          "mtp",
                                          "model.mtp"};
  for (const char* prefix : kPrefixes) {
    const std::string_view p(prefix);
    if (module_path.starts_with(p) && (module_path.size() == p.size() || module_path[p.size()] == '.')) return true;
  }
  return false;
}

QuantizationConfig parse_quantization(const json& q) {
  QuantizationConfig out;
  if (!q.is_object()) fail("config.json: 'quantization' must be an object, found {}", q.dump());
  out.global = *parse_quant_spec(q, "quantization");
  for (auto& [key, value] : q.items()) {
    if (key == "group_size" || key == "bits" || key == "mode" || key == "quant_method") continue;
    if (lily_never_loads(key)) continue;
    out.overrides[key] = parse_quant_spec(value, key);
  }
  return out;
}

// Quantized Hugging Face checkpoints say how in quantization_config.quant_method; lily reads none
// of those formats (only mlx's affine entry, which has no quant_method, or "mlx"). The refusal
// names the format, so the user knows which checkpoint to fetch instead.
void refuse_foreign_quantization(const json& q, const char* where) {
  if (!q.is_object()) return;  // parse_quantization says what is wrong
  auto it = q.find("quant_method");
  if (it == q.end() || it->is_null()) return;
  if (!it->is_string()) fail("config.json: {}.quant_method must be a string, found {}", where, it->dump());
  const std::string method = it->get<std::string>();
  if (method == "mlx") return;
  auto text_of = [&](const char* key) {
    auto f = q.find(key);
    return f != q.end() && f->is_string() ? f->get<std::string>() : std::string();
  };
  std::string name = method, detail;
  if (method == "fp8" || method == "fbgemm_fp8") {
    name = "FP8";
  } else if (method == "awq" || method == "gptq" || method == "hqq" || method == "eetq" || method == "aqlm") {
    name.clear();
    for (char ch : method) name += char(std::toupper(static_cast<unsigned char>(ch)));
  } else if (method == "mxfp4") {
    name = "MXFP4";
  } else if (method == "modelopt") {  // NVIDIA ModelOpt: quant_algo NVFP4, FP8, ...
    const std::string algo = text_of("quant_algo");
    name = algo.find("FP4") != std::string::npos ? "NVFP4" : algo.empty() ? "ModelOpt" : algo;
    if (!algo.empty()) detail = ", quant_algo " + algo;
  } else if (method == "compressed-tensors") {  // llm-compressor: the format says which
    std::string format = text_of("format");
    if (format.empty())
      if (auto groups = q.find("config_groups"); groups != q.end() && groups->is_object())
        for (auto& [_, group] : groups->items())
          if (group.is_object() && group.contains("format") && group["format"].is_string()) {
            format = group["format"].get<std::string>();
            break;
          }
    name = format.find("nvfp4") != std::string::npos ? "NVFP4"
           : format == "float-quantized"             ? "FP8"
                                                     : "compressed-tensors";
    if (!format.empty()) detail = ", format " + format;
  }
  fail("{} (quant_method {}{}) checkpoints are not supported: use the bf16 or mlx 4-bit checkpoint", name, method,
       detail);
}

void validate(const ModelConfig& c) {
  auto need = [](bool ok, const char* what, auto... values) {
    if (!ok) fail("config.json: {} ({})", what, fmt::format("{}", fmt::join(std::vector<long long>{values...}, ", ")));
  };
  need(c.head_dim == 256, "head_dim must be 256 (the Qwen3.6 attention head size)", c.head_dim);
  need(c.linear_key_head_dim == 128 && c.linear_value_head_dim == 128,
       "linear_key_head_dim and linear_value_head_dim must be 128", c.linear_key_head_dim, c.linear_value_head_dim);
  need(c.num_attention_heads % c.num_key_value_heads == 0,
       "num_attention_heads must be a multiple of num_key_value_heads", c.num_attention_heads, c.num_key_value_heads);
  need(c.linear_num_value_heads % c.linear_num_key_heads == 0,
       "linear_num_value_heads must be a multiple of linear_num_key_heads", c.linear_num_value_heads,
       c.linear_num_key_heads);
  need(c.linear_conv_kernel_dim >= 2 && c.linear_conv_kernel_dim <= 8, "linear_conv_kernel_dim must be 2..8",
       c.linear_conv_kernel_dim);
  need(c.num_experts_per_tok <= c.num_experts, "num_experts_per_tok must not exceed num_experts", c.num_experts_per_tok,
       c.num_experts);
  need(c.hidden_size % 64 == 0, "hidden_size must be a multiple of 64", c.hidden_size);
}

}  // namespace

std::optional<QuantSpec> QuantizationConfig::for_module(const std::string& module_path) const {
  if (auto it = overrides.find(module_path); it != overrides.end()) return it->second;
  return global;
}

int ModelConfig::num_layers_of(LayerKind kind) const {
  int n = 0;
  for (LayerKind k : layer_types) n += (k == kind);
  return n;
}

std::string to_string(LayerKind kind) {
  return kind == LayerKind::full_attention ? "full_attention" : "linear_attention";
}

ModelConfig qwen36_35b_a3b_config() {
  ModelConfig c;
  c.model_type = "qwen3_5_moe";
  c.vocab_size = 248320;
  c.hidden_size = 2048;
  c.num_layers = 40;
  for (int i = 0; i < 40; ++i)
    c.layer_types.push_back(i % 4 == 3 ? LayerKind::full_attention : LayerKind::linear_attention);
  c.rms_norm_eps = 1e-6f;
  c.max_position_embeddings = 262144;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 2;
  c.head_dim = 256;
  c.rotary_dim = 64;
  c.rope_theta = 1e7f;
  c.linear_num_key_heads = 16;
  c.linear_num_value_heads = 32;
  c.linear_key_head_dim = 128;
  c.linear_value_head_dim = 128;
  c.linear_conv_kernel_dim = 4;
  c.num_experts = 256;
  c.num_experts_per_tok = 8;
  c.moe_intermediate_size = 512;
  c.shared_expert_intermediate_size = 512;
  return c;
}

ModelConfig parse_model_config(const json& config) {
  if (!config.is_object()) fail("config.json: expected a JSON object");
  const json& model_type = require(config, "model_type");
  if (model_type != "qwen3_5_moe" && model_type != "qwen3_5_moe_text")
    fail("config.json: model_type = {} is not supported (lily runs \"qwen3_5_moe\", Qwen3.5/3.6 MoE)",
         model_type.dump());
  const json& text = config.contains("text_config") && config["text_config"].is_object() ? config["text_config"]
                                                                                         : config;
  // A quantized HF checkpoint is refused by its format before any field is read.
  for (const char* key : {"quantization_config", "quantization"})
    if (auto it = config.find(key); it != config.end()) refuse_foreign_quantization(*it, key);
  if (&text != &config)
    if (auto it = text.find("quantization_config"); it != text.end())
      refuse_foreign_quantization(*it, "text_config.quantization_config");

  ModelConfig c;
  c.model_type = model_type.get<std::string>();
  c.vocab_size = require_int(text, "vocab_size");
  c.hidden_size = require_int(text, "hidden_size");
  c.num_layers = require_int(text, "num_hidden_layers");
  c.layer_types = parse_layer_types(text, c.num_layers);
  const double eps = require_number(text, "rms_norm_eps");
  if (!(eps > 0 && eps < 1)) fail("config.json: rms_norm_eps = {} must be in (0, 1)", eps);
  c.rms_norm_eps = float(eps);
  c.max_position_embeddings = require_int(text, "max_position_embeddings", 1, INT32_MAX);
  if (auto tie = optional_field<bool>(text, "tie_word_embeddings")) c.tie_word_embeddings = *tie;
  else if (auto top = optional_field<bool>(config, "tie_word_embeddings")) c.tie_word_embeddings = *top;

  c.num_attention_heads = require_int(text, "num_attention_heads");
  c.num_key_value_heads = require_int(text, "num_key_value_heads");
  c.head_dim = require_int(text, "head_dim");
  parse_rope(text, c);
  if (auto gate = optional_field<bool>(text, "attn_output_gate"); gate && !*gate)
    fail("config.json: attn_output_gate = false is not supported (Qwen3.6 gates attention output)");
  if (auto bias = optional_field<bool>(text, "attention_bias"); bias && *bias)
    fail("config.json: attention_bias = true is not supported");
  if (auto act = optional_field<std::string>(text, "hidden_act"); act && *act != "silu")
    fail("config.json: hidden_act = \"{}\" is not supported (lily supports \"silu\")", *act);

  c.linear_num_key_heads = require_int(text, "linear_num_key_heads");
  c.linear_num_value_heads = require_int(text, "linear_num_value_heads");
  c.linear_key_head_dim = require_int(text, "linear_key_head_dim");
  c.linear_value_head_dim = require_int(text, "linear_value_head_dim");
  c.linear_conv_kernel_dim = require_int(text, "linear_conv_kernel_dim");

  c.num_experts = require_int(text, "num_experts");
  c.num_experts_per_tok = require_int(text, "num_experts_per_tok");
  c.moe_intermediate_size = require_int(text, "moe_intermediate_size");
  c.shared_expert_intermediate_size = require_int(text, "shared_expert_intermediate_size");
  if (auto norm = optional_field<bool>(text, "norm_topk_prob"); norm && !*norm)
    fail("config.json: norm_topk_prob = false is not supported (Qwen3.6 always renormalises)");

  const json* quant = nullptr;
  if (auto it = config.find("quantization"); it != config.end() && !it->is_null()) quant = &*it;
  else if (auto it2 = config.find("quantization_config"); it2 != config.end() && !it2->is_null()) quant = &*it2;
  if (quant) c.quantization = parse_quantization(*quant);

  validate(c);
  return c;
}

GenerationConfig parse_generation_config(const json& g) {
  GenerationConfig out;
  if (!g.is_object()) fail("generation_config.json: expected a JSON object");
  return with_context("generation_config.json", [&] {
    if (auto it = g.find("eos_token_id"); it != g.end() && !it->is_null()) {
      auto token_id = [](const json& v) {
        const bool ok = v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(INT32_MAX)
                                               : v.is_number_integer() && v.get<int64_t>() >= 0;
        if (!ok) fail("eos_token_id entries must be token ids (integers 0..2^31-1), found {}", v.dump());
        return int(v.get<int64_t>());
      };
      if (it->is_number_integer()) out.eos_token_ids.push_back(token_id(*it));
      else if (it->is_array())
        for (const json& v : *it) out.eos_token_ids.push_back(token_id(v));
      else fail("eos_token_id must be an integer or a list, found {}", it->dump());
    }
    out.temperature = optional_field<float>(g, "temperature");
    out.top_p = optional_field<float>(g, "top_p");
    out.min_p = optional_field<float>(g, "min_p");
    out.top_k = optional_field<int>(g, "top_k");
    out.repetition_penalty = optional_field<float>(g, "repetition_penalty");
    out.presence_penalty = optional_field<float>(g, "presence_penalty");
    out.do_sample = optional_field<bool>(g, "do_sample");
    return out;
  });
}

ModelConfig load_model_config(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  json doc = read_json_file(path);
  return with_context(path, [&] { return parse_model_config(doc); });
}

GenerationConfig load_generation_config(const std::string& model_dir) {
  std::string path = model_dir + "/generation_config.json";
  if (!std::filesystem::exists(path)) return {};
  json doc = read_json_file(path);
  return with_context(path, [&] { return parse_generation_config(doc); });
}

}  // namespace lily
