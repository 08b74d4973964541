#include "model/weights.h"

#include <fmt/format.h>

#include "base/error.h"
#include "model/gguf_dequant.h"
#include "model/quant.h"

namespace lily {

void Matrix::dequantize_row(int64_t r, float* out) const {
  switch (format) {
    case MatrixFormat::f32: {
      const float* p = static_cast<const float*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = p[c];
      return;
    }
    case MatrixFormat::bf16: {
      const bf16* p = static_cast<const bf16*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = to_float(p[c]);
      return;
    }
    case MatrixFormat::f16: {
      const uint16_t* p = static_cast<const uint16_t*>(data) + r * cols;
      for (int64_t c = 0; c < cols; ++c) out[c] = half_to_float(p[c]);
      return;
    }
    case MatrixFormat::affine: {
      const int64_t words = cols * bits / 32, groups = cols / group_size;
      lily::dequantize_row(static_cast<const uint32_t*>(data) + r * words, scales + r * groups, biases + r * groups,
                           cols, bits, group_size, out);
      return;
    }
    case MatrixFormat::gguf: {
      const int64_t row_bytes = ggml_row_bytes(gguf_type, cols);
      dequantize_gguf_row(gguf_type, static_cast<const uint8_t*>(data) + r * row_bytes, cols, out);
      return;
    }
  }
}

uint64_t Matrix::bytes() const {
  switch (format) {
    case MatrixFormat::f32: return uint64_t(rows * cols) * 4;
    case MatrixFormat::bf16:
    case MatrixFormat::f16: return uint64_t(rows * cols) * 2;
    case MatrixFormat::affine: return uint64_t(rows * cols) * bits / 8 + uint64_t(rows * (cols / group_size)) * 4;
    case MatrixFormat::gguf: return uint64_t(rows * ggml_row_bytes(gguf_type, cols));
  }
  return 0;
}

std::string Matrix::describe() const {
  std::string kind;
  switch (format) {
    case MatrixFormat::f32: kind = "f32"; break;
    case MatrixFormat::bf16: kind = "bf16"; break;
    case MatrixFormat::f16: kind = "f16"; break;
    case MatrixFormat::affine: kind = fmt::format("q{}g{}", bits, group_size); break;
    case MatrixFormat::gguf: kind = fmt::format("gguf {}", to_string(gguf_type)); break;
  }
  return fmt::format("{} [{}, {}]", kind, rows, cols);
}

std::string to_string(CheckpointLayout layout) {
  switch (layout) {
    case CheckpointLayout::hf: return "hf";
    case CheckpointLayout::mlx: return "mlx";
    case CheckpointLayout::gguf: return "gguf";
  }
  return "?";
}

namespace {
template <typename Fn>
void for_each_layer_matrix(const LayerWeights& l, Fn&& fn) {
  if (l.kind == LayerKind::full_attention) {
    for (const Matrix* m : {&l.attention.q_proj, &l.attention.k_proj, &l.attention.v_proj, &l.attention.o_proj}) fn(*m);
  } else {
    const DeltaNetWeights& d = l.deltanet;
    for (const Matrix* m : {&d.in_proj_qkv, &d.in_proj_z, &d.in_proj_b, &d.in_proj_a, &d.out_proj}) fn(*m);
  }
  const MoeWeights& m = l.moe;
  for (const Matrix* x :
       {&m.router, &m.shared_gate_proj, &m.shared_up_proj, &m.shared_down_proj, &m.shared_expert_gate})
    fn(*x);
  for (const auto* list : {&m.experts.gate_proj, &m.experts.up_proj, &m.experts.down_proj})
    for (const Matrix& x : *list) fn(x);
}

template <typename Fn>
void for_each_layer_vector(const LayerWeights& l, Fn&& fn) {
  fn(l.input_layernorm);
  fn(l.post_attention_layernorm);
  if (l.kind == LayerKind::full_attention) {
    fn(l.attention.q_norm);
    fn(l.attention.k_norm);
  } else {
    for (const auto* v : {&l.deltanet.conv1d, &l.deltanet.A_log, &l.deltanet.dt_bias, &l.deltanet.norm}) fn(*v);
  }
}

template <typename Fn>
void for_each_matrix(const ModelWeights& w, Fn&& fn) {
  fn(w.embed_tokens);
  if (w.lm_head.data != w.embed_tokens.data) fn(w.lm_head);
  for (const LayerWeights& l : w.layers) for_each_layer_matrix(l, fn);
}

template <typename Fn>
void for_each_vector(const ModelWeights& w, Fn&& fn) {
  fn(w.final_norm);
  for (const LayerWeights& l : w.layers) for_each_layer_vector(l, fn);
}
}  // namespace

uint64_t ModelWeights::parameter_count() const {
  uint64_t n = 0;
  for_each_matrix(*this, [&](const Matrix& m) { n += uint64_t(m.rows * m.cols); });
  for_each_vector(*this, [&](const std::vector<float>& v) { n += v.size(); });
  return n;
}

uint64_t ModelWeights::weight_bytes() const {
  uint64_t n = 0;
  for_each_matrix(*this, [&](const Matrix& m) { n += m.bytes(); });
  for_each_vector(*this, [&](const std::vector<float>& v) { n += v.size() * 4; });
  return n;
}

uint64_t ModelWeights::mtp_weight_bytes() const {
  if (!mtp) return 0;
  uint64_t n = mtp->fc.bytes();
  for_each_layer_matrix(mtp->layer, [&](const Matrix& m) { n += m.bytes(); });
  for_each_layer_vector(mtp->layer, [&](const std::vector<float>& v) { n += v.size() * 4; });
  for (const auto* v : {&mtp->pre_fc_norm_embedding, &mtp->pre_fc_norm_hidden, &mtp->norm}) n += v->size() * 4;
  return n;
}

}  // namespace lily
