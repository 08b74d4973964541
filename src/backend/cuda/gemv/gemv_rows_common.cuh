// gemv_rows_common.cuh: what the few-row GEMV kernels share (gemv_rows.cu: the register form;
// gemv_rows_ring.cu: the weights through a shared-memory ring, where the shapes allow):
// the parameters, the warp's weight tile and its mma dot against x staged in shared memory, the
// staging of x (RMSNorm folded in), the output store. gemv_rows.cu's header holds the layout.
// Internal to backend/cuda/gemv (and the MoE's few-row experts).
#pragma once

#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/common/quant_mma.cuh"
#include "backend/cuda/gemv/gemv_rows.h"

namespace lily::cuda::gemv_rows_detail {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kPairs = 2;  // pairs of 128-column blocks a warp holds per task: 512 columns
constexpr int kMaxCols = 4096, kNormMaxCols = 2048;

enum class Form { norm, accumulate, store, swiglu };

// A 4-bit matrix (or the first of a stack of experts) in the mlx layout.
struct Matrix4 {
  const uint4* codes;      // [rows, cols / 32] chunks of 32 codes
  const uint16_t* scales;  // [rows, cols / 64] bf16 bits
  const uint16_t* biases;  // [rows, cols / 64] bf16 bits
};

struct Params {
  Matrix4 w[2];       // W; the SwiGLU form: G, U
  const float* x;     // [x rows, cols]
  const float* gain;  // [cols] (RMSNorm form)
  float eps;
  RowsOutput out;
  int rows, cols;  // of W (of G and of U)
  int T;           // tokens (without tiles)
  int chunks;      // chunks of x staged per token: the warps' reach (KSPLIT x 512 columns / 32), zeros past cols
  // Grouped (tiles != null): tile j < *num_tiles of the map = {expert e, positions [first, end)
  // (at most 16)}; x row of position q: gather[q] / gather_div (no gather: q); its output row q.
  const int32_t* tiles;
  const int32_t* num_tiles;
  const int32_t* gather;
  int gather_div;
  // The ring kernel's one more tile after the map's (extra_n > 0): rows [0, extra_n) of extra_x
  // through extra_w (G, U; a matrix of the stack's shape: the shared expert beside the routed
  // ones) into extra_y [extra_n, rows].
  Matrix4 extra_w[2];
  const float* extra_x;
  float* extra_y;
  int extra_n;
};

// The bank-group swizzle of x's uint4 units (gemv_rows.cu's Layout).
__device__ __forceinline__ int unit_swizzle(int chunk, int token) { return ((chunk >> 1) & 1) ^ ((token & 1) << 1); }

// A bf16 (bits at p) in both halves of a word.
__device__ __forceinline__ uint32_t load_bf16x2(const uint16_t* p) {
  const uint32_t v = __ldg(p);
  return v | (v << 16);
}

__device__ __forceinline__ uint32_t fma_bf16x2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// A warp's weights for one task: NPAIR pairs of blocks of rows g and g + 8.
template <int NPAIR>
struct RowsTile {
  uint4 q[NPAIR][2][2];                            // [pair][block][row g, g + 8]
  uint32_t scale[NPAIR][2][2], bias[NPAIR][2][2];  // of the lane's chunk's group, bf16x2
};

// d[n] += the tile's rows (g, g + 8) times tokens n * 8 + (2t, 2t + 1) over the loaded pairs, for
// the token tiles n < NT that x_of takes: x_of(n, pp, b, w, chunk) is the uint4 of B registers of
// token n * 8 + g at word w of the pair's block b (chunk), or nothing (n past the tile's tokens).
template <int NT, int NPAIR, typename XOf>
__device__ __forceinline__ void dot_rows_tile(const RowsTile<NPAIR>& t, int pair0, XOf x_of, float (&d)[NT][4]) {
  const int t4 = threadIdx.x % 4;
#pragma unroll
  for (int pp = 0; pp < NPAIR; ++pp)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int chunk = 4 * (2 * (pair0 + pp) + b) + t4;
      const uint32_t wg[4] = {t.q[pp][b][0].x, t.q[pp][b][0].y, t.q[pp][b][0].z, t.q[pp][b][0].w};
      const uint32_t wg8[4] = {t.q[pp][b][1].x, t.q[pp][b][1].y, t.q[pp][b][1].z, t.q[pp][b][1].w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t ag[4], ag8[4];
        quant_mma::dequant_word(wg[w], ag);
        quant_mma::dequant_word(wg8[w], ag8);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          ag[j] = fma_bf16x2(ag[j], t.scale[pp][b][0], t.bias[pp][b][0]);
          ag8[j] = fma_bf16x2(ag8[j], t.scale[pp][b][1], t.bias[pp][b][1]);
        }
        const uint32_t a0[4] = {ag[0], ag8[0], ag[1], ag8[1]};
        const uint32_t a1[4] = {ag[2], ag8[2], ag[3], ag8[3]};
#pragma unroll
        for (int n = 0; n < NT; ++n)
          x_of(n, pp, b, w, chunk, [&](const uint4& xv) {
            ptx::mma_bf16(d[n], a0, xv.x, xv.y);
            ptx::mma_bf16(d[n], a1, xv.z, xv.w);
          });
      }
    }
}

