// gemv_rows.cu: the projections of a few rows (T = 1 .. 16) on the tensor cores for a 4-bit
// affine-quantized W (mlx layout, spec §5b), the weights read once for all rows.
//
//   y[t, r] (+)= sum_c W[r, c] * x'[t, c],   W[r, c] = scale[r, c/64] * q[r, c] + bias[r, c/64]
//   RMSNorm form: x'[t] = x[t] * inv_t * gain, inv_t = 1 / sqrt(mean(x[t]^2) + eps); else x' = x
//   SwiGLU form: y[t, r] = silu((G x[t])_r) * (U x[t])_r;  grouped: W of the tile's expert
// Shapes:   W [rows, cols] (group 64, cols a multiple of 64, at most 4096; 2048 in the RMSNorm
//           form) · x [T, cols] fp32 · y [T, rows] fp32, or the parts of a fused matrix
//           (RowsOutput) · T <= 16.
// Numerics: as gemm_q4 (prefill): x' rounded to bf16 once, each weight bf16(s * q + b) with one
//           rounding (bf16x2 FMA of the exact code), mma.sync m16n8k16 with fp32 accumulation.
// Layout:   the weights as the one-row mma_gemv reads them (quant_mma.cuh): a warp owns 16 rows
//           of W (the A operand) and 512 of the columns; lane (g = lane / 4, t = lane % 4) loads
//           chunk t (32 columns, 16 bytes) of each 128-column block for rows g and g + 8, so a
//           chunk's 4 words are 8 mma k-steps of 16 columns across the quad. The B operand's 8
//           columns are 8 tokens (NT tiles of 8 for T <= 8 NT): lane (g, t) needs token g's x at
//           the same permuted columns as its weights, so x is staged once per block in shared
//           memory as bf16 pairs in that order, [token][chunk][4 x uint4]: uint32 4w + j of a
//           chunk = (x[8w + j], x[8w + j + 4]), the B registers of word w's two mma. The uint4 of
//           word w sits at w ^ swizzle(chunk, token), so the 8 lanes of a quarter warp (2 tokens
//           x 4 chunks) read 8 distinct bank groups.
// Kernel:   gemv_rows_kernel<NT, KSPLIT, FORM>, 256 threads: a task is 8 / KSPLIT tiles of
//           16 rows (SwiGLU: half of them G, half U of the same rows), each tile's columns split
//           over KSPLIT warps (512 columns each) and summed in shared memory in a fixed order.
//           The first task's weights are in registers before the PDL wait and the later tasks'
//           on their way into L2 (grouped: one task, loaded once the tile map names the expert,
//           after the wait); then x
//           is staged (a warp per token, 8 columns a lane, several loads in flight; normalized
//           there as rms_norm does, so short and long passes round x alike), and the block strides over
//           its tasks: dense, a grid of at most the blocks resident at once; grouped, a grid of
//           (a tile's tasks, the map's tiles), blocks past the map's count exiting.
// Tested:   tests/cuda/test_gemv_rows.cu against the bf16 reference of the prefill GEMM, T 1..16
//           across the 8-token tiles, rows around the 16-row tiles, cols from one group to 4096,
//           fused outputs into four parts, NaN-poisoned outputs and guards past every part; the
//           grouped and SwiGLU forms through tests/cuda/test_moe_grouped.cu (ExpertsOnFewRowKernels).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"
#include "backend/cuda/gemv/gemv_rows.h"
#include "backend/cuda/gemv/gemv_rows_common.cuh"

#include <algorithm>

