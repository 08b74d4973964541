// moe.cu: the sparse MoE block on the GPU (spec §2.7) in three launches per token block:
// norm + routing (moe_route.cu), gate/up of the k routed experts and the shared expert, down of
// all of them (here).
//
//   x = RMSNorm(h; post_attention_layernorm)             (zero-centred: gain = 1 + w, spec §2.2)
//   p = softmax(x @ Wr^T) (fp32);  S = top-k of p (ties to the lower index);  w_e = p_e / sum_S p
//   slot s < k: the routed expert e = ids[t, s], weight w_s;  slot k: the shared expert, weight
//   sigmoid(x . w_sg)   ("routed + sigmoid(x @ Wsg^T) * shared" of the spec, as a ninth slot)
//   act[t, s]  = silu(G_s x_t) * (U_s x_t)
//   h[t]      += sum_{s <= k} weight_s * D_s act[t, s]
// Shapes:   h, x [T, H] fp32 · router [E, H] (8-bit in mlx) · gate/up stacks [E, I, H] · down stack
//           [E, H, I] · shared gate/up [I, H], down [H, I] (the shared expert's width must equal
//           I, true of every Qwen3.5/3.6 MoE) · act [T, k+1, I] fp32 · ids [T, k+1] int32 ·
//           weights [T, k+1] fp32.  E <= 256, k <= 8; H <= 4096 and I multiples of 64; h, x,
//           act 16-byte aligned.
// Layout:   weights in the mlx affine layout (gpu_types.h); a "chunk" is 16 bytes of codes, 32
//           columns at 4 bits or 16 at 8 bits; as in gemv.cu, a group of LPR lanes (8/16/32)
//           owns a few rows and reads their chunks j, j + LPR, ... with 16-byte streaming loads,
//           and one chunk of x in registers serves all the rows the lane holds.
// Kernels:  moe_gate_up_kernel    grid (I/8, T*(k+1)), 128 threads: each warp owns 2 rows of G
//                                 and the same 2 rows of U of its slot's expert (4 rows share
//                                 each chunk of x; 8 uint4 loads in flight per lane) and writes
//                                 silu(g)*u: intermediates never leave registers. The expert id
//                                 is read on the device; slot k reads the shared expert.
//           moe_down_kernel       grid (H/16, T), 256 threads: the block stages act[t] of all
//                                 k+1 slots in shared memory (swizzled, 18 KB at I = 512); a warp
//                                 owns 2 output rows for all slots (the lane groups split the
//                                 slots; 4 slots' loads in flight), weights the slots, reduces
//                                 over the warp and adds into h: one owner per output element,
//                                 no atomics, deterministic.
// Variants: 4-bit experts (the model's) go to the tensor-core forms of the last two
//           (quant_mma.cuh: codes exact in bf16, x as bf16 hi + lo, fp32-level accuracy):
//           moe_gate_up_mma_kernel grid (I/16, T*(k+1)), 4 warps splitting H, 16 rows of G and U;
//           moe_down_mma_kernel    grid (H/16, T), one warp per slot, act of every slot loaded
//                                  into shared memory in one round, then staged
//                                  as fragments, the slots weighted in order by 16 threads.
//           LILY_MMA_GEMV=0 keeps the FP32 forms above (tests run both).
//           One token (decode) at the model's shapes: moe_gate_up_staged.cu's kernel instead of
//           moe_gate_up_mma_kernel (the rows in shared memory through bulk copies, not in
//           registers, so that down's blocks fit beside it; LILY_GATEUP_STAGED=0: the mma kernel).
// Tested:   tests/cuda/test_moe.cu against backend/cpu (rms_norm, linear, sparse_moe's routing).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/decode/moe.h"
#include "backend/cuda/decode/moe_gate_up_staged.h"
#include "backend/cuda/decode/moe_common.cuh"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/common/route_topk.cuh"
#include "base/env.h"

#include <algorithm>
#include <cstdlib>

