// gemv.cu: y = x @ W^T for an affine-quantized W (mlx layout, spec §5b), few input rows.
//
//   y[t, r] (+)= sum_c W[r, c] * x[t, c],   W[r, c] = scale[r, c/64] * q[r, c] + bias[r, c/64]
//   per 64-column group g:  sum_{c in g} W x = scale * (sum q x) + bias * (sum x)
// Shapes:   W [rows, cols] (bits 4 or 8, group 64, cols a multiple of 64) · x [T, cols] fp32 ·
//           y [T, rows] fp32.  x must be 16-byte aligned; y must not overlap x.
// Layout:   a "chunk" is 16 bytes of codes (one uint4): 32 columns at 4 bits, 16 at 8 bits,
//           so half (4-bit) or a quarter (8-bit) of a group. A row has cpr = cols*bits/128 chunks.
// Design:   a group of LPR lanes (8, 16 or 32: the largest with at most cpr lanes) owns R = 4
//           consecutive rows; lane j of the group reads chunks j, j + LPR, ... of all R rows
//           (coalesced 16-byte loads, ld.global.nc without L1 allocation: the weights stream),
//           two chunks per row per step, so 2R = 8 uint4 loads are in flight per lane before the
//           first use. x (small, shared by all blocks) comes through L1/L2 with __ldg and is used
//           for the R rows at once: 32 fp32 of x per 16 bytes of codes would otherwise exceed
//           the L1 bandwidth. Codes become floats with PRMT into 0x4B0000qq (= 2^23 + q) and one
//           FADD, so most of the math sits on the FP32 pipe. fp32 accumulate, shuffle reduction
//           over the LPR lanes, one lane writes. Blocks of 128 threads (64 when there are few
//           rows, to spread them over more SMs).
// Variants: gemv_kernel<BITS 4|8, LPR 8|16|32, TP, ACC>: TP = 1 for T = 1 (decode); TP = 8 for
//           T > 1 (prefill chunks): the R rows' codes are held in registers while TP tokens
//           use them, so a pass over the weights serves 8 tokens; the groups of 8 tokens are
//           the grid's y dimension. ACC adds into y (gemv_accumulate). At T = 1 this kernel
//           only serves rows wider than 4096 columns; staged_gemv_kernel does the rest.
//           staged_gemv_kernel<BITS, LPR, NORM, ACC> (T = 1, cols <= 4096): every block of 256
//           threads stages the input row in shared memory, float4 index j stored at
//           j ^ ((j >> 3) & 7) so that the lanes of a warp, each reading its own chunk, hit
//           distinct banks (4- and 8-bit chunks alike); reading x from global memory instead, the
//           32 lanes of a warp touch 32 different 128-byte lines per float4 load, and L1 becomes
//           the bottleneck (measured: 65% L1 vs 8% DRAM throughput for o_proj, 12.9 us). NORM:
//           y = RMSNorm(x; gain) @ W^T in one launch (rms_norm_gemv; spec §2.2 zero-centred norm,
//           gain = 1 + w): the block computes 1 / sqrt(mean(x^2) + eps) as rms_norm does and
//           stages x * inv * gain. The grid is capped at the blocks that fit on the device at
//           once and strides over the row groups, so the staging is paid a few times per SM, not
//           once per 16 rows. ACC adds into y (gemv_accumulate at T = 1: out_proj, o_proj).
//           mma_gemv_kernel<KSPLIT, NORM, ACC> (T = 1, 4 bits, cols <= 4096; the model's
//           projections and lm_head): the same staging, then 16 rows per warp on the tensor cores
//           (quant_mma.cuh: codes exact in bf16, x as bf16 hi + lo, fp32-level accuracy), each
//           tile's columns split over KSPLIT warps of the block and summed in shared memory. It
//           takes the 4-bit rows staged_gemv_kernel would; LILY_MMA_GEMV=0 keeps the latter.
//           rms_norm_gemv of the model's input projections goes to gemv_prefetch.cu's kernel
//           (each block's rows copied into shared memory before the PDL wait) where it fits.
// Tested:   tests/cuda/test_gemv.cu against cpu::linear (and cpu::rms_norm for the fused kernel);
//           both T = 1 paths.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/block_rms.cuh"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/decode/gemv.h"
#include "backend/cuda/decode/gemv_prefetch.h"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/common/quant_mma.cuh"