namespace lily::cuda {

namespace {

using namespace gemv_rows_detail;

// Loads pairs pair0 .. pair0 + NPAIR - 1 (chunks past the row end: zero codes, scale and bias).
template <int NPAIR>
__device__ __forceinline__ void load_rows_tile(RowsTile<NPAIR>& t, const Matrix4& m, int cols, int64_t row_g,
                                               int64_t row_g8, int pair0) {
  const int t4 = threadIdx.x % 4, cpr = cols / 32, gpr = cols / 64;
#pragma unroll
  for (int pp = 0; pp < NPAIR; ++pp)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int chunk = 4 * (2 * (pair0 + pp) + b) + t4, grp = chunk / 2;
      const bool ok = chunk < cpr;
      t.q[pp][b][0] = ok ? quant::load_codes(m.codes + row_g * cpr + chunk) : make_uint4(0, 0, 0, 0);
      t.q[pp][b][1] = ok ? quant::load_codes(m.codes + row_g8 * cpr + chunk) : make_uint4(0, 0, 0, 0);
      t.scale[pp][b][0] = ok ? load_bf16x2(m.scales + row_g * gpr + grp) : 0u;
      t.scale[pp][b][1] = ok ? load_bf16x2(m.scales + row_g8 * gpr + grp) : 0u;
      t.bias[pp][b][0] = ok ? load_bf16x2(m.biases + row_g * gpr + grp) : 0u;
      t.bias[pp][b][1] = ok ? load_bf16x2(m.biases + row_g8 * gpr + grp) : 0u;
    }
}

// The lines load_rows_tile would read, into L2 only: the block's later tasks, before its wait.
template <int NPAIR>
__device__ __forceinline__ void prefetch_rows_tile(const Matrix4& m, int cols, int64_t row_g, int64_t row_g8,
                                                   int pair0) {
  const int t4 = threadIdx.x % 4, cpr = cols / 32, gpr = cols / 64;
#pragma unroll
  for (int pp = 0; pp < NPAIR; ++pp)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int chunk = 4 * (2 * (pair0 + pp) + b) + t4, grp = chunk / 2;
      if (chunk >= cpr) continue;
      prefetch_l2(m.codes + row_g * cpr + chunk), prefetch_l2(m.codes + row_g8 * cpr + chunk);
      if (chunk % 2 == 0) {
        prefetch_l2(m.scales + row_g * gpr + grp), prefetch_l2(m.scales + row_g8 * gpr + grp);
        prefetch_l2(m.biases + row_g * gpr + grp), prefetch_l2(m.biases + row_g8 * gpr + grp);
      }
    }
}