namespace lily::cuda {

namespace {

using namespace quant;
using namespace moe_detail;

constexpr int kGateUpThreads = 128;
constexpr int kGateUpRows = 2;      // rows of G (and of U) per lane group
constexpr int kDownThreads = 256;
// act[t] of all slots in shared memory: 18 KB at Qwen3.6's I = 512 and k = 8; up to 9 x 4096
// floats (144 KB) with the opt-in above the default 48 KB (H200: 227 KB per block).
constexpr int kDownMaxStagedBytes = 160 * 1024;
constexpr int kDownRows = 2;        // output rows per warp
constexpr int kDownSlots = 4;       // slots per lane group loaded together

// ---- Experts: gate/up with SwiGLU ---------------------------------------------------------

struct GateUpParams {
  QView gate, up;              // routed stacks [E, I, H]
  QView shared_gate, shared_up;  // the shared expert [I, H] (slot k)
  const float* x;              // [T, H]
  const int32_t* ids;          // [T, k + 1]
  int E, I, H, k;
  float* act;                  // [T, k + 1, I]
  const float* logits;         // [E] router logits of the one token: choose here (else ids)
};

template <int BITS, int LPR>
__global__ void __launch_bounds__(kGateUpThreads) moe_gate_up_kernel(GateUpParams p) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int R = kGateUpRows, kCodes = 128 / BITS;
  constexpr int kRowsPerWarp = 32 / LPR * R;
  const int cpr = p.H / kCodes, gpr = p.H / 64;
  const int ts = blockIdx.y, t = ts / (p.k + 1), s = ts % (p.k + 1);  // slot ts = t * (k + 1) + s
  const bool shared = s == p.k;
  const int e = shared ? 0 : min(max(p.ids[ts], 0), p.E - 1);
  const QView gate = shared ? p.shared_gate : p.gate;
  const QView up = shared ? p.shared_up : p.up;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPR;
  const int i0 = (blockIdx.x * (kGateUpThreads / 32) + warp) * kRowsPerWarp + lane / LPR * R;
  const float* x = p.x + int64_t(t) * p.H;

