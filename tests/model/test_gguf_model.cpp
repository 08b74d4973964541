// A qwen35moe GGUF as lily's model (src/model/gguf_weights.h): tiny-a written as GGUF by
// tools/hf_to_gguf.py (the converter's transforms applied: V heads tiled, ssm_a = -exp(A_log),
// +1 on the norms, experts split), loaded back and compared with lily's load of the HF
// checkpoint it came from: config, every weight, and the forward's logits (reference and fast
// CPU backends), then against transformers' logits. Damaged files give errors naming the part.
//
// tiny-a-bf16.gguf holds the HF bf16 weights exactly: the weights must be equal (A_log up to
// the log/exp round trip), the logits within float rounding. tiny-a-q8_0.gguf: within Q8_0's
// error.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/backend.h"
#include "backend/cpu_fast/cpu_fast.h"
#include "base/error.h"
#include "fixture.h"
#include "gguf_quantize.h"
#include "gguf_writer.h"
#include "model/checkpoint/load.h"
#include "model/gguf_file.h"

namespace lily {
namespace {

namespace fs = std::filesystem;

std::string gguf_fixture(const std::string& type) {
  return test::fixture_dir("tiny-a") + "/gguf/tiny-a-" + type + ".gguf";
}

std::vector<float> rows_of(const Matrix& m) {
  std::vector<float> v(static_cast<size_t>(m.rows * m.cols));
  for (int64_t r = 0; r < m.rows; ++r) m.dequantize_row(r, v.data() + r * m.cols);
  return v;
}

void expect_same_matrix(const Matrix& got, const Matrix& want, const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.cols, want.cols) << what;
  EXPECT_EQ(rows_of(got), rows_of(want)) << what;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(got[i], want[i], rel * std::fabs(want[i])) << what << "[" << i << "]";
}

TEST(GgufModel, ConfigFromTheMetadataEqualsConfigJson) {
  auto g = load_model(gguf_fixture("bf16"));
  auto h = load_model(test::fixture_dir("tiny-a") + "/hf-fused");
  const ModelConfig &a = g->config, &b = h->config;
  EXPECT_EQ(g->layout, CheckpointLayout::gguf);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.hidden_size, b.hidden_size);
  EXPECT_EQ(a.num_layers, b.num_layers);
  EXPECT_EQ(a.layer_types, b.layer_types);
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps);
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads);
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rotary_dim, b.rotary_dim);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.linear_num_key_heads, b.linear_num_key_heads);
  EXPECT_EQ(a.linear_num_value_heads, b.linear_num_value_heads);
  EXPECT_EQ(a.linear_key_head_dim, b.linear_key_head_dim);
  EXPECT_EQ(a.linear_value_head_dim, b.linear_value_head_dim);
  EXPECT_EQ(a.linear_conv_kernel_dim, b.linear_conv_kernel_dim);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.shared_expert_intermediate_size, b.shared_expert_intermediate_size);
  // tokenizer.ggml.eos_token_id (2, tiny-a's generation_config.json's first id), then the
  // vocabulary's <|im_end|> and <|endoftext|> (gguf_stop_token_ids; test_gguf_stop_tokens.cpp).
  EXPECT_EQ(g->generation.eos_token_ids, (std::vector<int>{2, 353, 351}));
}

