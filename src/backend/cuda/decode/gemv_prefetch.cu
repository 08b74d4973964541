// gemv_prefetch.cu: y = RMSNorm(x) @ W^T for ONE row (decode: the fused input projections), with each block's share of
// the weights copied into its shared memory BEFORE the PDL wait, so the whole read of W overlaps
// the kernels before it in the decode graph.
//
//   y[r] (+)= sum_g scale[r, g] * (sum_{c in g} q[r, c] x[c]) + bias[r, g] * (sum_{c in g} x[c])
//   x <- x * inv * gain, inv = 1 / sqrt(mean(x^2) + eps) (rms_norm, spec §2.2)
// Shapes:   W [rows, cols] 4-bit, group 64, cols a multiple of 512 up to 4096 · x, gain [cols]
//           fp32 · y [rows] fp32.
// Why:      the decode step is a chain of ~250 dependent kernels; a GEMV that starts loading its
//           weights only when its predecessor ends pays a DRAM round trip and the transfer on
//           the critical path. In the graph (pdl.cuh) a kernel's blocks are launched while its
//           predecessor still runs: here they spend that time pulling their rows of W into
//           shared memory with the copy engine (three bulk copies, one thread, no registers
//           held), and after the wait only x and the tensor-core math remain.
//           LILY_DECODE_SKIP=in_proj measured the fused input projection (14 MB) at ~9 us in the
//           graph against 3.3 us of bandwidth (docs/perf.md).
// Layout:   grid = min(#SMs, tiles of 16 rows); block b owns tiles [b T / G, (b + 1) T / G):
//           one contiguous range of rows, so its codes, scales and biases are three contiguous
//           ranges of global memory, copied as they are (rows of cols / 2 bytes, cols / 64 bf16).
//           The math is quant_mma.cuh's (16 rows per warp, codes exact in bf16, x as bf16 hi +
//           lo): a unit is (tile, pair of 128-column blocks); warp w takes units w, w + 8, ...;
//           the unit sums go to shared memory and each row adds its units in pair order.
//           Shared-memory banks: rows are a multiple of 128 bytes apart, so lanes g and g + 1
//           (one quarter-warp of a 16-byte load) would hit the same banks; odd g load the two
//           blocks of a pair in the opposite order.
// Limits:   the rows of one block fit in kMaxWeightBytes of shared memory (at 2048 columns 10
//           tiles, 21,120 rows on 132 SMs; the model's largest, 12,352, takes 6); larger W (lm_head) take gemv.cu's
//           mma_gemv_kernel. Registers capped for 3 blocks of 256 threads per SM, so the blocks
//           fit beside the predecessor's. LILY_PREFETCH_GEMV=0 turns the kernel off (A/B runs).
//           Blocks of 16 warps (63 registers, one unit per step); LILY_PREFETCH_WARPS=8 runs the
//           8-warp form (A/B).
// Streaming: opt-in, LILY_STREAM_GEMV=1 (measured slower than mma_gemv at lm_head, session 5):
//           stream_rms_norm_gemv_kernel (lm_head, 248,320 rows: too many to hold) passes each
//           block's rows through a ring of 3 shared-memory stages of up to 3 tiles, the first
//           three issued before the wait, each refilled once read. (mma_gemv ran lm_head at 2.5
//           TB/s, 114 us of the 4K step: its loads and math alternate within a block.)
// Tested:   tests/cuda/test_gemv.cu (both paths against cpu::linear / cpu::rms_norm).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/decode/gemv_prefetch.h"
#include "backend/cuda/common/device_info.h"

#include <algorithm>

#include "base/env.h"

#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/common/shared_rows_dot.cuh"

