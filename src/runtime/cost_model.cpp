#include "runtime/cost_model.h"

#include <algorithm>
#include <cmath>

namespace lily {

namespace {

// Bytes of an affine-quantized [rows, cols] matrix: codes + bf16 scale and bias per group.
double q_bytes(double rows, double cols, int bits = 4) { return rows * cols * bits / 8.0 + rows * (cols / 64.0) * 4.0; }

// Weights a step reads in one layer (the mixer, router, `experts` routed experts, shared expert).
double layer_weight_bytes(const ModelConfig& c, LayerKind kind, double experts) {
  const double H = c.hidden_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  double b = 0;
  if (kind == LayerKind::full_attention) {
    const double q = 2.0 * c.num_attention_heads * c.head_dim, kv = double(c.attention_kv_width());
    b += q_bytes(q, H) + 2 * q_bytes(kv, H) + q_bytes(H, c.num_attention_heads * double(c.head_dim));
  } else {
    b += q_bytes(c.linear_conv_dim(), H) + q_bytes(c.linear_value_dim(), H) + 2 * q_bytes(c.linear_num_value_heads, H) +
         q_bytes(H, c.linear_value_dim());
  }
  b += q_bytes(c.num_experts, H, 8) + q_bytes(1, H, 8);
  b += experts * (2 * q_bytes(I, H) + q_bytes(H, I));
  b += 2 * q_bytes(Is, H) + q_bytes(H, Is);
  return b;
}

// Multiply-adds per token of the same weights.
double layer_weight_params(const ModelConfig& c, LayerKind kind) {
  const double H = c.hidden_size, I = c.moe_intermediate_size, Is = c.shared_expert_intermediate_size;
  double p = 0;
  if (kind == LayerKind::full_attention)
    p += H * (2.0 * c.num_attention_heads * c.head_dim + 2.0 * c.attention_kv_width()) +
         H * c.num_attention_heads * double(c.head_dim);
  else
    p += H * (c.linear_conv_dim() + c.linear_value_dim() + 2.0 * c.linear_num_value_heads) + H * c.linear_value_dim();
  p += H * (c.num_experts + 1) + c.num_experts_per_tok * 3.0 * I * H + 3.0 * Is * H;
  return p;
}

}  // namespace

double expected_experts(const ModelConfig& c, int rows) {
  if (rows <= 1) return c.num_experts_per_tok;
  const double E = c.num_experts, miss = 1.0 - double(c.num_experts_per_tok) / E;
  return E * (1.0 - std::pow(miss, rows));
}

namespace {

// The weights a step reads, the routed experts as `experts` of them a layer.
double step_weight_bytes(const ModelConfig& c, double experts) {
  double bytes = q_bytes(c.vocab_size, c.hidden_size);  // lm_head (the embedding rows are negligible)
  for (LayerKind kind : c.layer_types) bytes += layer_weight_bytes(c, kind, experts);
  return bytes;
}

// One sequence's state a step moves: the DeltaNet state read and written, the KV cache's `keys`
// rows read (the new ones written).
double sequence_state_bytes(const ModelConfig& c, int64_t keys) {
  const double state = double(c.linear_num_value_heads) * c.linear_key_head_dim * c.linear_value_head_dim * 4.0;
  const double kv_row = 2.0 * c.attention_kv_width() * 2.0;  // K and V, bf16
  return c.num_layers_of(LayerKind::full_attention) * kv_row * double(keys) +
         c.num_layers_of(LayerKind::linear_attention) * 2.0 * state;
}

}  // namespace

double decode_step_bytes(const ModelConfig& c, int64_t depth, int rows) {
  return step_weight_bytes(c, expected_experts(c, rows)) + sequence_state_bytes(c, depth + std::max(rows, 1));
}

double decode_bytes_per_token(const ModelConfig& c, int64_t depth) { return decode_step_bytes(c, depth, 1); }

double batch_step_bytes(const ModelConfig& c, int64_t depth, int sequences) {
  const int n = std::max(sequences, 1);
  return step_weight_bytes(c, expected_experts(c, n)) + double(n) * sequence_state_bytes(c, depth + 1);
}

double prefill_flops(const ModelConfig& c, int64_t length) {
  double per_token = 2.0 * c.vocab_size * c.hidden_size / double(length);  // logits of the last token only
  for (LayerKind kind : c.layer_types) per_token += 2.0 * layer_weight_params(c, kind);
  // Attention: QK^T and PV over on average length/2 keys, per query head.
  const double attention_layers = c.num_layers_of(LayerKind::full_attention);
  const double attention = attention_layers * 2.0 * 2.0 * c.num_attention_heads * c.head_dim * (double(length) / 2.0);
  // DeltaNet: state update and readout, ~4 * dk * dv per head per token.
  const double deltanet = c.num_layers_of(LayerKind::linear_attention) * 4.0 * c.linear_num_value_heads *
                          c.linear_key_head_dim * c.linear_value_head_dim;
  return (per_token + attention + deltanet) * double(length);
}

}  // namespace lily