// Every weight the GGUF loader builds, against the HF load: the undone V-head reorder, A_log,
// the norms' +1 and the split experts must all come back exactly.
TEST(GgufModel, WeightsEqualTheHfCheckpointsTheyCameFrom) {
  auto g = load_model(gguf_fixture("bf16"));
  auto h = load_model(test::fixture_dir("tiny-a") + "/hf-fused");
  expect_same_matrix(g->embed_tokens, h->embed_tokens, "embed_tokens");
  expect_same_matrix(g->lm_head, h->lm_head, "lm_head");
  EXPECT_EQ(g->final_norm, h->final_norm);
  for (size_t i = 0; i < h->layers.size(); ++i) {
    const LayerWeights &a = g->layers[i], &b = h->layers[i];
    const std::string L = "layer " + std::to_string(i) + " ";
    EXPECT_EQ(a.input_layernorm, b.input_layernorm) << L;
    EXPECT_EQ(a.post_attention_layernorm, b.post_attention_layernorm) << L;
    if (b.kind == LayerKind::linear_attention) {
      const DeltaNetWeights &x = a.deltanet, &y = b.deltanet;
      expect_same_matrix(x.in_proj_qkv, y.in_proj_qkv, L + "in_proj_qkv");
      expect_same_matrix(x.in_proj_z, y.in_proj_z, L + "in_proj_z");
      expect_same_matrix(x.in_proj_a, y.in_proj_a, L + "in_proj_a");
      expect_same_matrix(x.in_proj_b, y.in_proj_b, L + "in_proj_b");
      expect_same_matrix(x.out_proj, y.out_proj, L + "out_proj");
      EXPECT_EQ(x.conv1d, y.conv1d) << L;
      EXPECT_EQ(x.dt_bias, y.dt_bias) << L;
      EXPECT_EQ(x.norm, y.norm) << L;
      expect_close(x.A_log, y.A_log, 1e-5f, L + "A_log");
    } else {
      const AttentionWeights &x = a.attention, &y = b.attention;
      expect_same_matrix(x.q_proj, y.q_proj, L + "q_proj");
      expect_same_matrix(x.k_proj, y.k_proj, L + "k_proj");
      expect_same_matrix(x.v_proj, y.v_proj, L + "v_proj");
      expect_same_matrix(x.o_proj, y.o_proj, L + "o_proj");
      EXPECT_EQ(x.q_norm, y.q_norm) << L;
      EXPECT_EQ(x.k_norm, y.k_norm) << L;
    }
    const MoeWeights &x = a.moe, &y = b.moe;
    expect_same_matrix(x.router, y.router, L + "router");
    expect_same_matrix(x.shared_gate_proj, y.shared_gate_proj, L + "shared_gate_proj");
    expect_same_matrix(x.shared_up_proj, y.shared_up_proj, L + "shared_up_proj");
    expect_same_matrix(x.shared_down_proj, y.shared_down_proj, L + "shared_down_proj");
    expect_same_matrix(x.shared_expert_gate, y.shared_expert_gate, L + "shared_expert_gate");
    ASSERT_EQ(x.experts.gate_proj.size(), y.experts.gate_proj.size());
    for (size_t e = 0; e < y.experts.gate_proj.size(); ++e) {
      expect_same_matrix(x.experts.gate_proj[e], y.experts.gate_proj[e], L + "gate_proj " + std::to_string(e));
      expect_same_matrix(x.experts.up_proj[e], y.experts.up_proj[e], L + "up_proj " + std::to_string(e));
      expect_same_matrix(x.experts.down_proj[e], y.experts.down_proj[e], L + "down_proj " + std::to_string(e));
    }
  }
}

// The MTP block (block 4 of tiny-a's GGUF, nextn_predict_layers 1) against the HF mtp.* head.
TEST(GgufModel, TheMtpBlockEqualsTheHfMtpHead) {
  auto g = load_model(gguf_fixture("bf16"));
  auto h = load_model(test::fixture_dir("tiny-a") + "/hf-fused");
  ASSERT_TRUE(h->mtp.has_value());
  ASSERT_TRUE(g->mtp.has_value());
  EXPECT_EQ(g->config.num_layers, 4);  // block_count 5 = 4 main + 1 MTP
  const MtpWeights &a = *g->mtp, &b = *h->mtp;
  expect_same_matrix(a.fc, b.fc, "fc");
  EXPECT_EQ(a.pre_fc_norm_embedding, b.pre_fc_norm_embedding);
  EXPECT_EQ(a.pre_fc_norm_hidden, b.pre_fc_norm_hidden);
  EXPECT_EQ(a.norm, b.norm);
  EXPECT_EQ(a.layer.kind, LayerKind::full_attention);
  EXPECT_EQ(a.layer.input_layernorm, b.layer.input_layernorm);
  EXPECT_EQ(a.layer.post_attention_layernorm, b.layer.post_attention_layernorm);
  expect_same_matrix(a.layer.attention.q_proj, b.layer.attention.q_proj, "mtp q_proj");
  expect_same_matrix(a.layer.attention.o_proj, b.layer.attention.o_proj, "mtp o_proj");
  EXPECT_EQ(a.layer.attention.q_norm, b.layer.attention.q_norm);
  expect_same_matrix(a.layer.moe.router, b.layer.moe.router, "mtp router");
  for (size_t e = 0; e < b.layer.moe.experts.gate_proj.size(); ++e) {
    expect_same_matrix(a.layer.moe.experts.gate_proj[e], b.layer.moe.experts.gate_proj[e], "mtp gate_proj");
    expect_same_matrix(a.layer.moe.experts.up_proj[e], b.layer.moe.experts.up_proj[e], "mtp up_proj");
    expect_same_matrix(a.layer.moe.experts.down_proj[e], b.layer.moe.experts.down_proj[e], "mtp down_proj");
  }
  expect_same_matrix(a.layer.moe.shared_expert_gate, b.layer.moe.shared_expert_gate, "mtp shared_expert_gate");
}

