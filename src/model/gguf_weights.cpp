// gguf_weights.cpp: the qwen35moe tensor table mapped onto ModelWeights (gguf_weights.h says
// which of the converter's transforms are kept and which undone). Every tensor's type and ne
// are checked; a missing or mis-shaped tensor is an error naming it, the expected and the
// found shape.
#include "model/gguf_weights.h"

#include <cmath>
#include <cstring>

#include "base/error.h"
#include "model/gguf_config.h"
#include "model/gguf_dequant.h"
#include "model/gguf_file.h"

namespace lily {

namespace {

// The HF order of the DeltaNet V heads from GGUF's tiled order: HF head n = kh * r + j is GGUF
// head j * Hk + kh.
struct VHeadOrder {
  int64_t k_heads = 0, ratio = 0;
  int64_t gguf_head(int64_t hf_head) const { return (hf_head % ratio) * k_heads + hf_head / ratio; }
};

class GgufReader {
 public:
  GgufReader(const GgufModel& model, ModelWeights& w) : m_(model), w_(w) {}

  // A [rows, cols] matrix (ne {cols, rows}; one row may be ne {cols}) as it lies in the file.
  Matrix matrix(const std::string& name, int64_t rows, int64_t cols) const {
    const GgufTensor* found = m_.find(name);
    const bool vector_row = rows == 1 && found && found->ne == std::vector<int64_t>{cols};
    const GgufTensor& t = vector_row ? *found : tensor(name, {cols, rows});
    return view(t, rows, cols, 0);
  }

  // Expert e of a stacked tensor ne {cols, rows_per_expert, E}: rows [row_offset, +rows).
  Matrix expert(const std::string& name, int64_t e, int64_t E, int64_t rows_per_expert, int64_t row_offset,
                int64_t rows, int64_t cols) const {
    const GgufTensor& t = tensor(name, {cols, rows_per_expert, E});
    return view(t, rows, cols, e * rows_per_expert + row_offset);
  }

  // A vector of n floats (ne {n}, or {n} padded with 1s), any type the decoder takes.
  std::vector<float> vector(const std::string& name, std::vector<int64_t> ne) const {
    const GgufTensor& t = tensor(name, ne);
    std::vector<float> out(size_t(t.numel()));
    with_context("tensor '" + name + "'", [&] {
      if (!gguf_dequant_supported(t.type)) fail("type {} is not one lily decodes", to_string(t.type));
      dequantize_gguf_row(t.type, t.data.data(), t.numel(), out.data());
    });
    return out;
  }

  // A matrix whose rows are reordered: row r of the result is row source_row(r) of the tensor
  // (whole rows move, so any type stays as it is). The bytes are owned by the weights.
  template <typename SourceRow>
  Matrix rows_reordered(const std::string& name, int64_t rows, int64_t cols, SourceRow source_row) const {
    const GgufTensor& t = tensor(name, {cols, rows});
    const int64_t row_bytes = row_bytes_of(t, cols);
    auto bytes = std::make_shared<std::vector<std::byte>>(t.data.size());
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(bytes->data() + r * row_bytes, t.data.data() + source_row(r) * row_bytes, size_t(row_bytes));
    w_.storage.push_back(bytes);
    Matrix out = view(t, rows, cols, 0);
    out.data = bytes->data();
    return out;
  }

  // A [rows, cols] matrix whose columns come in blocks of `block` (a head's 128): column block b
  // of the result is block source_block(b) of the tensor. Blocks move within each row when the
  // type's own blocks divide `block`; otherwise each row is decoded to f32 and reordered.
  template <typename SourceBlock>
  Matrix columns_reordered(const std::string& name, int64_t rows, int64_t cols, int64_t block,
                           SourceBlock source_block) const {
    const GgufTensor& t = tensor(name, {cols, rows});
    const GgmlTypeInfo& info = ggml_type_info(t.type);
    const int64_t blocks = cols / block;
    if (block % info.block_size == 0) {
      const int64_t row_bytes = row_bytes_of(t, cols), chunk = block / info.block_size * info.block_bytes;
      auto bytes = std::make_shared<std::vector<std::byte>>(t.data.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t b = 0; b < blocks; ++b)
          std::memcpy(bytes->data() + r * row_bytes + b * chunk,
                      t.data.data() + r * row_bytes + source_block(b) * chunk, size_t(chunk));
      w_.storage.push_back(bytes);
      Matrix out = view(t, rows, cols, 0);
      out.data = bytes->data();
      return out;
    }
    const Matrix stored = view(t, rows, cols, 0);
    auto values = std::make_shared<std::vector<float>>(size_t(rows * cols));
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      stored.dequantize_row(r, row.data());
      for (int64_t b = 0; b < blocks; ++b)
        std::memcpy(values->data() + r * cols + b * block, row.data() + source_block(b) * block,
                    size_t(block) * sizeof(float));
    }
    w_.storage.push_back(values);
    Matrix out;
    out.rows = rows, out.cols = cols, out.format = MatrixFormat::f32, out.data = values->data();
    return out;
  }

  bool contains(const std::string& name) const { return m_.find(name) != nullptr; }

