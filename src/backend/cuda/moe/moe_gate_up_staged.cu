// moe_gate_up_staged.cu: the MoE's gate/up for one token (decode) with each block's expert rows
// brought into SHARED memory by bulk copies (the copy engine) instead of into registers.
//
//   slot s < k: e = rank s of top-k(softmax(logits));  slot k: the shared expert
//   act[s, i] = silu(G_e[i] . x) * (U_e[i] . x)        i in the block's 16 rows
// Shapes:   gate, up: stacks [E, I, H] 4-bit group 64 (mlx layout) · shared_gate, shared_up [I, H]
//           · x [T, H] fp32 (moe_route's normed rows) · logits [T, E] fp32 · act [T, k + 1, I]
//           fp32; T = 1 in a decode step.
// Layout:   grid (I / 16, k + 1, T), 4 warps. Thread 0 copies the block's 16 rows of G and of U
//           (codes, scales, biases: six contiguous ranges, 36 KB at H = 2048) into dynamic shared
//           memory on one mbarrier: the shared expert's before the PDL wait, a routed expert's
//           as soon as warp 0 has chosen it. Meanwhile the block stages x as bf16 hi/lo mma
//           fragments; then warp w computes the pairs of 256 columns w, w + 4, ... of G and U side
//           by side (shared_rows_dot.cuh: two independent mma chains) and 16 threads sum the
//           pairs in order and write silu(g) * u.
// Why:      held in registers (moe_gate_up.cu), the weights take 168 registers per thread and 3
//           blocks fill an SM's register file, so the down kernel's blocks cannot become resident
//           until gate/up's exit, and down's work before its PDL wait (choosing the experts,
//           loading its weights) lands on the critical path. In shared memory the loads hold no
//           registers (70 per thread).
// Tested:   tests/cuda/test_moe.cu (GateUp: both gate/up kernels by name at the model's shape and
//           edges, against cpu::linear and the CPU's top-k).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/arch.cuh"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/moe/moe_gate_up_staged.h"

#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/common/shared_rows_dot.cuh"
#include "backend/cuda/moe/moe_common.cuh"
#include "backend/cuda/moe/route_topk.cuh"

namespace lily::cuda {

namespace {

using namespace quant_mma;

constexpr int kWarps = 4, kThreads = 32 * kWarps;
constexpr int kMaxHidden = 4096;
constexpr int kRows = 16;  // rows of G (and of U) per block

// One matrix (or stack) as byte ranges: codes [rows, H / 2], scales and biases [rows, H / 64] bf16.
struct StagedMatrix {
  const uint8_t* codes;
  const uint8_t* scales;
  const uint8_t* biases;
};

struct StagedGateUpParams {
  StagedMatrix routed[2];  // G, U stacks [E, I, H]
  StagedMatrix shared[2];  // the shared expert's G, U [I, H] (slot k)
  const float* x;          // [T, H]
  const float* logits;     // [T, E] router logits: each routed block chooses its expert
  int E, I, H, k;
  float* act;  // [T, k + 1, I]
};

// Dynamic shared memory: G then U, each codes | scales | biases of kRows rows.
__host__ __device__ constexpr uint32_t matrix_bytes(int H) { return uint32_t(kRows) * uint32_t(H / 2 + H / 64 * 4); }

// Slot blockIdx.y's rows blockIdx.x of one token (the kernels below).
__device__ __forceinline__ void moe_gate_up_staged_block(StagedGateUpParams p) {
#if LILY_SM90_CODE
  trace::BlockTrace trace(trace::kind_moe_gate_up);
  extern __shared__ __align__(128) uint4 weights_s[];
  __shared__ __align__(16) uint4 frag[fragment_uint4s(kMaxHidden)];
  __shared__ float gsum[kMaxHidden / 64];
  __shared__ __align__(16) uint4 zero[kFragU4PerChunk];
  __shared__ float unit_sum[2][kMaxHidden / kPairCols][16];  // [G | U][pair][row]
  __shared__ float choice_logits[kRouteMaxExperts];
  __shared__ __align__(8) uint64_t copied;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int s = blockIdx.y, row0 = blockIdx.x * kRows;
  const bool shared = s == p.k;
  const int H = p.H, cpr = H / 32, gpr = H / 64, pairs = H / kPairCols;
  const uint32_t code_bytes = uint32_t(kRows) * uint32_t(H / 2), scale_bytes = uint32_t(kRows) * uint32_t(gpr) * 2u;
  uint8_t* base = reinterpret_cast<uint8_t*>(weights_s);

  // One thread: rows [row, row + 16) of G and U into shared memory, completing on `copied`.
  auto issue = [&](const StagedMatrix(&m)[2], int64_t row) {
    ptx::mbarrier_arrive_expect_tx(&copied, 2 * matrix_bytes(H));
    for (int j = 0; j < 2; ++j) {
      uint8_t* dst = base + j * matrix_bytes(H);
      ptx::bulk_copy_to_shared(dst, m[j].codes + row * (H / 2), code_bytes, &copied);
      ptx::bulk_copy_to_shared(dst + code_bytes, m[j].scales + row * gpr * 2, scale_bytes, &copied);
      ptx::bulk_copy_to_shared(dst + code_bytes + scale_bytes, m[j].biases + row * gpr * 2, scale_bytes, &copied);
    }
  };

  // ---- Before the wait: the shared expert's rows depend on nothing in this step ----
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(&copied, 1);
    if (shared) issue(p.shared, row0);
  }
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);

