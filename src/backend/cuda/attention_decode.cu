// attention_decode.cu: the gated attention of one new token (T = 1) over the KV cache, split
// over the keys (flash decoding) in two launches. Formulas: attention.cu's header, spec §2.4.
//
//   split s of KV head g:  keys [s R, min(L, (s + 1) R)),  R = max(128, ceil(L / S)) rounded up
//                          to 64;  L = position + 1 is read on the device and S is fixed by the
//                          capacity (num_splits), so the launch can be captured in a graph.
//     m_s,h = max_j q_h.k_j / 16 (log2 units),  l_s,h = sum_j 2^(q_h.k_j/16 - m_s,h),
//     a_s,h = sum_j 2^(q_h.k_j/16 - m_s,h) v_j            (h: the group's query heads)
//   combine:  o_h = sum_s 2^(m_s,h - M_h) a_s,h / sum_s 2^(m_s,h - M_h) l_s,h,  M_h = max_s m_s,h
//             out_h = o_h * sigmoid(gate_h)
// Shapes:   qg [nq, 2, 256] fp32 · caches [capacity, nkv, 256] bf16 · out [nq, 256] fp32 ·
//           partials [nkv, S, 8, 256] + [nkv, S, 8, 2] fp32 (caller's scratch).
// Kernels:  attention_split_kernel   grid (S, nkv), 256 threads. Splits past L exit at once; the
//             one whose range holds the new row first prepares it (k_norm, RoPE) and appends K
//             and V to the caches. The group's query heads are prepared in the block (fp32).
//             Per tile of 64 keys: (1) warp w scores keys 8w..8w+7: one 16-byte load of K per
//             lane (8 dims), 8 head dots, a transposing butterfly (reduce8); (2) warp h: online
//             softmax of head slot h; (3) warp w accumulates keys w, w + 8, ... into acc[8 heads]
//             [8 dims] for dims 8 lane .. 8 lane + 7: one 16-byte load of V per lane and key (the
//             first version read 2 bytes per thread per key). At the end the 8 warps' accumulators
//             are summed through shared memory in a fixed order (deterministic).
//           attention_combine_kernel grid (8 head slots, nkv, 2 halves of the dims), 256 threads:
//             the weights 2^(m - M) of every active split in shared memory, then the 8 warps sum
//             disjoint ranges of splits (lane: 4 dims, float4 loads), summed across warps in a
//             fixed order; times sigmoid(gate) into out.
// Tested:   tests/cuda/test_attention.cu (decode at lengths on both sides of the split size,
//           many steps, small capacities, the caller's scratch).
#include "backend/cuda/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/pdl.cuh"

#include "backend/cuda/attention_common.cuh"

namespace lily::cuda::attention_detail {

namespace {

constexpr int kCombineWarps = 8;
constexpr int kCombineDims = kHeadDim / 2;  // dims per combine block (a float4 per lane)

struct SplitRange {
  int r0, r1, n_active;
};

// Keys of split `split` of S, and how many splits have keys, at length L.
__device__ __forceinline__ SplitRange split_range(int L, int split, int S) {
  const int rows = (max(kSplitMinRows, (L + S - 1) / S) + kTile - 1) / kTile * kTile;
  SplitRange r;
  r.n_active = (L + rows - 1) / rows;
  r.r0 = split * rows;
  r.r1 = min(L, r.r0 + rows);
  return r;
}

__global__ void __launch_bounds__(kThreads) attention_split_kernel(AttnArgs p) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ __align__(16) float q_s[kGroup][kHeadDim];  // prepared queries; later the warp sums
  __shared__ __align__(16) float k_s[kHeadDim];          // the new K row
  __shared__ float s_s[kGroup][kTile];                   // scores, log2 units
  __shared__ __align__(16) float p_s[kTile][kGroup];     // probabilities
  __shared__ float alpha_s[kGroup], m_s[kGroup], l_s[kGroup];
  __shared__ __align__(16) float red_s[kThreads / 32][kGroup / 2][kHeadDim];  // 32 KB: half the heads at a time

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int split = blockIdx.x, S = gridDim.x, kv = blockIdx.y;
  const int pos = *p.position;
  const int L = min(pos + 1, p.capacity);
  const SplitRange range = split_range(L, split, S);
  if (split >= range.n_active) return;

  if (warp < p.group) {
    const int h = kv * p.group + warp;
    norm_rope_head(p, p.qg + size_t(h) * 2 * kHeadDim, p.q_norm, pos, q_s[warp]);
  } else {
    for (int i = lane; i < kHeadDim; i += 32) q_s[warp][i] = 0.f;
  }
  if (split == range.n_active - 1 && warp == kGroup - 1 && pos < p.capacity) {
    // The new row at `pos` is in this block's range; written before the barrier below, so the
    // loads after it see it (same block). Warp 7 is free when the group has fewer than 8 heads,
    // and otherwise goes on after its query head.
    norm_rope_head(p, p.k + size_t(kv) * kHeadDim, p.k_norm, pos, k_s);
    store_kv_row(p, k_s, p.v + size_t(kv) * kHeadDim, pos, kv);
  }
  __syncthreads();

  // This lane's slice of the queries, pre-scaled by log2(e)/sqrt(256) for exp2.
  float q[kGroup][8];
#pragma unroll
  for (int h = 0; h < kGroup; ++h)
#pragma unroll
    for (int i = 0; i < 8; ++i) q[h][i] = q_s[h][8 * lane + i] * (kLog2e / 16.f);