 private:
  const GgufTensor& tensor(const std::string& name, const std::vector<int64_t>& ne) const {
    const GgufTensor& t = m_.get(name);
    if (t.ne != ne) fail("tensor '{}': expected ne {{{}}}, found {}", name, fmt::join(ne, ", "), t.shape_string());
    return t;
  }

  static int64_t row_bytes_of(const GgufTensor& t, int64_t cols) { return ggml_row_bytes(t.type, cols); }

  // Rows [first_row, first_row + rows) of t as a Matrix of its type.
  static Matrix view(const GgufTensor& t, int64_t rows, int64_t cols, int64_t first_row) {
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    switch (t.type) {
      case GgmlType::F32: m.format = MatrixFormat::f32; break;
      case GgmlType::F16: m.format = MatrixFormat::f16; break;
      case GgmlType::BF16: m.format = MatrixFormat::bf16; break;
      default:
        if (!gguf_dequant_supported(t.type))
          fail("tensor '{}' is {}: lily reads F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL "
               "and IQ4_XS",
               t.name, to_string(t.type));
        m.format = MatrixFormat::gguf;
        m.gguf_type = t.type;
    }
    m.data = t.data.data() + first_row * row_bytes_of(t, cols);
    return m;
  }

  const GgufModel& m_;
  ModelWeights& w_;
};

DeltaNetWeights load_deltanet(const GgufReader& r, const ModelConfig& c, const std::string& b) {
  DeltaNetWeights w;
  const int64_t H = c.hidden_size, Hv = c.linear_num_value_heads, dv = c.linear_value_head_dim;
  const int64_t key_rows = 2 * int64_t(c.linear_key_dim()), conv_dim = c.linear_conv_dim();
  const VHeadOrder order{c.linear_num_key_heads, Hv / c.linear_num_key_heads};
  // Rows [0, key_rows) are q | k as stored; V row v is row v % dv of head v / dv.
  auto qkv_row = [&](int64_t row) {
    if (row < key_rows) return row;
    const int64_t v = row - key_rows;
    return key_rows + order.gguf_head(v / dv) * dv + v % dv;
  };
  auto head_row = [&](int64_t row) { return order.gguf_head(row / dv) * dv + row % dv; };
  auto head = [&](int64_t n) { return order.gguf_head(n); };
  w.in_proj_qkv = r.rows_reordered(b + "attn_qkv.weight", conv_dim, H, qkv_row);
  w.in_proj_z = r.rows_reordered(b + "attn_gate.weight", Hv * dv, H, head_row);
  w.in_proj_b = r.rows_reordered(b + "ssm_beta.weight", Hv, H, head);
  w.in_proj_a = r.rows_reordered(b + "ssm_alpha.weight", Hv, H, head);
  w.out_proj = r.columns_reordered(b + "ssm_out.weight", H, Hv * dv, dv, head);
  const int64_t K = c.linear_conv_kernel_dim;
  const std::vector<float> conv = r.vector(b + "ssm_conv1d.weight", {K, conv_dim});
  w.conv1d.resize(conv.size());
  for (int64_t ch = 0; ch < conv_dim; ++ch)
    std::memcpy(&w.conv1d[size_t(ch * K)], &conv[size_t(qkv_row(ch) * K)], size_t(K) * sizeof(float));
  const std::vector<float> a = r.vector(b + "ssm_a", {Hv}), dt = r.vector(b + "ssm_dt.bias", {Hv});
  for (int64_t n = 0; n < Hv; ++n) {
    const float ssm_a = a[size_t(head(n))];
    // spec §5c: ssm_a = -exp(A_log).
    if (!(ssm_a < 0) || !std::isfinite(ssm_a))
      fail("tensor '{}ssm_a': value {} is {}, not negative as -exp(A_log) is", b, head(n), ssm_a);
    w.A_log.push_back(std::log(-ssm_a));
    w.dt_bias.push_back(dt[size_t(head(n))]);
  }
  w.norm = r.vector(b + "ssm_norm.weight", {dv});  // the gated norm, stored as is
  return w;
}

AttentionWeights load_attention(const GgufReader& r, const ModelConfig& c, const std::string& b) {
  AttentionWeights a;
  const int64_t H = c.hidden_size, d = c.head_dim;
  a.q_proj = r.matrix(b + "attn_q.weight", 2 * int64_t(c.num_attention_heads) * d, H);
  a.k_proj = r.matrix(b + "attn_k.weight", int64_t(c.num_key_value_heads) * d, H);
  a.v_proj = r.matrix(b + "attn_v.weight", int64_t(c.num_key_value_heads) * d, H);
  a.o_proj = r.matrix(b + "attn_output.weight", H, int64_t(c.num_attention_heads) * d);
  a.q_norm = r.vector(b + "attn_q_norm.weight", {d});  // GGUF holds the gain 1 + w, as lily does
  a.k_norm = r.vector(b + "attn_k_norm.weight", {d});
  return a;
}

MoeWeights load_moe(const GgufReader& r, const ModelConfig& c, const std::string& b) {
  MoeWeights m;
  const int64_t H = c.hidden_size, E = c.num_experts, I = c.moe_intermediate_size;
  const int64_t Is = c.shared_expert_intermediate_size;
  m.router = r.matrix(b + "ffn_gate_inp.weight", E, H);
  const bool fused = r.contains(b + "ffn_gate_up_exps.weight");
  for (int64_t e = 0; e < E; ++e) {
    if (fused) {  // gate rows [0, I) then up rows [I, 2I) of each expert
      m.experts.gate_proj.push_back(r.expert(b + "ffn_gate_up_exps.weight", e, E, 2 * I, 0, I, H));
      m.experts.up_proj.push_back(r.expert(b + "ffn_gate_up_exps.weight", e, E, 2 * I, I, I, H));
    } else {
      m.experts.gate_proj.push_back(r.expert(b + "ffn_gate_exps.weight", e, E, I, 0, I, H));
      m.experts.up_proj.push_back(r.expert(b + "ffn_up_exps.weight", e, E, I, 0, I, H));
    }
    m.experts.down_proj.push_back(r.expert(b + "ffn_down_exps.weight", e, E, H, 0, H, I));
  }
  m.shared_gate_proj = r.matrix(b + "ffn_gate_shexp.weight", Is, H);
  m.shared_up_proj = r.matrix(b + "ffn_up_shexp.weight", Is, H);
  m.shared_down_proj = r.matrix(b + "ffn_down_shexp.weight", H, Is);
  m.shared_expert_gate = r.matrix(b + "ffn_gate_inp_shexp.weight", 1, H);  // ne {H} (or {H, 1}): one row
  return m;
}

LayerWeights load_layer(const GgufReader& r, const ModelConfig& c, int i, LayerKind kind) {
  const std::string b = fmt::format("blk.{}.", i);
  LayerWeights l;
  l.kind = kind;
  l.input_layernorm = r.vector(b + "attn_norm.weight", {c.hidden_size});
  l.post_attention_layernorm = r.vector(b + "post_attention_norm.weight", {c.hidden_size});
  if (l.kind == LayerKind::full_attention) l.attention = load_attention(r, c, b);
  else l.deltanet = load_deltanet(r, c, b);
  l.moe = load_moe(r, c, b);
  return l;
}

// The MTP block (spec §5c): block n_main, a full-attention MoE layer, with its nextn tensors:
// eh_proj = mtp.fc [H, 2H] (embedding columns first), enorm / hnorm = the pre-fc norms,
// shared_head_norm = mtp.norm, all stored as the gain 1 + w. It reads the main embedding and
// lm_head (this file has no nextn.embed_tokens or nextn.shared_head_head of its own).
MtpWeights load_mtp(const GgufReader& r, const ModelConfig& c, int block) {
  const std::string b = fmt::format("blk.{}.nextn.", block);
  for (const char* own : {"embed_tokens.weight", "shared_head_head.weight"})
    if (r.contains(b + own))
      fail("tensor '{}{}': lily's MTP head reads the main embedding and lm_head, not its own", b, own);
  MtpWeights m;
  const int64_t H = c.hidden_size;
  m.fc = r.matrix(b + "eh_proj.weight", H, 2 * H);
  m.pre_fc_norm_embedding = r.vector(b + "enorm.weight", {H});
  m.pre_fc_norm_hidden = r.vector(b + "hnorm.weight", {H});
  m.norm = r.vector(b + "shared_head_norm.weight", {H});
  m.layer = load_layer(r, c, block, LayerKind::full_attention);
  return m;
}

}  // namespace

