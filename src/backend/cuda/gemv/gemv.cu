// gemv.cu: the decode projections of one row (T = 1) on the tensor cores (4-bit) or in FP32
// (8-bit), for an affine-quantized W in the mlx layout (spec §5b). gemv_prefetch.cu holds the
// third kernel of gemv.h.
//
//   y[r] (+)= sum_g scale[r, g] * (sum_{c in g} q[r, c] x[c]) + bias[r, g] * (sum_{c in g} x[c])
//   RMSNorm form: x <- x * inv * gain, inv = 1 / sqrt(mean(x^2) + eps) (rms_norm, spec §2.2)
// Shapes:   W [rows, cols] (group 64, cols a multiple of 64, at most 4096) · x, gain [cols] fp32,
//           16-byte aligned · y [rows] fp32, not overlapping x.
// Kernels:  both stage the input row in shared memory once per block (RMSNorm form: normalized
//           there; the block computes inv as rms_norm does) and stride over the rows with a grid
//           capped at the blocks resident at once, so the staging is paid a few times per SM.
//           mma_gemv_kernel<KSPLIT, NORM, ACC> (4-bit): the row as bf16 hi + lo mma fragments
//             (quant_mma.cuh: codes exact in bf16, fp32-level accuracy); a task of the block's 8
//             warps is 8 / KSPLIT tiles of 16 rows, each tile's columns split over KSPLIT warps
//             (512 columns per warp: 8 uint4 loads in flight per lane) and summed in shared
//             memory in a fixed order. The first task's weights are loaded before the PDL wait.
//           staged_gemv_kernel<BITS, LPR, NORM, ACC> (8-bit): a group of LPR lanes (8, 16 or 32:
//             the largest with at most one chunk of 16 bytes each) owns 4 consecutive rows; lane j
//             reads chunks j, j + LPR, ... of all 4 (coalesced 16-byte streaming loads, two per row
//             in flight); x float4 index j sits at j ^ ((j >> 3) & 7) in shared memory, so the
//             lanes of a warp, each on its own chunk, hit distinct banks. Codes become floats with
//             PRMT into 0x4B0000qq (= 2^23 + q) and one FADD; fp32 sums, a shuffle reduction over
//             the LPR lanes, one lane writes.
// Tested:   tests/cuda/test_gemv.cu against cpu::linear and cpu::rms_norm, every kernel by name,
//           edge sizes of rows and columns, NaN-poisoned outputs and guard rows past the end.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/block_rms.cuh"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/gemv/gemv.h"
#include "backend/cuda/gemv/gemv_prefetch.h"

#include <algorithm>