  // A routed slot: warp 0 chooses the expert and its lane 0 starts the copies at once.
  if (!shared && warp == 0) {
    warp_load_logits(p.logits, p.E, choice_logits);
    const int e = min(max(warp_route_rank(choice_logits, p.E, s), 0), p.E - 1);
    if (lane == 0) issue(p.routed, int64_t(e) * p.I + row0);
  }
  // While the rows arrive: x as mma fragments.
  if (threadIdx.x < kFragU4PerChunk) zero[threadIdx.x] = make_uint4(0, 0, 0, 0);
  stage_x_fragments(p.x, H, frag, gsum);
  __syncthreads();  // the fragments, zero, and the barrier's init
  trace.mark(2);
  ptx::mbarrier_wait(&copied, 0);
  trace.mark(3);

  const uint8_t* up_base = base + matrix_bytes(H);
  const uint4* g_codes = reinterpret_cast<const uint4*>(base);
  const uint16_t* g_scales = reinterpret_cast<const uint16_t*>(base + code_bytes);
  const uint16_t* g_biases = g_scales + kRows * gpr;
  const uint4* u_codes = reinterpret_cast<const uint4*>(up_base);
  const uint16_t* u_scales = reinterpret_cast<const uint16_t*>(up_base + code_bytes);
  const uint16_t* u_biases = u_scales + kRows * gpr;
  for (int u = warp; u < pairs; u += kWarps) {  // G and U of pair u: two independent mma chains
    TileLoad<1> tg, tu;
    load_shared_unit(g_codes, g_scales, g_biases, u, cpr, gpr, pairs, tg);
    load_shared_unit(u_codes, u_scales, u_biases, u, cpr, gpr, pairs, tu);
    float g_g = 0.f, g_g8 = 0.f, u_g = 0.f, u_g8 = 0.f;
    dot_tile<1>(tg, frag, gsum, zero, cpr, u, g_g, g_g8);
    dot_tile<1>(tu, frag, gsum, zero, cpr, u, u_g, u_g8);
    store_unit_sum(unit_sum[0], u, g_g, g_g8);
    store_unit_sum(unit_sum[1], u, u_g, u_g8);
  }
  __syncthreads();
  trace.mark(4);
  if (threadIdx.x < kRows) {
    float g = 0.f, up = 0.f;
    for (int j = 0; j < pairs; ++j) g += unit_sum[0][j][threadIdx.x], up += unit_sum[1][j][threadIdx.x];
    p.act[int64_t(s) * p.I + row0 + threadIdx.x] = moe_detail::silu(g) * up;
  }
#else
  __trap();
#endif
}

// One token (a decode step); a step of several, token blockIdx.z.
__global__ void __launch_bounds__(kThreads) moe_gate_up_staged_kernel(StagedGateUpParams p) {
  moe_gate_up_staged_block(p);
}

__global__ void __launch_bounds__(kThreads) moe_gate_up_staged_rows_kernel(StagedGateUpParams p) {
  moe_gate_up_staged_block(moe_detail::gate_up_row(p, blockIdx.z));
}

StagedMatrix bytes_of(const QMatrix& m) {
  return {reinterpret_cast<const uint8_t*>(m.codes), reinterpret_cast<const uint8_t*>(m.scales),
          reinterpret_cast<const uint8_t*>(m.biases)};
}

bool staged_shape(const QMatrix& m, int H, int I) {
  return m.bits == 4 && m.group_size == 64 && m.cols == H && m.rows == I && aligned16(m.codes) && aligned16(m.scales) &&
         aligned16(m.biases);
}

}  // namespace

bool moe_gate_up_staged_supports(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate,
                                 const QMatrix& shared_up, int k) {
  const int H = gate.cols, I = gate.rows;
  return H > 0 && H % 512 == 0 && H <= kMaxHidden && I > 0 && I % kRows == 0 && gate.batch >= 1 &&
         gate.batch <= kRouteMaxExperts && up.batch == gate.batch && k >= 1 && k <= kRouteMaxK && k <= gate.batch &&
         staged_shape(gate, H, I) && staged_shape(up, H, I) && staged_shape(shared_gate, H, I) &&
         staged_shape(shared_up, H, I);
}

void moe_gate_up_staged(const QMatrix& gate, const QMatrix& up, const QMatrix& shared_gate, const QMatrix& shared_up,
                        const float* x, const float* router_logits, int k, int T, float* act, cudaStream_t stream) {
  LILY_CHECK(moe_gate_up_staged_supports(gate, up, shared_gate, shared_up, k) && aligned16(x) && T >= 1,
             "moe_gate_up_staged: [{}, {}, {}] q{} experts, k {}: not supported", gate.batch, gate.rows, gate.cols,
             gate.bits, k);
  static const bool configured = [] {  // once: allow more than 48 KB (72 KB at H = 4096)
    for (const void* kernel : {reinterpret_cast<const void*>(moe_gate_up_staged_kernel),
                               reinterpret_cast<const void*>(moe_gate_up_staged_rows_kernel)}) {
      allow_dynamic_shared(kernel, 2 * matrix_bytes(kMaxHidden), "moe_gate_up_staged");
    }
    return true;
  }();
  (void)configured;
  const StagedGateUpParams p{{bytes_of(gate), bytes_of(up)},
                             {bytes_of(shared_gate), bytes_of(shared_up)},
                             x,
                             router_logits,
                             gate.batch,
                             gate.rows,
                             gate.cols,
                             k,
                             act};
  const dim3 grid(unsigned(gate.rows / kRows), unsigned(k + 1), unsigned(T));
  if (T == 1) moe_gate_up_staged_kernel<<<grid, kThreads, 2 * matrix_bytes(gate.cols), stream>>>(p);
  else moe_gate_up_staged_rows_kernel<<<grid, kThreads, 2 * matrix_bytes(gate.cols), stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