namespace lily::cuda {

namespace {

using namespace quant_mma;

constexpr int kMaxCols = 4096;
constexpr int kMaxUnits = 96;                        // (tile, pair) units of one block
constexpr uint32_t kMaxWeightBytes = 180 * 1024;     // dynamic shared memory (static: ~39 KB)

struct PrefetchGemvParams {
  const uint8_t* codes;   // [rows, cols / 2]
  const uint8_t* scales;  // [rows, cols / 64] bf16
  const uint8_t* biases;  // [rows, cols / 64] bf16
  const float* x;         // [cols]
  const float* gain;      // [cols] the norm's effective gain
  float eps;
  float* y;               // [rows]
  int rows, cols;
};

// THREADS 512 (the default: the units of a block over 16 warps, half the serial math per warp
// after the wait) or 256 (LILY_PREFETCH_WARPS=8: 3 blocks' registers per SM).
template <int THREADS>
__global__ void __launch_bounds__(THREADS, THREADS == 256 ? 3 : 2) prefetch_rms_norm_gemv_kernel(PrefetchGemvParams p) {
  constexpr int kThreads = THREADS, kWarps = THREADS / 32;
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

  stage_input_row<true, kThreads, kMaxCols>(p.x, p.gain, p.eps, p.cols, xs, frag, gsum, zero, red);
  __syncthreads();  // also publishes the barrier's init to every thread
  ptx::mbarrier_wait(&copied, 0);

  shared_rows_dot<kWarps>(codes_s, scales_s, biases_s, t_end - t_begin, cpr, gpr, p.cols / kPairCols, frag, gsum,
                          zero, unit_sum);
  __syncthreads();
  write_row_sums(unit_sum, p.cols / kPairCols, nrows, p.y + r_begin);
}

// ---- Streaming: matrices too large for one share (lm_head) --------------------------------
//
// The block's rows pass through a ring of kStreamStages stages of stage_tiles tiles each (bulk
// copies completing on one mbarrier per stage): the first stages are issued before the PDL
// wait; a stage is refilled with the chunk kStreamStages ahead as soon as the block has read it.
constexpr int kStreamStages = 3, kStreamMaxTiles = 3;
constexpr uint32_t kStreamSmem = 162 * 1024;  // the ring (static: ~39 KB)

__global__ void __launch_bounds__(256, 1) stream_rms_norm_gemv_kernel(PrefetchGemvParams p, int stage_tiles) {
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  extern __shared__ __align__(128) uint4 ring[];  // kStreamStages x [codes | scales | biases] of stage_tiles tiles
  __shared__ __align__(16) float xs[kMaxCols];
  __shared__ __align__(16) uint4 frag[fragment_uint4s(kMaxCols)];
  __shared__ float gsum[kMaxCols / 64];
  __shared__ __align__(16) uint4 zero[kFragU4PerChunk];
  __shared__ float unit_sum[kStreamMaxTiles * (kMaxCols / kPairCols)][16];
  __shared__ float red[kWarps];
  __shared__ __align__(8) uint64_t full[kStreamStages];

  const int tiles = (p.rows + 15) / 16;
  const int t_begin = int(int64_t(blockIdx.x) * tiles / gridDim.x);
  const int t_end = int(int64_t(blockIdx.x + 1) * tiles / gridDim.x);
  const int r_begin = 16 * t_begin, nrows = min(16 * t_end, p.rows) - r_begin;
  const int row_bytes = p.cols / 2, gpr = p.cols / 64, cpr = p.cols / 32, pairs = p.cols / kPairCols;
  const int chunk_rows = 16 * stage_tiles, chunks = (nrows + chunk_rows - 1) / chunk_rows;
  const size_t stage_bytes = size_t(chunk_rows) * (row_bytes + gpr * 4);
  auto stage_codes = [&](int s) { return reinterpret_cast<uint8_t*>(ring) + size_t(s) * stage_bytes; };
  auto stage_scales = [&](int s) { return stage_codes(s) + size_t(chunk_rows) * row_bytes; };
  auto stage_biases = [&](int s) { return stage_scales(s) + size_t(chunk_rows) * gpr * 2; };
  auto issue = [&](int c) {  // one thread: chunk c into stage c % kStreamStages
    const int s = c % kStreamStages, row0 = r_begin + c * chunk_rows, rows = min(chunk_rows, nrows - c * chunk_rows);
    const uint32_t code_bytes = uint32_t(rows) * row_bytes, scale_bytes = uint32_t(rows) * gpr * 2;
    ptx::mbarrier_arrive_expect_tx(&full[s], code_bytes + 2 * scale_bytes);
    ptx::bulk_copy_to_shared(stage_codes(s), p.codes + int64_t(row0) * row_bytes, code_bytes, &full[s]);
    ptx::bulk_copy_to_shared(stage_scales(s), p.scales + int64_t(row0) * gpr * 2, scale_bytes, &full[s]);
    ptx::bulk_copy_to_shared(stage_biases(s), p.biases + int64_t(row0) * gpr * 2, scale_bytes, &full[s]);
  };

  // ---- Before the wait: the first stages (the weights depend on nothing in this step) ----
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStreamStages; ++s) ptx::mbarrier_init(&full[s], 1);
    for (int c = 0; c < min(kStreamStages, chunks); ++c) issue(c);
  }
  pdl_wait();
  pdl_launch_dependents();

