// attention_decode.cu: the gated attention of one new token (T = 1) over the KV cache, split
// over the keys (flash decoding) in two launches, on the tensor cores. Formulas: spec §2.4 and
// attention/attention_prefill.cu's header.
//
//   split s of KV head g:  keys [s R, min(L, (s + 1) R)),  R = the larger of kSplitMinRows and
//                          ceil(L / N), rounded up to 64; N = the most splits that run at once
//                          (the SMs per KV head), L = position + 1 read on the device; the grid's
//                          S >= N is fixed by the capacity, so the launch can be captured.
//     m_s,h = max_j q_h.k_j / 16 (log2 units),  l_s,h = sum_j 2^(q_h.k_j/16 - m_s,h),
//     a_s,h = sum_j 2^(q_h.k_j/16 - m_s,h) v_j            (h: the group's query heads)
//   combine:  o_h = sum_s 2^(m_s,h - M_h) a_s,h / sum_s 2^(m_s,h - M_h) l_s,h,  M_h = max_s m_s,h
//             out_h = o_h * sigmoid(gate_h)
// Shapes:   qg [nq, 2, 256] fp32 · caches [capacity, nkv, 256] bf16 · out [nq, 256] fp32 ·
//           partials [nkv, S, 8, 256] + [nkv, S, 8, 2] fp32 (caller's scratch).
// Kernels:  attention_split_kernel   grid (S, nkv), 4 warps. Splits past the active ones exit at
//             once; the one whose range holds the new row first prepares it (k_norm, RoPE) and
//             appends K and V to the caches. The group's query heads are prepared in fp32 and
//             kept in shared memory as bf16 hi + lo parts, read as mma A fragments (rows = the 8
//             head slots, 8 rows of zero padding).
//             K and V stream through a cp.async pipeline of 64-key tiles (528-byte rows,
//             ldmatrix without bank conflicts) of 3 stages where the device profile's shared
//             memory holds them (Hopper), 2 (sm_80) or 1 (the 99 KB cards: a tile loaded, then
//             used), chosen once a process at the first launch (split_kernels; the 3-stage
//             kernels are the machine code of before); warp w owns keys 16w .. 16w + 15 of every tile
//             and keeps its own online softmax (m, l per head) and O^T [256 dims x 8 heads]
//             accumulators; the 4 warps are merged at the end in a fixed order.
//               S^T = Q K^T: mma.sync m16n8k16, M = head slots, N = the warp's 16 keys, K = dims
//               O^T += V^T P^T: M = dims (ldmatrix.trans of the V tile), N = head slots,
//                     K = the warp's 16 keys; P's B fragments are the S accumulators' layout.
//             Exact to fp32 level although the tensor cores take bf16: K and V are bf16 already,
//             and Q and P are split into hi + lo bf16 parts (two products each; the tensor cores
//             have time to spare, the kernel is bound by the K/V bytes).
//           attention_combine_kernel grid (8 head slots, nkv, 2 halves of the dims), 256 threads:
//             the weights 2^(m - M) of every active split in shared memory, then the 8 warps sum
//             disjoint ranges of splits (lane: 4 dims, float4 loads), summed across warps in a
//             fixed order; times sigmoid(gate) into out.
//           attention_split_rows_kernel, attention_combine_rows_kernel: the same two over the N
//             rows of a batch step (grid z: the row), each row's position, capacity and caches
//             from its tables (AttnRowTables), its vectors and partials at its offset. The
//             one-row kernels are the same code without the tables.
// Tested:   tests/cuda/test_attention.cu (decode at lengths on both sides of the split size,
//           many steps, small capacities, 69K keys, the caller's scratch); the 1- and 2-stage
//           forms by the same tests under LILY_DEVICE_PROFILE=sm86 / sm80 (not run yet on a GPU).
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/pdl.cuh"

#include "backend/cuda/attention/attention_common.cuh"
#include "backend/cuda/attention/attention_decode.h"
#include "backend/cuda/common/mma.cuh"