// Each Q8_0 weight within half a step of the HF weight (the step: the 32-value block's largest
// |w| / 127, its f16 rounding included): the mapping of quantized rows and column blocks.
void expect_within_q8_0(const Matrix& got, const Matrix& want, const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.cols, want.cols) << what;
  const std::vector<float> g = rows_of(got), w = rows_of(want);
  for (size_t b = 0; b < w.size(); b += 32) {
    float amax = 0;
    for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(w[i]));
    const float bound = amax * (0.5f / 127 * (1 + 1.f / 1024) + 1.f / 1024);
    for (size_t i = b; i < b + 32; ++i) ASSERT_LE(std::fabs(g[i] - w[i]), bound) << what << " value " << i;
  }
}

TEST(GgufModel, Q8_0WeightsWithinHalfAStepOfTheHfCheckpoints) {
  auto g = load_model(gguf_fixture("q8_0"));
  auto h = load_model(test::fixture_dir("tiny-a") + "/hf-fused");
  expect_within_q8_0(g->embed_tokens, h->embed_tokens, "embed_tokens");
  for (size_t i = 0; i < h->layers.size(); ++i) {
    const LayerWeights &a = g->layers[i], &b = h->layers[i];
    const std::string L = "layer " + std::to_string(i) + " ";
    if (b.kind == LayerKind::linear_attention) {
      expect_within_q8_0(a.deltanet.in_proj_qkv, b.deltanet.in_proj_qkv, L + "in_proj_qkv");
      expect_within_q8_0(a.deltanet.in_proj_z, b.deltanet.in_proj_z, L + "in_proj_z");
      expect_within_q8_0(a.deltanet.in_proj_a, b.deltanet.in_proj_a, L + "in_proj_a");
      expect_within_q8_0(a.deltanet.out_proj, b.deltanet.out_proj, L + "out_proj");
    } else {
      expect_within_q8_0(a.attention.q_proj, b.attention.q_proj, L + "q_proj");
      expect_within_q8_0(a.attention.o_proj, b.attention.o_proj, L + "o_proj");
    }
    expect_within_q8_0(a.moe.experts.up_proj[5], b.moe.experts.up_proj[5], L + "up_proj 5");
    expect_within_q8_0(a.moe.experts.down_proj[7], b.moe.experts.down_proj[7], L + "down_proj 7");
  }
}

// tiny-a-bf16.gguf with every ssm_out written as Q4_K: blocks of 256 columns span two V heads,
// so the loader cannot move them and decodes the matrix to f32 in HF column order.
std::vector<std::byte> with_q4_k_ssm_out(const GgufModel& m) {
  test::GgufWriter w;
  for (const auto& [key, v] : m.metadata()) {
    if (v.type == GgufValueType::string) w.str(key, v.as_string());
    else if (v.type == GgufValueType::u32) w.u32(key, uint32_t(v.as_int()));
    else if (v.type == GgufValueType::f32) w.f32(key, float(v.as_float()));
    else if (v.type == GgufValueType::boolean) w.boolean(key, v.as_bool());
    else if (v.is_array() && v.element_type == GgufValueType::string) w.strings(key, v.string_array());
    else if (v.is_array() && v.element_type == GgufValueType::i32) {
      std::vector<int32_t> a;
      for (int64_t x : v.int_array()) a.push_back(int32_t(x));
      w.array<int32_t>(key, GgufValueType::i32, a);
    } else ADD_FAILURE() << "metadata " << key << " of a type this copy does not take";
  }
  for (const GgufTensor* t : m.tensors()) {
    std::vector<uint64_t> ne(t->ne.begin(), t->ne.end());
    if (t->name.ends_with("ssm_out.weight")) {
      std::vector<float> row(static_cast<size_t>(t->ne[0]));
      std::vector<std::byte> q;
      for (int64_t r = 0; r < t->rows(); ++r) {
        dequantize_gguf_row(t->type, t->data.data() + r * ggml_row_bytes(t->type, t->ne[0]), t->ne[0], row.data());
        for (uint8_t b : test::quantize_gguf_row(GgmlType::Q4_K, row.data(), t->ne[0])) q.push_back(std::byte(b));
      }
      w.tensor(t->name, uint32_t(GgmlType::Q4_K), ne, q);
    } else {
      w.tensor(t->name, uint32_t(t->type), ne, std::vector<std::byte>(t->data.begin(), t->data.end()));
    }
  }
  return w.build();
}

