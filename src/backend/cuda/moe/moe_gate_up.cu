// moe_gate_up.cu: the second of the decode MoE's three launches (moe_decode.h), with the weights
// through registers (GateUpKernel::mma); moe_gate_up_staged.cu has the shared-memory form.
//
//   slot s < k: e = rank s of top-k(softmax(logits)) (route_topk.cuh);  slot k: the shared expert
//   act[s, i] = silu(G_e[i] . x) * (U_e[i] . x)
// Shapes:   gate, up: stacks [E, I, H] 4-bit group 64 (mlx layout) · shared_gate, shared_up [I, H]
//           · x [T, H] fp32 · logits [T, E] fp32 · act [T, k + 1, I] fp32.  H <= 4096, I multiples
//           of 64, T <= kMoeSlotsMaxRows (a decode step: 1).
// Layout:   grid (I / 16, k + 1, T), 4 warps: a block owns 16 rows of G and the same 16 of U of its
//           slot's expert, the warps split H in pairs of 256 columns (quant_mma.cuh: codes exact in
//           bf16, x as bf16 hi + lo, fp32-level accuracy; 8 uint4 loads of G and U in flight per
//           lane); x is staged as mma fragments; the warps' partial rows are summed in shared
//           memory in a fixed order. Warp 0 of a routed block chooses the expert after the PDL
//           wait; the shared expert's rows go into L2 before it.
// Registers: capped at 170 (3 blocks per SM) so that the 288 blocks of the model run in one wave
//           on 132 SMs; ptxas spills 168 bytes there (uncapped: 178, two waves).
// Tested:   tests/cuda/test_moe.cu (GateUp: both kernels by name at edge shapes against
//           cpu::linear, the chosen experts against the CPU's top-k).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/moe/moe_common.cuh"
#include "backend/cuda/moe/moe_decode.h"
#include "backend/cuda/moe/moe_gate_up_staged.h"
#include "backend/cuda/moe/route_topk.cuh"

namespace lily::cuda {

namespace {

using namespace moe_detail;

constexpr int kGateUpMmaWarps = 4;
constexpr int kGateUpMmaPairs = 2;  // pairs of 128-column blocks per load step (G and U: 8 uint4 each)

struct GateUpParams {
  QView gate, up;                // routed stacks [E, I, H]
  QView shared_gate, shared_up;  // the shared expert [I, H] (slot k)
  const float* x;                // [T, H]
  const float* logits;           // [T, E] router logits: each routed block chooses its expert
  int E, I, H, k;
  float* act;  // [T, k + 1, I]
};

// Slot blockIdx.y's rows blockIdx.x of one token; kManyRows: token blockIdx.z of a step of
// several (x, logits and act offset by it), else the one token of a decode step.
template <bool kManyRows>
__global__ void __launch_bounds__(32 * kGateUpMmaWarps, 3) moe_gate_up_mma_kernel(GateUpParams p) {
  trace::BlockTrace trace(trace::kind_moe_gate_up);
  using namespace quant_mma;
  __shared__ __align__(16) uint4 frag[fragment_uint4s(kMaxHidden)];
  __shared__ float gsum[kMaxHidden / 64];
  __shared__ __align__(16) uint4 zero[kFragU4PerChunk];
  __shared__ float partial[kGateUpMmaWarps][32];  // [warp][G rows 0..15 | U rows 0..15]
  __shared__ float choice_logits[kMaxExperts];
  __shared__ int choice_id;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int s = blockIdx.y;                      // this block's slot
  const int64_t t = kManyRows ? blockIdx.z : 0;  // its token
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
  // its expert, and the blocks would no longer fit on the SMs in one wave.)
  if (shared && pair_begin < pair_end)
    for (int pair0 = pair_begin; pair0 < pair_end; pair0 += kGateUpMmaPairs) {
      const int64_t rg = i_g, rg8 = i_g8;
      prefetch_tile_l2<kGateUpMmaPairs>(gate.codes, gate.scales, gate.biases, rg, rg8, cpr, pair0);
      prefetch_tile_l2<kGateUpMmaPairs>(up.codes, up.scales, up.biases, rg, rg8, cpr, pair0);
    }
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);
  int e = 0;
  if (!shared) {  // this block's expert: rank s of the logits' top-k
    if (warp == 0) {
      warp_load_logits(p.logits + t * p.E, p.E, choice_logits);
      const int chosen = warp_route_rank(choice_logits, p.E, s);
      if (lane == 0) choice_id = chosen;
    }
    __syncthreads();
    e = min(max(choice_id, 0), p.E - 1);
  }
  if (pair_begin < pair_end) load(e, pair_begin);

