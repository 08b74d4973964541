// gemv_prefetch.cu: y = RMSNorm(x) @ W^T for ONE row (the decode step's fused input
// projections), with each block's share of the weights copied into its shared memory BEFORE the
// PDL wait, so the whole read of W overlaps the kernels before it in the decode graph.
//
//   y[r] = sum_g scale[r, g] * (sum_{c in g} q[r, c] x[c]) + bias[r, g] * (sum_{c in g} x[c])
//   x <- x * inv * gain, inv = 1 / sqrt(mean(x^2) + eps) (rms_norm, spec §2.2)
// Shapes:   W [rows, cols] 4-bit, group 64, cols a multiple of 512 up to 4096 · x, gain [cols]
//           fp32 · y [rows] fp32.
// Why:      in the decode graph (pdl.cuh) a kernel's blocks are launched while its predecessor
//           still runs: here they spend that time pulling their rows of W into shared memory
//           with the copy engine (three bulk copies by one thread, no registers held), and after
//           the wait only x and the tensor-core math remain.
// Layout:   grid = min(#SMs, tiles of 16 rows); block b owns tiles [b T / G, (b + 1) T / G):
//           one contiguous range of rows, so its codes, scales and biases are three contiguous
//           ranges of global memory, copied as they are (rows of cols / 2 bytes, cols / 64 bf16).
//           The math is quant_mma.cuh's on rows in shared memory (shared_rows_dot.cuh): a unit
//           is (tile, pair of 128-column blocks); warp w of 16 takes units w, w + 16, ...; the
//           unit sums go to shared memory and each row adds its units in pair order.
// Limits:   the rows of one block fit in kMaxWeightBytes of shared memory (at 2048 columns 10
//           tiles: 21,120 rows on 132 SMs; the model's largest, 12,352, takes 6); larger W
//           (lm_head) take gemv.cu's mma_gemv_kernel. Registers capped for 2 blocks of 512
//           threads per SM, so the blocks fit beside the predecessor's.
// Tested:   tests/cuda/test_gemv.cu (block range edges, the model's shapes; against cpu::linear
//           and cpu::rms_norm).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/arch.cuh"
#include "backend/cuda/gemv/gemv_prefetch.h"

#include <algorithm>

#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/common/shared_rows_dot.cuh"

namespace lily::cuda {

namespace {

using namespace quant_mma;

constexpr int kMaxCols = 4096;
constexpr int kMaxUnits = 96;                     // (tile, pair) units of one block
constexpr uint32_t kMaxWeightBytes = 180 * 1024;  // dynamic shared memory (static: ~39 KB)

struct PrefetchGemvParams {
  const uint8_t* codes;   // [rows, cols / 2]
  const uint8_t* scales;  // [rows, cols / 64] bf16
  const uint8_t* biases;  // [rows, cols / 64] bf16
  const float* x;         // [cols]
  const float* gain;      // [cols] the norm's effective gain
  float eps;
  float* y;  // [rows]
  int rows, cols;
};

constexpr int kThreads = 512;  // 16 warps: the units of a block over 16 warps, half the serial math of 8

__global__ void __launch_bounds__(kThreads, 2) prefetch_rms_norm_gemv_kernel(PrefetchGemvParams p) {
#if LILY_SM90_CODE
  trace::BlockTrace trace(trace::kind_prefetch_gemv);
  constexpr int kWarps = kThreads / 32;
  extern __shared__ __align__(128) uint4 weights_s[];  // codes | scales | biases of the block's rows
  __shared__ __align__(16) float xs[kMaxCols];
  __shared__ __align__(16) uint4 frag[fragment_uint4s(kMaxCols)];
  __shared__ float gsum[kMaxCols / 64];
  __shared__ __align__(16) uint4 zero[kFragU4PerChunk];
  __shared__ float unit_sum[kMaxUnits][16];
  __shared__ float red[kWarps];
  __shared__ __align__(8) uint64_t copied;

  const int tiles = (p.rows + 15) / 16;
  const int t_begin = int(int64_t(blockIdx.x) * tiles / gridDim.x);
  const int t_end = int(int64_t(blockIdx.x + 1) * tiles / gridDim.x);
  const int r_begin = 16 * t_begin, nrows = min(16 * t_end, p.rows) - r_begin;
  const int row_bytes = p.cols / 2, gpr = p.cols / 64, cpr = p.cols / 32;
  const int cap_rows = 16 * (t_end - t_begin);  // rows of shared memory (the last tile may be partial)
  const uint4* codes_s = weights_s;
  const uint16_t* scales_s = reinterpret_cast<const uint16_t*>(reinterpret_cast<const uint8_t*>(weights_s) +
                                                               size_t(cap_rows) * row_bytes);
  const uint16_t* biases_s = scales_s + size_t(cap_rows) * gpr;

  // ---- Before the wait: the weights depend on nothing in this step ----
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(&copied, 1);
    const uint32_t code_bytes = uint32_t(nrows) * row_bytes, scale_bytes = uint32_t(nrows) * gpr * 2;
    ptx::mbarrier_arrive_expect_tx(&copied, code_bytes + 2 * scale_bytes);
    ptx::bulk_copy_to_shared(weights_s, p.codes + int64_t(r_begin) * row_bytes, code_bytes, &copied);
    ptx::bulk_copy_to_shared(const_cast<uint16_t*>(scales_s), p.scales + int64_t(r_begin) * gpr * 2, scale_bytes,
                             &copied);
    ptx::bulk_copy_to_shared(const_cast<uint16_t*>(biases_s), p.biases + int64_t(r_begin) * gpr * 2, scale_bytes,
                             &copied);
  }
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);