#include <algorithm>

namespace lily::cuda {

namespace {

using namespace quant;

constexpr int kRows = 4;   // R: rows per lane group (rms_norm_gemv, and gemv on tall matrices)
constexpr int kUnroll = 2; // chunks per row loaded together per step (with R = 4: 8 loads in flight)

struct GemvParams {
  const uint32_t* codes;   // [rows, cols*bits/32]
  const uint16_t* scales;  // [rows, cols/64] bf16 bits
  const uint16_t* biases;  // [rows, cols/64] bf16 bits
  const float* x;          // [T, cols]
  float* y;                // [T, rows]
  int rows, cols, T;
};

template <int BITS, int LPR, int TP, bool ACC, int ROWS = kRows, int UNROLL = kUnroll>
__global__ void __launch_bounds__(128) gemv_kernel(GemvParams p) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kCodes = 128 / BITS;         // columns per chunk
  constexpr int kChunksPerGroup = 64 / kCodes;
  const int cpr = p.cols / kCodes;           // chunks per row
  const int gpr = p.cols / 64;               // groups per row
  const int64_t cpr64 = cpr;
  const int sub = threadIdx.x % LPR;
  const int64_t group = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / LPR;
  const int64_t row0 = group * ROWS;

  // Rows past the end read the last row (always valid) and are not written.
  int64_t row[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) row[r] = min(row0 + r, int64_t(p.rows) - 1);

  // blockIdx.y: a group of TP tokens (T > 1: the token groups run in parallel, each re-reading
  // the weights from L2).
  for (int t0 = blockIdx.y * TP; t0 < p.T; t0 += gridDim.y * TP) {
    float acc[TP][ROWS];
#pragma unroll
    for (int i = 0; i < TP; ++i)
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[i][r] = 0.f;

    for (int c0 = sub; c0 < cpr; c0 += LPR * UNROLL) {
      uint4 q[UNROLL][ROWS];
      float sc[UNROLL][ROWS], bi[UNROLL][ROWS];
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int c = c0 + u * LPR;
        const int cc = c < cpr ? c : c0;  // a valid chunk; its result is discarded below
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          q[u][r] = load_codes(reinterpret_cast<const uint4*>(p.codes) + row[r] * cpr64 + cc);
          const int64_t g = row[r] * gpr + cc / kChunksPerGroup;
          sc[u][r] = load_bf16(p.scales + g);
          bi[u][r] = load_bf16(p.biases + g);
        }
      }
#pragma unroll
      for (int i = 0; i < TP; ++i) {
        if (TP > 1 && t0 + i >= p.T) break;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          const int c = c0 + u * LPR;
          if (c >= cpr) break;
          float x[kCodes];
          const float sx = load_x(p.x + int64_t(t0 + i) * p.cols + c * kCodes, x);
#pragma unroll
          for (int r = 0; r < ROWS; ++r)
            acc[i][r] += fmaf(sc[u][r], chunk_dot<BITS>(q[u][r], x), bi[u][r] * sx);
        }
      }
    }

#pragma unroll
    for (int i = 0; i < TP; ++i) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) acc[i][r] = group_sum<LPR>(acc[i][r]);
    }
    if (sub == 0) {
#pragma unroll
      for (int i = 0; i < TP; ++i) {
        if (t0 + i >= p.T) break;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          if (row0 + r < p.rows) {
            float* dst = p.y + int64_t(t0 + i) * p.rows + row0 + r;
            *dst = ACC ? *dst + acc[i][r] : acc[i][r];
          }
        }
      }
    }
  }
}

// ---- RMSNorm fused into the projection (T = 1) ---------------------------------------------

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
  float* y;                // [rows]
  int rows, cols;
};