// x staged in shared memory (stage_rows' layout): dot_rows_tile's x_of.
struct StagedX {
  const uint4* xf;
  int chunks;
  template <typename Mma>
  __device__ __forceinline__ void operator()(int n, int, int, int w, int chunk, Mma mma) const {
    const int token = n * 8 + (threadIdx.x % 32) / 4;
    mma(xf[(token * chunks + chunk) * 4 + (w ^ unit_swizzle(chunk, token))]);
  }
};

// dot_rows_tile over the token tiles that hold tokens: a tile of at most 8 (n) skips the second
// tile's x loads and mma. The branch stays outside the unrolled loop (inside, per mma, it cost
// the loop its interleaving: measured slower).
template <int NT, int NPAIR>
__device__ __forceinline__ void dot_rows_tile_of(const RowsTile<NPAIR>& t, int pair0, const StagedX& x, int n,
                                                 float (&d)[NT][4]) {
  if (NT == 2 && n <= 8) dot_rows_tile<1, NPAIR>(t, pair0, x, *reinterpret_cast<float(*)[1][4]>(&d));
  else dot_rows_tile<NT, NPAIR>(t, pair0, x, d);
}

// Block-wide: bf16(x[t] * inv_t * gain) (NORM, as rms_norm computes it, so a short pass rounds x
// as a long one does; else bf16(x[t])) of tokens 0 .. 8 NT - 1 into xf, zeros past T and cols; a
// warp per token, a lane one word (8 columns: two float4, one uint4 of xf) at a time with WORDS
// words in flight. NORM: inv_t = 1 / sqrt(mean(x[t]^2) + eps) from a first pass over the row.
// x was written by the previous kernel: read through L2. Deterministic: fixed-order sums.
template <int NT, bool NORM, int WORDS, typename XRow>
__device__ __forceinline__ void stage_rows(const Params& p, const float* x_base, int n, XRow x_row, uint4* xf) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int words = p.chunks * 4, real_words = p.cols / 8;
  const float4* gain = reinterpret_cast<const float4*>(p.gain);
  auto squares = [](float4 v, float s) { return fmaf(v.x, v.x, fmaf(v.y, v.y, fmaf(v.z, v.z, fmaf(v.w, v.w, s)))); };
  auto normed = [](float4 v, float inv, float4 g) {
    return make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
  };
  for (int token = warp; token < NT * 8; token += kWarps) {
    const bool real = token < n;
    const float4* x = reinterpret_cast<const float4*>(x_base + (real ? x_row(token) : 0) * p.cols);
    float inv = 1.f;
    if (NORM && real) {
      float ss = 0.f;
      for (int i0 = lane; i0 < p.cols / 4; i0 += 32 * 8) {
        float4 v[8];
#pragma unroll
        for (int r = 0; r < 8; ++r)
          v[r] = i0 + 32 * r < p.cols / 4 ? __ldcg(x + i0 + 32 * r) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int r = 0; r < 8; ++r) ss = squares(v[r], ss);
      }
      ss = quant::group_sum<32>(ss);
      inv = 1.f / sqrtf(ss / float(p.cols) + p.eps);
    }
    for (int m0 = lane; m0 < words; m0 += 32 * WORDS) {
      float4 a[WORDS], b[WORDS], ga[WORDS], gb[WORDS];
#pragma unroll
      for (int r = 0; r < WORDS; ++r) {
        const int m = m0 + 32 * r;
        const bool ok = real && m < real_words;
        const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
        a[r] = ok ? __ldcg(x + 2 * m) : zero;
        b[r] = ok ? __ldcg(x + 2 * m + 1) : zero;
        if constexpr (NORM) ga[r] = ok ? __ldg(gain + 2 * m) : zero, gb[r] = ok ? __ldg(gain + 2 * m + 1) : zero;
      }
#pragma unroll
      for (int r = 0; r < WORDS; ++r) {
        const int m = m0 + 32 * r, chunk = m / 4;
        if (m >= words) break;
        if constexpr (NORM) a[r] = normed(a[r], inv, ga[r]), b[r] = normed(b[r], inv, gb[r]);
        const uint4 u = make_uint4(ptx::pack_bf16(a[r].x, b[r].x), ptx::pack_bf16(a[r].y, b[r].y),
                                   ptx::pack_bf16(a[r].z, b[r].z), ptx::pack_bf16(a[r].w, b[r].w));
        xf[(int64_t(token) * p.chunks + chunk) * 4 + ((m % 4) ^ unit_swizzle(chunk, token))] = u;
      }
    }
  }
}

