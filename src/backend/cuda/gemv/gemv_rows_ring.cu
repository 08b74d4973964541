// gemv_rows_ring.cu: the few-row GEMVs of short passes (T <= 16 tokens) with the weights streamed
// through a ring of shared-memory stages, so that every SM keeps reading while it computes
// (gemv_rows.cu's register form reads a block's weights, then computes, then exits: about half
// the copy bandwidth on these shapes). Two uses:
//   grouped: the routed experts over the plan's tile map, for every position q of tile
//            j = {expert e, first, end}, j < *num_tiles, and optionally one more tile of all T
//            rows through a matrix of the stack's shape (the shared expert: its launches saved):
//              y[q, r] = sum_c W_e[r, c] * x[gather(q), c]          (store: the experts' down)
//              y[q, r] = silu((G_e x)_r) * (U_e x)_r                  (SwiGLU: gate/up)
//   dense:   one matrix over x's T rows, in any of gemv_rows.cu's forms (the RMSNorm form: the
//            input projections), its first items' weights in flight before the PDL wait.
// Shapes:   W [rows, cols] or a stack [E, rows, cols] (4-bit, group 64), cols 512 * KSPLIT for
//           KSPLIT = 1, 2 or 4 (the experts' 512 x 2048 and 2048 x 512, the input projections'
//           [12352 | 9216] x 2048) · x [.., cols] fp32 · y fp32 · a tile at most 16 positions.
// Numerics: gemv_rows.cu's: the same warp tiles, mma and fixed-order sums, bit for bit.
// Layout:   an item is (tile, task): a task is gemv_rows.cu's (8 / KSPLIT tiles of 16 rows of W;
//           SwiGLU: half G, half U), items in tile-major order, and a persistent block (one an SM)
//           takes a contiguous range of them, so x is staged only when its range enters a new
//           tile. A warp's share of an item (16 rows x 512 columns: 4 KB of codes, 16 rows of 8
//           group scales and biases) goes by cp.async into its part of a stage: each lane copies
//           the 8 code units it will read back itself ([unit][lane]: no bank conflicts), lanes
//           0-15 a row's scales and 16-31 a row's biases (16 bytes each).
// Kernel:   gemv_rows_ring_kernel<NT, KSPLIT, FORM>, 256 threads, kStages stages: the block
//           issues its first kStages - 1 items (grouped: after the PDL wait, the tile map being a
//           predecessor's); each iteration issues item + kStages - 1, stages x if the tile
//           changed, waits for its own stage, multiplies, and sums the KSPLIT partials through
//           shared memory.
// Tested:   tests/cuda/test_moe_grouped.cu (ExpertsOnFewRowKernels: the model's expert widths
//           and 1024 x 256 at T 1..16, uniform, few and one dominant expert, the shared expert
//           folded in) and tests/cuda/test_gemv_rows.cu (the dense forms at the model's input
//           projections and at ring shapes around them) against the bf16 reference.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"
#include "backend/cuda/gemv/gemv_rows_common.cuh"

namespace lily::cuda::gemv_rows_detail {

namespace {

constexpr int kStages = 4;
constexpr int kCodeUnits = kPairs * 2 * 2 * 32;  // uint4 of a warp's codes in a stage: 8 a lane
constexpr int kScaleUnits = 32;                  // 16 rows' scales (lanes 0-15), biases (16-31): 16 B each
constexpr int kWarpUnits = kCodeUnits + kScaleUnits;
constexpr int kStageUnits = kWarps * kWarpUnits;

// The code unit of lane's (pair pp, block b, row g + 8 half) in a warp's stage.
__device__ __forceinline__ int code_unit(int pp, int b, int half, int lane) {
  return ((pp * 2 + b) * 2 + half) * 32 + lane;
}

// This warp's share of item (e, rows row0 .. row0 + 15 of m_e, columns kpart * 512 ..) into dst.
__device__ __forceinline__ void issue_weights(const Matrix4& m, int64_t e, int rows, int cols, int64_t row0, int kpart,
                                              uint4* dst) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int64_t cpr = cols / 32, gpr = cols / 64;
  const uint4* codes = m.codes + e * rows * cpr;
#pragma unroll
  for (int pp = 0; pp < kPairs; ++pp)
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int chunk = 4 * (2 * (kpart * kPairs + pp) + b) + t4;
        ptx::cp_async16(dst + code_unit(pp, b, half, lane), codes + (row0 + g + 8 * half) * cpr + chunk);
      }
  const uint16_t* groups = (lane < 16 ? m.scales : m.biases) + e * rows * gpr;
  ptx::cp_async16(dst + kCodeUnits + lane, groups + (row0 + lane % 16) * gpr + kpart * 8);
}

