// gemm_exact.cu: y = x @ W^T for affine-quantized W on the tensor cores at fp32-level accuracy.
//
//   y[t, n] = sum_g scale[n, g] * (sum_{k in g} q[n, k] x[t, k]) + bias[n, g] * xsum[t, g]
// Shapes:   x [T, K] fp32 · W [N, K] (4 or 8 bits, group 64, mlx layout, spec §5b) · y [T, N] fp32.
// Method:   the codes q (0..255) are exact in bf16; x = hi + lo with hi = bf16(x), lo = bf16(x - hi)
//           (~2^-17 relative); mma.sync m16n8k16 multiplies exactly and accumulates in fp32, so
//           sum q x over one group is fp32-accurate. Each 64-column group is one chain of 8 mma
//           (4 k-steps x hi, lo) into a fresh accumulator, then scaled per weight row and added
//           with the bias times the group's sum of x (computed in fp32 while x is staged).
//           gemm_q4.cu instead rounds x and every w = s q + b to bf16 (faster, ~1e-3 relative):
//           fine for projections, not for a router whose top-k must match the reference.
// Tiles:    block = 64 rows of x x 64 weight rows, 4 warps; warp w owns x rows 16w .. 16w + 15
//           against all 64 weight rows (8 n-tiles). Per group: x -> bf16 hi/lo tiles and xsum,
//           codes -> exact bf16 tile, scale and bias into shared memory (double buffered: the
//           next group's loads are issued before this one is multiplied, and stored after).
// Split K:  with a workspace (split_k.h) and a grid that would not cover the SMs (a few rows),
//           the groups are split over gridDim.z blocks; the last block of an output tile adds
//           the splits in order.
// Used by:  the prefill router (moe_grouped.cu): N = 256, K = 2048, 8 bits.
// Tested:   tests/cuda/test_gemm_exact.cu against cpu::linear (bound 2e-5 of max |y|).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/gemm/gemm_exact.h"
#include "backend/cuda/gemm/split_k.cuh"

