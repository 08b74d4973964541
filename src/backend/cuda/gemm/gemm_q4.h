// gemm_q4.h: y = x @ W^T on the tensor cores for affine-quantized W (4-bit, or 8-bit for the
// router), many input rows (prefill). See gemm_q4.cu for the kernel design.
//
// Numerics (every function here): x is rounded to bf16 and each weight w = scale*q + bias to
// bf16 (one rounding) before the multiply; products are summed in fp32. Against an fp32
// reference expect |err| ~ 1e-2 of max |y| at worst (measured bound in tests/cuda/test_gemm_q4.cu).
#pragma once

#include "backend/cuda/common/gpu_types.h"
#include "backend/cuda/gemm/split_k.h"

namespace lily::cuda {

// Whether gemm_q4 and gemm_q4_accumulate take W (4 or 8 bits, group 64, cols a multiple of 64).
bool gemm_q4_supports(const QMatrix& W);

// The dense forms take an optional split-K workspace (split_k.h): with it, a product whose grid
// would not cover the SMs (a pass of a few tokens) splits K over more blocks; without it, or
// with a grid that covers them, one block per output tile sums all of K. Same bits either way
// for a given workspace choice (the split sum has a fixed order).

// y[t, n] = sum_c W[n, c] * x[t, c]      x: [T, W.cols] fp32 (16-byte aligned), y: [T, W.rows] fp32
void gemm_q4(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream, const SplitK* split = nullptr);

// y[t, n] += sum_c W[n, c] * x[t, c]     (the residual add fused into the projection)
void gemm_q4_accumulate(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream,
                        const SplitK* split = nullptr);

// y[t, i] = silu(G x_t)_i * (U x_t)_i    G, U: [I, K] of one shape and bit width; y: [T, I]
void gemm_q4_swiglu(const QMatrix& G, const QMatrix& U, const float* x, float* y, int T, cudaStream_t stream,
                    const SplitK* split = nullptr);

// The grouped (MoE) form. Rows of the product live in expert-sorted order ("positions"); a
// tile map built on the device (moe_routing.cu) lists fixed-size tiles of positions that all
// use one expert. The grid is sized for max_tiles; blocks past *num_tiles exit, so the host
// never waits for the map.
struct GroupedTiles {
  const int32_t* tiles = nullptr;      // [max_tiles, 4] device: expert, first position, end position, unused
  const int32_t* num_tiles = nullptr;  // [1] device
  int max_tiles = 0;
  int tile_rows = 0;                // positions per tile (16, 32 or 64): the M tile of the kernel
  const int32_t* gather = nullptr;  // [positions] device: position p reads x row gather[p] / gather_div;
  int gather_div = 1;               //   nullptr: position p reads x row p
};

// y[p, i] = silu(G_e x_r)_i * (U_e x_r)_i for every position p of every tile (e its expert,
// r its x row).  G, U: stacks [E, I, K];  y: [positions, I].
void gemm_q4_grouped_swiglu(const QMatrix& G, const QMatrix& U, const float* x, const GroupedTiles& tiles, float* y,
                            cudaStream_t stream);

// y[p, n] = sum_c W_e[n, c] * x_r[c].  W: stack [E, N, K];  y: [positions, N].
void gemm_q4_grouped(const QMatrix& W, const float* x, const GroupedTiles& tiles, float* y, cudaStream_t stream);

// The M tile (16, 32 or 64 rows) for a product whose groups have about `rows` rows each: one
// size above the rows (measured: padding costs less than re-dequantizing the weights), 64 from
// 24 rows on.
int gemm_q4_tile_rows(double rows);

}  // namespace lily::cuda