TEST(GgufModel, OutProjInBlocksWiderThanAHeadIsDecodedInHfOrder) {
  const fs::path path = fs::temp_directory_path() / ("lily-gguf-q4k-" + std::to_string(::getpid()) + ".gguf");
  test::GgufWriter::save(with_q4_k_ssm_out(GgufModel(gguf_fixture("bf16"))), path.string());
  auto g = load_model(path.string());
  auto h = load_model(test::fixture_dir("tiny-a") + "/hf-fused");
  for (size_t i = 0; i < h->layers.size(); ++i) {
    if (h->layers[i].kind != LayerKind::linear_attention) continue;
    const Matrix& got = g->layers[i].deltanet.out_proj;
    EXPECT_EQ(got.format, MatrixFormat::f32);
    const std::vector<float> a = rows_of(got), b = rows_of(h->layers[i].deltanet.out_proj);
    ASSERT_EQ(a.size(), b.size());
    // Q4_K's round trip: within 0.1 of each 256-value block's largest |w| (test_gguf_blocks.cpp);
    // a head out of place would be off by whole weights.
    for (size_t k = 0; k < b.size(); k += 256) {
      float amax = 0;
      for (size_t j = k; j < k + 256; ++j) amax = std::max(amax, std::fabs(b[j]));
      for (size_t j = k; j < k + 256; ++j) ASSERT_LE(std::fabs(a[j] - b[j]), 0.1f * amax) << "layer " << i << " " << j;
    }
    // The other DeltaNet matrices kept their stored types.
    EXPECT_EQ(g->layers[i].deltanet.in_proj_qkv.format, MatrixFormat::bf16);
  }
  fs::remove(path);
}

struct Logits {
  std::vector<float> values;
  int64_t vocab = 0;
};

Logits forward(std::unique_ptr<Backend> backend, const std::vector<int32_t>& ids, int64_t vocab) {
  auto seq = backend->new_sequence(4096);
  Logits out;
  out.vocab = vocab;
  backend->forward(*seq, ids, LogitsWanted::all, out.values);
  return out;
}

struct Diff {
  double max_abs = 0, max_ref = 0;
  int argmax_mismatches = 0;
  double relative() const { return max_abs / max_ref; }
};

Diff diff(const Logits& got, const Logits& want) {
  Diff d;
  EXPECT_EQ(got.values.size(), want.values.size());
  for (size_t i = 0; i < want.values.size(); ++i) {
    d.max_abs = std::max(d.max_abs,
                         std::isnan(got.values[i]) ? INFINITY : double(std::fabs(got.values[i] - want.values[i])));
    d.max_ref = std::max(d.max_ref, double(std::fabs(want.values[i])));
  }
  const size_t V = size_t(want.vocab);
  for (size_t t = 0; t < want.values.size() / V; ++t) {
    auto a = std::max_element(got.values.begin() + t * V, got.values.begin() + (t + 1) * V) - got.values.begin();
    auto b = std::max_element(want.values.begin() + t * V, want.values.begin() + (t + 1) * V) - want.values.begin();
    d.argmax_mismatches += a != b;
  }
  return d;
}

class GgufForward : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto ref = test::read_json(test::fixture_dir("tiny-a") + "/reference.json");
    ids_ = ref["ids"].get<std::vector<int32_t>>();
    vocab_ = ref["vocab_size"].get<int64_t>();
    transformers_.values = test::read_f32(test::fixture_dir("tiny-a") + "/" + ref["logits"]["hf"].get<std::string>());
    transformers_.vocab = vocab_;
    hf_ = forward(make_cpu_backend(load_model(test::fixture_dir("tiny-a") + "/hf-fused")), ids_, vocab_);
  }
  std::vector<int32_t> ids_;
  int64_t vocab_ = 0;
  Logits transformers_, hf_;  // transformers' logits; lily's reference forward on the HF checkpoint
};