// The warp tile of a stage filled by issue_weights, as gemv_rows.cu's load_rows_tile leaves it.
__device__ __forceinline__ void read_weights(const uint4* src, RowsTile<kPairs>& t) {
  const int lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const uint16_t* groups = reinterpret_cast<const uint16_t*>(src + kCodeUnits);  // [scales 16 | biases 16][8]
  auto both = [](uint16_t v) { return uint32_t(v) | (uint32_t(v) << 16); };
#pragma unroll
  for (int pp = 0; pp < kPairs; ++pp)
#pragma unroll
    for (int b = 0; b < 2; ++b) {
      const int lg = 4 * pp + 2 * b + t4 / 2;  // the chunk's group within the warp's 8
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        t.q[pp][b][half] = src[code_unit(pp, b, half, lane)];
        t.scale[pp][b][half] = both(groups[(g + 8 * half) * 8 + lg]);
        t.bias[pp][b][half] = both(groups[(16 + g + 8 * half) * 8 + lg]);
      }
    }
}

template <int NT, int KSPLIT, Form FORM>
__global__ void __launch_bounds__(kThreads, 1) gemv_rows_ring_kernel(Params p) {
  extern __shared__ __align__(16) uint4 smem[];
  constexpr bool SWIGLU = FORM == Form::swiglu, NORM = FORM == Form::norm;
  constexpr int kTilesPerTask = kWarps / KSPLIT;
  constexpr int kOutTiles = SWIGLU ? kTilesPerTask / 2 : kTilesPerTask;  // a task's output tiles of 16 rows
  static_assert(kOutTiles >= 1);
  uint4* ring = smem;                                                              // [kStages][kWarps][kWarpUnits]
  uint4* xf = smem + kStages * kStageUnits;                                        // [8 NT][chunks][4]
  float* partial = reinterpret_cast<float*>(xf + int64_t(NT) * 8 * p.chunks * 4);  // [warps][16][stride]
  const int warp = threadIdx.x / 32;
  const int kpart = warp % KSPLIT, local_tile = warp / KSPLIT;
  const int tasks = p.rows / 16 / kOutTiles;
  const int which = SWIGLU && local_tile >= kOutTiles ? 1 : 0;  // SwiGLU: the second half of the warps U
  uint4* my_ring = ring + warp * kWarpUnits;

  const bool grouped = p.tiles != nullptr;  // else one tile of all p.T rows of x
  int num_tiles = 1;                        // then the extra tile, if any
  int64_t begin = 0, end = 0;
  int issued_tile = -1, expert = 0;
  auto issue = [&](int64_t item) {
    const int tile = int(item / tasks), task = int(item % tasks);
    if (tile != issued_tile)
      issued_tile = tile, expert = grouped && tile < num_tiles ? __ldcg(p.tiles + 4 * int64_t(tile)) : 0;
    const int64_t row0 = int64_t(task * kOutTiles + local_tile % kOutTiles) * 16;
    issue_weights(tile < num_tiles ? p.w[which] : p.extra_w[which], expert, p.rows, p.cols, row0, kpart,
                  my_ring + int((item - begin) % kStages) * kStageUnits);
  };
  // The block's range of items, and its first kStages - 1 items' weights on their way.
  auto start = [&] {
    const int64_t items = int64_t(num_tiles + (p.extra_n > 0 ? 1 : 0)) * tasks;
    begin = items * blockIdx.x / gridDim.x, end = items * (blockIdx.x + 1) / gridDim.x;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (begin + s < end) issue(begin + s);
      ptx::cp_async_commit();  // possibly empty: keeps the group count uniform
    }
  };
  if (!grouped) start();  // dense: the weights depend on nothing, in flight before the wait
  pdl_wait();             // the tile map and x are predecessors'
  pdl_launch_dependents();
  if (grouped) num_tiles = __ldcg(p.num_tiles), start();

  int tile = -1, first = 0, n = 0;  // the staged tile: positions [first, first + n)
  for (int64_t item = begin; item < end; ++item) {
    if (item + kStages - 1 < end) issue(item + kStages - 1);  // into the stage read one item ago
    ptx::cp_async_commit();
    const int task = int(item % tasks);
    if (int(item / tasks) != tile) {  // a new tile: its x (every warp is past the last item's reads)
      tile = int(item / tasks);
      if (!grouped) {
        first = 0, n = p.T;
        stage_rows<NT, NORM, kStageWords<NT, KSPLIT, FORM>()>(
            p, p.x, n, [](int i) { return int64_t(i); }, xf);
      } else if (tile < num_tiles) {
        const int4 info = __ldcg(reinterpret_cast<const int4*>(p.tiles) + tile);
        first = info.y, n = info.z - info.y;
        auto x_row = [&](int i) -> int64_t {
          return p.gather ? __ldcg(p.gather + first + i) / p.gather_div : first + i;
        };
        stage_rows<NT, false, kStageWords<NT, KSPLIT, FORM>()>(p, p.x, n, x_row, xf);
      } else {  // the extra tile: its own rows of its own x
        first = 0, n = p.extra_n;
        stage_rows<NT, false, kStageWords<NT, KSPLIT, FORM>()>(
            p, p.extra_x, n, [](int i) { return int64_t(i); }, xf);
      }
      __syncthreads();
    }
    ptx::cp_async_wait<kStages - 1>();  // this item's stage: this lane's copies
    __syncwarp();                       // and the warp's other lanes' (the scales)
    RowsTile<kPairs> t;
    read_weights(my_ring + int((item - begin) % kStages) * kStageUnits, t);
    float d[NT][4] = {};
    dot_rows_tile_of<NT, kPairs>(t, kpart * kPairs, StagedX{xf, p.chunks}, n, d);
    // then partial, x and this stage may be rewritten by the next items
    sum_partials<NT, KSPLIT, kOutTiles, SWIGLU>(d, partial, n, [&](int lt, int r, int token, float v) {
      const int64_t row = (int64_t(task) * kOutTiles + lt) * 16 + r;
      if (tile < num_tiles) store_output<FORM == Form::accumulate>(p.out, row, first + token, v);
      else p.extra_y[int64_t(token) * p.rows + row] = v;
    });
  }
  ptx::cp_async_wait<0>();
}

