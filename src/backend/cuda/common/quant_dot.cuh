// quant_dot.cuh: the pieces the FP32 decode kernels (gemv/gemv.cu, moe_route.cu) share for dot products of
// affine-quantized rows (mlx layout, spec §5b) with fp32 vectors: streaming loads of 16-byte code chunks, codes to
// floats, one chunk's dot product, the matching x values, the shared-memory swizzle of a staged
// x, the sum over a lane group, and the host-side dispatch over bits and lanes per row. Internal to backend/cuda.
//
// A "chunk" is 16 bytes of codes (one uint4): 32 columns at 4 bits, 16 at 8 bits; per 64-column
// group the dot is scale * (sum q x) + bias * (sum x), so every x loader also returns sum x.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace lily::cuda::quant {

// 16 bytes of weight codes, streamed: read once per token, no point keeping them in L1.
__device__ __forceinline__ uint4 load_codes(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ float load_bf16(const uint16_t* p) { return __uint_as_float(uint32_t(__ldg(p)) << 16); }

// Byte k of v as a float: PRMT builds 0x4B0000bb = 2^23 + byte, one FADD removes 2^23.
template <int K>
__device__ __forceinline__ float byte_to_float(uint32_t v) {
  return __uint_as_float(__byte_perm(v, 0x4B000000u, 0x7540u + K)) - 8388608.f;
}

// sum_i q_i * x_i over the codes of one chunk (32 codes at 4 bits, 16 at 8 bits).
template <int BITS>
__device__ __forceinline__ float chunk_dot(const uint4& q, const float* x) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
  float a0 = 0.f, a1 = 0.f;
  if constexpr (BITS == 4) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Byte k holds columns 8i+2k (low nibble) and 8i+2k+1 (high nibble).
      const uint32_t lo = w[i] & 0x0F0F0F0Fu, hi = (w[i] >> 4) & 0x0F0F0F0Fu;
      a0 = fmaf(byte_to_float<0>(lo), x[8 * i + 0], a0);
      a1 = fmaf(byte_to_float<0>(hi), x[8 * i + 1], a1);
      a0 = fmaf(byte_to_float<1>(lo), x[8 * i + 2], a0);
      a1 = fmaf(byte_to_float<1>(hi), x[8 * i + 3], a1);
      a0 = fmaf(byte_to_float<2>(lo), x[8 * i + 4], a0);
      a1 = fmaf(byte_to_float<2>(hi), x[8 * i + 5], a1);
      a0 = fmaf(byte_to_float<3>(lo), x[8 * i + 6], a0);
      a1 = fmaf(byte_to_float<3>(hi), x[8 * i + 7], a1);
    }
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      a0 = fmaf(byte_to_float<0>(w[i]), x[4 * i + 0], a0);
      a1 = fmaf(byte_to_float<1>(w[i]), x[4 * i + 1], a1);
      a0 = fmaf(byte_to_float<2>(w[i]), x[4 * i + 2], a0);
      a1 = fmaf(byte_to_float<3>(w[i]), x[4 * i + 3], a1);
    }
  }
  return a0 + a1;
}

// The N x values of one chunk into registers (16-byte loads), and their sum. GLOBAL: through
// the read-only path (__ldg); otherwise plain loads (shared or any generic memory).
template <int N, bool GLOBAL = true>
__device__ __forceinline__ float load_x(const float* p, float (&x)[N]) {
  const float4* p4 = reinterpret_cast<const float4*>(p);
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 v = GLOBAL ? __ldg(p4 + i) : p4[i];
    x[4 * i] = v.x, x[4 * i + 1] = v.y, x[4 * i + 2] = v.z, x[4 * i + 3] = v.w;
    s0 += v.x + v.y;
    s1 += v.z + v.w;
  }
  return s0 + s1;
}

// Where float4 j of a row staged in shared memory lives: an XOR within aligned groups of 8, so
// that the lanes of a warp, each reading its own chunk, hit distinct banks (4- and 8-bit chunks
// alike). Read from global memory instead, the 32 lanes of a warp touch 32 different 128-byte
// lines per float4 load and L1 becomes the bottleneck.
__device__ __forceinline__ int swizzle(int j) { return j ^ ((j >> 3) & 7); }

// The N x values of chunk c of a swizzled staged row, and their sum.
template <int N>
__device__ __forceinline__ float load_x_staged(const float4* row, int c, float (&x)[N]) {
  float s0 = 0.f, s1 = 0.f;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 v = row[swizzle(c * (N / 4) + i)];
    x[4 * i] = v.x, x[4 * i + 1] = v.y, x[4 * i + 2] = v.z, x[4 * i + 3] = v.w;
    s0 += v.x + v.y;
    s1 += v.z + v.w;
  }
  return s0 + s1;
}

// Sum over aligned groups of W lanes; every lane of the warp must call it.
template <int W>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, o, W);
  return v;
}

// Lanes per row group: the largest of 32, 16, 8 that is at most the chunks per row.
inline int lanes_per_row(int chunks_per_row) { return chunks_per_row >= 32 ? 32 : chunks_per_row >= 16 ? 16 : 8; }

template <int V>
using Int = std::integral_constant<int, V>;

// f(Int<bits>, Int<lanes>) for bits 4 | 8 and lanes 32 | 16 | 8.
template <class F>
void dispatch_bits_lanes(int bits, int lanes, F&& f) {
  auto with_bits = [&](auto b) {
    if (lanes == 32) f(b, Int<32>{});
    else if (lanes == 16) f(b, Int<16>{});
    else f(b, Int<8>{});
  };
  if (bits == 4) with_bits(Int<4>{});
  else with_bits(Int<8>{});
}

}  // namespace lily::cuda::quant
