// config.h: the model's hyper-parameters, read from config.json and validated.
//
// lily runs one architecture, Qwen3.5/3.6 MoE (`model_type` qwen3_5_moe, spec §1). The
// decoder fields sit under `text_config` in published checkpoints and at the top level in
// flattened exports; both are read. Every field lily relies on is checked: a missing,
// mistyped or unsupported value is an error naming the field and the value found.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lily {

enum class LayerKind { linear_attention, full_attention };  // Gated DeltaNet | gated attention

// Affine quantization of one module: w = scale * q + bias per group of `group_size` inputs.
struct QuantSpec {
  int group_size = 64;
  int bits = 4;
};

// The `quantization` entry of an mlx config.json: a global default plus per-module overrides
// keyed by module path (e.g. "language_model.model.layers.0.mlp.gate" -> 8 bits).
struct QuantizationConfig {
  QuantSpec global;
  std::map<std::string, std::optional<QuantSpec>> overrides;  // nullopt: module not quantized
  // The spec for `module_path`: its override if any, else the global one.
  std::optional<QuantSpec> for_module(const std::string& module_path) const;
};

struct ModelConfig {
  std::string model_type;  // qwen3_5_moe (or qwen3_5_moe_text)
  int vocab_size = 0;
  int hidden_size = 0;
  int num_layers = 0;
  std::vector<LayerKind> layer_types;  // [num_layers]
  float rms_norm_eps = 1e-6f;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;

  // Gated full attention (spec §2.4).
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;  // head_dim * partial_rotary_factor
  float rope_theta = 0;

  // Gated DeltaNet (spec §2.6).
  int linear_num_key_heads = 0;
  int linear_num_value_heads = 0;
  int linear_key_head_dim = 0;
  int linear_value_head_dim = 0;
  int linear_conv_kernel_dim = 0;

  // Sparse MoE (spec §2.7).
  int num_experts = 0;
  int num_experts_per_tok = 0;
  int moe_intermediate_size = 0;
  int shared_expert_intermediate_size = 0;

  std::optional<QuantizationConfig> quantization;  // present in mlx checkpoints

  // Derived sizes.
  int attention_q_width() const { return num_attention_heads * head_dim; }                 // 4096
  int attention_kv_width() const { return num_key_value_heads * head_dim; }                // 512
  int linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }        // 2048
  int linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }  // 4096
  int linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }        // 8192
  int num_layers_of(LayerKind kind) const;
};

// Sampling defaults and stop tokens from generation_config.json (all optional).
struct GenerationConfig {
  std::vector<int> eos_token_ids;
  std::optional<float> temperature, top_p, min_p, repetition_penalty, presence_penalty;
  std::optional<int> top_k;
  std::optional<bool> do_sample;
};

// Parses and validates a config.json document. Throws lily::Error naming the field.
ModelConfig parse_model_config(const nlohmann::json& config);
GenerationConfig parse_generation_config(const nlohmann::json& config);

// Reads DIR/config.json (required) and DIR/generation_config.json (optional).
ModelConfig load_model_config(const std::string& model_dir);
GenerationConfig load_generation_config(const std::string& model_dir);

std::string to_string(LayerKind kind);

// The published Qwen3.6-35B-A3B text geometry (spec §1.2), for synthetic benchmarks.
ModelConfig qwen36_35b_a3b_config();

}  // namespace lily