template <int NT, int KSPLIT>
constexpr size_t shared_bytes() {
  return size_t(kStages) * kStageUnits * 16 + size_t(NT) * 8 * (KSPLIT * kPairs * 8) * 64 +
         size_t(kWarps) * 16 * partial_stride<NT>() * 4;
}

template <int NT, int KSPLIT, Form FORM>
void launch(const Params& p, cudaStream_t stream) {
  auto* kernel = gemv_rows_ring_kernel<NT, KSPLIT, FORM>;
  constexpr size_t bytes = shared_bytes<NT, KSPLIT>();
  static const bool attribute_set = [&] {
    allow_dynamic_shared(kernel, bytes, "gemv_rows_ring");
    return true;
  }();
  (void)attribute_set;
  launch_after_wait(kernel, dim3(unsigned(multiprocessor_count())), dim3(kThreads), bytes, stream, p);
}

template <Form FORM>
void dispatch(const Params& p, int T, cudaStream_t stream) {
  auto go = [&](auto nt) {
    constexpr int NT = decltype(nt)::value;
    switch (ksplit_for(p.cols)) {
      case 1: launch<NT, 1, FORM>(p, stream); break;
      case 2: launch<NT, 2, FORM>(p, stream); break;
      default: launch<NT, 4, FORM>(p, stream); break;
    }
  };
  if (T <= 8) go(quant::Int<1>{});
  else go(quant::Int<2>{});
}

}  // namespace

bool ring_supports(int rows, int cols, bool grouped, bool swiglu) {
  const int ksplit = ksplit_for(cols), out_tiles = kWarps / ksplit / (swiglu ? 2 : 1);
  return rows > 0 && ksplit <= 4 && cols == 512 * ksplit && rows % (16 * (grouped ? kWarps : out_tiles)) == 0 &&
         shared_bytes<2, 4>() <= size_t(max_dynamic_shared_bytes());
}

void gemv_rows_ring(const Params& p, Form form, int T, cudaStream_t stream) {
  LILY_CHECK(ring_supports(p.rows, p.cols, p.tiles != nullptr, form == Form::swiglu) && T >= 1 && T <= kGemvRowsMaxT &&
                 (p.tiles == nullptr) == (p.num_tiles == nullptr),
             "gemv_rows_ring: [{}, {}] with {} tokens a tile", p.rows, p.cols, T);
  switch (form) {
    case Form::norm: dispatch<Form::norm>(p, T, stream); break;
    case Form::accumulate: dispatch<Form::accumulate>(p, T, stream); break;
    case Form::store: dispatch<Form::store>(p, T, stream); break;
    case Form::swiglu: dispatch<Form::swiglu>(p, T, stream); break;
  }
}

}  // namespace lily::cuda::gemv_rows_detail