template <int BITS, int LPR, bool NORM, bool ACC>
__global__ void __launch_bounds__(kNormThreads, 2) staged_gemv_kernel(RmsNormGemvParams p) {
  {  // This thread's first chunks into L2 while the predecessor finishes: weights depend on nothing.
    constexpr int kCodes = 128 / BITS;
    const int cpr = p.cols / kCodes, lane = threadIdx.x % 32, sub = lane % LPR;
    const int64_t row0 =
        ((int64_t(blockIdx.x) * (kNormThreads / 32) + threadIdx.x / 32) * (32 / LPR) + lane / LPR) * kRows;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        if (row0 + r < p.rows && sub + u * LPR < cpr)
          prefetch_l2(reinterpret_cast<const uint4*>(p.codes) + (row0 + r) * cpr + sub + u * LPR);
  }
  pdl_wait();
  pdl_launch_dependents();
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
    else
      gv[i] = make_float4(1.f, 1.f, 1.f, 1.f);
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
      else
        xs[swizzle(j)] = xv[i];
    }
  }
  __syncthreads();

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

// ---- T = 1 on the tensor cores (4-bit): mma_gemv_kernel ---------------------------------------
//
// Block of 256 threads: stage x (NORM: x * inv_rms * gain) as bf16 hi/lo fragments in shared
// memory (quant_mma.cuh), then tasks of 8 warps: a task is 8 / KSPLIT tiles of 16 rows, each
// tile's columns split over KSPLIT warps (kMmaPairs pairs of 128-column blocks, 512 columns,
// per warp: 8 uint4 loads in flight per lane), the KSPLIT partial rows summed in shared memory
// in a fixed order. The first task's weights are loaded before the PDL wait. The grid is
// capped at the resident blocks and strides over the tasks.

constexpr int kMmaPairs = 2;  // pairs of blocks (256 columns each) per warp

template <int KSPLIT, bool NORM, bool ACC>
__global__ void __launch_bounds__(kNormThreads, 2) mma_gemv_kernel(RmsNormGemvParams p) {
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

  // Stage x (NORM: x * inv * gain, inv = 1 / sqrt(mean(x^2) + eps) as rms_norm).
  stage_input_row<NORM, kNormThreads, kNormMaxCols, 4>(p.x, p.gain, p.eps, p.cols, xs, frag, group_sum, zero,
                                                    &partial[0][0]);
  __syncthreads();

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
}

// mma_gemv_kernel serves 4-bit rows of up to kNormMaxCols columns; LILY_MMA_GEMV=0 sends them to
// staged_gemv_kernel instead (read at every launch: tests and benchmarks compare the two).
bool mma_gemv_supports(const QMatrix& W) {
  return W.bits == 4 && W.group_size == 64 && W.cols % 64 == 0 && W.cols <= kNormMaxCols;
}
bool mma_gemv_enabled() { return quant_mma::decode_mma_enabled(); }

// Blocks of `Kernel` (256 threads, static shared memory) resident at once on the current device
// (cached per kernel; one device per process): the grid cap of the grid-stride T = 1 kernels.
template <auto Kernel>
int resident_blocks() {
  static const int blocks = [] {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, kNormThreads, 0));
    return std::max(1, multiprocessor_count() * per_sm);
  }();
  return blocks;
}

