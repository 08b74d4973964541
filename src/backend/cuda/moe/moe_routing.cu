// moe_routing.cu: the routing half of the grouped MoE block (moe_grouped.h; moe_grouped.cu has
// the experts and the combine): the top-k of each token's router logits and the plan, the
// expert-sorted order of the T*k (token, slot) pairs and its tile map.
//
//   ids, w = top-k(softmax(logits)), renormalised       moe_topk_kernel (a warp a token)  [T, k]
//   sg     = x @ w_sg^T (fp32, the same warp)           moe_topk_kernel                   [T]
//   plan: histogram of pairs per expert, exclusive scan -> offsets, stable scatter of the pairs
//         into expert order, tile map                   moe_plan_count_kernel, moe_plan_place_kernel
//                                                       (a block per 1024 pairs); moe_plan_kernel
//                                                       (one block, the top-k too: short passes)
// Determinism: the scatter is stable (pairs keep their order inside an expert: per-chunk warp
//           match + per-warp counts, no atomics decide positions). Same input, same bits.
// Tested:   tests/cuda/test_moe_grouped.cu (the top-k against the CPU's rule, the plan against a
//           host counting sort over 1 .. 64 chunks, the gate logit against cpu::linear).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/pdl_launch.cuh"
#include "backend/cuda/moe/moe_grouped.h"

#include <algorithm>

#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/moe/route_topk.cuh"

namespace lily::cuda {

namespace {

constexpr int kMaxExperts = kRouteMaxExperts;  // warp_route_topk's bounds (route_topk.cuh)
constexpr int kMaxK = kRouteMaxK;
constexpr int kTopkWarps = 4;       // tokens per block in moe_topk_kernel
constexpr int kPlanThreads = 1024;  // moe_plan_kernel: one block, 32 warps

// ---- Top-k ------------------------------------------------------------------------------

// The shared expert's gate row [1, H] (BITS 4 or 8, group 64), for the top-k kernel's logit.
struct GateRow {
  const uint4* codes = nullptr;  // nullptr: no logit asked for
  const uint16_t* scales = nullptr;
  const uint16_t* biases = nullptr;
  int bits = 8;
  const float* x = nullptr;  // [T, H] fp32
  int H = 0;
  float* sg = nullptr;  // [T]
};

// x[t] . w_sg in fp32 by one warp (lane c: chunks c, c + 32, ...), as cpu::linear and the decode
// route compute it: dequantized weights in fp32, fp32 x.
template <int BITS>
__device__ float warp_gate_logit(const GateRow& g, int t) {
  constexpr int kCodes = 128 / BITS, kChunksPerGroup = 64 / kCodes;
  const int lane = threadIdx.x % 32, cpr = g.H / kCodes;
  const float* x = g.x + int64_t(t) * g.H;
  float acc = 0.f;
  for (int c = lane; c < cpr; c += 32) {
    float xr[kCodes];
    const float sx = quant::load_x<kCodes, false>(x + c * kCodes, xr);
    const float scale = quant::load_bf16(g.scales + c / kChunksPerGroup);
    const float bias = quant::load_bf16(g.biases + c / kChunksPerGroup);
    acc += fmaf(scale, quant::chunk_dot<BITS>(quant::load_codes(g.codes + c), xr), bias * sx);
  }
  return quant::group_sum<32>(acc);
}

// One warp per token: warp_route_topk (route_topk.cuh), the rule the decode expert launches use;
// with a gate row, the shared expert's gate logit of the token too.
__global__ void __launch_bounds__(kTopkWarps * 32)
    moe_topk_kernel(const float* logits, int T, int E, int k, int32_t* ids, float* weights, GateRow gate) {
  pdl_wait();
  pdl_launch_dependents();
  const int t = blockIdx.x * kTopkWarps + threadIdx.x / 32;
  if (t >= T) return;
  warp_route_topk(logits + int64_t(t) * E, E, k, ids + int64_t(t) * k, weights + int64_t(t) * k);
  if (gate.codes) {
    const float sg = gate.bits == 4 ? warp_gate_logit<4>(gate, t) : warp_gate_logit<8>(gate, t);
    if (threadIdx.x % 32 == 0) gate.sg[t] = sg;
  }
}

// ---- Plan: histogram, scan, stable scatter, tile map --------------------------------------

struct PlanParams {
  const int32_t* ids;  // [P]
  int P, E, tile_rows;
  int32_t *offsets, *sorted, *position, *tiles, *num_tiles;
  // Top-k first (moe_topk_plan): ids [T, k] and weights from logits [T, E], T = P / k <= 32.
  const float* logits;
  int k;
  float* weights;
};

// Exclusive prefix sum of v over the block (kPlanThreads threads); *total gets the sum.
__device__ int block_exclusive_scan(int v, int* warp_sums, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int inc = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int u = __shfl_up_sync(0xFFFFFFFFu, inc, o);
    if (lane >= o) inc += u;
  }
  if (lane == 31) warp_sums[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int w = warp_sums[lane], wi = w;  // kPlanThreads / 32 == 32 warps
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int u = __shfl_up_sync(0xFFFFFFFFu, wi, o);
      if (lane >= o) wi += u;
    }
    warp_sums[lane] = wi - w;  // exclusive
    if (lane == 31) *total = wi;
  }
  __syncthreads();
  const int result = warp_sums[warp] + inc - v;
  __syncthreads();  // warp_sums is reused by the next scan
  return result;
}