  stage_input_row<true, kThreads, kMaxCols>(p.x, p.gain, p.eps, p.cols, xs, frag, gsum, zero, red);
  __syncthreads();  // also publishes the barrier's init to every thread
  trace.mark(2);
  ptx::mbarrier_wait(&copied, 0);
  trace.mark(3);

  shared_rows_dot<kWarps>(codes_s, scales_s, biases_s, t_end - t_begin, cpr, gpr, p.cols / kPairCols, frag, gsum, zero,
                          unit_sum);
  __syncthreads();
  trace.mark(4);
  write_row_sums(unit_sum, p.cols / kPairCols, nrows, p.y + r_begin);
#else
  __trap();
#endif
}

// Shared-memory bytes of one tile of 16 rows: codes, then scales and biases (bf16).
uint32_t tile_bytes(int cols) { return 16u * uint32_t(cols / 2 + cols / 64 * 4); }

// One 4-bit matrix, group 64, cols a multiple of 512 up to kMaxCols, its three arrays 16-byte
// aligned (bulk copies).
bool prefetch_shape(const QMatrix& W) {
  return W.bits == 4 && W.group_size == 64 && W.batch == 1 && W.rows > 0 && W.cols % 512 == 0 && W.cols > 0 &&
         W.cols <= kMaxCols && aligned16(W.codes) && aligned16(W.scales) && aligned16(W.biases);
}

struct Plan {
  int grid = 0;
  int max_tiles = 0;  // tiles of 16 rows of the largest block
  uint32_t smem = 0;  // dynamic shared memory of one block
};

Plan plan_for(const QMatrix& W, int multiprocessors) {
  const int tiles = (W.rows + 15) / 16;
  Plan plan;
  plan.grid = std::min(multiprocessors, tiles);
  plan.max_tiles = (tiles + plan.grid - 1) / plan.grid;
  plan.smem = uint32_t(plan.max_tiles) * tile_bytes(W.cols);
  return plan;
}

}  // namespace

bool prefetch_gemv_supports(const QMatrix& W, int multiprocessors) {
  if (!prefetch_shape(W)) return false;
  const Plan plan = plan_for(W, multiprocessors);
  return plan.smem <= kMaxWeightBytes && plan.max_tiles * (W.cols / kPairCols) <= kMaxUnits;
}

void prefetch_rms_norm_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y,
                            cudaStream_t stream) {
  LILY_CHECK(prefetch_gemv_supports(W, multiprocessor_count()) && aligned16(x) && aligned16(gain),
             "prefetch_rms_norm_gemv: [{}, {}] q{} is not supported", W.rows, W.cols, W.bits);
  static const bool configured = [] {  // once: allow more than 48 KB
    allow_dynamic_shared(prefetch_rms_norm_gemv_kernel, kMaxWeightBytes, "prefetch_rms_norm_gemv");
    return true;
  }();
  (void)configured;
  const Plan plan = plan_for(W, multiprocessor_count());
  const PrefetchGemvParams p{reinterpret_cast<const uint8_t*>(W.codes),
                             reinterpret_cast<const uint8_t*>(W.scales),
                             reinterpret_cast<const uint8_t*>(W.biases),
                             x,
                             gain,
                             eps,
                             y,
                             W.rows,
                             W.cols};
  prefetch_rms_norm_gemv_kernel<<<unsigned(plan.grid), kThreads, plan.smem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
