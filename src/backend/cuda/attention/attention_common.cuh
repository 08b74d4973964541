// attention_common.cuh: what the attention kernels share (attention/attention_prefill.cu,
// attention/attention_decode.cu): the argument struct, the constants of the head layout, and the
// per-warp helpers (query/key preparation, cache append, reductions). Internal to backend/cuda;
// the formulas are in attention_prefill.cu's header (spec §2.4, §2.5).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/attention/attention.h"

namespace lily::cuda::attention_detail {

constexpr int kHeadDim = 256;
constexpr int kGroup = 8;      // query-head slots per KV head
constexpr int kThreads = 256;  // 8 warps; one thread per dim in the V pass
constexpr int kTile = 64;      // keys per tile, 8 per warp
constexpr int kRowsPerWarp = kTile / (kThreads / 32);
// Decode: the grid has min(kMaxSplits, capacity / kSplitMinRows) splits per KV head (fixed by
// the capacity, so the launch can be captured in a graph); at most SMs / nkv of them get keys,
// each at least kSplitMinRows (one 64-key tile; attention_decode.cu).
constexpr int kMaxSplits = 512;
constexpr int kSplitMinRows = 64;
constexpr float kLog2e = 1.4426950408889634f;

struct AttnArgs {
  int T, nq, nkv, group, rotary_dim, capacity;
  float eps, rope_theta;
  const float* q_norm;      // [256] effective gain
  const float* k_norm;      // [256]
  const int32_t* position;  // device: position of token 0
  const float* qg;          // [T, nq, 512]
  const float* k;           // [T, nkv, 256]
  const float* v;           // [T, nkv, 256]
  uint16_t* k_cache;        // [capacity, nkv, 256] bf16 bits
  uint16_t* v_cache;
  float* out;       // [T, nq, 256]
  float* part_acc;  // decode: [nkv, S, 8, 256] unnormalised accumulators
  float* part_ml;   // decode: [nkv, S, 8, 2]  (max, sum) in log2 units
};

// A batch step's rows (one token of each of N sequences, batch_rows.h): row r's position,
// capacity and caches, entry r of each table. Only the rows kernels take them: the one-row
// kernels' arguments are AttnArgs alone.
struct AttnRowTables {
  int32_t* const* position;  // [N]
  const int32_t* capacity;   // [N]
  uint16_t* const* k_cache;  // [N]
  uint16_t* const* v_cache;  // [N]
};

// The arguments of row r of a rows launch: its state from the tables, its qg, k, v, out and
// partials at r times their size. S: the splits a row's partials hold.
__device__ __forceinline__ AttnArgs row_args(const AttnArgs& p, const AttnRowTables& rows, int r, int S) {
  AttnArgs a = p;
  a.position = rows.position[r];
  a.capacity = rows.capacity[r];
  a.k_cache = rows.k_cache[r];
  a.v_cache = rows.v_cache[r];
  a.qg = p.qg + size_t(r) * p.nq * 2 * kHeadDim;
  a.k = p.k + size_t(r) * p.nkv * kHeadDim;
  a.v = p.v + size_t(r) * p.nkv * kHeadDim;
  a.out = p.out + size_t(r) * p.nq * kHeadDim;
  a.part_acc = p.part_acc + size_t(r) * p.nkv * S * kGroup * kHeadDim;
  a.part_ml = p.part_ml + size_t(r) * p.nkv * S * kGroup * 2;
  return a;
}

inline AttnArgs attn_args(const AttentionParams& p, const float* qg, const float* k, const float* v, bf16* k_cache,
                          bf16* v_cache, float* out) {
  return AttnArgs{p.T,
                  p.num_heads,
                  p.num_kv_heads,
                  p.num_heads / p.num_kv_heads,
                  p.rotary_dim,
                  p.capacity,
                  p.eps,
                  p.rope_theta,
                  p.q_norm,
                  p.k_norm,
                  p.position,
                  qg,
                  k,
                  v,
                  reinterpret_cast<uint16_t*>(k_cache),
                  reinterpret_cast<uint16_t*>(v_cache),
                  out,
                  nullptr,
                  nullptr};
}

__device__ __forceinline__ float bf16_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
// Round to nearest even, as base/bf16.h (to_bf16) does on the host.
__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One warp: dst = RoPE(RMSNorm_zc(src; gain)) for one 256-value head at `position` (spec §2.2.1,
// §2.5); dst is shared memory. Lane l holds dims 8l..8l+7 for the norm.
inline __device__ void norm_rope_head(const AttnArgs& p, const float* src, const float* gain, int position,
                                      float* dst) {
  const int lane = threadIdx.x % 32;
  const float4 x0 = reinterpret_cast<const float4*>(src)[2 * lane];
  const float4 x1 = reinterpret_cast<const float4*>(src)[2 * lane + 1];
  const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += x[i] * x[i];
  ss = warp_sum(ss);
  const float inv = 1.f / sqrtf(ss / float(kHeadDim) + p.eps);
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[8 * lane + i] = x[i] * inv * gain[8 * lane + i];
  __syncwarp();
  const int half = p.rotary_dim / 2;
  for (int j = lane; j < half; j += 32) {
    // inv_freq_j = 1 / theta^(2j / rotary_dim) and the angle in fp32, as HF; full-range sincosf.
    const float inv_freq = 1.f / powf(p.rope_theta, float(2 * j) / float(p.rotary_dim));
    float s, c;
    sincosf(float(position) * inv_freq, &s, &c);
    const float a = dst[j], b = dst[j + half];
    dst[j] = a * c - b * s;
    dst[j + half] = b * c + a * s;
  }
  __syncwarp();
}

// One warp writes a prepared K row (shared) and copies the V row into the caches at `row`.
inline __device__ void store_kv_row(const AttnArgs& p, const float* k_row, const float* v_src, int row, int kv) {
  const int lane = threadIdx.x % 32;
  const size_t off = (size_t(row) * p.nkv + kv) * kHeadDim + 8 * lane;
  uint32_t kw[4], vw[4];  // 8 bf16 each, low half first
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int d = 8 * lane + 2 * e;
    kw[e] = uint32_t(float_to_bf16(k_row[d])) | uint32_t(float_to_bf16(k_row[d + 1])) << 16;
    vw[e] = uint32_t(float_to_bf16(v_src[d])) | uint32_t(float_to_bf16(v_src[d + 1])) << 16;
  }
  *reinterpret_cast<uint4*>(p.k_cache + off) = make_uint4(kw[0], kw[1], kw[2], kw[3]);
  *reinterpret_cast<uint4*>(p.v_cache + off) = make_uint4(vw[0], vw[1], vw[2], vw[3]);
}

// v[s]: this lane's partial dots for the 8 head slots. Returns the sum over the warp for slot
// (lane >> 2) & 7: each step halves the values a lane keeps and doubles the lanes summed.
__device__ __forceinline__ float reduce8(const float (&v)[8]) {
  const int lane = threadIdx.x % 32;
  const bool h16 = lane & 16, h8 = lane & 8, h4 = lane & 4;
  float w[4], x[2];
#pragma unroll
  for (int i = 0; i < 4; ++i)  // slots (h16 ? 4 : 0) + i
    w[i] = (h16 ? v[i + 4] : v[i]) + __shfl_xor_sync(0xffffffffu, h16 ? v[i] : v[i + 4], 16);
#pragma unroll
  for (int i = 0; i < 2; ++i)  // slots ... + (h8 ? 2 : 0) + i
    x[i] = (h8 ? w[i + 2] : w[i]) + __shfl_xor_sync(0xffffffffu, h8 ? w[i] : w[i + 2], 8);
  float y = (h4 ? x[1] : x[0]) + __shfl_xor_sync(0xffffffffu, h4 ? x[0] : x[1], 4);
  y += __shfl_xor_sync(0xffffffffu, y, 2);
  y += __shfl_xor_sync(0xffffffffu, y, 1);
  return y;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// The 8 bf16 of a uint4 as floats, in order.
__device__ __forceinline__ void bf16x8_to_float(const uint4& r, float (&f)[8]) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int e = 0; e < 4; ++e)
    f[2 * e] = __uint_as_float(w[e] << 16), f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
}

// dot[h] = sum_e q[h][e] k[e] over this lane's 8 dims of one K row (8 bf16 in kr).
__device__ __forceinline__ void key_dots(const uint4& kr, const float (&q)[kGroup][8], float (&dot)[kGroup]) {
  float kf[8];
  bf16x8_to_float(kr, kf);
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    dot[h] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) dot[h] += q[h][e] * kf[e];
  }
}

}  // namespace lily::cuda::attention_detail