// Thread e < E (after the block's scans): expert e's offset (off, of its c pairs) and its nt tiles
// from tile toff on; thread 0 the total and the tile count.
__device__ __forceinline__ void write_offsets_and_tiles(const PlanParams& p, int c, int off, int nt, int toff,
                                                        int total_tiles) {
  const int tid = threadIdx.x;
  if (tid < p.E) {
    p.offsets[tid] = off;
    for (int j = 0; j < nt; ++j) {
      int4 tile{tid, off + j * p.tile_rows, min(off + c, off + (j + 1) * p.tile_rows), 0};
      reinterpret_cast<int4*>(p.tiles)[toff + j] = tile;
    }
  }
  if (tid == 0) {
    p.offsets[p.E] = p.P;
    *p.num_tiles = total_tiles;
  }
}

__global__ void __launch_bounds__(kPlanThreads) moe_plan_kernel(PlanParams p) {
  pdl_wait();
  pdl_launch_dependents();
  static_assert(kPlanThreads == 32 * 32 && kMaxExperts <= kPlanThreads);
  if (p.logits) {  // a warp per token: its top-k into ids and weights, read below by the block
    const int t = threadIdx.x / 32;
    if (t < p.P / p.k)
      warp_route_topk(p.logits + int64_t(t) * p.E, p.E, p.k, const_cast<int32_t*>(p.ids) + int64_t(t) * p.k,
                      p.weights + int64_t(t) * p.k);
    __syncthreads();
  }
  __shared__ int count[kMaxExperts], base[kMaxExperts];
  __shared__ int warp_count[32][kMaxExperts];  // per chunk: first position of each (warp, expert)
  __shared__ int warp_sums[32];
  __shared__ int total, total_tiles;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

  for (int e = tid; e < p.E; e += kPlanThreads) count[e] = 0;
  __syncthreads();
  for (int i = tid; i < p.P; i += kPlanThreads) atomicAdd(&count[min(max(p.ids[i], 0), p.E - 1)], 1);
  __syncthreads();

  // offsets = exclusive scan of the counts; tiles of tile_rows positions per expert.
  const int c = tid < p.E ? count[tid] : 0;
  const int off = block_exclusive_scan(c, warp_sums, &total);
  const int nt = (c + p.tile_rows - 1) / p.tile_rows;
  const int toff = block_exclusive_scan(nt, warp_sums, &total_tiles);
  if (tid < p.E) base[tid] = off;
  write_offsets_and_tiles(p, c, off, nt, toff, total_tiles);
  __syncthreads();

  // Stable scatter, kPlanThreads pairs at a time: a pair's position is its expert's base, plus
  // the pairs of that expert in earlier warps of the chunk, plus those in earlier lanes.
  const uint32_t lanes_below = (1u << lane) - 1u;
  for (int c0 = 0; c0 < p.P; c0 += kPlanThreads) {
    for (int j = tid; j < 32 * p.E; j += kPlanThreads) warp_count[j / p.E][j % p.E] = 0;
    __syncthreads();
    const int i = c0 + tid;
    const bool valid = i < p.P;
    const int e = valid ? min(max(p.ids[i], 0), p.E - 1) : -1;
    const uint32_t peers = __match_any_sync(0xFFFFFFFFu, e);
    const int rank = __popc(peers & lanes_below);
    if (valid && rank == 0) warp_count[warp][e] = __popc(peers);
    __syncthreads();
    if (tid < p.E) {
      int run = base[tid];
      for (int w = 0; w < 32; ++w) {
        const int n = warp_count[w][tid];
        warp_count[w][tid] = run;
        run += n;
      }
      base[tid] = run;
    }
    __syncthreads();
    if (valid) {
      const int pos = warp_count[warp][e] + rank;
      p.sorted[pos] = i;
      p.position[i] = pos;
    }
    __syncthreads();
  }
}

