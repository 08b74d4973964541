// route_topk.cuh: the MoE router's choice (spec §2.7) for one token by one warp, shared by the
// decode expert launches (moe_gate_up*.cu, moe_down.cu) and the prefill routing
// (moe/moe_routing.cu) so both pick the same experts with the same weights: p = softmax(logits)
// in fp32; k rounds of warp argmax over p (ties to the lower index); weights p / sum of the chosen
// p, summed in rank order as the CPU reference does.
// Internal to backend/cuda.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

namespace lily::cuda {

constexpr int kRouteMaxExperts = 256;
constexpr int kRouteMaxK = 8;

// Every lane of the warp calls it; lane l reads logits l, l + 32, ... (E <= 256; shared or
// global memory) and gets p = softmax(logits) of those experts in v (-2 past E: no expert).
__device__ __forceinline__ void warp_route_probs(const float* logits, int E, float (&v)[kRouteMaxExperts / 32]) {
  const int lane = threadIdx.x % 32;
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
}

// One round of argmax over (p, -index), every lane: returns the expert with the largest p (ties:
// the lower index) and its p in `best`, and marks it chosen in v (-1, below every p >= 0). Each
// lane's best of its 8 (ascending index: ties keep the lower), then the warp's largest value
// (redux.sync on order-preserving keys) and, among the lanes holding it, the lowest expert index
// (redux.sync min): the same choice as a shuffle tree, in two instructions.
__device__ __forceinline__ int warp_route_next(float (&v)[kRouteMaxExperts / 32], float& best) {
  const int lane = threadIdx.x % 32;
  float local = v[0];
  int local_j = 0;
#pragma unroll
  for (int j = 1; j < kRouteMaxExperts / 32; ++j)
    if (v[j] > local) local = v[j], local_j = j;
  const uint32_t bits = __float_as_uint(local);
  const uint32_t key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);  // unsigned order = float order
  const uint32_t top = __reduce_max_sync(0xFFFFFFFFu, key);
  const int best_e = int(__reduce_min_sync(0xFFFFFFFFu, key == top ? uint32_t(lane + 32 * local_j) : 0xFFFFFFFFu));
  best = __shfl_sync(0xFFFFFFFFu, local, best_e % 32);
#pragma unroll
  for (int j = 0; j < kRouteMaxExperts / 32; ++j)
    if (lane + 32 * j == best_e) v[j] = -1.f;
  return best_e;
}

// Every lane of the warp calls it: the router logits [E] into logits_s (shared memory), read
// through L2 (an earlier kernel of the step wrote them; this SM's L1 may hold an older step's).
// All of a lane's loads are issued before its stores: a store between them (logits_s may alias
// logits, for all the compiler knows) made each load wait for the one before, eight L2 round
// trips in a row (a whole-step kernel's trace, 2026-12-03).
__device__ __forceinline__ void warp_load_logits(const float* logits, int E, float* logits_s) {
  const int lane = threadIdx.x % 32;
  float v[kRouteMaxExperts / 32];
#pragma unroll
  for (int j = 0; j < kRouteMaxExperts / 32; ++j) v[j] = lane + 32 * j < E ? __ldcg(logits + lane + 32 * j) : 0.f;
#pragma unroll
  for (int j = 0; j < kRouteMaxExperts / 32; ++j)
    if (lane + 32 * j < E) logits_s[lane + 32 * j] = v[j];
  __syncwarp();
}

// Every lane calls it. Lane 0 writes ids[0..k) and weights[0..k) (k <= 8): k rounds of
// warp_route_next; weights p / sum of the chosen p, summed in rank order as the CPU reference.
__device__ __forceinline__ void warp_route_topk(const float* logits, int E, int k, int32_t* ids, float* weights) {
  const int lane = threadIdx.x % 32;
  float v[kRouteMaxExperts / 32];
  warp_route_probs(logits, E, v);
  int sel_e[kRouteMaxK];
  float sel_p[kRouteMaxK], chosen = 0.f;
#pragma unroll
  for (int i = 0; i < kRouteMaxK; ++i) {
    sel_e[i] = 0, sel_p[i] = 0.f;
    if (i >= k) continue;
    sel_e[i] = warp_route_next(v, sel_p[i]);
    chosen += sel_p[i];  // in rank order, as the CPU reference sums
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

// Every lane calls it: the expert at `rank` (0-based, < E) of warp_route_topk's order, for a
// kernel that needs only one slot's expert (no weights, fewer registers).
__device__ __forceinline__ int warp_route_rank(const float* logits, int E, int rank) {
  float v[kRouteMaxExperts / 32];
  warp_route_probs(logits, E, v);
  int e = 0;
  float p;
  for (int i = 0; i <= rank; ++i) e = warp_route_next(v, p);
  return e;
}

}  // namespace lily::cuda