TEST_F(GgufForward, Bf16LogitsEqualTheHfCheckpoints) {
  auto w = load_model(gguf_fixture("bf16"));
  const Diff own = diff(forward(make_cpu_backend(w), ids_, vocab_), hf_);
  std::printf("[bf16 gguf, reference backend] vs lily on hf-fused: relative %.3g, argmax mismatches %d of %zu\n",
              own.relative(), own.argmax_mismatches, ids_.size());
  EXPECT_LE(own.relative(), 1e-5);  // the same weights: A_log's round trip and float rounding
  EXPECT_EQ(own.argmax_mismatches, 0);
  const Diff ref = diff(forward(make_cpu_backend(w), ids_, vocab_), transformers_);
  EXPECT_LE(ref.relative(), 1e-3);  // tests/model/test_golden.cpp's bar
  EXPECT_EQ(ref.argmax_mismatches, 0);
  const Diff fast = diff(forward(make_cpu_fast_backend(w), ids_, vocab_), hf_);
  std::printf("[bf16 gguf, fast backend] vs lily on hf-fused: relative %.3g, argmax mismatches %d\n", fast.relative(),
              fast.argmax_mismatches);
  EXPECT_LE(fast.relative(), 1e-3);
  EXPECT_EQ(fast.argmax_mismatches, 0);
}

TEST_F(GgufForward, Q8_0LogitsWithinTheQuantizationError) {
  auto w = load_model(gguf_fixture("q8_0"));
  EXPECT_EQ(w->layers[0].deltanet.out_proj.format, MatrixFormat::gguf);  // columns moved in Q8_0 blocks
  EXPECT_EQ(w->layers[0].deltanet.out_proj.gguf_type, GgmlType::Q8_0);
  const Logits ref_q8 = forward(make_cpu_backend(w), ids_, vocab_);
  const Diff q8 = diff(ref_q8, hf_);
  std::printf("[q8_0 gguf, reference backend] vs lily on hf-fused: relative %.3g, argmax mismatches %d of %zu\n",
              q8.relative(), q8.argmax_mismatches, ids_.size());
  // The scale of 8-bit quantization error on this model: lily's own q8 (affine, group 64) of
  // the same checkpoint. Q8_0 (group 32) should do no worse.
  LoadOptions affine_q8;
  affine_q8.quantize_bits = 8;
  const Diff affine = diff(
      forward(make_cpu_backend(load_model(test::fixture_dir("tiny-a") + "/hf-fused", affine_q8)), ids_, vocab_), hf_);
  std::printf("[hf-fused quantized to q8g64] vs lily on hf-fused: relative %.3g, argmax mismatches %d\n",
              affine.relative(), affine.argmax_mismatches);
  EXPECT_LE(q8.relative(), affine.relative());
  EXPECT_LE(q8.argmax_mismatches, 2 * affine.argmax_mismatches);
  // The fast backend's GGUF kernels against the reference backend's row decoding, same file.
  const Diff fast = diff(forward(make_cpu_fast_backend(w), ids_, vocab_), ref_q8);
  std::printf("[q8_0 gguf] fast vs reference backend: relative %.3g, argmax mismatches %d\n", fast.relative(),
              fast.argmax_mismatches);
  EXPECT_LE(fast.relative(), 1e-3);
  EXPECT_EQ(fast.argmax_mismatches, 0);
}