  stage_input_row<true, kThreads, kMaxCols>(p.x, p.gain, p.eps, p.cols, xs, frag, gsum, zero, red);
  __syncthreads();  // also publishes the barriers' init to every thread
  for (int c = 0; c < chunks; ++c) {
    const int s = c % kStreamStages, rows = min(chunk_rows, nrows - c * chunk_rows);
    ptx::mbarrier_wait(&full[s], uint32_t(c / kStreamStages) & 1u);
    shared_rows_dot<kWarps>(reinterpret_cast<const uint4*>(stage_codes(s)),
                            reinterpret_cast<const uint16_t*>(stage_scales(s)),
                            reinterpret_cast<const uint16_t*>(stage_biases(s)), (rows + 15) / 16, cpr, gpr, pairs,
                            frag, gsum, zero, unit_sum);
    __syncthreads();  // stage s is read: refill it
    if (threadIdx.x == 0 && c + kStreamStages < chunks) {
      ptx::fence_proxy_async_shared();
      issue(c + kStreamStages);
    }
    write_row_sums(unit_sum, pairs, rows, p.y + r_begin + c * chunk_rows);
    __syncthreads();  // unit_sum is read
  }
}

// Shared-memory bytes of one tile of 16 rows: codes, then scales and biases (bf16).
uint32_t tile_bytes(int cols) { return 16u * uint32_t(cols / 2 + cols / 64 * 4); }

// What both kernels take: one 4-bit matrix, group 64, cols a multiple of 512 up to kMaxCols, all
// four arrays 16-byte aligned (bulk copies, vector loads of x).
bool row_kernels_take(const QMatrix& W, const float* x) {
  return W.bits == 4 && W.group_size == 64 && W.batch == 1 && W.rows > 0 && W.cols % 512 == 0 && W.cols > 0 &&
         W.cols <= kMaxCols && aligned16(W.codes) && aligned16(W.scales) && aligned16(W.biases) && aligned16(x);
}

struct Plan {
  int grid = 0;
  int max_tiles = 0;  // tiles of 16 rows of the largest block
  uint32_t smem = 0;  // dynamic shared memory of one block
};

Plan plan_for(const QMatrix& W) {
  const int tiles = (W.rows + 15) / 16;
  Plan plan;
  plan.grid = std::min(multiprocessor_count(), tiles);
  plan.max_tiles = (tiles + plan.grid - 1) / plan.grid;
  plan.smem = uint32_t(plan.max_tiles) * tile_bytes(W.cols);
  return plan;
}


