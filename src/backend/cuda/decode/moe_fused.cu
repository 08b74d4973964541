// moe_fused.cu: the sparse MoE block of one decode token (T = 1) in ONE launch: the three
// launches of moe.cu (route + norm, gate/up, down) as three phases of a persistent kernel
// separated by two grid-wide barriers. Same formulas as moe.cu (spec §2.7); the same
// arithmetic in the same order, so the results equal the three-launch path's.
//
//   phase A  every block: x = RMSNorm(h) in shared memory (and as bf16 hi/lo fragments);
//            router row quads spread one per warp over the blocks (loaded before the PDL wait):
//            logits -> scratch; one warp: the shared expert's gate sigmoid(x . w_sg) -> slot k.
//   barrier
//   phase B  every block: softmax / top-k / renormalise from the logits (warp_route_topk, as
//            moe.cu); items (slot, 16 rows of G and U) two per block per round, four warps per
//            item splitting H (quant_mma.cuh), silu(g) * u -> act (scratch). The shared
//            expert's items load their weights before the PDL wait.
//   barrier
//   phase C  block b < H / 16: rows 16 b .. 16 b + 15 of every slot's D act (one warp per slot,
//            warps taking slots w, w + 8), weighted in slot order, added into h.
// Why: the three launches cost ~33 us per layer in the decode graph for ~16 MB of weights
//      (~5 us at the bandwidth): the step is bound by launches and their ramps (docs/perf.md).
// Grid: one block of 256 threads per SM, all resident (the barrier needs it; the launch asks
//      for no more blocks than fit). Barrier: one word in scratch whose top bit flips when the
//      last block arrives (graph replays need nothing else).
// Measured (H200, docs/perf.md session 4): correct, and slower than the three launches (4K
//      decode 2.476 vs 2.314 ms): one block of 255 registers per SM keeps PDL from overlapping
//      anything with it, and the barriers and per-block top-k outweigh two launches. The decode
//      step uses it only with LILY_MOE_FUSED=1 (moe_fused_enabled).
// Limits (else moe.cu's three launches): T = 1, 4-bit experts, I <= 512, H <= 4096, E <= 256,
//      k <= 8, router rows of at most 128 chunks (8-bit H <= 2048, 4-bit H <= 4096).
// Tested:   tests/cuda/test_moe.cu (FusedDecode*: against the three launches and the CPU).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/decode/moe_fused.h"
#include "backend/cuda/common/device_info.h"

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/decode/moe_common.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/common/route_topk.cuh"
#include "base/env.h"

namespace lily::cuda {

namespace {

using namespace quant;
using namespace quant_mma;

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxH = 4096, kMaxI = 512, kMaxSlots = kRouteMaxK + 1;
constexpr int kStage = kMaxSlots * kMaxI > kMaxH ? kMaxSlots * kMaxI : kMaxH;  // x (phase A), act (phase C)
constexpr int kQuadRows = 4;        // router rows per warp
constexpr int kRouterChunks = 4;    // chunks per lane of a router row (128 chunks per row at most)
constexpr int kGateUpPairs = 2;     // pairs of 128-column blocks per load step (H = 2048 / 4 warps)
constexpr int kDownPairs = 2;       // I = 512: all of a row

struct QV {
  const uint4* codes;
  const uint16_t* scales;
  const uint16_t* biases;
};

QV qv(const QMatrix& m) {
  return {reinterpret_cast<const uint4*>(m.codes), reinterpret_cast<const uint16_t*>(m.scales),
          reinterpret_cast<const uint16_t*>(m.biases)};
}

struct FusedParams {
  QV router, expert_gate, gate, up, down, shared_gate, shared_up, shared_down;
  int router_bits, expert_gate_bits;
  float* h;            // [H] residual stream: read in phase A, += in phase C
  const float* gain;   // [H]
  float eps;
  int E, H, I, k;
  float* logits;       // [E] scratch
  float* act;          // [k + 1, I] scratch
  int32_t* ids;        // [k + 1] (written for the caller; the blocks use their own copies)
  float* weights;      // [k + 1]
  unsigned* barrier;   // [1]: grid_barrier's word (zero before the first launch)
};

// Every thread of every block calls it; returns when all blocks have arrived. Writes before it
// are visible after it to every block (fences on both sides; readers use ld.global.cg).
// One word, never reset: every block adds 1 except block 0, which adds 2^31 - (G - 1), so the
// word's top bit flips exactly when the last block arrives (the low 31 bits return to zero).
// A block waits until the top bit differs from the one it saw in its own atomicAdd: no separate
// read that could race with the flip.
__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void grid_barrier(unsigned* word) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    const unsigned seen = atomicAdd(word, add);
    while (((seen ^ load_acquire(word)) & 0x80000000u) == 0) __nanosleep(20);
    __threadfence();
  }
  __syncthreads();
}

