// gemm_w4_wgmma.h: y = x @ W^T for 4-bit affine W on Hopper's wgmma (issue 19), many input rows
// (prefill). The products of gemm_q4.h with the same numerics, on sm_90a; gemm_w4_wgmma.cu has the
// design, gemm_w4_wgmma_layout.h the order of K it uses.
//
// The activations come in as bf16 in the kernel's K order (x_to_bf16_permuted): one conversion of
// x serves every product that reads it (the experts' gate and up, the fused input projections).
#pragma once

#include "backend/cuda/common/gpu_types.h"
#include "backend/cuda/common/rows_output.h"
#include "backend/cuda/gemm/gemm_q4.h"  // GroupedTiles

namespace lily::cuda {

// Whether the wgmma kernels take W: 4 bits, group 64, cols a multiple of 64 (sm_90a only: the
// caller checks the device).
bool gemm_w4_wgmma_supports(const QMatrix& W);

// xp[t, 64 g + c] = bf16(x[t, 64 g + k(c)])  (k(c): w4_wgmma::k_of_column)   x: [T, K] fp32, xp: [T, K]
void x_to_bf16_permuted(const float* x, bf16* xp, int T, int K, cudaStream_t stream);

// x = RMSNorm(h; gain) as rms_norm computes it, into x [T, K] fp32 when x is not null, and its bf16
// in x_to_bf16_permuted's order into xp [T, K]: the norm before a wgmma product in one pass.
void rms_norm_bf16_permuted(const float* h, const float* gain, float eps, int T, int K, float* x, bf16* xp,
                            cudaStream_t stream);

// y[t, n] = sum_c W[n, c] * x[t, c]     xp: x_to_bf16_permuted's [T, W.cols], y: [T, W.rows] fp32
void gemm_w4_wgmma(const QMatrix& W, const bf16* xp, float* y, int T, cudaStream_t stream);

// The same for a fused matrix ([qkv; z; b; a], [q; k; v]), each part of the rows to its own buffer.
void gemm_w4_wgmma(const QMatrix& W, const bf16* xp, const RowsOutput& y, int T, cudaStream_t stream);

// y[t, n] += sum_c W[n, c] * x[t, c]
void gemm_w4_wgmma_accumulate(const QMatrix& W, const bf16* xp, float* y, int T, cudaStream_t stream);

// y[t, i] = silu(G x_t)_i * (U x_t)_i    G, U: [I, K]; y: [T, I]
void gemm_w4_wgmma_swiglu(const QMatrix& G, const QMatrix& U, const bf16* xp, float* y, int T, cudaStream_t stream);

// The grouped (MoE) forms over gemm_q4's tile map (tile_rows up to 128: tiles of more than 64
// positions run the 128-token form; the gather indexes rows of xp). G, U, W: stacks [E, rows, K]; y: [positions, rows].
void gemm_w4_wgmma_grouped_swiglu(const QMatrix& G, const QMatrix& U, const bf16* xp, const GroupedTiles& tiles,
                                  float* y, cudaStream_t stream);
void gemm_w4_wgmma_grouped(const QMatrix& W, const bf16* xp, const GroupedTiles& tiles, float* y, cudaStream_t stream);

}  // namespace lily::cuda
