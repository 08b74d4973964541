// gguf_config.cpp: the qwen35moe metadata read into ModelConfig (gguf_config.h has the map).
#include "model/gguf_config.h"

#include <limits>
#include <numeric>

#include "base/error.h"
#include "model/gguf_vocabulary.h"

namespace lily {

namespace {

constexpr const char* kArch = "qwen35moe";

std::string key(const char* name) { return fmt::format("{}.{}", kArch, name); }

// An integer key in [lo, hi]; `fallback` when absent (nullopt: required).
int int_key(const GgufModel& m, const std::string& k, int lo, int hi, std::optional<int> fallback = std::nullopt) {
  const GgufValue* v = m.find_metadata(k);
  if (!v) {
    if (fallback) return *fallback;
    fail("missing metadata key '{}'", k);
  }
  return with_context(fmt::format("metadata '{}'", k), [&] {
    const int64_t x = v->as_int();
    if (x < lo || x > hi) fail("{} is outside [{}, {}]", x, lo, hi);
    return int(x);
  });
}

float float_key(const GgufModel& m, const std::string& k) {
  const GgufValue* v = m.find_metadata(k);
  if (!v) fail("missing metadata key '{}'", k);
  return with_context(fmt::format("metadata '{}'", k), [&] { return float(v->as_float()); });
}

// Fields lily's kernels fix (spec §1.2), checked with the GGUF key that carries them.
void check_supported(const ModelConfig& c) {
  auto need = [](bool ok, const std::string& what) {
    if (!ok) fail("{}", what);
  };
  need(c.head_dim == 256,
       fmt::format("{} = {}: lily's attention takes heads of 256", key("attention.key_length"), c.head_dim));
  need(c.linear_key_head_dim == 128,
       fmt::format("{} = {}: lily's DeltaNet takes key heads of 128", key("ssm.state_size"), c.linear_key_head_dim));
  need(c.linear_value_head_dim == 128,
       fmt::format("{} / {} = {}: lily's DeltaNet takes value heads of 128", key("ssm.inner_size"),
                   key("ssm.time_step_rank"), c.linear_value_head_dim));
  need(c.num_attention_heads % c.num_key_value_heads == 0,
       fmt::format("{} = {} is not a multiple of {} = {}", key("attention.head_count"), c.num_attention_heads,
                   key("attention.head_count_kv"), c.num_key_value_heads));
  need(c.linear_num_value_heads % c.linear_num_key_heads == 0,
       fmt::format("{} = {} is not a multiple of {} = {}", key("ssm.time_step_rank"), c.linear_num_value_heads,
                   key("ssm.group_count"), c.linear_num_key_heads));
  need(c.num_experts_per_tok <= c.num_experts, fmt::format("{} = {} exceeds {} = {}", key("expert_used_count"),
                                                           c.num_experts_per_tok, key("expert_count"), c.num_experts));
  need(c.hidden_size % 64 == 0, fmt::format("{} = {} is not a multiple of 64", key("embedding_length"), c.hidden_size));
  need(c.rotary_dim % 2 == 0 && c.rotary_dim <= c.head_dim,
       fmt::format("{} = {} must be even and at most the head size", key("rope.dimension_count"), c.rotary_dim));
}

// Text positions give every MRoPE section the same angle, so the sections only need to cover
// the rotary half-dimensions (spec §2.5).
void check_rope_sections(const GgufModel& m, const ModelConfig& c) {
  const GgufValue* v = m.find_metadata(key("rope.dimension_sections"));
  if (!v) return;
  with_context(fmt::format("metadata '{}'", key("rope.dimension_sections")), [&] {
    const std::vector<int64_t> s = v->int_array();
    const int64_t sum = std::accumulate(s.begin(), s.end(), int64_t(0));
    if (sum != c.rotary_dim / 2)
      fail("the sections [{}] add up to {}, not rope.dimension_count / 2 = {}", fmt::join(s, ", "), sum,
           c.rotary_dim / 2);
  });
}

std::vector<LayerKind> layer_kinds(const GgufModel& m, int layers) {
  std::vector<LayerKind> kinds(static_cast<size_t>(layers));
  if (const GgufValue* v = m.find_metadata(key("attention.recurrent_layers"))) {
    with_context(fmt::format("metadata '{}'", key("attention.recurrent_layers")), [&] {
      const std::vector<int64_t> r = v->int_array();
      if (int64_t(r.size()) < layers) fail("has {} entries for {} layers", r.size(), layers);
      for (int i = 0; i < layers; ++i)
        kinds[size_t(i)] = r[size_t(i)] ? LayerKind::linear_attention : LayerKind::full_attention;
    });
    return kinds;
  }
  const int interval = int_key(m, key("full_attention_interval"), 1, layers > 0 ? layers : 1, 4);
  for (int i = 0; i < layers; ++i)
    kinds[size_t(i)] = (i + 1) % interval == 0 ? LayerKind::full_attention : LayerKind::linear_attention;
  return kinds;
}

}  // namespace

GgufModelConfig gguf_model_config(const GgufModel& m) {
  return with_context(m.paths().front(), [&] {
    const GgufValue* arch = m.find_metadata("general.architecture");
    if (!arch) fail("missing metadata key 'general.architecture'");
    const std::string& name = with_context("metadata 'general.architecture'", [&] { return arch->as_string(); });
    if (name != kArch) fail("general.architecture = \"{}\": lily runs Qwen3.5/3.6 MoE (\"{}\")", name, kArch);
    constexpr int kBig = std::numeric_limits<int>::max();
    GgufModelConfig out;
    ModelConfig& c = out.config;
    c.model_type = "qwen3_5_moe";
    const int blocks = int_key(m, key("block_count"), 1, 4096);
    out.nextn_layers = int_key(m, key("nextn_predict_layers"), 0, blocks - 1, 0);
    c.num_layers = blocks - out.nextn_layers;
    c.hidden_size = int_key(m, key("embedding_length"), 1, 1 << 20);
    c.max_position_embeddings = int_key(m, key("context_length"), 1, kBig, 262144);
    c.num_attention_heads = int_key(m, key("attention.head_count"), 1, 1024);
    c.num_key_value_heads = int_key(m, key("attention.head_count_kv"), 1, 1024);
    c.head_dim = int_key(m, key("attention.key_length"), 1, 4096);
    const int value_length = int_key(m, key("attention.value_length"), 1, 4096, c.head_dim);
    if (value_length != c.head_dim)
      fail("{} = {} differs from {} = {}; lily takes one head size", key("attention.value_length"), value_length,
           key("attention.key_length"), c.head_dim);
    c.rms_norm_eps = float_key(m, key("attention.layer_norm_rms_epsilon"));
    c.rope_theta = float_key(m, key("rope.freq_base"));
    c.rotary_dim = int_key(m, key("rope.dimension_count"), 1, 4096);
    c.linear_num_key_heads = int_key(m, key("ssm.group_count"), 1, 1024);
    c.linear_num_value_heads = int_key(m, key("ssm.time_step_rank"), 1, 1024);
    c.linear_key_head_dim = int_key(m, key("ssm.state_size"), 1, 4096);
    const int inner = int_key(m, key("ssm.inner_size"), 1, 1 << 20);
    if (inner % c.linear_num_value_heads != 0)
      fail("{} = {} is not a multiple of {} = {}", key("ssm.inner_size"), inner, key("ssm.time_step_rank"),
           c.linear_num_value_heads);
    c.linear_value_head_dim = inner / c.linear_num_value_heads;
    c.linear_conv_kernel_dim = int_key(m, key("ssm.conv_kernel"), 2, 8);
    c.num_experts = int_key(m, key("expert_count"), 1, 4096);
    c.num_experts_per_tok = int_key(m, key("expert_used_count"), 1, 4096);
    c.moe_intermediate_size = int_key(m, key("expert_feed_forward_length"), 1, 1 << 20);
    c.shared_expert_intermediate_size = int_key(m, key("expert_shared_feed_forward_length"), 1, 1 << 20);
    c.layer_types = layer_kinds(m, c.num_layers);
    const GgufTensor& embd = m.get("token_embd.weight");
    if (embd.ne.size() != 2 || embd.ne[0] != c.hidden_size)
      fail("tensor 'token_embd.weight' is {}, expected {{{}, vocab}}", embd.shape_string(), c.hidden_size);
    c.vocab_size = int(embd.ne[1]);
    c.tie_word_embeddings = m.find("output.weight") == nullptr;
    check_supported(c);
    check_rope_sections(m, c);
    out.generation.eos_token_ids = gguf_stop_token_ids(m.metadata(), c.vocab_size);
    return out;
  });
}

}  // namespace lily