std::shared_ptr<ModelWeights> load_gguf_model(const std::string& path) {
  auto model = std::make_shared<GgufModel>(path);
  return with_context("loading " + model->paths().front(), [&] {
    auto w = std::make_shared<ModelWeights>();
    w->storage.push_back(model);
    w->model_dir = path;
    w->layout = CheckpointLayout::gguf;
    GgufModelConfig cfg = gguf_model_config(*model);
    w->config = cfg.config;
    w->generation = cfg.generation;
    const ModelConfig& c = w->config;
    GgufReader r(*model, *w);
    w->embed_tokens = r.matrix("token_embd.weight", c.vocab_size, c.hidden_size);
    w->final_norm = r.vector("output_norm.weight", {c.hidden_size});
    w->lm_head = c.tie_word_embeddings ? w->embed_tokens : r.matrix("output.weight", c.vocab_size, c.hidden_size);
    w->layers.resize(size_t(c.num_layers));
    for (int i = 0; i < c.num_layers; ++i)
      w->layers[size_t(i)] = with_context(fmt::format("block {}", i),
                                          [&] { return load_layer(r, c, i, c.layer_types[size_t(i)]); });
    if (cfg.nextn_layers > 1)
      fail("qwen35moe.nextn_predict_layers = {}: lily runs a one-layer MTP head (spec §6)", cfg.nextn_layers);
    if (cfg.nextn_layers == 1) {
      w->mtp = with_context(fmt::format("the MTP block (block {})", c.num_layers),
                            [&] { return load_mtp(r, c, c.num_layers); });
      w->mtp_dir = path;
    }
    return w;
  });
}

}  // namespace lily