template <int NT, int KSPLIT, Form FORM>
__global__ void __launch_bounds__(kThreads, 2) gemv_rows_kernel(Params p) {
  extern __shared__ __align__(16) uint4 smem[];
  constexpr bool NORM = FORM == Form::norm, SWIGLU = FORM == Form::swiglu;
  constexpr int kTilesPerTask = kWarps / KSPLIT;
  constexpr int kOutTiles = SWIGLU ? kTilesPerTask / 2 : kTilesPerTask;  // a task's output tiles of 16 rows
  static_assert(kOutTiles >= 1);
  uint4* xf = smem;                                                                  // [8 NT][chunks][4]
  float* partial = reinterpret_cast<float*>(smem + int64_t(NT) * 8 * p.chunks * 4);  // [warps][16][stride]
  const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4;
  const int64_t tiles = (int64_t(p.rows) + 15) / 16, tasks = (tiles + kOutTiles - 1) / kOutTiles;
  const int kpart = warp % KSPLIT, local_tile = warp / KSPLIT;

  // The warp's matrix and rows in a task: SwiGLU: the first half of the warps G, the second U,
  // of the same rows.
  Matrix4 m = p.w[SWIGLU && local_tile >= kOutTiles ? 1 : 0];
  auto rows_of = [&](int64_t task, int64_t& row_g, int64_t& row_g8) {
    const int64_t tile = min(task * kOutTiles + local_tile % kOutTiles, tiles - 1);
    row_g = min(tile * 16 + g, int64_t(p.rows) - 1), row_g8 = min(tile * 16 + g + 8, int64_t(p.rows) - 1);
  };
  auto load = [&](RowsTile<kPairs>& t, int64_t task) {
    int64_t row_g, row_g8;
    rows_of(task, row_g, row_g8);
    load_rows_tile<kPairs>(t, m, p.cols, row_g, row_g8, kpart * kPairs);
  };
  RowsTile<kPairs> t;
  const bool grouped = p.tiles != nullptr;
  if (!grouped) {  // weights depend on nothing: before the wait, the later tasks' into L2
    if (blockIdx.x < tasks) load(t, blockIdx.x);
    for (int64_t task = blockIdx.x + gridDim.x; task < tasks; task += gridDim.x) {
      int64_t row_g, row_g8;
      rows_of(task, row_g, row_g8);
      prefetch_rows_tile<kPairs>(m, p.cols, row_g, row_g8, kpart * kPairs);
    }
  }
  pdl_wait();
  pdl_launch_dependents();
  int n = p.T, first = 0;  // the tokens: positions [first, first + n)
  if (grouped) {           // the tile map is a predecessor's: after the wait
    if (int(blockIdx.y) >= __ldcg(p.num_tiles)) return;
    const int4 tile = __ldcg(reinterpret_cast<const int4*>(p.tiles) + blockIdx.y);
    first = tile.y, n = tile.z - tile.y;
    const int64_t cpr = p.cols / 32, gpr = p.cols / 64, e = tile.x;
    m.codes += e * p.rows * cpr, m.scales += e * p.rows * gpr, m.biases += e * p.rows * gpr;
    load(t, blockIdx.x);
  }
  auto x_row = [&](int i) -> int64_t {
    if (!grouped) return i;
    return p.gather ? __ldcg(p.gather + first + i) / p.gather_div : first + i;
  };
  stage_rows<NT, NORM, kStageWords<NT, KSPLIT, FORM>()>(p, p.x, n, x_row, xf);
  __syncthreads();

  for (int64_t task = blockIdx.x; task < tasks; task += gridDim.x) {
    if (task != blockIdx.x) load(t, task);
    float d[NT][4] = {};
    dot_rows_tile_of<NT, kPairs>(t, kpart * kPairs, StagedX{xf, p.chunks}, n, d);
    sum_partials<NT, KSPLIT, kOutTiles, SWIGLU>(d, partial, n, [&](int lt, int r, int token, float v) {
      const int64_t row = (task * kOutTiles + lt) * 16 + r;
      if (row < p.rows) store_output<FORM == Form::accumulate>(p.out, row, first + token, v);
    });
  }
}

template <int NT, int KSPLIT, Form FORM>
void launch(const Params& p, int max_tiles, cudaStream_t stream) {
  auto* kernel = gemv_rows_kernel<NT, KSPLIT, FORM>;
  const size_t sums = size_t(kWarps) * 16 * partial_stride<NT>() * 4;  // partial
  const size_t shared = size_t(NT) * 8 * size_t(p.chunks) * 64 + sums;
  static const bool attribute_set = [&] {
    const size_t most = size_t(NT) * 8 * (kMaxCols / 32) * 64 + sums;
    allow_dynamic_shared_up_to(kernel, most, "gemv_rows");
    return true;
  }();
  (void)attribute_set;
  check_dynamic_shared(shared, "gemv_rows");
  constexpr int kOutTiles = FORM == Form::swiglu ? kWarps / KSPLIT / 2 : kWarps / KSPLIT;
  const int64_t tiles = (int64_t(p.rows) + 15) / 16, tasks = (tiles + kOutTiles - 1) / kOutTiles;
  if (p.tiles) {  // a block a task of a tile (blocks taking 4 tasks each measured slower)
    launch_after_wait(kernel, dim3(unsigned(tasks), unsigned(max_tiles)), dim3(kThreads), shared, stream, p);
    return;
  }
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, shared));
  const int64_t blocks = std::min<int64_t>(tasks, int64_t(std::max(1, per_sm)) * multiprocessor_count());
  launch_after_wait(kernel, dim3(unsigned(blocks)), dim3(kThreads), shared, stream, p);
}