// One warp: lane-partial dots of kQuadRows rows with x (shared), from codes loaded earlier.
template <int BITS>
struct RouterQuad {
  uint4 q[kRouterChunks][kQuadRows];
  float sc[kRouterChunks][kQuadRows], bi[kRouterChunks][kQuadRows];

  __device__ __forceinline__ void load(const QV& w, int first_row, int rows, int cpr) {
    constexpr int kChunksPerGroup = 64 / (128 / BITS);
    const int lane = threadIdx.x % 32, gpr = cpr / kChunksPerGroup;
#pragma unroll
    for (int u = 0; u < kRouterChunks; ++u)
#pragma unroll
      for (int r = 0; r < kQuadRows; ++r) {
        const int64_t row = first_row + min(r, rows - 1);
        const int c = min(lane + 32 * u, cpr - 1);
        q[u][r] = load_codes(w.codes + row * cpr + c);
        sc[u][r] = load_bf16(w.scales + row * gpr + c / kChunksPerGroup);
        bi[u][r] = load_bf16(w.biases + row * gpr + c / kChunksPerGroup);
      }
  }
  // Sums over the warp: every lane returns the rows' full dots.
  __device__ __forceinline__ void dots(const float* x, int cpr, float (&out)[kQuadRows]) const {
    constexpr int kCodes = 128 / BITS;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < kQuadRows; ++r) out[r] = 0.f;
#pragma unroll
    for (int u = 0; u < kRouterChunks; ++u) {
      const int c = lane + 32 * u;
      if (c >= cpr) break;
      float xr[kCodes];
      const float sx = load_x<kCodes, false>(x + c * kCodes, xr);
#pragma unroll
      for (int r = 0; r < kQuadRows; ++r) out[r] += fmaf(sc[u][r], chunk_dot<BITS>(q[u][r], xr), bi[u][r] * sx);
    }
#pragma unroll
    for (int r = 0; r < kQuadRows; ++r) out[r] = group_sum<32>(out[r]);
  }
};