namespace lily::cuda {

namespace {

using namespace quant;

constexpr int kRows = 4;    // rows per lane group (staged_gemv_kernel)
constexpr int kUnroll = 2;  // chunks per row loaded together per step (with 4 rows: 8 loads in flight)

constexpr int kNormThreads = 256;
constexpr int kNormMaxCols = 4096;
constexpr int kNormPerThread = kNormMaxCols / 4 / kNormThreads;  // float4s of x per thread

struct RmsNormGemvParams {
  const uint32_t* codes;   // [rows, cols*bits/32]
  const uint16_t* scales;  // [rows, cols/64] bf16 bits
  const uint16_t* biases;  // [rows, cols/64] bf16 bits
  const float* x;          // [cols] the raw (un-normalized) row
  const float* gain;       // [cols] effective gain
  float eps;
  float* y;  // [rows]
  int rows, cols;
};

template <int BITS, int LPR, bool NORM, bool ACC>
__global__ void __launch_bounds__(kNormThreads, 2) staged_gemv_kernel(RmsNormGemvParams p) {
  trace::BlockTrace trace(trace::kind_staged_gemv);
  {  // This thread's first chunks into L2 while the predecessor finishes: weights depend on nothing.
    constexpr int kCodes = 128 / BITS;
    const int cpr = p.cols / kCodes, lane = threadIdx.x % 32, sub = lane % LPR;
    const int64_t row0 = ((int64_t(blockIdx.x) * (kNormThreads / 32) + threadIdx.x / 32) * (32 / LPR) + lane / LPR) *
                         kRows;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (row0 + r < p.rows && sub + u * LPR < cpr)
          prefetch_l2(reinterpret_cast<const uint4*>(p.codes) + (row0 + r) * cpr + sub + u * LPR);
  }
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);
  constexpr int kCodes = 128 / BITS, kChunksPerGroup = 64 / kCodes;
  __shared__ float4 xs[kNormMaxCols / 4];
  __shared__ float partial[kNormThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n4 = p.cols / 4;

  // Stage x (NORM: x * inv_rms * gain; the loads of x and gain are all issued before the
  // reduction).
  float4 xv[kNormPerThread], gv[kNormPerThread];
#pragma unroll
  for (int i = 0; i < kNormPerThread; ++i) {
    const int j = threadIdx.x + i * kNormThreads;
    xv[i] = j < n4 ? __ldg(reinterpret_cast<const float4*>(p.x) + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    if constexpr (NORM)
      gv[i] = j < n4 ? __ldg(reinterpret_cast<const float4*>(p.gain) + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    else gv[i] = make_float4(1.f, 1.f, 1.f, 1.f);
  }
  float inv = 1.f;
  if constexpr (NORM) inv = block_inv_rms<kNormPerThread, kNormThreads>(xv, p.cols, p.eps, partial);
#pragma unroll
  for (int i = 0; i < kNormPerThread; ++i) {
    const int j = threadIdx.x + i * kNormThreads;
    if (j < n4) {
      if constexpr (NORM)
        xs[swizzle(j)] = make_float4(xv[i].x * inv * gv[i].x, xv[i].y * inv * gv[i].y, xv[i].z * inv * gv[i].z,
                                     xv[i].w * inv * gv[i].w);
      else xs[swizzle(j)] = xv[i];
    }
  }
  __syncthreads();
  trace.mark(2);

  const int cpr = p.cols / kCodes, gpr = p.cols / 64;
  const int64_t cpr64 = cpr;
  const int sub = lane % LPR;
  constexpr int kGroupsPerWarp = 32 / LPR;
  const int64_t groups = (int64_t(p.rows) + kRows - 1) / kRows;
  const int64_t stride = int64_t(gridDim.x) * (kNormThreads / 32) * kGroupsPerWarp;
  // Warp-uniform loop (the shuffles need the whole warp); groups past the end read the last
  // row and are not written.
  for (int64_t base = (int64_t(blockIdx.x) * (kNormThreads / 32) + warp) * kGroupsPerWarp; base < groups;
       base += stride) {
    const int64_t row0 = (base + lane / LPR) * kRows;
    int64_t row[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) row[r] = min(row0 + r, int64_t(p.rows) - 1);
    float acc[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = 0.f;

    for (int c0 = sub; c0 < cpr; c0 += LPR * kUnroll) {
      uint4 q[kUnroll][kRows];
      float sc[kUnroll][kRows], bi[kUnroll][kRows];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * LPR;
        const int cc = c < cpr ? c : c0;
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          q[u][r] = load_codes(reinterpret_cast<const uint4*>(p.codes) + row[r] * cpr64 + cc);
          const int64_t g = row[r] * gpr + cc / kChunksPerGroup;
          sc[u][r] = load_bf16(p.scales + g);
          bi[u][r] = load_bf16(p.biases + g);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * LPR;
        if (c >= cpr) break;
        float x[kCodes];
        const float sx = load_x_staged(xs, c, x);
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] += fmaf(sc[u][r], chunk_dot<BITS>(q[u][r], x), bi[u][r] * sx);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = group_sum<LPR>(acc[r]);
    if (sub == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        if (row0 + r < p.rows) p.y[row0 + r] = ACC ? p.y[row0 + r] + acc[r] : acc[r];
    }
  }
}

constexpr int kMmaPairs = 2;  // pairs of blocks (256 columns each) per warp

template <int KSPLIT, bool NORM, bool ACC>
__global__ void __launch_bounds__(kNormThreads, 2) mma_gemv_kernel(RmsNormGemvParams p) {
  trace::BlockTrace trace(trace::kind_mma_gemv);
  using namespace quant_mma;
  constexpr int kWarps = kNormThreads / 32, kTilesPerTask = kWarps / KSPLIT;
  __shared__ __align__(16) float xs[kNormMaxCols];
  __shared__ __align__(16) uint4 frag[fragment_uint4s(kNormMaxCols)];
  __shared__ float group_sum[kNormMaxCols / 64];
  __shared__ __align__(16) uint4 zero[kFragU4PerChunk];
  __shared__ float partial[kWarps][16];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4;
  const int cpr = p.cols / 32;
  const uint4* codes = reinterpret_cast<const uint4*>(p.codes);
  const int64_t tiles = (int64_t(p.rows) + 15) / 16;
  const int64_t tasks = (tiles + kTilesPerTask - 1) / kTilesPerTask;
  const int kpart = warp % KSPLIT, local_tile = warp / KSPLIT;

  auto load = [&](TileLoad<kMmaPairs>& t, int64_t task) {
    const int64_t tile = min(task * kTilesPerTask + local_tile, tiles - 1);
    const int64_t row_g = min(tile * 16 + g, int64_t(p.rows) - 1), row_g8 = min(tile * 16 + g + 8, int64_t(p.rows) - 1);
    load_tile<kMmaPairs>(t, codes, p.scales, p.biases, row_g, row_g8, cpr, kpart * kMmaPairs);
  };
  TileLoad<kMmaPairs> t;
  if (blockIdx.x < tasks) load(t, blockIdx.x);  // weights depend on nothing: before the wait
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);

  // Stage x (NORM: x * inv * gain, inv = 1 / sqrt(mean(x^2) + eps) as rms_norm).
  stage_input_row<NORM, kNormThreads, kNormMaxCols, 4>(p.x, p.gain, p.eps, p.cols, xs, frag, group_sum, zero,
                                                       &partial[0][0]);
  __syncthreads();
  trace.mark(2);

  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    if (task != blockIdx.x) load(t, task);
    float y_g = 0.f, y_g8 = 0.f;
    dot_tile<kMmaPairs>(t, frag, group_sum, zero, cpr, kpart * kMmaPairs, y_g, y_g8);
    y_g = quad_sum(y_g);
    y_g8 = quad_sum(y_g8);
    if (lane % 4 == 0) partial[warp][g] = y_g, partial[warp][g + 8] = y_g8;
    __syncthreads();
    if (threadIdx.x < kTilesPerTask * 16) {
      const int lt = threadIdx.x / 16, r = threadIdx.x % 16;
      const int64_t row = (task * kTilesPerTask + lt) * 16 + r;
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < KSPLIT; ++k) sum += partial[lt * KSPLIT + k][r];
      if (row < p.rows) p.y[row] = ACC ? p.y[row] + sum : sum;
    }
    __syncthreads();  // partial is rewritten by the next task
  }
  trace.mark(4);
}

// Blocks of `Kernel` (256 threads, static shared memory) resident at once on the current device
// (cached per kernel; one device per process): the grid cap of the grid-stride kernels.
template <auto Kernel>
int resident_blocks() {
  static const int blocks = [] {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, kNormThreads, 0));
    return std::max(1, multiprocessor_count() * per_sm);
  }();
  return blocks;
}