// T: the most tokens of a group (grouped: of a tile).
template <Form FORM>
void dispatch(Params p, int T, int max_tiles, cudaStream_t stream) {
  const int ksplit = ksplit_for(p.cols);
  p.chunks = ksplit * kPairs * 8;
  if (ring_supports(p.rows, p.cols, p.tiles != nullptr, FORM == Form::swiglu)) {  // the model's shapes
    gemv_rows_ring(p, FORM, T, stream);
    CUDA_CHECK_LAUNCH();
    return;
  }
  auto go = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    switch (ksplit) {
      case 1: launch<NT, 1, FORM>(p, max_tiles, stream); break;
      case 2: launch<NT, 2, FORM>(p, max_tiles, stream); break;
      case 4: launch<NT, 4, FORM>(p, max_tiles, stream); break;
      default:
        if constexpr (FORM != Form::swiglu) launch<NT, 8, FORM>(p, max_tiles, stream);
        break;
    }
  };
  if (T <= 8) go(quant::Int<1>{});
  else go(quant::Int<2>{});
  CUDA_CHECK_LAUNCH();
}

Matrix4 matrix_of(const QMatrix& W) {
  return {reinterpret_cast<const uint4*>(W.codes), reinterpret_cast<const uint16_t*>(W.scales),
          reinterpret_cast<const uint16_t*>(W.biases)};
}

Params params_of(const QMatrix& W, const float* x, int T) {
  Params p{};
  p.w[0] = p.w[1] = matrix_of(W);
  p.x = x;
  p.rows = W.rows, p.cols = W.cols, p.T = T;
  return p;
}

void check_call(const QMatrix& W, const float* x, int T, bool rms_norm, const char* what) {
  LILY_CHECK(gemv_rows_supports(W, rms_norm), "{}: [{}, {}] q{} group {} is not a matrix it takes", what, W.rows,
             W.cols, W.bits, W.group_size);
  LILY_CHECK(T >= 1 && T <= kGemvRowsMaxT, "{}: {} rows (1 .. {})", what, T, kGemvRowsMaxT);
  LILY_CHECK(aligned16(x), "{}: x must be 16-byte aligned", what);
}

void set_groups(Params& p, const RowsGroups& groups) {
  p.tiles = groups.tiles, p.num_tiles = groups.num_tiles, p.gather = groups.gather;
  p.gather_div = std::max(1, groups.gather_div);
}

bool same_shape(const QMatrix& a, const QMatrix& b) {
  return gemv_rows_supports(b, false) && a.rows == b.rows && a.cols == b.cols && b.batch == 1;
}

// The groups' extra into the ring kernel's last tile, where it takes it (U: SwiGLU's, or null).
bool fold_extra(Params& p, const RowsGroups& g, const QMatrix& W, const QMatrix* U) {
  if (!g.extra_w || g.extra_T < 1) return false;
  LILY_CHECK(g.extra_T <= kGemvRowsMaxT && g.extra_x && g.extra_y && aligned16(g.extra_x) && (!U || g.extra_u),
             "gemv_rows: an extra group of {} rows", g.extra_T);
  if (!ring_supports(W.rows, W.cols, true, U != nullptr) || !same_shape(W, *g.extra_w) ||
      (U && !same_shape(*U, *g.extra_u)))
    return false;
  p.extra_w[0] = matrix_of(*g.extra_w), p.extra_w[1] = matrix_of(U ? *g.extra_u : *g.extra_w);
  p.extra_x = g.extra_x, p.extra_y = g.extra_y, p.extra_n = g.extra_T;
  return true;
}

}  // namespace

bool gemv_rows_supports(const QMatrix& W, bool rms_norm) {
  return W.bits == 4 && W.group_size == 64 && W.rows > 0 && W.cols > 0 && W.cols % 64 == 0 &&
         W.cols <= (rms_norm ? kNormMaxCols : kMaxCols) && aligned16(W.codes) && aligned16(W.scales) &&
         aligned16(W.biases);
}