#include <algorithm>

namespace lily::cuda {

using namespace attention_detail;

namespace {

using namespace ptx;

constexpr int kCombineWarps = 8;
constexpr int kCombineDims = kHeadDim / 2;  // dims per combine block (a float4 per lane)

constexpr int kSplitWarps = 4, kSplitThreads = 32 * kSplitWarps;
constexpr int kSplitKeys = 16 * kSplitWarps;         // keys per tile, 16 per warp
constexpr int kRowStride = kHeadDim + 8;             // bf16 per shared row (528 bytes)
constexpr int kTileElems = kSplitKeys * kRowStride;  // bf16 per K (or V) tile
// Dynamic shared memory of kStages tiles in the cp.async pipeline (K and V): 3 stages 202,752
// bytes (Hopper's 227 KB), 2 stages 135,168 (sm_80's 163 KB), 1 stage 67,584 (99 KB cards:
// each tile loaded, then used, without overlap inside the block).
constexpr size_t split_smem_bytes(int stages) { return size_t(stages) * 2 * kTileElems * sizeof(uint16_t); }
constexpr int kMostStages = 3;
static_assert(size_t(kSplitWarps) * kGroup * kHeadDim * sizeof(float) <= split_smem_bytes(1), "merge buffer");
static_assert(kSplitMinRows % kSplitKeys == 0, "splits hold whole tiles");

struct SplitRange {
  int r0, r1, n_active;
};

// Keys of split `split` at length L when at most `max_splits` run.
__device__ __forceinline__ SplitRange split_range(int L, int split, int max_splits) {
  const int rows = (max(kSplitMinRows, (L + max_splits - 1) / max_splits) + kSplitKeys - 1) / kSplitKeys * kSplitKeys;
  SplitRange r;
  r.n_active = (L + rows - 1) / rows;
  r.r0 = split * rows;
  r.r1 = min(L, r.r0 + rows);
  return r;
}

// Split blockIdx.x of KV head blockIdx.y (the kernels below, after their PDL wait).
template <int kStages>
__device__ __forceinline__ void attention_split(const AttnArgs& p, int max_splits, trace::BlockTrace& trace) {
  extern __shared__ uint4 split_smem[];
  uint16_t* Ks = reinterpret_cast<uint16_t*>(split_smem);      // [kStages][64 keys][kRowStride]
  uint16_t* Vs = Ks + kStages * kTileElems;                    // [kStages][64 keys][kRowStride]
  __shared__ __align__(16) float q_s[kGroup][kHeadDim];        // prepared queries (fp32)
  __shared__ __align__(16) float k_s[kHeadDim];                // the new K row
  __shared__ __align__(16) uint16_t qh_s[kGroup][kRowStride];  // Q x log2(e)/16, bf16 hi part
  __shared__ __align__(16) uint16_t ql_s[kGroup][kRowStride];  // and the lo part
  __shared__ float ml_s[kSplitWarps][kGroup][2];               // each warp's (m, l) per head slot

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int split = blockIdx.x, S = gridDim.x, kv = blockIdx.y;
  const int pos = *p.position;
  const int L = min(pos + 1, p.capacity);
  const SplitRange range = split_range(L, split, max_splits);
  if (split >= range.n_active) return;

  if (split == range.n_active - 1 && warp == kSplitWarps - 1 && pos < p.capacity) {
    // The new row at `pos` is in this block's range: in the caches before any tile is issued.
    norm_rope_head(p, p.k + size_t(kv) * kHeadDim, p.k_norm, pos, k_s);
    store_kv_row(p, k_s, p.v + size_t(kv) * kHeadDim, pos, kv);
    __threadfence();
  }
  __syncthreads();

  // Tile j (keys r0 + 64 j ..) into stage st: 16 chunks of 16 bytes per thread per matrix; keys
  // past r1 read row r1 - 1 (finite; their probabilities are 0).
  const size_t row_stride = size_t(p.nkv) * kHeadDim;
  const int ntiles = (range.r1 - range.r0 + kSplitKeys - 1) / kSplitKeys;
  auto issue_tile = [&](int j, int st) {
#pragma unroll 4
    for (int c = tid; c < kSplitKeys * (kHeadDim / 8); c += kSplitThreads) {
      const int key = c / (kHeadDim / 8), part = c % (kHeadDim / 8);
      const size_t src = size_t(min(range.r0 + j * kSplitKeys + key, range.r1 - 1)) * row_stride +
                         size_t(kv) * kHeadDim + part * 8;
      const int dst = st * kTileElems + key * kRowStride + part * 8;
      cp_async16(Ks + dst, p.k_cache + src);
      cp_async16(Vs + dst, p.v_cache + src);
    }
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < ntiles) issue_tile(j, j);
    cp_async_commit();  // possibly empty: keeps the group count uniform
  }
  if constexpr (kStages == 1) {  // the first tile, its load overlapping the queries' preparation
    issue_tile(0, 0);
    cp_async_commit();
  }