  QRow w[2 * R];  // rows 0..R-1 of G_e, then the same rows of U_e
  float acc[2 * R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = int64_t(e) * p.I + min(i0 + r, p.I - 1);
    w[r] = row_of(gate, row, cpr, gpr);
    w[R + r] = row_of(up, row, cpr, gpr);
    acc[r] = acc[R + r] = 0.f;
  }
  rows_dot<BITS, LPR, 2 * R>(w, x, cpr, sub, acc);
#pragma unroll
  for (int r = 0; r < 2 * R; ++r) acc[r] = group_sum<LPR>(acc[r]);
  if (sub == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      if (i0 + r < p.I) p.act[int64_t(ts) * p.I + i0 + r] = silu(acc[r]) * acc[R + r];
  }
}

// The same on the tensor cores (4-bit, H <= kMaxHidden; quant_mma.cuh): block (16 rows of G and
// of U, slot ts), 4 warps splitting the H columns; x staged as bf16 hi/lo fragments; the warps'
// partial rows summed in shared memory in a fixed order. The shared expert's weights (slot k)
// are loaded before the PDL wait; a routed slot's after its id.
constexpr int kGateUpMmaWarps = 4;
constexpr int kGateUpMmaPairs = 2;  // pairs of 128-column blocks per load step (G and U: 8 uint4 each)

// (A cap at 128, four blocks per SM, spilled and the 4K decode step lost 7%: docs/perf.md.)
// MIN_BLOCKS 3 caps the registers at 170 so that the 288 blocks of a token run in one wave on 132
// SMs; uncapped, the choice from the logits takes it to 178 (two blocks per SM). Capped, ptxas
// spills 168 bytes (LILY_GATEUP_MIN_BLOCKS=1: uncapped, for the A/B run).
template <int MIN_BLOCKS>
__global__ void __launch_bounds__(32 * kGateUpMmaWarps, MIN_BLOCKS) moe_gate_up_mma_kernel(GateUpParams p) {
  using namespace quant_mma;
  __shared__ __align__(16) uint4 frag[fragment_uint4s(kMaxHidden)];
  __shared__ float gsum[kMaxHidden / 64];
  __shared__ __align__(16) uint4 zero[kFragU4PerChunk];
  __shared__ float partial[kGateUpMmaWarps][32];  // [warp][G rows 0..15 | U rows 0..15]
  __shared__ float choice_logits[kMaxExperts];
  __shared__ int choice_id;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int ts = blockIdx.y, t = ts / (p.k + 1), s = ts % (p.k + 1);
  const bool shared = s == p.k;
  const QView gate = shared ? p.shared_gate : p.gate;
  const QView up = shared ? p.shared_up : p.up;
  const int cpr = p.H / 32, pairs = (p.H + kPairCols - 1) / kPairCols;
  const int per_warp = pairs_per_warp(pairs, kGateUpMmaWarps, kGateUpMmaPairs);
  const int pair_begin = warp * per_warp, pair_end = min(pairs, pair_begin + per_warp);
  const int i_g = min(int(blockIdx.x) * 16 + g, p.I - 1), i_g8 = min(int(blockIdx.x) * 16 + g + 8, p.I - 1);

  TileLoad<kGateUpMmaPairs> tg, tu;
  auto load = [&](int e, int pair0) {
    const int64_t rg = int64_t(e) * p.I + i_g, rg8 = int64_t(e) * p.I + i_g8;
    load_tile(tg, gate.codes, gate.scales, gate.biases, rg, rg8, cpr, pair0);
    load_tile(tu, up.codes, up.scales, up.biases, rg, rg8, cpr, pair0);
  };
  // The shared expert's weights depend on nothing: into L2 before the wait. (Not into registers:
  // held across the wait they would raise the kernel's registers where a routed block chooses
  // its expert, and at 186 registers the 288 blocks no longer fit on 132 SMs in one wave.)
  if (shared && pair_begin < pair_end)
    for (int pair0 = pair_begin; pair0 < pair_end; pair0 += kGateUpMmaPairs) {
      const int64_t rg = i_g, rg8 = i_g8;
      prefetch_tile_l2<kGateUpMmaPairs>(gate.codes, gate.scales, gate.biases, rg, rg8, cpr, pair0);
      prefetch_tile_l2<kGateUpMmaPairs>(up.codes, up.scales, up.biases, rg, rg8, cpr, pair0);
    }
  pdl_wait();
  pdl_launch_dependents();
  int e = 0;
  if (!shared && p.logits) {  // this block's expert: rank s of the logits' top-k (as moe_route_norm)
    if (warp == 0) {
      warp_load_logits(p.logits, p.E, choice_logits);
      const int chosen = warp_route_rank(choice_logits, p.E, s);
      if (lane == 0) choice_id = chosen;
    }
    __syncthreads();
    e = min(max(choice_id, 0), p.E - 1);
  } else if (!shared) {
    e = min(max(p.ids[ts], 0), p.E - 1);
  }
  if (pair_begin < pair_end) load(e, pair_begin);

  if (threadIdx.x < kFragU4PerChunk) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
  stage_x_fragments(p.x + int64_t(t) * p.H, p.H, frag, gsum);
  __syncthreads();

  float yg[2] = {0.f, 0.f}, yu[2] = {0.f, 0.f};  // rows g, g + 8
  for (int pair0 = pair_begin; pair0 < pair_end; pair0 += kGateUpMmaPairs) {
    if (pair0 != pair_begin) load(e, pair0);
    dot_tile(tg, frag, gsum, zero, cpr, pair0, yg[0], yg[1]);
    dot_tile(tu, frag, gsum, zero, cpr, pair0, yu[0], yu[1]);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) yg[r] = quad_sum(yg[r]), yu[r] = quad_sum(yu[r]);
  if (lane % 4 == 0) {
    partial[warp][g] = yg[0], partial[warp][g + 8] = yg[1];
    partial[warp][16 + g] = yu[0], partial[warp][16 + g + 8] = yu[1];
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int i = blockIdx.x * 16 + threadIdx.x;
    float gs = 0.f, us = 0.f;
#pragma unroll
    for (int w = 0; w < kGateUpMmaWarps; ++w) gs += partial[w][threadIdx.x], us += partial[w][16 + threadIdx.x];
    if (i < p.I) p.act[int64_t(ts) * p.I + i] = silu(gs) * us;
  }
}

// ---- Experts: down projection, weighted, added into the residual --------------------------

struct DownParams {
  QView down;                 // routed stack [E, H, I]
  QView shared_down;          // the shared expert [H, I] (slot k)
  const float* act;           // [T, k + 1, I]
  const int32_t* ids;         // [T, k + 1]
  const float* weights;       // [T, k + 1]
  int E, H, I, k;
  float* out;                 // [T, H]
  bool ids_before_launch;     // ids readable before pdl_wait (moe_down_accumulate)
  const float* logits;        // [E] router logits of the one token: choose here (else ids, weights)
};

template <int BITS, int LPR>
__global__ void __launch_bounds__(kDownThreads) moe_down_kernel(DownParams p) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int R = kDownRows, S = kDownSlots, kCodes = 128 / BITS, kChunksPerGroup = 64 / kCodes;
  constexpr int kSlotLanes = 32 / LPR;  // slots processed side by side in a warp
  const int cpr = p.I / kCodes, gpr = p.I / 64;
  const int t = blockIdx.y, slots = p.k + 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPR, sg = lane / LPR;
  const int row0 = (blockIdx.x * (kDownThreads / 32) + warp) * R;