// y[token, row] (+)= v, in the part that holds `row`.
template <bool ACC>
__device__ __forceinline__ void store_output(const RowsOutput& out, int64_t row, int token, float v) {
  float* y = out.parts[0].y;
  int first = 0, ld = out.parts[0].ld;
#pragma unroll
  for (int i = 1; i < RowsOutput::kMaxParts; ++i)
    if (i < out.count && row >= out.parts[i].first_row)
      y = out.parts[i].y, first = out.parts[i].first_row, ld = out.parts[i].ld;
  float* dst = y + int64_t(token) * ld + (row - first);
  *dst = ACC ? *dst + v : v;
}

// Words of x a lane stages at once: as many as the registers beside the weights allow (ptxas: no
// spills at 128 registers).
template <int NT, int KSPLIT, Form FORM>
__host__ __device__ constexpr int kStageWords() {
  if (FORM == Form::norm) return NT == 2 ? 2 : 4;  // x and the gain
  if (FORM == Form::swiglu) return 4;
  return NT == 2 || KSPLIT == 1 ? 4 : 8;
}

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// Floats per row of a warp's partial sums: odd, so the final sum reads without bank conflicts.
template <int NT>
__host__ __device__ constexpr int partial_stride() {
  return NT * 8 + 1;
}

// A task's end, block-wide, after each warp's dot_rows_tile: the warps' accumulators into their
// rows of `partial` ([warps][16][partial_stride], d[j] = (row g, tokens 8j + 2t, + 1), (row g + 8,
// the same tokens)), then for every output (output tile lt < OUT_TILES, row r, token < n) the sum
// of its KSPLIT warps' partials in a fixed order (SwiGLU: silu(G) * U, U the tiles after G's)
// handed to store(lt, r, token, v). Two block barriers: after it, partial may be rewritten.
template <int NT, int KSPLIT, int OUT_TILES, bool SWIGLU, typename Store>
__device__ __forceinline__ void sum_partials(const float (&d)[NT][4], float* partial, int n, Store store) {
  constexpr int kStride = partial_stride<NT>();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  float* mine = partial + warp * 16 * kStride;
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int token = j * 8 + 2 * t4;
    mine[g * kStride + token] = d[j][0], mine[g * kStride + token + 1] = d[j][1];
    mine[(g + 8) * kStride + token] = d[j][2], mine[(g + 8) * kStride + token + 1] = d[j][3];
  }
  __syncthreads();
  for (int o = threadIdx.x; o < OUT_TILES * 16 * n; o += kThreads) {
    const int r = o % 16, lt = (o / 16) % OUT_TILES, token = o / (16 * OUT_TILES);
    auto sum_of = [&](int tile) {
      float sum = 0.f;
#pragma unroll
      for (int k = 0; k < KSPLIT; ++k) sum += partial[((tile * KSPLIT + k) * 16 + r) * kStride + token];
      return sum;
    };
    float v = sum_of(lt);
    if constexpr (SWIGLU) v = silu(v) * sum_of(lt + OUT_TILES);
    store(lt, r, token, v);
  }
  __syncthreads();
}

// KSPLIT: the fewest warps whose 512 columns each cover cols.
inline int ksplit_for(int cols) {
  const int pairs = (cols + quant_mma::kPairCols - 1) / quant_mma::kPairCols;
  int k = 1;
  while (k * kPairs < pairs) k *= 2;
  return k;
}

// gemv_rows_ring.cu: whether its kernel takes [rows, cols] (cols 512, 1024 or 2048; rows a
// multiple of 128 for a stack of experts, of a task's rows for one matrix), and the kernel in
// `form` (T: the most positions a tile has; dense: the rows of x).
bool ring_supports(int rows, int cols, bool grouped, bool swiglu);
void gemv_rows_ring(const Params& p, Form form, int T, cudaStream_t stream);

}  // namespace lily::cuda::gemv_rows_detail