// ---- Plan over many chunks: counts, then places ---------------------------------------------
// moe_plan for any number of pairs in two launches of one block per chunk of kPlanThreads pairs
// (the one-block loop above walks the chunks one after the other: ~100 us at 4096 tokens):
//   count:  per chunk, the pairs of each expert (chunk_counts [chunk][E]) and each pair's rank
//           among its expert's pairs in the chunk (kept in position[] until place overwrites it)
//   place:  every block sums the chunks' counts (the offsets, and the pairs of each expert in
//           earlier chunks), scans them as moe_plan_kernel does, and places its chunk's pairs;
//           block 0 writes offsets, the tile map and its size.
// Positions are the one-block kernel's: an expert's base, its pairs in earlier chunks, in earlier
// warps of the chunk, in earlier lanes (stable).

__global__ void __launch_bounds__(kPlanThreads) moe_plan_count_kernel(PlanParams p, int32_t* chunk_counts) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ int warp_count[32][kMaxExperts];  // this chunk's pairs of each (warp, expert)
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, i = blockIdx.x * kPlanThreads + tid;
  for (int j = tid; j < 32 * p.E; j += kPlanThreads) warp_count[j / p.E][j % p.E] = 0;
  __syncthreads();
  const bool valid = i < p.P;
  const int e = valid ? min(max(p.ids[i], 0), p.E - 1) : -1;
  const uint32_t peers = __match_any_sync(0xFFFFFFFFu, e);
  const int rank = __popc(peers & ((1u << lane) - 1u));  // among its expert's pairs in the warp
  if (valid && rank == 0) warp_count[warp][e] = __popc(peers);
  __syncthreads();
  if (tid < p.E) {  // counts -> exclusive prefixes over the warps; the chunk's count per expert
    int run = 0;
    for (int w = 0; w < 32; ++w) {
      const int n = warp_count[w][tid];
      warp_count[w][tid] = run;
      run += n;
    }
    chunk_counts[int64_t(blockIdx.x) * p.E + tid] = run;
  }
  __syncthreads();
  if (valid) p.position[i] = warp_count[warp][e] + rank;
}

__global__ void __launch_bounds__(kPlanThreads) moe_plan_place_kernel(PlanParams p, const int32_t* chunk_counts) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ int base[kMaxExperts];
  __shared__ int warp_sums[32];
  __shared__ int total, total_tiles;
  const int tid = threadIdx.x, chunks = int(gridDim.x);
  int c = 0, before = 0;  // pairs of expert tid in all chunks, in the chunks before this one
  if (tid < p.E)
    for (int b = 0; b < chunks; ++b) {
      const int n = __ldcg(chunk_counts + int64_t(b) * p.E + tid);
      c += n;
      before += b < int(blockIdx.x) ? n : 0;
    }
  const int off = block_exclusive_scan(c, warp_sums, &total);
  const int nt = (c + p.tile_rows - 1) / p.tile_rows;
  const int toff = block_exclusive_scan(nt, warp_sums, &total_tiles);
  if (tid < p.E) base[tid] = off + before;
  if (blockIdx.x == 0) write_offsets_and_tiles(p, c, off, nt, toff, total_tiles);
  __syncthreads();
  const int i = blockIdx.x * kPlanThreads + tid;
  if (i < p.P) {
    const int e = min(max(p.ids[i], 0), p.E - 1);
    const int pos = base[e] + __ldcg(p.position + i);
    p.sorted[pos] = i;
    p.position[i] = pos;
  }
}

}  // namespace

int moe_max_tiles(int pairs, int E, int tile_rows) {
  // sum_e ceil(c_e / BM) <= (P + n * (BM - 1)) / BM with n <= min(E, P) experts used.
  const int64_t n = std::min(E, pairs);
  return int((int64_t(pairs) + n * (tile_rows - 1)) / tile_rows);
}

int moe_plan_chunks(int pairs) { return std::max(1, (pairs + kPlanThreads - 1) / kPlanThreads); }