  // act[t] of every slot into shared memory, swizzled per slot row: read from global memory, each
  // lane's float4 loads of its own chunk would touch a different 128-byte line (L1-bound).
  extern __shared__ float4 act_s[];  // [slots][I / 4]
  const int i4 = p.I / 4;
  const float4* act4 = reinterpret_cast<const float4*>(p.act + int64_t(t) * slots * p.I);
  for (int j = threadIdx.x; j < slots * i4; j += kDownThreads) act_s[(j / i4) * i4 + swizzle(j % i4)] = __ldg(act4 + j);
  __syncthreads();
  int row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) row[r] = min(row0 + r, p.H - 1);

  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int c = sub; c < cpr; c += LPR) {
    for (int s0 = sg; s0 < slots; s0 += kSlotLanes * S) {
      uint4 q[S][R];
      float sc[S][R], bi[S][R];
#pragma unroll
      for (int u = 0; u < S; ++u) {
        const int s = s0 + u * kSlotLanes < slots ? s0 + u * kSlotLanes : s0;
        const bool shared = s == p.k;
        const int e = shared ? 0 : min(max(p.ids[int64_t(t) * slots + s], 0), p.E - 1);
        const QView m = shared ? p.shared_down : p.down;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int64_t rr = int64_t(e) * p.H + row[r];
          q[u][r] = load_codes(m.codes + rr * cpr + c);
          sc[u][r] = load_bf16(m.scales + rr * gpr + c / kChunksPerGroup);
          bi[u][r] = load_bf16(m.biases + rr * gpr + c / kChunksPerGroup);
        }
      }
#pragma unroll
      for (int u = 0; u < S; ++u) {
        const int s = s0 + u * kSlotLanes;
        if (s >= slots) break;
        const int64_t ts = int64_t(t) * slots + s;
        const float ws = __ldg(p.weights + ts);
        float xr[kCodes];
        const float sx = load_x_staged(act_s + s * i4, c, xr);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] += ws * fmaf(sc[u][r], chunk_dot<BITS>(q[u][r], xr), bi[u][r] * sx);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    acc[r] = group_sum<32>(acc[r]);  // over the chunks and the slots
    if (lane == 0 && row0 + r < p.H) p.out[int64_t(t) * p.H + row0 + r] += acc[r];
  }
}

// ---- Launchers ----------------------------------------------------------------------------

// The shared expert must fit the routed launches' slot shape.
void check_shared(const QMatrix& routed, const QMatrix& shared, const char* what) {
  LILY_CHECK(shared.rows == routed.rows && shared.cols == routed.cols && shared.bits == routed.bits &&
                 shared.group_size == 64,
             "{}: the shared expert [{}, {}] q{} must have the routed experts' shape [{}, {}] q{}", what, shared.rows,
             shared.cols, shared.bits, routed.rows, routed.cols, routed.bits);
}

