// gemm_w4_wgmma_layout.h: where each value of one 64-column K group lives in the wgmma W4A16
// GEMM (gemm_w4_wgmma.cu), as index functions the kernel and its CPU test share.
//
// The product is y^T = W x^T (C^T = A B): the 4-bit weight W [rows, K] (mlx layout, spec §5b)
// is wgmma's A operand, dequantized in registers; the activations x [tokens, K] are B, bf16 in
// shared memory. A warpgroup owns 64 weight rows; warp w of it rows 16w .. 16w + 15, lane
// 4g + t the rows 16w + g and 16w + g + 8. Per k16 step s (4 a group) its A fragment is
// mma.sync's (mma.cuh):
//   a0 = (row g, cols 2t, 2t+1)  a1 = (row g+8, same)  a2 = (row g, cols 2t+8, 2t+9)  a3 = (g+8, ..)
// in *fragment columns* c = 16 s + j. The sum over K does not care which k a fragment column
// stands for, as long as A and B agree; we choose the permutation that lets each thread read
// its weights straight from mlx's words:
//   thread t of a row reads words 2t and 2t+1 of the group (k = 16t .. 16t + 15, 8 bytes);
//   register a(2h + r) of step s holds, for word 2t + h, nibbles s (low half) and s + 4 (high
//   half): one shift and one LOP3 (w >> 4s) & 0x000F000F | 0x43004300 = bf16(128 + q) pairs.
// So fragment column c = 16 s + 8 h + 2 t + e stands for k = 16 t + 8 h + 4 e + s, and the
// activations are stored in that order (x_to_bf16_permuted): B column c holds x[k(c)].
//
// B tile in shared memory, K-major with the 128-byte swizzle wgmma reads (one 64-column group of
// a token is 128 bytes; 16-byte chunk i of row n sits at chunk i ^ (n % 8)); 8-row atoms of
// 1024 bytes one after the other (the descriptor's stride byte offset).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#include "backend/cuda/common/mma.cuh"  // ptx::pack_bf16
#endif

#if defined(__CUDACC__)
#define LILY_HD __host__ __device__ __forceinline__
#else
#define LILY_HD inline
#endif

namespace lily::cuda::w4_wgmma {

constexpr int kGroup = 64;         // columns of a K group (= the quant group)
constexpr int kStepsPerGroup = 4;  // k16 wgmma steps a group
constexpr int kRowBytes = 128;     // one token's group in the B tile (64 bf16)

// The k (0..63 within the group) that fragment column c (0..63) stands for.
LILY_HD constexpr int k_of_column(int c) {
  const int s = c / 16, h = (c / 8) % 2, t = (c % 8) / 2, e = c % 2;
  return 16 * t + 8 * h + 4 * e + s;
}

// Its inverse: the fragment column of k.
LILY_HD constexpr int column_of_k(int k) {
  const int t = k / 16, h = (k / 8) % 2, e = (k / 4) % 2, s = k % 4;
  return 16 * s + 8 * h + 2 * t + e;
}

// Byte offset of fragment column c (0..63) of token row n in a swizzled B tile.
LILY_HD constexpr uint32_t b_tile_offset(int n, int c) {
  const int chunk = c / 8, in_chunk = c % 8;
  return uint32_t(n) * kRowBytes + uint32_t((chunk ^ (n % 8)) * 16 + in_chunk * 2);
}

// The two 4-bit codes (low half: nibble s, high half: nibble s + 4) of word w as a bf16x2 of
// 128 + q each (0x4300 is bf16 128.0; its 7 mantissa bits take q < 128 exactly).
LILY_HD constexpr uint32_t code_pair(uint32_t word, int s) { return ((word >> (4 * s)) & 0x000F000Fu) | 0x43004300u; }

// The A-fragment register (0..3 of step s) that holds row r (0: g, 1: g + 8) and word half h.
LILY_HD constexpr int a_register(int r, int h) { return 2 * h + r; }

#if defined(__CUDACC__)
// Fragment columns c0 .. c0 + 7 (c0 a multiple of 8) of one K group in bf16, from the group's 64
// values in k order: one 16-byte piece of x_to_bf16_permuted's layout.
__device__ __forceinline__ uint4 permuted_piece(const float* group, int c0) {
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) w[j] = ptx::pack_bf16(group[k_of_column(c0 + 2 * j)], group[k_of_column(c0 + 2 * j + 1)]);
  return make_uint4(w[0], w[1], w[2], w[3]);
}
#endif

}  // namespace lily::cuda::w4_wgmma