  // The group's query heads (slots past the group are zero) in fp32, then Q x log2(e)/16 as
  // hi and lo bf16 parts in shared memory (528-byte rows: the A-fragment reads of the 8 rows
  // hit distinct banks). Rows 8..15 of the A operand are padding (zero registers).
  for (int h = warp; h < kGroup; h += kSplitWarps) {
    if (h < p.group) {
      norm_rope_head(p, p.qg + size_t(kv * p.group + h) * 2 * kHeadDim, p.q_norm, pos, q_s[h]);
    } else {
      for (int i = lane; i < kHeadDim; i += 32) q_s[h][i] = 0.f;
    }
  }
  __syncthreads();
  for (int i = tid; i < kGroup * kHeadDim / 2; i += kSplitThreads) {
    const int h = i / (kHeadDim / 2), d = 2 * (i % (kHeadDim / 2));
    const float sc = kLog2e / 16.f;
    uint32_t hi, lo;
    split_bf16(q_s[h][d] * sc, q_s[h][d + 1] * sc, hi, lo);
    *reinterpret_cast<uint32_t*>(&qh_s[h][d]) = hi;
    *reinterpret_cast<uint32_t*>(&ql_s[h][d]) = lo;
  }
  // (The barrier at the top of the first tile makes qh_s / ql_s visible.)