RmsNormGemvParams params_of(const QMatrix& W, const float* x, const float* gain, float eps, float* y) {
  return {W.codes,
          reinterpret_cast<const uint16_t*>(W.scales),
          reinterpret_cast<const uint16_t*>(W.biases),
          x,
          gain,
          eps,
          y,
          W.rows,
          W.cols};
}

template <bool NORM, bool ACC>
void launch_mma_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y, cudaStream_t stream) {
  const RmsNormGemvParams p = params_of(W, x, gain, eps, y);
  const int pairs = (W.cols + quant_mma::kPairCols - 1) / quant_mma::kPairCols;
  const int ksplit_needed = (pairs + kMmaPairs - 1) / kMmaPairs;  // 1 .. 8 at cols <= 4096
  const int64_t tiles = (int64_t(W.rows) + 15) / 16;
  auto go = [&](auto ksplit) {
    constexpr int K = decltype(ksplit)::value;
    const int64_t tasks = (tiles + (8 / K) - 1) / (8 / K);
    const int64_t blocks = std::min<int64_t>(tasks, resident_blocks<mma_gemv_kernel<K, NORM, ACC>>());
    mma_gemv_kernel<K, NORM, ACC><<<unsigned(blocks), kNormThreads, 0, stream>>>(p);
  };
  if (ksplit_needed <= 1) go(Int<1>{});
  else if (ksplit_needed <= 2) go(Int<2>{});
  else if (ksplit_needed <= 4) go(Int<4>{});
  else go(Int<8>{});
  CUDA_CHECK_LAUNCH();
}