namespace {

void launch_topk(const float* logits, int T, int E, int k, int32_t* ids, float* weights, const GateRow& gate,
                 cudaStream_t stream) {
  LILY_CHECK(E >= 1 && E <= kMaxExperts && k >= 1 && k <= kMaxK && k <= E, "moe_topk: top-{} of {} experts", k, E);
  if (T <= 0) return;
  launch_after_wait(moe_topk_kernel, dim3(unsigned((T + kTopkWarps - 1) / kTopkWarps)), dim3(kTopkWarps * 32), 0,
                    stream, logits, T, E, k, ids, weights, gate);
}

}  // namespace

void moe_topk(const float* logits, int T, int E, int k, int32_t* ids, float* weights, cudaStream_t stream) {
  launch_topk(logits, T, E, k, ids, weights, GateRow{}, stream);
}

void moe_topk_gate(const float* logits, const float* x, const QMatrix& w_sg, int T, int E, int k, int32_t* ids,
                   float* weights, float* sg, cudaStream_t stream) {
  LILY_CHECK(w_sg.rows == 1 && (w_sg.bits == 4 || w_sg.bits == 8) && w_sg.group_size == 64 && w_sg.cols % 64 == 0,
             "moe_topk_gate: the shared expert gate [{}, {}] q{} group {} (one row, 4 or 8 bits, group 64)", w_sg.rows,
             w_sg.cols, w_sg.bits, w_sg.group_size);
  LILY_CHECK((reinterpret_cast<uintptr_t>(x) & 15) == 0, "moe_topk_gate: x must be 16-byte aligned");
  GateRow g;
  g.codes = reinterpret_cast<const uint4*>(w_sg.codes);
  g.scales = reinterpret_cast<const uint16_t*>(w_sg.scales);
  g.biases = reinterpret_cast<const uint16_t*>(w_sg.biases);
  g.bits = w_sg.bits, g.x = x, g.H = w_sg.cols, g.sg = sg;
  launch_topk(logits, T, E, k, ids, weights, g, stream);
}

void moe_plan(const int32_t* ids, int T, int k, int E, const MoePlan& plan, cudaStream_t stream) {
  LILY_CHECK(E >= 1 && E <= kMaxExperts, "moe_plan: {} experts (1..{})", E, kMaxExperts);
  LILY_CHECK(plan.tile_rows >= 1 && plan.max_tiles >= moe_max_tiles(T * k, E, plan.tile_rows),
             "moe_plan: room for {} tiles, {} pairs may need {}", plan.max_tiles, T * k,
             moe_max_tiles(T * k, E, plan.tile_rows));
  LILY_CHECK(plan.chunk_counts != nullptr, "moe_plan: no chunk_counts ([moe_plan_chunks(T * k), E])");
  const PlanParams p{ids,         T * k,         E,          plan.tile_rows, plan.offsets,
                     plan.sorted, plan.position, plan.tiles, plan.num_tiles, nullptr,
                     k,           nullptr};
  const dim3 chunks(unsigned(moe_plan_chunks(T * k)));
  launch_after_wait(moe_plan_count_kernel, chunks, dim3(kPlanThreads), 0, stream, p, plan.chunk_counts);
  launch_after_wait(moe_plan_place_kernel, chunks, dim3(kPlanThreads), 0, stream, p,
                    static_cast<const int32_t*>(plan.chunk_counts));
}

void moe_topk_plan(const float* logits, int T, int k, int E, int32_t* ids, float* weights, const MoePlan& plan,
                   cudaStream_t stream) {
  LILY_CHECK(E >= 1 && E <= kMaxExperts && k >= 1 && k <= kMaxK && k <= E && T >= 1 && T <= kPlanThreads / 32,
             "moe_topk_plan: top-{} of {} experts for {} tokens (at most {})", k, E, T, kPlanThreads / 32);
  LILY_CHECK(plan.tile_rows >= 1 && plan.max_tiles >= moe_max_tiles(T * k, E, plan.tile_rows),
             "moe_topk_plan: room for {} tiles, {} pairs may need {}", plan.max_tiles, T * k,
             moe_max_tiles(T * k, E, plan.tile_rows));
  const PlanParams p{ids,         T * k,         E,          plan.tile_rows, plan.offsets,
                     plan.sorted, plan.position, plan.tiles, plan.num_tiles, logits,
                     k,           weights};
  launch_after_wait(moe_plan_kernel, dim3(1), dim3(kPlanThreads), 0, stream, p);
}

}  // namespace lily::cuda