// The same on the tensor cores (4-bit; quant_mma.cuh): block (16 output rows, token t), one warp
// per slot (k + 1 warps); act[t] of every slot staged as bf16 hi/lo fragments (dynamic shared
// memory, 4 bytes per activation); each warp's 16 rows weighted and summed over the slots in
// slot order by 16 threads, added into out. The shared expert's weights (slot k) are loaded
// before the PDL wait.
constexpr int kDownMmaPairs = 2;  // pairs of 128-column blocks per load step (I = 512: all)

__global__ void __launch_bounds__(32 * (kMaxK + 1)) moe_down_mma_kernel(DownParams p) {
  using namespace quant_mma;
  extern __shared__ uint4 down_smem[];
  const int slots = p.k + 1;
  uint4* frag = down_smem;                                               // [slots][fragment_uint4s(I)]
  float* act_s = reinterpret_cast<float*>(frag + size_t(slots) * fragment_uint4s(p.I));  // [slots][I]
  float* gsum = act_s + size_t(slots) * p.I;                             // [slots][I / 64]
  __shared__ __align__(16) uint4 zero[kFragU4PerChunk];
  __shared__ float partial[kMaxK + 1][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int t = blockIdx.y, s = warp;  // this warp's slot
  const bool shared = s == p.k;
  const QView down = shared ? p.shared_down : p.down;
  const int cpr = p.I / 32, pairs = (p.I + kPairCols - 1) / kPairCols;
  const int r_g = min(int(blockIdx.x) * 16 + g, p.H - 1), r_g8 = min(int(blockIdx.x) * 16 + g + 8, p.H - 1);

  TileLoad<kDownMmaPairs> tile;
  auto load = [&](int e, int pair0) {
    load_tile(tile, down.codes, down.scales, down.biases, int64_t(e) * p.H + r_g, int64_t(e) * p.H + r_g8, cpr, pair0);
  };
  // Before the wait: the shared expert's weights, and the routed ones when their ids were
  // written two kernels back (read through L2: this SM's L1 may hold an older step's ids), or
  // when this block chooses them from the logits (also two kernels back).
  __shared__ float choice_logits[kMaxExperts];
  __shared__ int32_t choice_ids[kMaxK + 1];
  __shared__ float choice_weights[kMaxK + 1];
  if (p.logits) {
    if (warp == 0) {
      warp_load_logits(p.logits, p.E, choice_logits);
      warp_route_topk(choice_logits, p.E, p.k, choice_ids, choice_weights);
      if (lane == 0) choice_ids[p.k] = 0, choice_weights[p.k] = __ldcg(p.weights + p.k);  // the shared gate
    }
    __syncthreads();
  }
  const int64_t id_index = int64_t(t) * slots + s;
  const bool early = shared || p.ids_before_launch || p.logits;
  int e = 0;
  if (!shared && p.logits) e = min(max(choice_ids[s], 0), p.E - 1);
  else if (!shared && p.ids_before_launch) e = min(max(__ldcg(p.ids + id_index), 0), p.E - 1);
  if (early) load(e, 0);
  pdl_wait();
  pdl_launch_dependents();
  if (!early) {
    e = min(max(p.ids[id_index], 0), p.E - 1);
    load(e, 0);
  }

  if (threadIdx.x < kFragU4PerChunk) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
  // act[t] of every slot into shared memory in one round of loads (staging each slot's
  // fragments straight from global memory cost a memory latency per slot: 9 in a row), then
  // the fragments from there.
  {
    const float4* act4 = reinterpret_cast<const float4*>(p.act + int64_t(t) * slots * p.I);
    float4* act_s4 = reinterpret_cast<float4*>(act_s);
    const int n4 = slots * p.I / 4;
    constexpr int kBatch = 4;  // float4s per thread per round: one round at k = 8, I = 512
    for (int i0 = threadIdx.x; i0 < n4; i0 += kBatch * blockDim.x) {
      float4 v[kBatch];
#pragma unroll
      for (int r = 0; r < kBatch; ++r) {
        const int i = i0 + r * blockDim.x;
        v[r] = i < n4 ? __ldcg(act4 + i) : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int r = 0; r < kBatch; ++r)
        if (i0 + r * int(blockDim.x) < n4) act_s4[i0 + r * blockDim.x] = v[r];
    }
  }
  __syncthreads();
  // The slots are consecutive in act_s, frag and gsum alike (I is a multiple of 64): one row of
  // slots x I columns, staged in one call whose batches overlap the slots' shuffle sums (a call
  // per slot ran their group sums one slot after another).
  stage_x_fragments<4>(act_s, slots * p.I, frag, gsum);
  __syncthreads();

  const uint4* my_frag = frag + size_t(s) * fragment_uint4s(p.I);
  const float* my_gsum = gsum + s * (p.I / 64);
  float y_g = 0.f, y_g8 = 0.f;
  for (int pair0 = 0; pair0 < pairs; pair0 += kDownMmaPairs) {
    if (pair0 != 0) load(e, pair0);
    dot_tile(tile, my_frag, my_gsum, zero, cpr, pair0, y_g, y_g8);
  }
  y_g = quad_sum(y_g);
  y_g8 = quad_sum(y_g8);
  if (lane % 4 == 0) partial[s][g] = y_g, partial[s][g + 8] = y_g8;
  __syncthreads();
  if (threadIdx.x < 16) {
    const int row = blockIdx.x * 16 + threadIdx.x;
    float sum = 0.f;
    for (int j = 0; j < slots; ++j)
      sum = fmaf(p.logits ? choice_weights[j] : p.weights[int64_t(t) * slots + j], partial[j][threadIdx.x], sum);
    if (row < p.H) p.out[int64_t(t) * p.H + row] += sum;
  }
}

// Dynamic shared memory of moe_down_mma_kernel: the fragments (4 bytes per activation), the
// activations (fp32) and the group sums of every slot.
size_t down_mma_smem(int slots, int I) {
  return size_t(slots) * (size_t(quant_mma::fragment_uint4s(I)) * sizeof(uint4) + size_t(I) * sizeof(float) +
                          size_t(I / 64) * sizeof(float));
}
constexpr size_t kDownMmaMaxSmem = 200 * 1024;

// The tensor-core expert kernels serve 4-bit experts (unless LILY_MMA_GEMV=0).
bool moe_mma_enabled(const QMatrix& m) { return m.bits == 4 && quant_mma::decode_mma_enabled(); }

}  // namespace

