// shared_rows_dot.cuh: dot products of 4-bit rows held in SHARED memory (copied there by bulk
// copies, e.g. before a PDL wait) with one staged input row, on the tensor cores (quant_mma.cuh's
// math). Shared by gemv_prefetch.cu (a block's contiguous rows of a projection) and
// moe_gate_up_staged.cu (16 rows of an expert's G and U). Internal to backend/cuda.
//
//   unit (tile, pair): 16 rows x 256 columns;  unit_sum[u][r] = sum over the pair of W[r, c] x[c]
// Layout:   codes_s: rows of cpr 16-byte chunks; scales_s, biases_s: rows of gpr bf16, as in
//           global memory (mlx layout). Shared-memory banks: rows are a multiple of 128 bytes
//           apart, so lanes g and g + 1 (one quarter-warp of a 16-byte load) would hit the same
//           banks; odd g load the two blocks of a pair in the opposite order.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/quant_mma.cuh"

namespace lily::cuda::quant_mma {

__device__ __forceinline__ float bf16_bits_to_float(uint16_t v) { return __uint_as_float(uint32_t(v) << 16); }

// This lane's share of unit u (tile u / pairs, pair u % pairs) from shared memory into t.
__device__ __forceinline__ void load_shared_unit(const uint4* codes_s, const uint16_t* scales_s,
                                                 const uint16_t* biases_s, int u, int cpr, int gpr, int pairs,
                                                 TileLoad<1>& t) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int flip = g & 1;  // odd rows load the pair's blocks in the opposite order (banks)
  const int tile = u / pairs, pair = u % pairs;
  const int row_g = 16 * tile + g, row_g8 = row_g + 8;  // local rows
  const int c0 = 4 * (2 * pair + flip) + t4, c1 = 4 * (2 * pair + (flip ^ 1)) + t4;
  const uint4 a0 = codes_s[row_g * cpr + c0], a1 = codes_s[row_g * cpr + c1];
  const uint4 b0 = codes_s[row_g8 * cpr + c0], b1 = codes_s[row_g8 * cpr + c1];
  t.q[0][0][0] = flip ? a1 : a0, t.q[0][1][0] = flip ? a0 : a1;
  t.q[0][0][1] = flip ? b1 : b0, t.q[0][1][1] = flip ? b0 : b1;
  const int grp = 4 * pair + t4;
  t.scale[0][0] = bf16_bits_to_float(scales_s[row_g * gpr + grp]);
  t.scale[0][1] = bf16_bits_to_float(scales_s[row_g8 * gpr + grp]);
  t.bias[0][0] = bf16_bits_to_float(biases_s[row_g * gpr + grp]);
  t.bias[0][1] = bf16_bits_to_float(biases_s[row_g8 * gpr + grp]);
}

// The quad's row sums of one unit into unit_sum[u] (every lane calls it).
__device__ __forceinline__ void store_unit_sum(float (*unit_sum)[16], int u, float y_g, float y_g8) {
  const int lane = threadIdx.x % 32, g = lane / 4;
  y_g = quad_sum(y_g);
  y_g8 = quad_sum(y_g8);
  if (lane % 4 == 0) unit_sum[u][g] = y_g, unit_sum[u][g + 8] = y_g8;
}

// Block-wide (every thread calls it; the caller syncs after): the (tile, pair) units of `tiles`
// tiles of rows held in shared memory, each unit's 16 row sums into unit_sum[u] (u = tile *
// pairs + pair). frag, gsum, zero: the staged input row (stage_input_row / stage_x_fragments).
template <int WARPS>
__device__ __forceinline__ void shared_rows_dot(const uint4* codes_s, const uint16_t* scales_s,
                                                const uint16_t* biases_s, int tiles, int cpr, int gpr, int pairs,
                                                const uint4* frag, const float* gsum, const uint4* zero,
                                                float (*unit_sum)[16]) {
  constexpr int kWarps = WARPS;
  const int warp = threadIdx.x / 32;
  const int units = tiles * pairs;
  if constexpr (kWarps == 8) {
    // Two units at a time (independent mma chains for the scheduler to interleave).
    for (int u = warp; u < units; u += 2 * kWarps) {
      const int v = u + kWarps;
      const bool two = v < units;
      TileLoad<1> tu, tv;
      load_shared_unit(codes_s, scales_s, biases_s, u, cpr, gpr, pairs, tu);
      load_shared_unit(codes_s, scales_s, biases_s, two ? v : u, cpr, gpr, pairs, tv);
      float yu_g = 0.f, yu_g8 = 0.f, yv_g = 0.f, yv_g8 = 0.f;
      dot_tile<1>(tu, frag, gsum, zero, cpr, u % pairs, yu_g, yu_g8);
      dot_tile<1>(tv, frag, gsum, zero, cpr, (two ? v : u) % pairs, yv_g, yv_g8);
      store_unit_sum(unit_sum, u, yu_g, yu_g8);
      if (two) store_unit_sum(unit_sum, v, yv_g, yv_g8);
    }
  } else {  // 16 warps: one unit at a time (64 registers)
    for (int u = warp; u < units; u += kWarps) {
      TileLoad<1> tu;
      load_shared_unit(codes_s, scales_s, biases_s, u, cpr, gpr, pairs, tu);
      float y_g = 0.f, y_g8 = 0.f;
      dot_tile<1>(tu, frag, gsum, zero, cpr, u % pairs, y_g, y_g8);
      store_unit_sum(unit_sum, u, y_g, y_g8);
    }
  }
}

// Block-wide: y[r] = the sum of row r's units, in pair order, for rows [0, rows).
__device__ __forceinline__ void write_row_sums(const float (*unit_sum)[16], int pairs, int rows, float* y) {
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    float sum = 0.f;
    for (int j = 0; j < pairs; ++j) sum += unit_sum[(r / 16) * pairs + j][r % 16];
    y[r] = sum;
  }
}

}  // namespace lily::cuda::quant_mma