namespace lily::cuda {

namespace {

using namespace ptx;

constexpr int kRows = 64;            // x rows per block
constexpr int kCols = 64;            // weight rows per block
constexpr int kGroup = 64;           // K columns per step (one quantization group)
constexpr int kStride = kGroup + 8;  // bf16 per shared row (144 bytes: ldmatrix without conflicts)
constexpr int kThreads = 128;

struct Params {
  const uint8_t* codes;    // [N, K * bits / 8]
  const uint16_t* scales;  // [N, K / 64] bf16 bits
  const uint16_t* biases;
  const float* x;  // [T, K]
  float* y;        // [T, N]
  int T, N, K, bits;
  SplitK split;  // used when gridDim.z > 1: the groups split over z (split_k.h)
};

struct __align__(16) Stage {
  uint16_t x_hi[kRows][kStride], x_lo[kRows][kStride];  // this group's x as bf16 parts
  uint16_t w[kCols][kStride];                           // the codes as exact bf16
  float xsum[kRows];                                    // sum of x over the group, per row
  float scale[kCols], bias[kCols];
};

// One group's loads for this thread, held in registers while the block multiplies the previous
// group (the loads of group g + 1 are in flight during group g's mma).
struct GroupLoads {
  float4 x[8];        // row tid / 2, 32 columns (half tid % 2); zeros past T
  uint4 w[2];         // weight row tid / 2, 32 columns: two chunks at 8 bits, one at 4
  float scale, bias;  // weight row tid (tid < kCols)
};

__device__ __forceinline__ void load_group(const Params& p, int g, int row0, int col0, GroupLoads& r) {
  const int tid = threadIdx.x;
  {
    const int t = row0 + tid / 2, half = tid % 2;
    const float4* src = reinterpret_cast<const float4*>(p.x + size_t(t) * p.K + g * kGroup + half * 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) r.x[i] = t < p.T ? __ldg(src + i) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  {  // rows past N read row N - 1 (not written)
    const int half = tid % 2, n = min(col0 + tid / 2, p.N - 1);
    const int row_bytes = p.K * p.bits / 8;
    if (p.bits == 8) {
      const uint4* src = reinterpret_cast<const uint4*>(p.codes + size_t(n) * row_bytes + g * kGroup + half * 32);
      r.w[0] = __ldg(src), r.w[1] = __ldg(src + 1);
    } else {
      r.w[0] = __ldg(reinterpret_cast<const uint4*>(p.codes + size_t(n) * row_bytes + g * kGroup / 2 + half * 16));
    }
  }
  if (tid < kCols) {
    const int n = min(col0 + tid, p.N - 1);
    const size_t gi = size_t(n) * (p.K / kGroup) + g;
    r.scale = quant::load_bf16(p.scales + gi);
    r.bias = quant::load_bf16(p.biases + gi);
  }
}

// The loads of a group into stage st: x as bf16 hi + lo and its sum, the codes as exact bf16.
__device__ __forceinline__ void store_group(const Params& p, const GroupLoads& r, Stage& st) {
  const int tid = threadIdx.x;
  {
    const int row = tid / 2, half = tid % 2;
    float v[32];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      v[4 * i] = r.x[i].x, v[4 * i + 1] = r.x[i].y, v[4 * i + 2] = r.x[i].z, v[4 * i + 3] = r.x[i].w;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) s += v[i];
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    if (half == 0) st.xsum[row] = s;
    uint32_t* hi = reinterpret_cast<uint32_t*>(&st.x_hi[row][half * 32]);
    uint32_t* lo = reinterpret_cast<uint32_t*>(&st.x_lo[row][half * 32]);
#pragma unroll
    for (int i = 0; i < 16; ++i) split_bf16(v[2 * i], v[2 * i + 1], hi[i], lo[i]);
  }
  {
    const int c = tid / 2, half = tid % 2;
    float q[32];
    if (p.bits == 8) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t words[4] = {r.w[i].x, r.w[i].y, r.w[i].z, r.w[i].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          q[16 * i + 4 * j + 0] = quant::byte_to_float<0>(words[j]);
          q[16 * i + 4 * j + 1] = quant::byte_to_float<1>(words[j]);
          q[16 * i + 4 * j + 2] = quant::byte_to_float<2>(words[j]);
          q[16 * i + 4 * j + 3] = quant::byte_to_float<3>(words[j]);
        }
      }
    } else {  // 4 bits: column 8 i + j is nibble j of word i
      const uint32_t words[4] = {r.w[0].x, r.w[0].y, r.w[0].z, r.w[0].w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) q[8 * i + j] = float((words[i] >> (4 * j)) & 0xFu);
    }
    uint32_t* dst = reinterpret_cast<uint32_t*>(&st.w[c][half * 32]);
#pragma unroll
    for (int i = 0; i < 16; ++i) dst[i] = pack_bf16(q[2 * i], q[2 * i + 1]);  // exact: integers <= 255
  }
  if (tid < kCols) st.scale[tid] = r.scale, st.bias[tid] = r.bias;
}