  // o[mt]: O^T rows (dims) 16 mt + g (c0, c1) and 16 mt + g + 8 (c2, c3), columns (head
  // slots) 2 t4, 2 t4 + 1. m_run, l_run: head slot g (l_run this lane's part of it).
  float o[kHeadDim / 16][4];
#pragma unroll
  for (int mt = 0; mt < kHeadDim / 16; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
  float m_run = -INFINITY, l_run = 0.f;

  for (int j = 0; j < ntiles; ++j) {
    if constexpr (kStages == 1) {
      if (j > 0) {
        __syncthreads();  // every warp is done with tile j - 1: its stage takes tile j
        issue_tile(j, 0);
        cp_async_commit();
      }
      cp_async_wait<0>();
      __syncthreads();  // tile j visible to all warps
    } else {
      cp_async_wait<kStages - 2>();
      __syncthreads();  // tile j visible to all warps; the stage of tile j - 1 is free again
      if (j + kStages - 1 < ntiles) issue_tile(j + kStages - 1, (j + kStages - 1) % kStages);
      cp_async_commit();
    }

    const int st = j % kStages;
    const uint16_t* Kw = Ks + st * kTileElems + warp * 16 * kRowStride;  // this warp's 16 keys
    const uint16_t* Vw = Vs + st * kTileElems + warp * 16 * kRowStride;

    // S^T = Q K^T: head slots x this warp's keys 0..7 (s[0]) and 8..15 (s[1]); hi and lo
    // products in separate accumulators (independent mma chains).
    float sh[2][4] = {}, sl[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      uint32_t r[4];
      ldmatrix_x4(r, Kw + ((lane & 7) + ((lane >> 4) << 3)) * kRowStride + ks * 16 + ((lane >> 3) & 1) * 8);
      const int d = ks * 16 + 2 * t4;  // A fragment: row g, dims d, d + 1 (a0) and d + 8, d + 9 (a2)
      const uint32_t ah[4] = {*reinterpret_cast<const uint32_t*>(&qh_s[g][d]), 0u,
                              *reinterpret_cast<const uint32_t*>(&qh_s[g][d + 8]), 0u};
      const uint32_t al[4] = {*reinterpret_cast<const uint32_t*>(&ql_s[g][d]), 0u,
                              *reinterpret_cast<const uint32_t*>(&ql_s[g][d + 8]), 0u};
      mma_bf16(sh[0], ah, r[0], r[1]);
      mma_bf16(sh[1], ah, r[2], r[3]);
      mma_bf16(sl[0], al, r[0], r[1]);
      mma_bf16(sl[1], al, r[2], r[3]);
    }

    // Online softmax of head slot g over this warp's keys 8n + 2 t4 + e (a quad holds a row).
    const int key0 = range.r0 + j * kSplitKeys + warp * 16;
    float s[2][2];
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const float v = sh[n][e] + sl[n][e];
        s[n][e] = key0 + 8 * n + 2 * t4 + e < range.r1 ? v : -INFINITY;
        mx = fmaxf(mx, s[n][e]);
      }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m_run, mx);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;  // no visible key yet in this warp
    const float alpha = exp2f(m_run - m_use);
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        s[n][e] = exp2f(s[n][e] - m_use);
        sum += s[n][e];
      }
    l_run = l_run * alpha + sum;
    m_run = m_new;

    // O^T = alpha O^T + V^T P^T. Column 2 t4 + e of O^T is head slot 2 t4 + e: its alpha lives
    // in the quad of lanes 4 (2 t4 + e).
    const float alpha0 = __shfl_sync(0xffffffffu, alpha, 8 * t4);
    const float alpha1 = __shfl_sync(0xffffffffu, alpha, 8 * t4 + 4);
    uint32_t pb_hi[2], pb_lo[2];  // B fragments: keys 2 t4 + e (b0) and 8 + 2 t4 + e (b1), slot g
    split_bf16(s[0][0], s[0][1], pb_hi[0], pb_lo[0]);
    split_bf16(s[1][0], s[1][1], pb_hi[1], pb_lo[1]);
#pragma unroll
    for (int mt = 0; mt < kHeadDim / 16; ++mt) {
      o[mt][0] *= alpha0, o[mt][1] *= alpha1, o[mt][2] *= alpha0, o[mt][3] *= alpha1;
      uint32_t va[4];
      ldmatrix_x4_trans(va, Vw + ((lane & 7) + ((lane >> 4) << 3)) * kRowStride + mt * 16 + ((lane >> 3) & 1) * 8);
      mma_bf16(o[mt], va, pb_hi[0], pb_hi[1]);
      mma_bf16(o[mt], va, pb_lo[0], pb_lo[1]);
    }
  }
  cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory becomes the merge buffer
  trace.mark(4);

  // Merge the 4 warps (fixed order) into this split's partials.
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  if (t4 == 0) ml_s[warp][g][0] = m_run, ml_s[warp][g][1] = l_run;
  float* o_s = reinterpret_cast<float*>(split_smem);  // [warp][head slot][dim]
#pragma unroll
  for (int mt = 0; mt < kHeadDim / 16; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int d = 16 * mt + g + 8 * (i >> 1), h = 2 * t4 + (i & 1);
      o_s[(warp * kGroup + h) * kHeadDim + d] = o[mt][i];
    }
  __syncthreads();
  const size_t slot = size_t(kv) * S + split;
  for (int i = tid; i < kGroup * kHeadDim; i += kSplitThreads) {
    const int h = i / kHeadDim, d = i % kHeadDim;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) M = fmaxf(M, ml_s[w][h][0]);
    float acc = 0.f, l = 0.f;