bool moe_experts_can_choose(const QMatrix& gate, const QMatrix& down, int E, int k) {
  return moe_mma_enabled(gate) && moe_mma_enabled(down) && gate.cols <= kMaxHidden &&
         down_mma_smem(k + 1, down.cols) <= kDownMmaMaxSmem && E <= kMaxExperts && k <= kMaxK;
}

void moe_gate_up(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate, const QMatrix& shared_up,
                 const float* x, const int32_t* expert_ids, int T, int k, float* act, cudaStream_t stream,
                 const float* router_logits) {
  check_matrix(gate, "moe_gate_up");
  LILY_CHECK(gate.batch == up.batch && gate.rows == up.rows && gate.cols == up.cols && gate.bits == up.bits &&
                 up.group_size == 64,
             "moe_gate_up: gate [{}, {}, {}] q{} and up [{}, {}, {}] q{} differ", gate.batch, gate.rows, gate.cols,
             gate.bits, up.batch, up.rows, up.cols, up.bits);
  check_shared(gate, shared_gate, "moe_gate_up (gate)");
  check_shared(gate, shared_up, "moe_gate_up (up)");
  LILY_CHECK(k >= 1, "moe_gate_up: k = {}", k);
  check_aligned(x, "moe_gate_up: x");
  if (T <= 0) return;
  LILY_CHECK(!router_logits || (T == 1 && k <= kMaxK && gate.batch <= kMaxExperts && moe_mma_enabled(gate) &&
                                 gate.cols <= kMaxHidden),
             "moe_gate_up: choosing from the logits needs one token and the tensor-core kernel");
  if (T == 1 && moe_mma_enabled(gate) && moe_gate_up_staged_supports(gate, up, shared_gate, shared_up, x, k)) {
    moe_gate_up_staged(gate, up, shared_gate, shared_up, x, expert_ids, router_logits, k, act, stream);
    return;
  }
  const GateUpParams p{view(gate), view(up), view(shared_gate), view(shared_up), x, expert_ids, gate.batch,
                       gate.rows, gate.cols, k, act, router_logits};
  if (moe_mma_enabled(gate) && gate.cols <= kMaxHidden) {
    const dim3 grid(unsigned((gate.rows + 15) / 16), unsigned(T * (k + 1)));
    static const bool uncapped = env_value("LILY_GATEUP_MIN_BLOCKS").starts_with('1');
    if (uncapped)
      moe_gate_up_mma_kernel<1><<<grid, 32 * kGateUpMmaWarps, 0, stream>>>(p);
    else
      moe_gate_up_mma_kernel<3><<<grid, 32 * kGateUpMmaWarps, 0, stream>>>(p);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int lanes = lanes_per_row(gate.cols * gate.bits / 128);
  const int rows_per_block = kGateUpThreads / lanes * kGateUpRows;
  const dim3 grid(unsigned((gate.rows + rows_per_block - 1) / rows_per_block), unsigned(T * (k + 1)));
  dispatch_bits_lanes(gate.bits, lanes, [&](auto bits, auto lpr) {
    moe_gate_up_kernel<decltype(bits)::value, decltype(lpr)::value><<<grid, kGateUpThreads, 0, stream>>>(p);
  });
  CUDA_CHECK_LAUNCH();
}

void moe_down_accumulate(const QMatrix& down, const QMatrix& shared_down, const float* act, const int32_t* expert_ids,
                         const float* expert_weights, int T, int k, float* out, cudaStream_t stream,
                         bool ids_before_launch, const float* router_logits) {
  check_matrix(down, "moe_down_accumulate");
  check_shared(down, shared_down, "moe_down_accumulate");
  LILY_CHECK(k >= 1, "moe_down_accumulate: k = {}", k);
  check_aligned(act, "moe_down_accumulate: act");
  if (T <= 0) return;
  LILY_CHECK(!router_logits || (T == 1 && k <= kMaxK && down.batch <= kMaxExperts && moe_mma_enabled(down) &&
                                 down_mma_smem(k + 1, down.cols) <= kDownMmaMaxSmem),
             "moe_down_accumulate: choosing from the logits needs one token and the tensor-core kernel");
  const DownParams p{view(down), view(shared_down), act, expert_ids, expert_weights, down.batch, down.rows, down.cols,
                     k, out, ids_before_launch, router_logits};
  if (moe_mma_enabled(down) && down_mma_smem(k + 1, down.cols) <= kDownMmaMaxSmem) {
    static const bool configured = [] {  // once: allow more than 48 KB
      CUDA_CHECK(cudaFuncSetAttribute(moe_down_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(kDownMmaMaxSmem)));
      return true;
    }();
    (void)configured;
    const dim3 grid(unsigned((down.rows + 15) / 16), unsigned(T));
    moe_down_mma_kernel<<<grid, 32 * (k + 1), down_mma_smem(k + 1, down.cols), stream>>>(p);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t staged = size_t(k + 1) * size_t(down.cols) * sizeof(float);
  LILY_CHECK(staged <= size_t(kDownMaxStagedBytes), "moe_down_accumulate: {} slots of {} activations exceed {} bytes",
             k + 1, down.cols, kDownMaxStagedBytes);
  const int rows_per_block = kDownThreads / 32 * kDownRows;
  const dim3 grid(unsigned((down.rows + rows_per_block - 1) / rows_per_block), unsigned(T));
  dispatch_bits_lanes(down.bits, lanes_per_row(down.cols * down.bits / 128), [&](auto bits, auto lpr) {
    auto kernel = moe_down_kernel<decltype(bits)::value, decltype(lpr)::value>;
    static const bool configured = [&] {  // once per instantiation: allow more than 48 KB
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kDownMaxStagedBytes));
      return true;
    }();
    (void)configured;
    kernel<<<grid, kDownThreads, staged, stream>>>(p);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