template <int THREADS>
void launch_with(const QMatrix& W, const float* x, const float* gain, float eps, float* y, cudaStream_t stream) {
  static const bool configured = [] {  // once per form: allow more than 48 KB
    CUDA_CHECK(cudaFuncSetAttribute(prefetch_rms_norm_gemv_kernel<THREADS>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxWeightBytes)));
    return true;
  }();
  (void)configured;
  const Plan plan = plan_for(W);
  const PrefetchGemvParams p{reinterpret_cast<const uint8_t*>(W.codes), reinterpret_cast<const uint8_t*>(W.scales),
                             reinterpret_cast<const uint8_t*>(W.biases), x, gain, eps, y, W.rows, W.cols};
  prefetch_rms_norm_gemv_kernel<THREADS><<<unsigned(plan.grid), THREADS, plan.smem, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void launch(const QMatrix& W, const float* x, const float* gain, float eps, float* y, cudaStream_t stream) {
  // 16 warps by default (measured 2.156 -> 2.128 ms per 4K step, docs/perf.md session 5);
  // LILY_PREFETCH_WARPS=8 runs the 256-thread form (read at every launch: tests compare both).
  if (env_value("LILY_PREFETCH_WARPS") == "8")
    launch_with<256>(W, x, gain, eps, y, stream);
  else
    launch_with<512>(W, x, gain, eps, y, stream);
}

}  // namespace

bool prefetch_gemv_supports(const QMatrix& W, const float* x) {
  if (env_value("LILY_PREFETCH_GEMV").starts_with('0')) return false;
  if (!row_kernels_take(W, x)) return false;
  const Plan plan = plan_for(W);
  return plan.smem <= kMaxWeightBytes && plan.max_tiles * (W.cols / kPairCols) <= kMaxUnits;
}

// Tiles per stage of the streaming kernel at this width (0: none fits).
int stream_stage_tiles(int cols) {
  return std::min<int>(kStreamMaxTiles, int(kStreamSmem / (kStreamStages * tile_bytes(cols))));
}

bool stream_gemv_supports(const QMatrix& W, const float* x) {
  // Opt-in (LILY_STREAM_GEMV=1): measured 0.017 ms slower than mma_gemv on lm_head (session 5).
  if (!env_value("LILY_STREAM_GEMV").starts_with('1')) return false;
  return row_kernels_take(W, x) && stream_stage_tiles(W.cols) >= 1;
}

void stream_rms_norm_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y,
                          cudaStream_t stream) {
  LILY_CHECK(stream_gemv_supports(W, x) && aligned16(gain), "stream_rms_norm_gemv: [{}, {}] q{} is not supported",
             W.rows, W.cols, W.bits);
  static const bool configured = [] {  // once: allow more than 48 KB
    CUDA_CHECK(cudaFuncSetAttribute(stream_rms_norm_gemv_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kStreamSmem)));
    return true;
  }();
  (void)configured;
  const int stage_tiles = stream_stage_tiles(W.cols);
  const int grid = std::min(multiprocessor_count(), (W.rows + 15) / 16);
  const uint32_t smem = uint32_t(kStreamStages) * uint32_t(stage_tiles) * tile_bytes(W.cols);
  const PrefetchGemvParams p{reinterpret_cast<const uint8_t*>(W.codes), reinterpret_cast<const uint8_t*>(W.scales),
                             reinterpret_cast<const uint8_t*>(W.biases), x, gain, eps, y, W.rows, W.cols};
  stream_rms_norm_gemv_kernel<<<unsigned(grid), 256, smem, stream>>>(p, stage_tiles);
  CUDA_CHECK_LAUNCH();
}

void prefetch_rms_norm_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y,
                            cudaStream_t stream) {
  LILY_CHECK(prefetch_gemv_supports(W, x) && aligned16(gain), "prefetch_rms_norm_gemv: [{}, {}] q{} is not supported",
             W.rows, W.cols, W.bits);
  launch(W, x, gain, eps, y, stream);
}

}  // namespace lily::cuda