  float m_run = -INFINITY, l_run = 0.f;  // warp h: head slot h's running max and sum
  float acc[kGroup][8] = {};              // keys w, w + 8, ... of every tile; dims 8 lane ..
  const uint16_t* kbase = p.k_cache + size_t(kv) * kHeadDim;
  const uint16_t* vbase = p.v_cache + size_t(kv) * kHeadDim;
  const size_t row_stride = size_t(p.nkv) * kHeadDim;

  for (int base = range.r0; base < range.r1; base += kTile) {
    const int n = min(kTile, range.r1 - base);
    // (1) scores of keys 8w .. 8w+7 of the tile
    uint4 kr[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int j = warp * kRowsPerWarp + i;
      kr[i] = j < n ? reinterpret_cast<const uint4*>(kbase + size_t(base + j) * row_stride)[lane] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int j = warp * kRowsPerWarp + i;
      float dot[kGroup];
      key_dots(kr[i], q, dot);
      const float s = reduce8(dot);
      if ((lane & 3) == 0) s_s[lane >> 2][j] = j < n ? s : -INFINITY;
    }
    __syncthreads();
    // (2) online softmax of head slot `warp` over the tile
    {
      const float s0 = s_s[warp][lane], s1 = s_s[warp][lane + 32];
      const float m_new = fmaxf(m_run, warp_max(fmaxf(s0, s1)));  // finite: the tile has a key
      const float p0 = exp2f(s0 - m_new), p1 = exp2f(s1 - m_new);
      const float alpha = exp2f(m_run - m_new);
      l_run = l_run * alpha + warp_sum(p0 + p1);
      m_run = m_new;
      p_s[lane][warp] = p0;
      p_s[lane + 32][warp] = p1;
      if (lane == 0) alpha_s[warp] = alpha;
    }
    __syncthreads();
    // (3) acc = alpha acc + sum over keys j = warp, warp + 8, ... of p_j V_j
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      const float a = alpha_s[h];
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[h][e] *= a;
    }
    uint4 vr[kTile / (kThreads / 32)];
#pragma unroll
    for (int i = 0; i < kTile / (kThreads / 32); ++i) {
      const int j = warp + i * (kThreads / 32);
      vr[i] = j < n ? reinterpret_cast<const uint4*>(vbase + size_t(base + j) * row_stride)[lane] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kTile / (kThreads / 32); ++i) {
      const int j = warp + i * (kThreads / 32);  // p of keys past n is 0: their zero rows add nothing
      float vf[8];
      bf16x8_to_float(vr[i], vf);
      const float4 pa = *reinterpret_cast<const float4*>(&p_s[j][0]);
      const float4 pb = *reinterpret_cast<const float4*>(&p_s[j][4]);
      const float pj[kGroup] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
      for (int h = 0; h < kGroup; ++h)
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[h][e] = fmaf(pj[h], vf[e], acc[h][e]);
    }
    __syncthreads();  // s_s, p_s and alpha_s are rewritten by the next tile
  }
  if (lane == 0) m_s[warp] = m_run, l_s[warp] = l_run;

  // Sum the 8 warps' accumulators (fixed order) and publish this split's partials.
  const size_t slot = size_t(kv) * S + split;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int hh = 0; hh < kGroup / 2; ++hh) {
      float4* dst = reinterpret_cast<float4*>(&red_s[warp][hh][8 * lane]);
      const int h = half * (kGroup / 2) + hh;
      dst[0] = make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
      dst[1] = make_float4(acc[h][4], acc[h][5], acc[h][6], acc[h][7]);
    }
    __syncthreads();
    for (int i = tid; i < (kGroup / 2) * kHeadDim; i += kThreads) {
      const int hh = i / kHeadDim, d = i % kHeadDim;
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) sum += red_s[w][hh][d];
      p.part_acc[(slot * kGroup + half * (kGroup / 2) + hh) * kHeadDim + d] = sum;
    }
    __syncthreads();  // red_s is rewritten by the second half
  }
  if (tid < kGroup) {
    p.part_ml[(slot * kGroup + tid) * 2] = m_s[tid];
    p.part_ml[(slot * kGroup + tid) * 2 + 1] = l_s[tid];
  }
}

__global__ void __launch_bounds__(32 * kCombineWarps) attention_combine_kernel(AttnArgs p, int S) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float w_s[];  // [S] weights 2^(m_s - M)
  __shared__ float red_s[kCombineWarps][kCombineDims];
  __shared__ float part_s[kCombineWarps];
  __shared__ float M_s, den_s;
  const int h = blockIdx.x, kv = blockIdx.y, d0 = blockIdx.z * kCombineDims;
  if (h >= p.group) return;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int L = min(*p.position + 1, p.capacity);
  const int n_active = split_range(L, 0, S).n_active;
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

}  // namespace

void launch_attention_decode(const AttnArgs& args, int S, cudaStream_t stream) {
  attention_split_kernel<<<dim3(unsigned(S), unsigned(args.nkv)), kThreads, 0, stream>>>(args);
  CUDA_CHECK_LAUNCH();
  attention_combine_kernel<<<dim3(unsigned(kGroup), unsigned(args.nkv), unsigned(kHeadDim / kCombineDims)),
                             32 * kCombineWarps, size_t(S) * sizeof(float), stream>>>(args, S);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda::attention_detail
