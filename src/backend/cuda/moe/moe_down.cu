// moe_down.cu: the last of the decode MoE's three launches (moe_decode.h): the experts' down
// projections, weighted and added into the residual, for one token.
//
//   (e_s, w_s) = top-k(softmax(logits)), renormalised (route_topk.cuh);  slot k: the shared
//   expert with w_k = shared_weight (or its sigmoid, when the route left the logit)
//   h[r] += sum_{s <= k} w_s * (D_{e_s}[r] . act[s])          (the slots summed in slot order)
// Shapes:   down: stack [E, H, I] 4-bit group 64 · shared_down [H, I] · act [T, k + 1, I] fp32 ·
//           logits [T, E] · shared_weight [T] · h [T, H] fp32 (T rows; a decode step: 1).  I a multiple of 64 with the
//           staged activations of all slots within kDownMmaMaxSmem (I <= 2,800 at k = 8).
// Layout:   grid (H / 16, T), one warp per slot (k + 1 warps): warp 0 chooses the experts and their
//           weights from the logits BEFORE the PDL wait (route wrote them two launches back), and
//           every warp loads its first weights then; after the wait act of all slots comes into
//           shared memory in one round of loads and is staged as bf16 hi + lo mma fragments
//           (quant_mma.cuh); each warp computes its slot's 16 rows on the tensor cores, and 16
//           threads weight and sum the slots in order and add into h: one owner per output, no
//           atomics, deterministic.
// Tested:   tests/cuda/test_moe.cu (Down: edge shapes against cpu::linear with the CPU's top-k;
//           WholeBlockMatchesCpu: the three launches against cpu::sparse_moe).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/moe/moe_common.cuh"
#include "backend/cuda/moe/moe_decode.h"
#include "backend/cuda/moe/route_topk.cuh"