// A copy of a fixture GGUF that a test damages.
class DamagedGguf {
 public:
  DamagedGguf() {
    path_ = fs::temp_directory_path() /
            ("lily-gguf-model-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++) + ".gguf");
    fs::copy_file(gguf_fixture("bf16"), path_);
    std::ifstream in(path_, std::ios::binary);
    bytes_.assign(std::istreambuf_iterator<char>(in), {});
  }
  ~DamagedGguf() { fs::remove(path_); }
  // Replaces the first occurrence of `from` by `to` (the same length).
  void replace(const std::string& from, const std::string& to) {
    auto at = bytes_.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    ASSERT_EQ(from.size(), to.size());
    bytes_.replace(at, from.size(), to);
    save();
  }
  void patch_f32(size_t at, float v) {
    std::memcpy(bytes_.data() + at, &v, 4);
    save();
  }
  const std::string& bytes() const { return bytes_; }
  std::string path() const { return path_.string(); }
  std::string load_error() const {
    try {
      load_model(path());
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "loaded a damaged GGUF";
    return "";
  }

 private:
  void save() {
    std::ofstream out(path_, std::ios::binary);
    out.write(bytes_.data(), std::streamsize(bytes_.size()));
  }
  fs::path path_;
  std::string bytes_;
  static inline int counter_ = 0;
};

#define EXPECT_CONTAINS(text, part) EXPECT_PRED_FORMAT2(::testing::IsSubstring, part, text)

TEST(GgufModelDamaged, AnotherArchitecture) {
  DamagedGguf f;
  const std::string length(std::string("\x09\0\0\0\0\0\0\0", 8));  // the value's u64 length: keys stay
  f.replace(length + "qwen35moe", length + "llama3xyz");
  EXPECT_CONTAINS(f.load_error(), "general.architecture = \"llama3xyz\": lily runs Qwen3.5/3.6 MoE");
}

TEST(GgufModelDamaged, AMissingTensor) {
  DamagedGguf f;
  const std::string length(std::string("\x0b\0\0\0\0\0\0\0", 8));  // the name's u64 length
  f.replace(length + "blk.1.ssm_a", length + "blk.1.ssm_q");
  EXPECT_CONTAINS(f.load_error(), "block 1: missing tensor 'blk.1.ssm_a'");
}

TEST(GgufModelDamaged, MetadataThatDoesNotFitTheTensors) {
  DamagedGguf f;
  // expert_count 8 -> 4: the router is {128, 8}.
  const std::string key = "qwen35moe.expert_count";
  const size_t at = f.bytes().find(key) + key.size() + 4;  // after the key and its type
  std::string value = f.bytes().substr(at, 4);
  ASSERT_EQ(value, std::string("\x08\0\0\0", 4));
  f.replace(key + std::string("\x04\0\0\0\x08\0\0\0", 8), key + std::string("\x04\0\0\0\x04\0\0\0", 8));
  EXPECT_CONTAINS(f.load_error(), "tensor 'blk.0.ffn_gate_inp.weight': expected ne {128, 4}, found {128, 8}");
}

TEST(GgufModelDamaged, AnUnsupportedHeadSize) {
  DamagedGguf f;
  const std::string key = "qwen35moe.attention.key_length";
  f.replace(key + std::string("\x04\0\0\0\x00\x01\0\0", 8), key + std::string("\x04\0\0\0\x80\0\0\0", 8));
  EXPECT_CONTAINS(f.load_error(),
                  "qwen35moe.attention.value_length = 256 differs from qwen35moe.attention.key_length = 128");
}

TEST(GgufModelDamaged, APositiveSsmA) {
  DamagedGguf f;
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(f.bytes().data()), f.bytes().size());
  const GgufHeader h = parse_gguf(bytes, f.path());
  size_t at = 0;
  for (const GgufTensor& t : h.tensors)
    if (t.name == "blk.2.ssm_a") at = size_t(h.data_offset + t.offset);
  ASSERT_GT(at, 0u);
  f.patch_f32(at + 4, 0.5f);  // GGUF head 1
  EXPECT_CONTAINS(f.load_error(), "block 2: tensor 'blk.2.ssm_a': value 1 is 0.5, not negative");
}

TEST(GgufModelDamaged, AGgufDirectoryLoadsItsFile) {
  const fs::path dir = fs::temp_directory_path() / ("lily-gguf-dir-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(gguf_fixture("q8_0"), dir / "tiny.gguf", fs::copy_options::overwrite_existing);
  auto w = load_model(dir.string());
  EXPECT_EQ(w->layout, CheckpointLayout::gguf);
  EXPECT_EQ(w->config.num_layers, 4);
  fs::remove_all(dir);
}

TEST(GgufModelDamaged, AnMtpBlockWithPartsMissing) {
  DamagedGguf f;
  f.replace("blk.4.nextn.hnorm.weight", "blk.4.nextn.hnorx.weight");
  EXPECT_CONTAINS(f.load_error(), "the MTP block (block 4): missing tensor 'blk.4.nextn.hnorm.weight'");
}

}  // namespace
}  // namespace lily
