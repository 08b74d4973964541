// deltanet_decode.h: the core of a Gated DeltaNet layer for a few consecutive tokens of one
// sequence (T = 1 .. 16: a decode step, a short pass) in one launch (deltanet_decode.cu).
#pragma once

#include "backend/cuda/common/row_tables.h"
#include "backend/cuda/deltanet/deltanet.h"

namespace lily::cuda {

constexpr int kDeltaNetDecodeMaxT = 16;

// mixed: [T, conv_dim] pre-conv q|k|v (in_proj_qkv output), z: [T, Hv*128], b, a: [T, Hv]
// conv_state: [K-1, conv_dim] fp32 (oldest first), updated;  ssm_state: [Hv, 128, 128] fp32
// (dk-major, as the CPU backend), updated;  y: [T, Hv*128] = gated_rms_norm(o, z), ready for out_proj.
//   u = silu(conv(mixed)); q = l2norm(q)/sqrt(128); k = l2norm(k); beta = sigmoid(b);
//   g = -exp(A_log) * softplus(a + dt_bias); o = delta rule; y = rmsnorm(o) * w * silu(z)
// 1 <= p.T <= kDeltaNetDecodeMaxT; the tokens in order, each after the one before.
void gated_deltanet_decode(const DeltaNetParams& p, const float* mixed, const float* z, const float* b, const float* a,
                           float* conv_state, float* ssm_state, float* y, cudaStream_t stream);

// A batch step's DeltaNet core: one token of each of N sequences (N <= kMaxBatchRows, p.T = 1),
// row r with its own conv and recurrent state from rows' tables: mixed [N, conv_dim], z, y
// [N, Hv*128], b, a [N, Hv], as gated_deltanet_decode row by row, in one launch (grid row r).
void gated_deltanet_decode_rows(const DeltaNetParams& p, const DeltaNetRows& rows, int N, const float* mixed,
                                const float* z, const float* b, const float* a, float* y, cudaStream_t stream);

}  // namespace lily::cuda