  if (threadIdx.x < kFragU4PerChunk) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
  stage_x_fragments(p.x + t * p.H, p.H, frag, gsum);
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
    if (i < p.I) p.act[(t * (p.k + 1) + s) * p.I + i] = silu(gs) * us;
  }
}

void launch_mma(const MoeDecodeArgs& a, cudaStream_t stream) {
  const GpuMoe& w = *a.w;
  const GateUpParams p{
      view(w.experts_gate), view(w.experts_up),   view(w.shared_gate), view(w.shared_up),   a.buffers.x,
      a.buffers.logits,     w.experts_gate.batch, w.experts_gate.rows, w.experts_gate.cols, a.k,
      a.buffers.act};
  const dim3 grid(unsigned((w.experts_gate.rows + 15) / 16), unsigned(a.k + 1), unsigned(a.rows));
  if (a.rows == 1) moe_gate_up_mma_kernel<false><<<grid, 32 * kGateUpMmaWarps, 0, stream>>>(p);
  else moe_gate_up_mma_kernel<true><<<grid, 32 * kGateUpMmaWarps, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

const char* kernel_name(GateUpKernel kernel) {
  return kernel == GateUpKernel::staged ? "moe_gate_up_staged" : "moe_gate_up_mma";
}

// G, U: stacks [E, I, H], the shared expert [I, H], H a multiple of 64 up to 4096, I of 64.
bool moe_detail::gate_up_supports(GateUpKernel kernel, const GpuMoe& w, int k) {
  const QMatrix &G = w.experts_gate, &U = w.experts_up, &SG = w.shared_gate, &SU = w.shared_up;
  const int E = G.batch, I = G.rows, H = G.cols;
  const bool shapes = U.batch == E && U.rows == I && U.cols == H && SG.batch == 1 && SG.rows == I && SG.cols == H &&
                      SU.batch == 1 && SU.rows == I && SU.cols == H && H > 0 && H % 64 == 0 && H <= kMaxHidden &&
                      I > 0 && I % 64 == 0;
  if (!shapes || !choice_ok(E, k) || !expert_matrix_ok(G) || !expert_matrix_ok(U) || !expert_matrix_ok(SG) ||
      !expert_matrix_ok(SU))
    return false;
  return kernel == GateUpKernel::mma || moe_gate_up_staged_supports(G, U, SG, SU, k);
}

void moe_gate_up(GateUpKernel kernel, const MoeDecodeArgs& a, cudaStream_t stream) {
  const GpuMoe& w = *a.w;
  LILY_CHECK(gate_up_supports(kernel, w, a.k),
             "moe_gate_up: the {} kernel does not take [{}, {}, {}] q{} experts, k {}", kernel_name(kernel),
             w.experts_gate.batch, w.experts_gate.rows, w.experts_gate.cols, w.experts_gate.bits, a.k);
  check_aligned(a.buffers.x, "moe_gate_up: x");
  LILY_CHECK(a.rows >= 1 && a.rows <= kMoeSlotsMaxRows, "moe_gate_up: {} rows (1 to {})", a.rows, kMoeSlotsMaxRows);
  if (kernel == GateUpKernel::staged)
    moe_gate_up_staged(w.experts_gate, w.experts_up, w.shared_gate, w.shared_up, a.buffers.x, a.buffers.logits, a.k,
                       a.rows, a.buffers.act, stream);
  else launch_mma(a, stream);
}

}  // namespace lily::cuda
