// gemv_rows.h: the decode projections for a few rows at once (T = 1 .. 16): a pass of a few
// tokens, and later a decode step of several rows (issue 16). The weights are read once for all
// rows, as in the one-row GEMVs (gemv.h), and the rows ride in the tensor-core tiles' 8 columns:
//   rms_norm_gemv_rows   y[t] = RMSNorm(x[t]; gain) @ W^T    the input projections (fused)
//   gemv_rows_accumulate y[t] += x[t] @ W^T                  out_proj, o_proj (residual add)
//   gemv_rows            y[t] = x[t] @ W^T                   the shared expert's down
//   gemv_rows_swiglu     y[t] = silu(G x[t]) * (U x[t])      the shared expert's gate/up
// The last two also take a tile map over a stack of experts (moe_grouped.h's, tiles of at most
// 16 positions): each tile's rows through its expert, the routed experts of a short pass.
// Numerics are the prefill GEMM's (gemm_q4.h): x and the dequantized weights in bf16, fp32 sums.
// The output of a fused matrix ([qkv; z; b; a], [q; k; v]) goes to its parts' buffers directly.
#pragma once

#include "backend/cuda/common/gpu_types.h"
#include "backend/cuda/common/rows_output.h"

namespace lily::cuda {

constexpr int kGemvRowsMaxT = 16;

// Whether the kernels take W: 4-bit, group 64, cols a multiple of 64 up to 4096 (up to 2048 in
// the RMSNorm form), arrays 16-byte aligned. The SwiGLU form: G and U alike, cols up to 2048.
bool gemv_rows_supports(const QMatrix& W, bool rms_norm);
bool gemv_rows_swiglu_supports(const QMatrix& G, const QMatrix& U);

// A tile map over a stack of experts (device arrays, as moe_plan builds them with tiles of 16):
// tile j < *num_tiles = {expert e, first position, end position, -}; position q's input is row
// gather[q] / gather_div of x (gather null: row q) and its output row q of y.
struct RowsGroups {
  const int32_t* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  int max_tiles = 0;
  const int32_t* gather = nullptr;
  int gather_div = 1;
  // One more group: rows [0, extra_T) of extra_x through extra_w (and extra_u: SwiGLU) into
  // extra_y [extra_T, rows]: the shared expert beside the routed ones, in the same launch where
  // the kernel takes it (a matrix of the stack's shape), else in a launch of its own.
  const QMatrix* extra_w = nullptr;
  const QMatrix* extra_u = nullptr;
  const float* extra_x = nullptr;
  float* extra_y = nullptr;
  int extra_T = 0;
};

// y[t] = RMSNorm(x[t]) @ W^T for t < T,  RMSNorm(v) = v * rsqrt(mean(v^2) + eps) * gain
// x: [T, W.cols] fp32, 16-byte aligned; gain: [W.cols]; 1 <= T <= kGemvRowsMaxT.
void rms_norm_gemv_rows(const QMatrix& W, const float* x, int T, const float* gain, float eps, const RowsOutput& y,
                        cudaStream_t stream);

// y[t] += x[t] @ W^T for t < T.   x: [T, W.cols] fp32, 16-byte aligned;  y: [T, W.rows].
void gemv_rows_accumulate(const QMatrix& W, const float* x, int T, float* y, cudaStream_t stream);

// y[t] = x[t] @ W^T for t < T (groups null), or for every position of every tile with W_e
// (groups: W a stack; T the most positions a tile has, at most 16), and the groups' extra.
// y: [positions, W.rows].
void gemv_rows(const QMatrix& W, const float* x, int T, const RowsGroups* groups, float* y, cudaStream_t stream);

// act[t] = silu(G x[t]) * (U x[t]), the same way.  act: [positions, G.rows].
void gemv_rows_swiglu(const QMatrix& G, const QMatrix& U, const float* x, int T, const RowsGroups* groups, float* act,
                      cudaStream_t stream);

}  // namespace lily::cuda