template <bool NORM, bool ACC>
void launch_staged(const QMatrix& W, const float* x, const float* gain, float eps, float* y, cudaStream_t stream) {
  const RmsNormGemvParams p = params_of(W, x, gain, eps, y);
  const int lanes = lanes_per_row(W.cols * W.bits / 128);
  const int64_t groups = (int64_t(W.rows) + kRows - 1) / kRows;
  const int64_t needed = (groups * lanes + kNormThreads - 1) / kNormThreads;
  auto go = [&](auto lpr) {
    constexpr int L = decltype(lpr)::value;
    const int64_t blocks = std::min<int64_t>(needed, resident_blocks<staged_gemv_kernel<8, L, NORM, ACC>>());
    staged_gemv_kernel<8, L, NORM, ACC><<<unsigned(blocks), kNormThreads, 0, stream>>>(p);
  };
  if (lanes == 32) go(Int<32>{});
  else if (lanes == 16) go(Int<16>{});
  else go(Int<8>{});
  CUDA_CHECK_LAUNCH();
}

// The shape both kernels of this file take: group 64, cols a multiple of 64 up to kNormMaxCols.
bool staged_shape(const QMatrix& W) {
  return W.batch == 1 && W.group_size == 64 && W.rows > 0 && W.cols > 0 && W.cols % 64 == 0 && W.cols <= kNormMaxCols;
}

void check_supported(GemvKernel kernel, const QMatrix& W, bool accumulate, const char* what) {
  LILY_CHECK(gemv_supports(kernel, W, accumulate, current_device_limits()),
             "{}: the {} kernel does not take [{}, {}] q{} group {}", what, kernel_name(kernel), W.rows, W.cols, W.bits,
             W.group_size);
}

}  // namespace

const char* kernel_name(GemvKernel kernel) {
  switch (kernel) {
    case GemvKernel::prefetch: return "prefetch_rms_norm_gemv";
    case GemvKernel::mma: return "mma_gemv";
    case GemvKernel::fp32: return "staged_gemv (fp32)";
  }
  return "?";
}

bool gemv_supports(GemvKernel kernel, const QMatrix& W, bool accumulate, const DeviceLimits& device) {
  const bool aligned = aligned16(W.codes) && aligned16(W.scales) && aligned16(W.biases);
  switch (kernel) {
    case GemvKernel::prefetch:  // bulk copies on an mbarrier: Hopper
      return device.hopper() && !accumulate && prefetch_gemv_supports(W, device.multiprocessors);
    case GemvKernel::mma: return W.bits == 4 && staged_shape(W) && aligned;
    case GemvKernel::fp32: return W.bits == 8 && staged_shape(W) && aligned;
  }
  return false;
}

void rms_norm_gemv(GemvKernel kernel, const QMatrix& W, const float* x, const float* gain, float eps, float* y,
                   cudaStream_t stream) {
  check_supported(kernel, W, false, "rms_norm_gemv");
  LILY_CHECK(aligned16(x) && aligned16(gain), "rms_norm_gemv: x and gain must be 16-byte aligned");
  switch (kernel) {
    case GemvKernel::prefetch: prefetch_rms_norm_gemv(W, x, gain, eps, y, stream); return;
    case GemvKernel::mma: launch_mma_gemv<true, false>(W, x, gain, eps, y, stream); return;
    case GemvKernel::fp32: launch_staged<true, false>(W, x, gain, eps, y, stream); return;
  }
}

void gemv_accumulate(GemvKernel kernel, const QMatrix& W, const float* x, float* y, cudaStream_t stream) {
  check_supported(kernel, W, true, "gemv_accumulate");
  LILY_CHECK(aligned16(x), "gemv_accumulate: x must be 16-byte aligned");
  if (kernel == GemvKernel::mma) launch_mma_gemv<false, true>(W, x, nullptr, 0.f, y, stream);
  else launch_staged<false, true>(W, x, nullptr, 0.f, y, stream);
}

}  // namespace lily::cuda