#pragma unroll
    for (int w = 0; w < kSplitWarps; ++w) {
      const float m = ml_s[w][h][0];
      const float wt = m == -INFINITY ? 0.f : exp2f(m - M);
      acc = fmaf(wt, o_s[(w * kGroup + h) * kHeadDim + d], acc);
      l = fmaf(wt, ml_s[w][h][1], l);
    }
    p.part_acc[(slot * kGroup + h) * kHeadDim + d] = acc;
    if (d == 0) {
      p.part_ml[(slot * kGroup + h) * 2] = M;
      p.part_ml[(slot * kGroup + h) * 2 + 1] = l;
    }
  }
}

// Head slot blockIdx.x of KV head blockIdx.y, dims [half * 128, half * 128 + 128).
__device__ __forceinline__ void attention_combine(const AttnArgs& p, int S, int max_splits, int half) {
  extern __shared__ float w_s[];  // [S] weights 2^(m_s - M)
  __shared__ float red_s[kCombineWarps][kCombineDims];
  __shared__ float part_s[kCombineWarps];
  __shared__ float M_s, den_s;
  const int h = blockIdx.x, kv = blockIdx.y, d0 = half * kCombineDims;
  if (h >= p.group) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int L = min(*p.position + 1, p.capacity);
  const int n_active = split_range(L, 0, max_splits).n_active;
  const float* ml = p.part_ml + (size_t(kv) * S * kGroup + h) * 2;  // split s: + s * kGroup * 2

  // M = max_s m_s, w_s = 2^(m_s - M), den = sum_s w_s l_s (each a block reduction, fixed order).
  float m = -INFINITY;
  for (int s = tid; s < n_active; s += blockDim.x) m = fmaxf(m, ml[size_t(s) * kGroup * 2]);
  m = warp_max(m);
  if (lane == 0) part_s[warp] = m;
  __syncthreads();
  if (tid == 0) {
    float M = -INFINITY;
    for (int w = 0; w < kCombineWarps; ++w) M = fmaxf(M, part_s[w]);
    M_s = M;
  }
  __syncthreads();
  float den = 0.f;
  for (int s = tid; s < n_active; s += blockDim.x) {
    const float w = exp2f(ml[size_t(s) * kGroup * 2] - M_s);
    w_s[s] = w;
    den += w * ml[size_t(s) * kGroup * 2 + 1];
  }
  den = warp_sum(den);
  __syncthreads();  // part_s is reused
  if (lane == 0) part_s[warp] = den;
  __syncthreads();
  if (tid == 0) {
    float sum = 0.f;
    for (int w = 0; w < kCombineWarps; ++w) sum += part_s[w];
    den_s = sum;
  }

  // o = sum_s w_s a_s over dims [d0, d0 + 128): warp w takes splits w, w + 8, ...; lane 4 dims.
  float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
  const float* acc = p.part_acc + (size_t(kv) * S * kGroup + h) * kHeadDim + d0 + 4 * lane;
#pragma unroll 4
  for (int s = warp; s < n_active; s += kCombineWarps) {
    const float w = w_s[s];
    const float4 a = *reinterpret_cast<const float4*>(acc + size_t(s) * kGroup * kHeadDim);
    o.x = fmaf(w, a.x, o.x), o.y = fmaf(w, a.y, o.y), o.z = fmaf(w, a.z, o.z), o.w = fmaf(w, a.w, o.w);
  }
  *reinterpret_cast<float4*>(&red_s[warp][4 * lane]) = o;
  __syncthreads();
  if (tid < kCombineDims) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kCombineWarps; ++w) sum += red_s[w][tid];
    const int head = kv * p.group + h, d = d0 + tid;
    const float gate = p.qg[size_t(head) * 2 * kHeadDim + kHeadDim + d];
    p.out[size_t(head) * kHeadDim + d] = sum / den_s * sigmoid(gate);
  }
}

