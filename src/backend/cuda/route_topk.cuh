// route_topk.cuh: the MoE router's choice (spec §2.7) for one token by one warp, shared by the
// decode routing (moe.cu) and the prefill routing (moe_grouped.cu) so both pick the same experts
// with the same weights: p = softmax(logits) in fp32; k rounds of warp argmax over p (ties to the
// lower index); weights p / sum of the chosen p, summed in rank order as the CPU reference does.
// Internal to backend/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace lily::cuda {

constexpr int kRouteMaxExperts = 256;
constexpr int kRouteMaxK = 8;

// Every lane of the warp calls it; lane l reads logits l, l + 32, ... (E <= 256; shared or
// global memory). Lane 0 writes ids[0..k) and weights[0..k) (k <= 8).
__device__ __forceinline__ void warp_route_topk(const float* logits, int E, int k, int32_t* ids, float* weights) {
  const int lane = threadIdx.x % 32;
  float v[kRouteMaxExperts / 32];
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < kRouteMaxExperts / 32; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < E ? logits[e] : -INFINITY;
    m = fmaxf(m, v[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < kRouteMaxExperts / 32; ++j) {
    v[j] = lane + 32 * j < E ? expf(v[j] - m) : 0.f;
    sum += v[j];
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
#pragma unroll
  for (int j = 0; j < kRouteMaxExperts / 32; ++j) v[j] = lane + 32 * j < E ? v[j] / sum : -2.f;  // -2: no expert

  // k rounds of argmax over (p, -index); a chosen expert is set to -1 (below every p >= 0).
  int sel_e[kRouteMaxK];
  float sel_p[kRouteMaxK], chosen = 0.f;
#pragma unroll
  for (int i = 0; i < kRouteMaxK; ++i) {
    sel_e[i] = 0, sel_p[i] = 0.f;
    if (i >= k) continue;
    float best = -3.f;
    int best_e = 0x7FFFFFFF;
#pragma unroll
    for (int j = 0; j < kRouteMaxExperts / 32; ++j)
      if (v[j] > best) best = v[j], best_e = lane + 32 * j;  // ascending index: ties keep the lower
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const float ob = __shfl_xor_sync(0xFFFFFFFFu, best, o);
      const int oe = __shfl_xor_sync(0xFFFFFFFFu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
#pragma unroll
    for (int j = 0; j < kRouteMaxExperts / 32; ++j)
      if (lane + 32 * j == best_e) v[j] = -1.f;
    sel_e[i] = best_e, sel_p[i] = best;
    chosen += best;  // in rank order, as the CPU reference sums
  }
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < kRouteMaxK; ++i) {
      if (i >= k) break;
      ids[i] = sel_e[i];
      weights[i] = sel_p[i] / chosen;
    }
  }
}

}  // namespace lily::cuda