__global__ void __launch_bounds__(kThreads) gemm_exact_kernel(Params p) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ uint4 exact_smem[];
  Stage* stage = reinterpret_cast<Stage*>(exact_smem);  // [2]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g4 = lane / 4, t4 = lane % 4;
  const int row0 = blockIdx.y * kRows, col0 = blockIdx.x * kCols;
  // Groups [g0, g1): all of K, or this block's split.
  const KRange kr = gridDim.z > 1 ? split_k_range(p.K / kGroup) : KRange{0, p.K / kGroup};
  const int g0 = kr.begin, g1 = kr.end;

  float acc[kCols / 8][4] = {};  // rows 16 warp + g4 (+ 8), weight rows 8 n + 2 t4 (+ 1)
  GroupLoads next;
  load_group(p, g0, row0, col0, next);
  store_group(p, next, stage[0]);
  for (int g = g0; g < g1; ++g) {
    __syncthreads();  // stage (g - g0) % 2 complete; the other free (read in step g - 1)
    if (g + 1 < g1) load_group(p, g + 1, row0, col0, next);  // in flight during this group's mma
    const Stage& st = stage[(g - g0) % 2];
    float c[kCols / 8][4] = {};
#pragma unroll
    for (int ks = 0; ks < kGroup / 16; ++ks) {
      uint32_t ah[4], al[4];
      ldmatrix_x4(ah, &st.x_hi[warp * 16 + (lane & 15)][ks * 16 + (lane >> 4) * 8]);
      ldmatrix_x4(al, &st.x_lo[warp * 16 + (lane & 15)][ks * 16 + (lane >> 4) * 8]);
#pragma unroll
      for (int jp = 0; jp < kCols / 16; ++jp) {
        uint32_t b[4];
        ldmatrix_x4(b, &st.w[jp * 16 + (lane & 7) + ((lane >> 4) << 3)][ks * 16 + ((lane >> 3) & 1) * 8]);
        mma_bf16(c[2 * jp], ah, b[0], b[1]);
        mma_bf16(c[2 * jp + 1], ah, b[2], b[3]);
        mma_bf16(c[2 * jp], al, b[0], b[1]);
        mma_bf16(c[2 * jp + 1], al, b[2], b[3]);
      }
    }
    const float xs0 = st.xsum[warp * 16 + g4], xs1 = st.xsum[warp * 16 + g4 + 8];
#pragma unroll
    for (int n = 0; n < kCols / 8; ++n) {
      const int col = 8 * n + 2 * t4;
      const float s0 = st.scale[col], s1 = st.scale[col + 1], b0 = st.bias[col], b1 = st.bias[col + 1];
      acc[n][0] = fmaf(s0, c[n][0], fmaf(b0, xs0, acc[n][0]));
      acc[n][1] = fmaf(s1, c[n][1], fmaf(b1, xs0, acc[n][1]));
      acc[n][2] = fmaf(s0, c[n][2], fmaf(b0, xs1, acc[n][2]));
      acc[n][3] = fmaf(s1, c[n][3], fmaf(b1, xs1, acc[n][3]));
    }
    if (g + 1 < g1) store_group(p, next, stage[(g + 1 - g0) % 2]);
  }
  if (gridDim.z > 1) {  // split K: the last block of this output tile sums the splits
    float flat[kCols / 8 * 4];
#pragma unroll
    for (int r = 0; r < kCols / 8 * 4; ++r) flat[r] = acc[r / 4][r % 4];
    if (!split_k_finish(flat, p.split, int(blockIdx.y * gridDim.x + blockIdx.x))) return;
#pragma unroll
    for (int r = 0; r < kCols / 8 * 4; ++r) acc[r / 4][r % 4] = flat[r];
  }
#pragma unroll
  for (int n = 0; n < kCols / 8; ++n) {
    const int col = col0 + 8 * n + 2 * t4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = row0 + warp * 16 + g4 + 8 * h;
      if (t >= p.T) continue;
      if (col < p.N) p.y[size_t(t) * p.N + col] = acc[n][2 * h];
      if (col + 1 < p.N) p.y[size_t(t) * p.N + col + 1] = acc[n][2 * h + 1];
    }
  }
}

}  // namespace

void gemm_exact(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream, const SplitK* split) {
  LILY_CHECK(W.batch == 1 && (W.bits == 4 || W.bits == 8) && W.group_size == 64 && W.cols > 0 && W.cols % 64 == 0 &&
                 W.rows > 0,
             "gemm_exact: [{}, {}, {}] q{} group {} (one matrix, 4/8 bits, group 64, cols a multiple of 64)", W.batch,
             W.rows, W.cols, W.bits, W.group_size);
  LILY_CHECK(aligned16(x), "gemm_exact: x must be 16-byte aligned");
  LILY_CHECK(T >= 0 && (int64_t(T) + kRows - 1) / kRows < 65536, "gemm_exact: T = {}", T);
  if (T == 0) return;
  static const bool configured = [] {
    allow_dynamic_shared(gemm_exact_kernel, 2 * sizeof(Stage), "gemm_exact");
    return true;
  }();
  (void)configured;
  Params p{reinterpret_cast<const uint8_t*>(W.codes),
           reinterpret_cast<const uint16_t*>(W.scales),
           reinterpret_cast<const uint16_t*>(W.biases),
           x,
           y,
           T,
           W.rows,
           W.cols,
           W.bits,
           {}};
  const unsigned gx = unsigned((W.rows + kCols - 1) / kCols), gy = unsigned((T + kRows - 1) / kRows);
  // At least 2 groups a split: the router (4 blocks, 32 groups) in 16 splits, not 32.
  const int splits = split_k_count(split, int64_t(gx) * gy, W.cols / kGroup, 2, int64_t(kThreads) * kCols / 8 * 4);
  if (splits > 1) p.split = *split;
  const dim3 grid(gx, gy, unsigned(splits));
  launch_after_wait(gemm_exact_kernel, grid, dim3(kThreads), 2 * sizeof(Stage), stream, p);
}

}  // namespace lily::cuda