// The one-row kernels (a decode step: grid (S, nkv) and (8, nkv, 2)) and the rows kernels of a
// batch step (grid z: the row, its two halves of the dims for the combine), each row on its own
// state and partials (row_args).
template <int kStages>
__global__ void __launch_bounds__(kSplitThreads, 1) attention_split_kernel(AttnArgs p, int max_splits) {
  trace::BlockTrace trace(trace::kind_attention_split);
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);
  attention_split<kStages>(p, max_splits, trace);
}

__global__ void __launch_bounds__(32 * kCombineWarps) attention_combine_kernel(AttnArgs p, int S, int max_splits) {
  trace::BlockTrace trace(trace::kind_attention_combine);
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);
  attention_combine(p, S, max_splits, blockIdx.z);
}

template <int kStages>
__global__ void __launch_bounds__(kSplitThreads, 1)
    attention_split_rows_kernel(AttnArgs args, AttnRowTables rows, int max_splits) {
  trace::BlockTrace trace(trace::kind_attention_split);
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);
  attention_split<kStages>(row_args(args, rows, blockIdx.z, gridDim.x), max_splits, trace);
}

__global__ void __launch_bounds__(32 * kCombineWarps)
    attention_combine_rows_kernel(AttnArgs args, AttnRowTables rows, int S, int max_splits) {
  trace::BlockTrace trace(trace::kind_attention_combine);
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);
  attention_combine(row_args(args, rows, blockIdx.z / 2, S), S, max_splits, blockIdx.z % 2);
}

int num_splits(const AttentionParams& p) {
  return std::clamp((p.capacity + kSplitMinRows - 1) / kSplitMinRows, 1, kMaxSplits);
}

// The splits that run at once: one per SM of a KV head's share.
int max_active_splits(int S, int nkv) { return std::min(S, std::max(1, multiprocessor_count() / nkv)); }

// A row of a batch step has at most max_active_splits splits with keys whatever its length
// (split_range: each holds at least L / max_splits keys), so its partials need no more.
int row_splits(const AttentionParams& p) { return max_active_splits(kMaxSplits, p.num_kv_heads); }

// A budget for the static shared memory of attention_split (queries, the new K row, the warps'
// m and l: 17,920 bytes declared, 18,944 in the sm_90a cubin).
constexpr size_t kSplitStaticSmem = 20 * 1024;
static_assert(sizeof(float) * kGroup * kHeadDim + sizeof(float) * kHeadDim +
                      2 * sizeof(uint16_t) * kGroup * kRowStride + sizeof(float) * kSplitWarps * kGroup * 2 + 1024 <=
                  kSplitStaticSmem,
              "the static shared memory budget");

// The most pipeline stages whose shared memory the device profile allows a block (0: none fit).
int split_stages(size_t shared_per_block) {
  for (int stages = kMostStages; stages >= 1; --stages)
    if (split_smem_bytes(stages) + kSplitStaticSmem <= shared_per_block) return stages;
  return 0;
}

// The split kernels of the stages this device's profile takes, their shared memory opted in once.
struct SplitKernels {
  void (*one)(AttnArgs, int) = nullptr;
  void (*rows)(AttnArgs, AttnRowTables, int) = nullptr;
  size_t smem = 0;
};

template <int kStages>
SplitKernels split_kernels_of() {
  SplitKernels k{attention_split_kernel<kStages>, attention_split_rows_kernel<kStages>, split_smem_bytes(kStages)};
  allow_dynamic_shared(k.one, k.smem, "attention_split");
  allow_dynamic_shared(k.rows, k.smem, "attention_split_rows");
  return k;
}

const SplitKernels& split_kernels() {
  static const SplitKernels kernels = [] {
    switch (split_stages(size_t(max_dynamic_shared_bytes()))) {
      case 3: return split_kernels_of<3>();
      case 2: return split_kernels_of<2>();
      case 1: return split_kernels_of<1>();
      default:
        fail("attention_split: {} bytes of shared memory a block do not hold one stage of K and V tiles ({} bytes)",
             max_dynamic_shared_bytes(), split_smem_bytes(1) + kSplitStaticSmem);
    }
  }();
  return kernels;
}

}  // namespace