template <bool NORM, bool ACC>
void launch_mma_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y, cudaStream_t stream) {
  const RmsNormGemvParams p{W.codes, reinterpret_cast<const uint16_t*>(W.scales),
                            reinterpret_cast<const uint16_t*>(W.biases), x, gain, eps, y, W.rows, W.cols};
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

// y (+)= [RMSNorm](x) @ W^T for one row, x staged in shared memory (cols <= kNormMaxCols).
template <bool NORM, bool ACC>
void launch_staged(const QMatrix& W, const float* x, const float* gain, float eps, float* y, cudaStream_t stream) {
  const RmsNormGemvParams p{W.codes, reinterpret_cast<const uint16_t*>(W.scales),
                            reinterpret_cast<const uint16_t*>(W.biases), x, gain, eps, y, W.rows, W.cols};
  const int lanes = lanes_per_row(W.cols * W.bits / 128);
  const int64_t groups = (int64_t(W.rows) + kRows - 1) / kRows;
  const int64_t needed = (groups * lanes + kNormThreads - 1) / kNormThreads;
  dispatch_bits_lanes(W.bits, lanes, [&](auto bits, auto lpr) {
    constexpr int B = decltype(bits)::value, L = decltype(lpr)::value;
    const int64_t blocks = std::min<int64_t>(needed, resident_blocks<staged_gemv_kernel<B, L, NORM, ACC>>());
    staged_gemv_kernel<B, L, NORM, ACC><<<unsigned(blocks), kNormThreads, 0, stream>>>(p);
  });
  CUDA_CHECK_LAUNCH();
}

template <bool ACC>
void launch_gemv(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream) {
  LILY_CHECK(W.bits == 4 || W.bits == 8, "gemv: {}-bit weights are not supported (4 or 8)", W.bits);
  LILY_CHECK(W.group_size == 64, "gemv: group size {} is not supported (64)", W.group_size);
  LILY_CHECK(W.cols > 0 && W.cols % 64 == 0, "gemv: cols {} is not a positive multiple of 64", W.cols);
  LILY_CHECK(W.rows > 0 && T >= 0, "gemv: bad shape rows {} T {}", W.rows, T);
  LILY_CHECK(aligned16(x), "gemv: x must be 16-byte aligned");
  if (T == 0) return;
  const GemvParams p{W.codes, reinterpret_cast<const uint16_t*>(W.scales), reinterpret_cast<const uint16_t*>(W.biases),
                     x, y, W.rows, W.cols, T};
  const int cpr = W.cols * W.bits / 128;
  const int lanes = lanes_per_row(cpr);
  if (T == 1 && mma_gemv_supports(W) && mma_gemv_enabled()) {  // tensor cores, x staged
    launch_mma_gemv<false, ACC>(W, x, nullptr, 0.f, y, stream);
    return;
  }
  if (T == 1 && W.cols <= kNormMaxCols) {  // x staged in shared memory
    launch_staged<false, ACC>(W, x, nullptr, 0.f, y, stream);
    return;
  }
  const int64_t groups = (int64_t(W.rows) + kRows - 1) / kRows;
  // 128 threads per block, or 64 when that leaves fewer than two blocks per SM.
  const int threads = groups * lanes / 128 >= 264 ? 128 : 64;
  const int64_t blocks = (groups * lanes + threads - 1) / threads;
  LILY_CHECK(blocks < (int64_t(1) << 31), "gemv: {} rows is too many", W.rows);
  constexpr int kTP = 8;  // tokens per weight pass for T > 1
  const unsigned token_groups = unsigned(std::min<int64_t>((T + kTP - 1) / kTP, 65535));
  dispatch_bits_lanes(W.bits, lanes, [&](auto bits, auto lpr) {
    constexpr int B = decltype(bits)::value, L = decltype(lpr)::value;
    if (T > 1)
      gemv_kernel<B, L, kTP, ACC><<<dim3(unsigned(blocks), token_groups), threads, 0, stream>>>(p);
    else
      gemv_kernel<B, L, 1, ACC><<<unsigned(blocks), threads, 0, stream>>>(p);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool rms_norm_gemv_supports(const QMatrix& W) {
  return (W.bits == 4 || W.bits == 8) && W.group_size == 64 && W.cols > 0 && W.cols % 64 == 0 &&
         W.cols <= kNormMaxCols && W.rows > 0;
}

void rms_norm_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y, cudaStream_t stream) {
  LILY_CHECK(rms_norm_gemv_supports(W),
             "rms_norm_gemv: [{}, {}] q{} group {} (4/8 bits, group 64, cols a multiple of 64 up to {})", W.rows,
             W.cols, W.bits, W.group_size, kNormMaxCols);
  LILY_CHECK(aligned16(x) && aligned16(gain),
             "rms_norm_gemv: x and gain must be 16-byte aligned");
  if (mma_gemv_enabled() && prefetch_gemv_supports(W, x))
    prefetch_rms_norm_gemv(W, x, gain, eps, y, stream);
  else if (mma_gemv_enabled() && stream_gemv_supports(W, x))
    stream_rms_norm_gemv(W, x, gain, eps, y, stream);
  else if (mma_gemv_supports(W) && mma_gemv_enabled())
    launch_mma_gemv<true, false>(W, x, gain, eps, y, stream);
  else
    launch_staged<true, false>(W, x, gain, eps, y, stream);
}

void gemv(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream) {
  launch_gemv<false>(W, x, y, T, stream);
}

void gemv_accumulate(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream) {
  launch_gemv<true>(W, x, y, T, stream);
}

}  // namespace lily::cuda
