// ops.h: the CPU backend's building blocks, fp32 activations and accumulation throughout.
//
// This is the readable reference that every faster backend is tested against: plain loops
// that follow the spec line by line (spec sections in the comments), threaded with
// parallel_for over independent rows, heads or experts. Tensors are row-major float arrays
// with their shape in a comment; T is the number of tokens in the current block.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace lily::cpu {

// y[T, W.rows] = x[T, W.cols] @ W^T   (an nn.Linear without bias; W dequantized row by row)
void linear(const Matrix& W, const float* x, int64_t T, float* y);

// Zero-centred RMSNorm with the effective gain (spec §2.2.1), over rows of n values:
//   y = x * rsqrt(mean(x^2) + eps) * gain
void rms_norm(const float* x, const float* gain, int64_t rows, int64_t n, float eps, float* y);

// Gated RMSNorm of the DeltaNet output (spec §2.2.2), per row of n values:
//   y = (x * rsqrt(mean(x^2) + eps) * weight) * silu(z)
void gated_rms_norm(const float* x, const float* z, const float* weight, int64_t rows, int64_t n, float eps, float* y);

// x * rsqrt(sum(x^2) + 1e-6) * scale, over n values (HF/FLA l2norm of q and k heads, spec §2.6).
void l2_normalize(float* x, int64_t n, float scale);

// Rotary embedding, NEOX rotate-half on the first `rotary_dim` of each head (spec §2.5):
//   pairs (j, j + rotary_dim/2); angle = position * theta^(-2j/rotary_dim)
// x: [T, heads, head_dim], positions first_position + t.
void apply_rope(float* x, int64_t T, int64_t heads, int64_t head_dim, int64_t rotary_dim, float theta,
                int64_t first_position);

inline float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
inline float silu(float x) { return x * sigmoid(x); }
// softplus with torch's threshold: x when x > 20.
inline float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

// ---- Caches of one sequence (spec §4) ----------------------------------------------------

struct AttentionCache {
  std::vector<float> k;  // [length, nkv, head_dim]  post-norm, post-RoPE
  std::vector<float> v;  // [length, nkv, head_dim]
};

struct DeltaNetCache {
  std::vector<float> conv;  // [K-1, conv_dim]  the last K-1 pre-conv inputs, oldest first
  std::vector<float> ssm;   // [Hv, dk, dv]     recurrent state S (HF order, dk-major)
};

// Where a Gated DeltaNet layer keeps its states after rows [first_row, first_row + rows) of its
// block, for SequenceState::rewind (buffers of the sequence state, sequence_state.h; rows 0: none):
//   conv  [rows + K - 2, C]   rows first_row + 1 .. first_row + rows + K - 2 of X = [conv state ;
//                             mixed]: the conv state after row first_row + j is its rows j .. j + K - 2
//   ssm   [rows, Hv, dk, dv]  the SSM state after row first_row + j
struct DeltaNetKept {
  float* conv = nullptr;
  float* ssm = nullptr;
  int64_t first_row = 0, rows = 0;
};

// ---- Layers ------------------------------------------------------------------------------

// Gated full attention (spec §2.4). x: [T, H] (normed) -> out: [T, H]. Appends T rows to cache.
void gated_attention(const AttentionWeights& w, const ModelConfig& c, AttentionCache& cache, int64_t first_position,
                     const float* x, int64_t T, float* out);

// Gated DeltaNet (spec §2.6). x: [T, H] (normed) -> out: [T, H]. Advances conv and SSM state.
// With kept.rows > 0 it also writes the states after those rows (the delta rule then runs row by
// row from kept.first_row, to have them).
void gated_deltanet(const DeltaNetWeights& w, const ModelConfig& c, DeltaNetCache& cache, const float* x, int64_t T,
                    float* out, const DeltaNetKept& kept = {});

// The routing of spec §2.7 for one token: softmax over the E router logits, the k largest (ties to
// the lower expert id), renormalised over the k.   experts, weights: [k]
void route_top_k(const float* logits, int64_t E, int64_t k, int* experts, float* weights);

// Sparse MoE with the gated shared expert (spec §2.7). x: [T, H] (normed) -> out: [T, H].
void sparse_moe(const MoeWeights& w, const ModelConfig& c, const float* x, int64_t T, float* out);

// The cache a decoder layer reads and appends to: its mixer's (the other is null).
struct LayerCache {
  AttentionCache* attention = nullptr;  // a full-attention layer
  DeltaNetCache* deltanet = nullptr;    // a Gated DeltaNet layer
  DeltaNetKept kept;                    // the DeltaNet layer's states to keep (none by default)
};

// One decoder layer (spec §2.3) on the residual stream h: [T, H], in place, at positions
// first_position + t:
//   h += mixer(RMSNorm_zc(h; input_layernorm));  h += sparse_moe(RMSNorm_zc(h; post_attention_layernorm))
void decoder_layer(const LayerWeights& layer, const ModelConfig& c, const LayerCache& cache, int64_t first_position,
                   float* h, int64_t T);

// ---- The MTP head (spec §6, mtp.cpp) ------------------------------------------------------

// Its input for T rows: u[T, H] = concat(e, hh) @ fc^T, embedding first, then hidden, with
//   e = RMSNorm_zc(embed_tokens[tokens[t]]; pre_fc_norm_embedding)
//   hh = RMSNorm_zc(hidden[t]; pre_fc_norm_hidden)      hidden: [T, H], post final norm
void mtp_input(const MtpWeights& w, const Matrix& embed_tokens, const ModelConfig& c, const float* hidden,
               const int32_t* tokens, int64_t T, float* u);

// The whole block for T rows at positions first_position + t (the cache holds exactly
// first_position rows; T are appended): m[T, H] = RMSNorm_zc(decoder_layer(mtp_input); mtp.norm).
// The head's logits are m @ lm_head^T; m is also the hidden input of a chained next step.
void mtp_block(const MtpWeights& w, const Matrix& embed_tokens, const ModelConfig& c, AttentionCache& cache,
               int64_t first_position, const float* hidden, const int32_t* tokens, int64_t T, float* m);

// ---- The gated delta rule (spec §3), one value head ------------------------------------

struct DeltaRuleInputs {
  const float* q;     // [T, q_stride] row t at q + t*q_stride; l2-normalised and scaled by 1/sqrt(dk)
  const float* k;     // [T, k_stride] l2-normalised
  const float* v;     // [T, v_stride]
  const float* g;     // [T, g_stride] log decay (<= 0)
  const float* beta;  // [T, g_stride]
  int64_t q_stride, k_stride, v_stride, g_stride;
  int64_t T, dk, dv;
};

// Recurrent form (spec §3.1), token by token: S [dk, dv] updated in place; o: [T, o_stride].
void delta_rule_recurrent(const DeltaRuleInputs& in, float* S, float* o, int64_t o_stride);

// Chunked form (spec §3.2), chunks of `chunk` tokens; same results up to rounding.
void delta_rule_chunked(const DeltaRuleInputs& in, float* S, float* o, int64_t o_stride, int64_t chunk = 64);

}  // namespace lily::cpu
