// deltanet.h: the parameters of a Gated DeltaNet layer's core on the GPU (spec §2.6, §3):
// everything between the input projections and out_proj. The two paths:
// deltanet/deltanet_decode.h (one token), deltanet/deltanet_prefill.h (T tokens).
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// Where a few-token core keeps the state after each of its last rows (a speculative verify's
// rewind, SequenceState::keep_row_states): after token t >= first, the conv state to conv +
// (t - first) * (K-1) * conv_dim and the recurrent state to ssm + (t - first) * Hv * 128 * 128, in
// the live states' layouts. Only the decode kernel (deltanet_decode.h, the rows form) keeps them.
struct DeltaNetKept {
  float* conv = nullptr;  // null: none kept
  float* ssm = nullptr;
  int first = 0;
};

struct DeltaNetParams {
  int T = 1;                           // tokens in this block
  int num_key_heads = 16;              // Hk
  int num_value_heads = 32;            // Hv (v-head n reads q/k head n / (Hv/Hk))
  int head_dim = 128;                  // dk = dv = 128
  int conv_kernel = 4;                 // K
  float eps = 1e-6f;                   // the gated RMSNorm's epsilon
  const float* conv_weight = nullptr;  // [conv_dim, K] fp32, w[c, K-1] multiplies the current token
  const float* A_log = nullptr;        // [Hv]
  const float* dt_bias = nullptr;      // [Hv]
  const float* norm_weight = nullptr;  // [128] gated RMSNorm weight
  DeltaNetKept kept;                   // the rows' states kept (the decode kernel only)
  int conv_dim() const { return 2 * num_key_heads * head_dim + num_value_heads * head_dim; }
};

// Throws lily::Error naming what the kernels do not implement (head_dim other than 128, a conv
// kernel other than 4, more than 2 v-heads per key head, ...). Both paths call it; so does the
// kernel plan, at load.
void check_deltanet_params(const DeltaNetParams& p);

}  // namespace lily::cuda
