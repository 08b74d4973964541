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

  // k rounds of argmax over (p, -index); a chosen expert is set to -1 (below every p >= 0). A
  // round: each lane's best of its 8 (ascending index: ties keep the lower), then the warp's
  // largest value (redux.sync on order-preserving keys) and, among the lanes holding it, the
  // lowest expert index (redux.sync min): the same choice as a shuffle tree, in two instructions.
  int sel_e[kRouteMaxK];
  float sel_p[kRouteMaxK], chosen = 0.f;
#pragma unroll
  for (int i = 0; i < kRouteMaxK; ++i) {
    sel_e[i] = 0, sel_p[i] = 0.f;
    if (i >= k) continue;
    float local = v[0];
    int local_j = 0;
#pragma unroll
    for (int j = 1; j < kRouteMaxExperts / 32; ++j)
      if (v[j] > local) local = v[j], local_j = j;
    const uint32_t bits = __float_as_uint(local);
    const uint32_t key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // unsigned order = float order
    const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, key);
    const int best_e = int(__reduce_min_sync(0xFFFFFFFFu, key == top ? uint32_t(lane + 32 * local_j) : 0xFFFFFFFFu));
    const float best = __shfl_sync(0xFFFFFFFFu, local, best_e % 32);
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