size_t attention_decode_scratch_bytes(const AttentionParams& p) {
  return size_t(p.num_kv_heads) * num_splits(p) * kGroup * (kHeadDim + 2) * sizeof(float);
}

void gated_attention_decode(const AttentionParams& p, const float* qg, const float* k, const float* v, bf16* k_cache,
                            bf16* v_cache, float* out, void* scratch, cudaStream_t stream) {
  check_attention_params(p);
  LILY_CHECK(p.T == 1, "gated_attention_decode: one token, {} given", p.T);
  LILY_CHECK(scratch != nullptr, "gated_attention_decode: no scratch");
  const SplitKernels& split = split_kernels();
  const int S = num_splits(p);
  AttnArgs args = attn_args(p, qg, k, v, k_cache, v_cache, out);
  args.part_acc = static_cast<float*>(scratch);
  args.part_ml = args.part_acc + size_t(p.num_kv_heads) * S * kGroup * kHeadDim;
  const int max_splits = max_active_splits(S, args.nkv);
  split.one<<<dim3(unsigned(S), unsigned(args.nkv)), kSplitThreads, split.smem, stream>>>(args, max_splits);
  CUDA_CHECK_LAUNCH();
  attention_combine_kernel<<<dim3(unsigned(kGroup), unsigned(args.nkv), unsigned(kHeadDim / kCombineDims)),
                             32 * kCombineWarps, size_t(S) * sizeof(float), stream>>>(args, S, max_splits);
  CUDA_CHECK_LAUNCH();
}

size_t attention_decode_rows_scratch_bytes(const AttentionParams& p, int N) {
  return size_t(N) * size_t(p.num_kv_heads) * row_splits(p) * kGroup * (kHeadDim + 2) * sizeof(float);
}

void gated_attention_decode_rows(const AttentionParams& p, const AttentionRows& rows, int N, const float* qg,
                                 const float* k, const float* v, float* out, void* scratch, cudaStream_t stream) {
  check_attention_params(p);
  LILY_CHECK(p.T == 1 && N >= 1 && N <= kMaxBatchRows, "gated_attention_decode_rows: {} rows of {} token(s)", N, p.T);
  LILY_CHECK(scratch != nullptr && rows.position && rows.capacity && rows.k_cache && rows.v_cache,
             "gated_attention_decode_rows: no scratch or no tables");
  const SplitKernels& split = split_kernels();
  const int S = row_splits(p);
  AttnArgs args = attn_args(p, qg, k, v, nullptr, nullptr, out);
  args.part_acc = static_cast<float*>(scratch);
  args.part_ml = args.part_acc + size_t(N) * p.num_kv_heads * S * kGroup * kHeadDim;
  // row_args offsets each row's ml partials from part_ml by its own share: lay them after all
  // rows' accumulators, row by row.
  const AttnRowTables tables{rows.position, rows.capacity, reinterpret_cast<uint16_t* const*>(rows.k_cache),
                             reinterpret_cast<uint16_t* const*>(rows.v_cache)};
  split.rows<<<dim3(unsigned(S), unsigned(args.nkv), unsigned(N)), kSplitThreads, split.smem, stream>>>(args, tables,
                                                                                                        S);
  CUDA_CHECK_LAUNCH();
  attention_combine_rows_kernel<<<dim3(unsigned(kGroup), unsigned(args.nkv), unsigned(2 * N)), 32 * kCombineWarps,
                                  size_t(S) * sizeof(float), stream>>>(args, tables, S, S);
  CUDA_CHECK_LAUNCH();
}

size_t attention_decode_shared_bytes(size_t shared_per_block) {
  const int stages = split_stages(shared_per_block);
  return split_smem_bytes(stages > 0 ? stages : 1) + kSplitStaticSmem;
}

}  // namespace lily::cuda