template <int RBITS>
__global__ void __launch_bounds__(kThreads, 1) moe_fused_kernel(FusedParams p) {
  __shared__ __align__(16) float xs[kStage];                            // x = RMSNorm(h); later act
  __shared__ __align__(16) uint4 frag[fragment_uint4s(kStage)];         // their bf16 hi/lo fragments
  __shared__ float gsum[kStage / 64];
  __shared__ __align__(16) uint4 zero[kFragU4PerChunk];
  __shared__ float all[kRouteMaxExperts];                               // every logit
  __shared__ int32_t ids_s[kMaxSlots];
  __shared__ float weights_s[kMaxSlots];
  __shared__ float partial[kWarps][32];
  __shared__ float norm_part[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int G = gridDim.x, slots = p.k + 1;
  const int cpr_h = p.H / 32, cpr_i = p.I / 32;                          // 4-bit chunks per row
  const int router_cpr = p.H * RBITS / 128;

  // ---- Before the wait: weights that depend on nothing in this step ----
  // Router quad q = warp * G + block (quads spread over the SMs first).
  const int quads = (p.E + kQuadRows - 1) / kQuadRows;
  const int quad = warp * G + blockIdx.x;
  RouterQuad<RBITS> rq;
  if (quad < quads) rq.load(p.router, quad * kQuadRows, min(kQuadRows, p.E - quad * kQuadRows), router_cpr);
  // Phase B items: item = round * 2G + 2 * block + warp / 4; warp % 4 is its quarter of H.
  const int rows_i = (p.I + 15) / 16, items = slots * rows_i, kpart = warp % 4;
  const int pairs_h = (p.H + kPairCols - 1) / kPairCols, per_warp = pairs_per_warp(pairs_h, 4, kGateUpPairs);
  TileLoad<kGateUpPairs> tg, tu;
  auto gate_up_load = [&](int item, int e, int pair0) {
    const int s = item / rows_i, tile = item % rows_i;
    const bool shared = s == p.k;
    const QV& gw = shared ? p.shared_gate : p.gate;
    const QV& uw = shared ? p.shared_up : p.up;
    const int64_t base = int64_t(shared ? 0 : e) * p.I;
    const int64_t rg = base + min(tile * 16 + g, p.I - 1), rg8 = base + min(tile * 16 + g + 8, p.I - 1);
    load_tile(tg, gw.codes, gw.scales, gw.biases, rg, rg8, cpr_h, pair0);
    load_tile(tu, uw.codes, uw.scales, uw.biases, rg, rg8, cpr_h, pair0);
  };
  const int first_item = 2 * blockIdx.x + warp / 4;
  const bool first_is_shared = first_item < items && first_item / rows_i == p.k;
  if (first_is_shared && kpart * per_warp < pairs_h) gate_up_load(first_item, 0, kpart * per_warp);
  pdl_wait();
  pdl_launch_dependents();

  // ---- Phase A: norm (x and its fragments for phase B), router logits, the shared expert's gate ----
  stage_input_row<true, kThreads, kMaxH>(p.h, p.gain, p.eps, p.H, xs, frag, gsum, zero, norm_part);
  __syncthreads();
  if (quad < quads) {
    float d[kQuadRows];
    rq.dots(xs, router_cpr, d);
    if (lane == 0)
#pragma unroll
      for (int r = 0; r < kQuadRows; ++r)
        if (quad * kQuadRows + r < p.E) p.logits[quad * kQuadRows + r] = d[r];
  }
  if (blockIdx.x == G - 1 && warp == kWarps - 1) {  // the shared expert's gate: slot k
    const QV& w = p.expert_gate;
    const int cpr = p.H * p.expert_gate_bits / 128;
    float d[kQuadRows];
    if (p.expert_gate_bits == 8) {
      RouterQuad<8> one;
      one.load(w, 0, 1, cpr);
      one.dots(xs, cpr, d);
    } else {
      RouterQuad<4> one;
      one.load(w, 0, 1, cpr);
      one.dots(xs, cpr, d);
    }
    if (lane == 0) p.weights[p.k] = 1.f / (1.f + expf(-d[0])), p.ids[p.k] = 0;
  }
  grid_barrier(p.barrier);

  // ---- Phase B: top-k in every block, gate/up items ----
  if (warp == 0) {
    warp_load_logits(p.logits, p.E, all);
    warp_route_topk(all, p.E, p.k, ids_s, weights_s);
    if (lane == 0) {
      weights_s[p.k] = __ldcg(p.weights + p.k), ids_s[p.k] = 0;
      if (blockIdx.x == 0)
        for (int s = 0; s < p.k; ++s) p.ids[s] = ids_s[s], p.weights[s] = weights_s[s];
    }
  }
  __syncthreads();
  for (int round = 0; round * 2 * G < items; ++round) {
    const int item = round * 2 * G + first_item;
    float yg[2] = {0.f, 0.f}, yu[2] = {0.f, 0.f};
    if (item < items) {
      const int s = item / rows_i;
      const int e = s == p.k ? 0 : min(max(ids_s[s], 0), p.E - 1);
      const int pair_begin = kpart * per_warp, pair_end = min(pairs_h, pair_begin + per_warp);
      for (int pair0 = pair_begin; pair0 < pair_end; pair0 += kGateUpPairs) {
        if (!(round == 0 && first_is_shared && pair0 == pair_begin)) gate_up_load(item, e, pair0);
        dot_tile(tg, frag, gsum, zero, cpr_h, pair0, yg[0], yg[1]);
        dot_tile(tu, frag, gsum, zero, cpr_h, pair0, yu[0], yu[1]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) yg[r] = quad_sum(yg[r]), yu[r] = quad_sum(yu[r]);
    if (lane % 4 == 0) {
      partial[warp][g] = yg[0], partial[warp][g + 8] = yg[1];
      partial[warp][16 + g] = yu[0], partial[warp][16 + g + 8] = yu[1];
    }
    __syncthreads();
    if (threadIdx.x < 32) {  // two items x 16 rows
      const int half = threadIdx.x / 16, r = threadIdx.x % 16;
      const int it = round * 2 * G + 2 * blockIdx.x + half;
      const int row = (it % rows_i) * 16 + r;
      if (it < items && row < p.I) {
        float gs = 0.f, us = 0.f;
#pragma unroll
        for (int w = 0; w < 4; ++w) gs += partial[half * 4 + w][r], us += partial[half * 4 + w][16 + r];
        p.act[int64_t(it / rows_i) * p.I + row] = moe_detail::silu(gs) * us;
      }
    }
    __syncthreads();
  }
  grid_barrier(p.barrier);

  // ---- Phase C: down of every slot, weighted, into h ----
  const int rows_h = (p.H + 15) / 16;
  for (int tile = blockIdx.x; tile < rows_h; tile += G) {
    // act of every slot -> fragments (reuses frag: slot j at j * fragment_uint4s(I)); xs as staging.
    for (int j = threadIdx.x; j < slots * p.I; j += kThreads) xs[j] = __ldcg(p.act + j);
    __syncthreads();
    for (int j = 0; j < slots; ++j)
      stage_x_fragments<1>(xs + j * p.I, p.I, frag + j * fragment_uint4s(p.I), gsum + j * (p.I / 64));
    __syncthreads();
    float y[2][2] = {};  // [slot pass][row g, g + 8]
    for (int pass = 0; pass < 2; ++pass) {
      const int s = warp + pass * kWarps;
      if (s >= slots) break;
      const bool shared = s == p.k;
      const QV& dw = shared ? p.shared_down : p.down;
      const int64_t base = int64_t(shared ? 0 : min(max(ids_s[s], 0), p.E - 1)) * p.H;
      TileLoad<kDownPairs> td;
      const int pairs_i = (p.I + kPairCols - 1) / kPairCols;
      for (int pair0 = 0; pair0 < pairs_i; pair0 += kDownPairs) {
        load_tile(td, dw.codes, dw.scales, dw.biases, base + min(tile * 16 + g, p.H - 1),
                  base + min(tile * 16 + g + 8, p.H - 1), cpr_i, pair0);
        dot_tile(td, frag + s * fragment_uint4s(p.I), gsum + s * (p.I / 64), zero, cpr_i, pair0, y[pass][0],
                 y[pass][1]);
      }
    }
    __syncthreads();  // the fragments are done with; partial is free
    for (int pass = 0; pass < 2; ++pass) {
      const int s = warp + pass * kWarps;
      const float a = quad_sum(y[pass][0]), b = quad_sum(y[pass][1]);
      if (s < slots && lane % 4 == 0) partial[s % kWarps][g + 16 * (s / kWarps)] = a, partial[s % kWarps][g + 8 + 16 * (s / kWarps)] = b;
    }
    __syncthreads();
    if (threadIdx.x < 16) {
      const int row = tile * 16 + threadIdx.x;
      float sum = 0.f;
      for (int s = 0; s < slots; ++s) sum = fmaf(weights_s[s], partial[s % kWarps][threadIdx.x + 16 * (s / kWarps)], sum);
      if (row < p.H) p.h[row] += sum;
    }
    __syncthreads();
  }
}

}  // namespace

bool moe_fused_enabled() {
  return env_value("LILY_MOE_FUSED").starts_with('1');
}

bool moe_fused_supports(const MoeFusedWeights& w, int k) {
  const int H = w.router.cols, I = w.gate.rows;
  const bool router_ok = (w.router.bits == 8 && H <= 2048) || (w.router.bits == 4 && H <= 4096);
  const bool gate_ok = w.shared_expert_gate.bits == 8 ? H <= 2048 : H <= 4096;
  return router_ok && gate_ok && w.gate.bits == 4 && w.up.bits == 4 && w.down.bits == 4 && w.shared_gate.bits == 4 &&
         w.shared_up.bits == 4 && w.shared_down.bits == 4 && H % 64 == 0 && H <= kMaxH && I % 64 == 0 &&
         I <= kMaxI && w.router.rows <= kRouteMaxExperts && k >= 1 && k <= kRouteMaxK;
}

size_t moe_fused_scratch_bytes(int E, int I, int k) {
  return 16 + size_t(E) * sizeof(float) + size_t(k + 1) * I * sizeof(float);
}

void moe_fused_decode(const MoeFusedWeights& w, float* h, const float* gain, float eps, int k, int32_t* expert_ids,
                      float* expert_weights, void* scratch, cudaStream_t stream) {
  LILY_CHECK(moe_fused_supports(w, k), "moe_fused_decode: this MoE shape is not supported (moe_fused_supports)");
  FusedParams p{};
  p.router = qv(w.router), p.expert_gate = qv(w.shared_expert_gate);
  p.gate = qv(w.gate), p.up = qv(w.up), p.down = qv(w.down);
  p.shared_gate = qv(w.shared_gate), p.shared_up = qv(w.shared_up), p.shared_down = qv(w.shared_down);
  p.router_bits = w.router.bits, p.expert_gate_bits = w.shared_expert_gate.bits;
  p.h = h, p.gain = gain, p.eps = eps;
  p.E = w.router.rows, p.H = w.router.cols, p.I = w.gate.rows, p.k = k;
  p.barrier = static_cast<unsigned*>(scratch);
  p.logits = reinterpret_cast<float*>(static_cast<char*>(scratch) + 16);
  p.act = p.logits + p.E;
  p.ids = expert_ids, p.weights = expert_weights;
  const int grid = multiprocessor_count();  // one block per SM: all resident (the barriers need it)
  if (w.router.bits == 8)
    moe_fused_kernel<8><<<grid, kThreads, 0, stream>>>(p);
  else
    moe_fused_kernel<4><<<grid, kThreads, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
