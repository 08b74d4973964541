// moe_common.cuh: what the decode MoE's launches (moe_route.cu, moe_gate_up.cu,
// moe_gate_up_staged.cu, moe_down.cu) share: the quantized-matrix views, the FP32 lane-group dot
// products of quant_dot.cuh over rows (the router), the bounds, and the shape checks.
// Internal to backend/cuda/moe.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/gpu_types.h"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/moe/moe_decode.h"
#include "backend/cuda/moe/route_topk.cuh"

namespace lily::cuda::moe_detail {

using namespace quant;

constexpr int kMaxExperts = kRouteMaxExperts;  // warp_route_topk's bounds (route_topk.cuh)
constexpr int kMaxK = kRouteMaxK;
constexpr int kMaxHidden = 4096;  // H staged in shared memory (routing, gate/up)

// A quantized matrix (or stack) as the kernels see it.
struct QView {
  const uint4* codes;      // [batch, rows, cpr] chunks
  const uint16_t* scales;  // [batch, rows, gpr] bf16 bits
  const uint16_t* biases;
};

inline QView view(const QMatrix& m) {
  return {reinterpret_cast<const uint4*>(m.codes), reinterpret_cast<const uint16_t*>(m.scales),
          reinterpret_cast<const uint16_t*>(m.biases)};
}

struct QRow {
  const uint4* codes;
  const uint16_t* scales;
  const uint16_t* biases;
};

__device__ __forceinline__ QRow row_of(const QView& m, int64_t row, int cpr, int gpr) {
  return {m.codes + row * cpr, m.scales + row * gpr, m.biases + row * gpr};
}

// Lane-partial dot products of NR rows with x over chunks sub, sub + LPR, ...: UNROLL chunks
// of every row are loaded before the first use. X_SHARED: x is in shared memory.
template <int BITS, int LPR, int NR, bool X_SHARED = false, int UNROLL = 2>
__device__ __forceinline__ void rows_dot(const QRow (&w)[NR], const float* x, int cpr, int sub, float (&acc)[NR]) {
  constexpr int kCodes = 128 / BITS, kChunksPerGroup = 64 / kCodes;
  for (int c0 = sub; c0 < cpr; c0 += UNROLL * LPR) {
    uint4 q[UNROLL][NR];
    float sc[UNROLL][NR], bi[UNROLL][NR];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = c0 + u * LPR < cpr ? c0 + u * LPR : c0;
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        q[u][r] = load_codes(w[r].codes + c);
        sc[u][r] = load_bf16(w[r].scales + c / kChunksPerGroup);
        bi[u][r] = load_bf16(w[r].biases + c / kChunksPerGroup);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int c = c0 + u * LPR;
      if (c >= cpr) break;
      float xr[kCodes];
      const float sx = X_SHARED ? load_x<kCodes, false>(x + c * kCodes, xr) : load_x(x + c * kCodes, xr);
#pragma unroll
      for (int r = 0; r < NR; ++r) acc[r] += fmaf(sc[u][r], chunk_dot<BITS>(q[u][r], xr), bi[u][r] * sx);
    }
  }
}

// The gate/up parameters of row t of a step of several tokens (grid z): its x, logits and act.
template <typename Params>
__device__ __forceinline__ Params gate_up_row(Params p, int64_t t) {
  p.x += t * p.H;
  p.logits += t * p.E;
  p.act += t * (p.k + 1) * p.I;
  return p;
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// x . w for a one-row quantized vector [1, H] (4 or 8 bits), by one warp. Every lane's chunks
// (at most 8 at H <= 4096) are loaded before the first use: the row costs one memory latency,
// not one per word.
template <int BITS>
__device__ inline float warp_row_dot_bits(const QView& w, int cols, const float* x) {
  constexpr int kCodes = 128 / BITS, kChunksPerGroup = 64 / kCodes, kMaxChunks = kMaxHidden / kCodes / 32;
  const int cpr = cols / kCodes, lane = threadIdx.x % 32;
  uint4 q[kMaxChunks];
  float sc[kMaxChunks], bi[kMaxChunks];
#pragma unroll
  for (int i = 0; i < kMaxChunks; ++i) {
    const int c = min(lane + 32 * i, cpr - 1);  // a valid chunk; unused past the end
    q[i] = load_codes(w.codes + c);
    sc[i] = load_bf16(w.scales + c / kChunksPerGroup);
    bi[i] = load_bf16(w.biases + c / kChunksPerGroup);
  }
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxChunks; ++i) {
    const int c = lane + 32 * i;
    if (c >= cpr) break;
    float xr[kCodes];
    const float sx = load_x<kCodes, false>(x + c * kCodes, xr);
    acc += fmaf(sc[i], chunk_dot<BITS>(q[i], xr), bi[i] * sx);
  }
  return group_sum<32>(acc);
}

__device__ inline float warp_row_dot(const QView& w, int bits, int cols, const float* x) {
  return bits == 4 ? warp_row_dot_bits<4>(w, cols, x) : warp_row_dot_bits<8>(w, cols, x);
}

// An expert matrix the launches take: 4-bit, group 64, 16-byte aligned arrays.
inline bool expert_matrix_ok(const QMatrix& m) {
  return m.bits == 4 && m.group_size == 64 && aligned16(m.codes) && aligned16(m.scales) && aligned16(m.biases);
}

// E experts of which k are chosen: E <= 256 (route_topk.cuh), 1 <= k <= min(8, E).
inline bool choice_ok(int E, int k) { return E >= 1 && E <= kMaxExperts && k >= 1 && k <= kMaxK && k <= E; }

// Each launch's own conditions (moe_route.cu, moe_gate_up.cu, moe_down.cu).
bool route_supports(const GpuMoe& w);
bool gate_up_supports(GateUpKernel kernel, const GpuMoe& w, int k);
bool down_supports(const GpuMoe& w, int k);

inline void check_aligned(const float* p, const char* what) {
  LILY_CHECK(aligned16(p), "{} must be 16-byte aligned", what);
}

}  // namespace lily::cuda::moe_detail