namespace lily::cuda {

namespace {

using namespace moe_detail;

constexpr int kDownMmaPairs = 2;  // pairs of 128-column blocks per load step (I = 512: all)
constexpr size_t kDownMmaMaxSmem = 200 * 1024;

struct DownParams {
  QView down;                  // routed stack [E, H, I]
  QView shared_down;           // the shared expert [H, I] (slot k)
  const float* act;            // [T, k + 1, I]
  const float* logits;         // [T, E] router logits
  const float* shared_weight;  // [T] the shared expert's gate
  int E, H, I, k;
  float* out;  // [T, H] the residual stream, added to
};

// The shared expert's weight: *w, or its sigmoid where the route left the logit x . w_sg (the
// rows' route, moe_route_rows.h). Read through L2 (written two launches back).
__device__ __forceinline__ float shared_expert_weight(const float* w, bool logit) {
  const float v = __ldcg(w);
  return logit ? 1.f / (1.f + expf(-v)) : v;
}

// Rows blockIdx.x of one token (the kernels below).
__device__ __forceinline__ void moe_down_mma(const DownParams& p, bool gate_logit) {
  trace::BlockTrace trace(trace::kind_moe_down);
  using namespace quant_mma;
  extern __shared__ uint4 down_smem[];
  const int slots = p.k + 1;
  uint4* frag = down_smem;                                                               // [slots][fragment_uint4s(I)]
  float* act_s = reinterpret_cast<float*>(frag + size_t(slots) * fragment_uint4s(p.I));  // [slots][I]
  float* gsum = act_s + size_t(slots) * p.I;                                             // [slots][I / 64]
  __shared__ __align__(16) uint4 zero[kFragU4PerChunk];
  __shared__ float partial[kMaxK + 1][16];
  __shared__ float choice_logits[kMaxExperts];
  __shared__ int32_t choice_ids[kMaxK + 1];
  __shared__ float choice_weights[kMaxK + 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int s = warp;  // this warp's slot
  const bool shared = s == p.k;
  const QView down = shared ? p.shared_down : p.down;
  const int cpr = p.I / 32, pairs = (p.I + kPairCols - 1) / kPairCols;
  const int r_g = min(int(blockIdx.x) * 16 + g, p.H - 1), r_g8 = min(int(blockIdx.x) * 16 + g + 8, p.H - 1);

  TileLoad<kDownMmaPairs> tile;
  auto load = [&](int e, int pair0) {
    load_tile(tile, down.codes, down.scales, down.biases, int64_t(e) * p.H + r_g, int64_t(e) * p.H + r_g8, cpr, pair0);
  };
  // Before the wait: the choice from the logits and the shared expert's weight (written by the
  // router two launches back; read through L2: this SM's L1 may hold an older step's), and every
  // slot's first weights.
  if (warp == 0) {
    warp_load_logits(p.logits, p.E, choice_logits);
    warp_route_topk(choice_logits, p.E, p.k, choice_ids, choice_weights);
    if (lane == 0) choice_ids[p.k] = 0, choice_weights[p.k] = shared_expert_weight(p.shared_weight, gate_logit);
  }
  __syncthreads();
  trace.mark(3);  // the choice made (before the wait)
  const int e = shared ? 0 : min(max(choice_ids[s], 0), p.E - 1);
  load(e, 0);
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);

  if (threadIdx.x < kFragU4PerChunk) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
  // act of every slot into shared memory in one round of loads (staging each slot's fragments
  // straight from global memory cost a memory latency per slot: 9 in a row), then the fragments
  // from there.
  {
    const float4* act4 = reinterpret_cast<const float4*>(p.act);
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
  // slots x I columns, staged in one call whose batches overlap the slots' shuffle sums.
  stage_x_fragments<4>(act_s, slots * p.I, frag, gsum);
  __syncthreads();
  trace.mark(2);

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
  trace.mark(4);
  if (threadIdx.x < 16) {
    const int row = blockIdx.x * 16 + threadIdx.x;
    float sum = 0.f;
    for (int j = 0; j < slots; ++j) sum = fmaf(choice_weights[j], partial[j][threadIdx.x], sum);
    if (row < p.H) p.out[row] += sum;
  }
}

// One token (a decode step); a step of several, token blockIdx.y, the gate a logit or not.
__global__ void __launch_bounds__(32 * (kMaxK + 1)) moe_down_mma_kernel(DownParams p) { moe_down_mma(p, false); }

__global__ void __launch_bounds__(32 * (kMaxK + 1)) moe_down_mma_rows_kernel(DownParams p, bool gate_logit) {
  const int64_t t = blockIdx.y;  // the block's token
  p.act += t * (p.k + 1) * p.I, p.logits += t * p.E, p.shared_weight += t, p.out += t * p.H;
  moe_down_mma(p, gate_logit);
}

// Dynamic shared memory of moe_down_mma_kernel: the fragments (4 bytes per activation), the
// activations (fp32) and the group sums of every slot.
size_t down_mma_smem(int slots, int I) {
  return size_t(slots) * (size_t(quant_mma::fragment_uint4s(I)) * sizeof(uint4) + size_t(I) * sizeof(float) +
                          size_t(I / 64) * sizeof(float));
}

}  // namespace

// D: stack [E, H, I], the shared expert [H, I], I a multiple of 64 with every slot's activations
// within the kernel's shared memory.
bool moe_detail::down_supports(const GpuMoe& w, int k) {
  const QMatrix &D = w.experts_down, &SD = w.shared_down;
  const int E = D.batch, H = D.rows, I = D.cols;
  return choice_ok(E, k) && expert_matrix_ok(D) && expert_matrix_ok(SD) && SD.batch == 1 && SD.rows == H &&
         SD.cols == I && H > 0 && I > 0 && I % 64 == 0 && down_mma_smem(k + 1, I) <= kDownMmaMaxSmem;
}

bool moe_decode_supports(const GpuMoe& w, int k, GateUpKernel gate_up) {
  const QMatrix &G = w.experts_gate, &D = w.experts_down;
  return moe_detail::route_supports(w) && moe_detail::gate_up_supports(gate_up, w, k) &&
         moe_detail::down_supports(w, k) && w.router.rows == G.batch && w.router.cols == G.cols && D.batch == G.batch &&
         D.rows == G.cols && D.cols == G.rows;
}

void moe_down(const MoeDecodeArgs& a, cudaStream_t stream) {
  const GpuMoe& w = *a.w;
  const QMatrix& D = w.experts_down;
  LILY_CHECK(down_supports(w, a.k), "moe_down: [{}, {}, {}] q{} experts, k {}: not supported", D.batch, D.rows, D.cols,
             D.bits, a.k);
  check_aligned(a.buffers.act, "moe_down: act");
  LILY_CHECK(a.rows >= 1 && a.rows <= kMoeSlotsMaxRows, "moe_down: {} rows (1 to {})", a.rows, kMoeSlotsMaxRows);
  static const bool configured = [] {  // once: allow more than 48 KB
    for (const void* kernel : {reinterpret_cast<const void*>(moe_down_mma_kernel),
                               reinterpret_cast<const void*>(moe_down_mma_rows_kernel)}) {
      allow_dynamic_shared_up_to(kernel, kDownMmaMaxSmem, "moe_down_mma");
    }
    return true;
  }();
  (void)configured;
  const MoeDecodeBuffers& b = a.buffers;
  const DownParams p{view(D), view(w.shared_down), b.act, b.logits, b.shared_weight, D.batch, D.rows, D.cols, a.k, b.h};
  const dim3 grid(unsigned((D.rows + 15) / 16), unsigned(a.rows));
  const size_t smem = down_mma_smem(a.k + 1, D.cols);
  check_dynamic_shared(smem, "moe_down_mma");
  if (a.rows == 1 && !a.shared_gate_logit) moe_down_mma_kernel<<<grid, 32 * (a.k + 1), smem, stream>>>(p);
  else moe_down_mma_rows_kernel<<<grid, 32 * (a.k + 1), smem, stream>>>(p, a.shared_gate_logit);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