bool gemv_rows_swiglu_supports(const QMatrix& G, const QMatrix& U) {
  return gemv_rows_supports(G, false) && gemv_rows_supports(U, false) && G.rows == U.rows && G.cols == U.cols &&
         G.batch == U.batch && ksplit_for(G.cols) <= 4;
}

void rms_norm_gemv_rows(const QMatrix& W, const float* x, int T, const float* gain, float eps, const RowsOutput& y,
                        cudaStream_t stream) {
  check_call(W, x, T, true, "rms_norm_gemv_rows");
  LILY_CHECK(W.batch == 1, "rms_norm_gemv_rows: a stack of {} matrices", W.batch);
  LILY_CHECK(y.count >= 1 && y.count <= RowsOutput::kMaxParts && y.parts[0].first_row == 0,
             "rms_norm_gemv_rows: {} output parts, the first at row {}", y.count, y.parts[0].first_row);
  for (int i = 1; i < y.count; ++i)
    LILY_CHECK(y.parts[i].first_row > y.parts[i - 1].first_row && y.parts[i].first_row < W.rows,
               "rms_norm_gemv_rows: output part {} starts at row {}", i, y.parts[i].first_row);
  Params p = params_of(W, x, T);
  p.gain = gain, p.eps = eps, p.out = y;
  dispatch<Form::norm>(p, T, 0, stream);
}

void gemv_rows_accumulate(const QMatrix& W, const float* x, int T, float* y, cudaStream_t stream) {
  check_call(W, x, T, false, "gemv_rows_accumulate");
  LILY_CHECK(W.batch == 1, "gemv_rows_accumulate: a stack of {} matrices", W.batch);
  Params p = params_of(W, x, T);
  p.out = RowsOutput::whole(y, W.rows);
  dispatch<Form::accumulate>(p, T, 0, stream);
}

void gemv_rows(const QMatrix& W, const float* x, int T, const RowsGroups* groups, float* y, cudaStream_t stream) {
  check_call(W, x, T, false, "gemv_rows");
  LILY_CHECK(groups || W.batch == 1, "gemv_rows: a stack of {} matrices without a tile map", W.batch);
  Params p = params_of(W, x, T);
  p.out = RowsOutput::whole(y, W.rows);
  if (groups) set_groups(p, *groups);
  const bool folded = groups && fold_extra(p, *groups, W, nullptr);
  dispatch<Form::store>(p, std::max(T, folded ? groups->extra_T : 0), groups ? groups->max_tiles : 0, stream);
  if (groups && groups->extra_w && groups->extra_T > 0 && !folded)
    gemv_rows(*groups->extra_w, groups->extra_x, groups->extra_T, nullptr, groups->extra_y, stream);
}

void gemv_rows_swiglu(const QMatrix& G, const QMatrix& U, const float* x, int T, const RowsGroups* groups, float* act,
                      cudaStream_t stream) {
  LILY_CHECK(gemv_rows_swiglu_supports(G, U), "gemv_rows_swiglu: G [{}, {}, {}] q{}, U [{}, {}, {}] q{}", G.batch,
             G.rows, G.cols, G.bits, U.batch, U.rows, U.cols, U.bits);
  check_call(G, x, T, false, "gemv_rows_swiglu");
  LILY_CHECK(groups || G.batch == 1, "gemv_rows_swiglu: a stack of {} matrices without a tile map", G.batch);
  Params p = params_of(G, x, T);
  p.w[1] = matrix_of(U);
  p.out = RowsOutput::whole(act, G.rows);
  if (groups) set_groups(p, *groups);
  const bool folded = groups && fold_extra(p, *groups, G, &U);
  dispatch<Form::swiglu>(p, std::max(T, folded ? groups->extra_T : 0), groups ? groups->max_tiles : 0, stream);
  if (groups && groups->extra_w && groups->extra_T > 0 && !folded)
    gemv_rows_swiglu(*groups->extra_w, *groups->extra_u, groups->extra_x, groups->extra_T, nullptr, groups->extra_y,
                     stream);
}

}  // namespace lily::cuda