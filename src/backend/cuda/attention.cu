// attention.cu: the core of a gated full-attention layer (spec §2.4, §2.5), for any T >= 1.
//
//   q_h = RoPE(RMSNorm_zc(qg[h, 0:256]; q_norm)),  gate_h = qg[h, 256:512]
//   k_j = RoPE(RMSNorm_zc(k_j; k_norm)) -> k_cache[pos + t],  v_j -> v_cache[pos + t]  (bf16)
//   o_h = softmax(q_h K_g^T / 16) V_g over keys [0, pos + t],  g = h / (nq / nkv)
//   out_h = o_h * sigmoid(gate_h)
// RoPE: NEOX rotate-half on dims [0, 64), pairs (j, j + 32), angle (pos + t) * theta^(-2j/64) in fp32.
// Shapes:   qg [T, nq, 2, 256] · k, v [T, nkv, 256] · caches [capacity, nkv, 256] bf16 · out [T, nq, 256]
// Layout:   one block per (token, KV head, split): 256 threads handle the group's <= 8 query
//           heads together, so each K/V row is read once for all of them. Keys go in tiles of
//           64: (1) warp w scores rows 8w..8w+7, one 16-byte load of 8 bf16 per lane (a whole
//           512-byte row per warp), 8 head dots per lane summed by a transposing butterfly
//           (9 shuffles for 8 sums); (2) warp h does the online softmax of head h (fp32, exp2);
//           (3) thread d accumulates dim d of the 8 heads from the V rows.
//           The query heads are normalised and rotated by the block itself (recomputed per
//           split: 16 KB of reads), so decode is one launch.
// Variants: decode (T = 1): grid (1, nkv, S), S = min(64, capacity / 128) fixed by the
//             capacity so the launch can be captured; the length (position + 1) is read on the
//             device, each split gets max(128, L/S rounded up to 64) keys and the splits beyond
//             the length return at once. One active split (L <= kSplitMinRows = 128) writes the
//             output directly; otherwise each writes (max, sum, acc) to scratch and the last to
//             finish (an atomic counter per KV head) combines them (flash-decoding). The block
//             whose range holds the new row prepares and writes it to the caches first.
//           prefill (T > 1): kv_prep_kernel writes the T new K/V rows, then one block per
//             (token, KV head) walks keys [0, pos + t] (simple; the flash prefill is the next issue).
// Tested:   tests/cuda/test_attention.cu vs a host reference (backend/cpu rms_norm, apply_rope).
#include "backend/cuda/cuda_check.h"  // first: it configures fmt for nvcc

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/attention.h"

namespace lily::cuda {

namespace {

constexpr int kHeadDim = 256;
constexpr int kGroup = 8;          // query-head slots per KV head
constexpr int kThreads = 256;      // 8 warps; one thread per dim in the V pass
constexpr int kTile = 64;          // keys per tile, 8 per warp
constexpr int kRowsPerWarp = kTile / (kThreads / 32);
constexpr int kMaxSplits = 64;     // splits per KV head in decode (x nkv = 128 blocks)
// Decode lengths up to this use one block per KV head; longer ones split into pieces of at
// least this many keys. A first guess (a split costs about a prep plus a combine, roughly two
// tiles of latency); the lead engineer measures it.
constexpr int kSplitMinRows = 128;
constexpr float kLog2e = 1.4426950408889634f;

struct AttnArgs {
  int T, nq, nkv, group, rotary_dim, capacity;
  float eps, rope_theta;
  const float* q_norm;          // [256] effective gain
  const float* k_norm;          // [256]
  const int32_t* position;      // device: position of token 0
  const float* qg;              // [T, nq, 512]
  const float* k;               // [T, nkv, 256]
  const float* v;               // [T, nkv, 256]
  uint16_t* k_cache;            // [capacity, nkv, 256] bf16 bits
  uint16_t* v_cache;
  float* out;                   // [T, nq, 256]
  unsigned* counters;           // [nkv] split-KV arrivals (decode)
  float* part_acc;              // [nkv, S, 8, 256]
  float* part_ml;               // [nkv, S, 8, 2]  (max, sum) in log2 units
};

__device__ __forceinline__ float bf16_to_float(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }
// Round to nearest even, as base/bf16.h (to_bf16) does on the host.
__device__ __forceinline__ uint16_t float_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// One warp: dst = RoPE(RMSNorm_zc(src; gain)) for one 256-value head at `position` (spec §2.2.1,
// §2.5); dst is shared memory. Lane l holds dims 8l..8l+7 for the norm.
__device__ void norm_rope_head(const AttnArgs& p, const float* src, const float* gain, int position, float* dst) {
  const int lane = threadIdx.x % 32;
  const float4 x0 = reinterpret_cast<const float4*>(src)[2 * lane];
  const float4 x1 = reinterpret_cast<const float4*>(src)[2 * lane + 1];
  const float x[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += x[i] * x[i];
  ss = warp_sum(ss);
  const float inv = 1.f / sqrtf(ss / float(kHeadDim) + p.eps);
#pragma unroll
  for (int i = 0; i < 8; ++i) dst[8 * lane + i] = x[i] * inv * gain[8 * lane + i];
  __syncwarp();
  const int half = p.rotary_dim / 2;
  for (int j = lane; j < half; j += 32) {
    // inv_freq_j = 1 / theta^(2j / rotary_dim) and the angle in fp32, as HF; full-range sincosf.
    const float inv_freq = 1.f / powf(p.rope_theta, float(2 * j) / float(p.rotary_dim));
    float s, c;
    sincosf(float(position) * inv_freq, &s, &c);
    const float a = dst[j], b = dst[j + half];
    dst[j] = a * c - b * s;
    dst[j + half] = b * c + a * s;
  }
  __syncwarp();
}

// One warp writes a prepared K row (shared) and copies the V row into the caches at `row`.
__device__ void store_kv_row(const AttnArgs& p, const float* k_row, const float* v_src, int row, int kv) {
  const int lane = threadIdx.x % 32;
  const size_t off = (size_t(row) * p.nkv + kv) * kHeadDim + 8 * lane;
  uint32_t kw[4], vw[4];  // 8 bf16 each, low half first
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int d = 8 * lane + 2 * e;
    kw[e] = uint32_t(float_to_bf16(k_row[d])) | uint32_t(float_to_bf16(k_row[d + 1])) << 16;
    vw[e] = uint32_t(float_to_bf16(v_src[d])) | uint32_t(float_to_bf16(v_src[d + 1])) << 16;
  }
  *reinterpret_cast<uint4*>(p.k_cache + off) = make_uint4(kw[0], kw[1], kw[2], kw[3]);
  *reinterpret_cast<uint4*>(p.v_cache + off) = make_uint4(vw[0], vw[1], vw[2], vw[3]);
}

// v[s]: this lane's partial dots for the 8 head slots. Returns the sum over the warp for slot
// (lane >> 2) & 7: each step halves the values a lane keeps and doubles the lanes summed.
__device__ __forceinline__ float reduce8(const float (&v)[8]) {
  const int lane = threadIdx.x % 32;
  const bool h16 = lane & 16, h8 = lane & 8, h4 = lane & 4;
  float w[4], x[2];
#pragma unroll
  for (int i = 0; i < 4; ++i)  // slots (h16 ? 4 : 0) + i
    w[i] = (h16 ? v[i + 4] : v[i]) + __shfl_xor_sync(0xffffffffu, h16 ? v[i] : v[i + 4], 16);
#pragma unroll
  for (int i = 0; i < 2; ++i)  // slots ... + (h8 ? 2 : 0) + i
    x[i] = (h8 ? w[i + 2] : w[i]) + __shfl_xor_sync(0xffffffffu, h8 ? w[i] : w[i + 2], 8);
  float y = (h4 ? x[1] : x[0]) + __shfl_xor_sync(0xffffffffu, h4 ? x[0] : x[1], 4);
  y += __shfl_xor_sync(0xffffffffu, y, 2);
  y += __shfl_xor_sync(0xffffffffu, y, 1);
  return y;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// Block (token t, KV head kv, split): see the header. kFuseKv: decode, the block holding the new
// row prepares and writes it.
template <bool kFuseKv>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttnArgs p) {
  __shared__ __align__(16) float q_s[kGroup][kHeadDim];  // prepared queries
  __shared__ __align__(16) float k_s[kHeadDim];          // the new K row (decode)
  __shared__ float s_s[kGroup][kTile];                   // scores, log2 units
  __shared__ __align__(16) float p_s[kTile][kGroup];     // probabilities
  __shared__ float alpha_s[kGroup], m_s[kGroup], l_s[kGroup];
  __shared__ float ml_s[kMaxSplits][kGroup][2];          // combine: (max, sum), then (weight, sum)
  __shared__ int last_s;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t = blockIdx.x, kv = blockIdx.y, split = blockIdx.z, nsplit = gridDim.z;
  const int pos = *p.position + t;                     // this token's position
  const int L = min(pos + 1, p.capacity);              // visible keys [0, L)
  // Keys per split: all of them, or max(kSplitMinRows, L / S) rounded up to whole tiles.
  const int rows = nsplit == 1 ? L : (max(kSplitMinRows, (L + nsplit - 1) / nsplit) + kTile - 1) / kTile * kTile;
  const int n_active = (L + rows - 1) / rows;
  if (split >= n_active) return;
  const int r0 = split * rows, r1 = min(L, r0 + rows);

  if (warp < p.group) {
    const int h = kv * p.group + warp;
    norm_rope_head(p, p.qg + (size_t(t) * p.nq + h) * 2 * kHeadDim, p.q_norm, pos, q_s[warp]);
  } else {
    for (int i = lane; i < kHeadDim; i += 32) q_s[warp][i] = 0.f;
  }
  if (kFuseKv && split == n_active - 1 && warp == kGroup - 1 && pos < p.capacity) {
    // The new row at `pos` is in this block's range; written before the barrier below, so the
    // loads after it see it (same block). Warp 7 is free when the group has fewer than 8 heads,
    // and otherwise goes on after its query head.
    const float* src = p.k + size_t(t) * p.nkv * kHeadDim + kv * kHeadDim;
    norm_rope_head(p, src, p.k_norm, pos, k_s);
    store_kv_row(p, k_s, p.v + size_t(t) * p.nkv * kHeadDim + kv * kHeadDim, pos, kv);
  }
  __syncthreads();

  // This lane's slice of the queries, pre-scaled by log2(e)/sqrt(256) for exp2.
  float q[kGroup][8];
#pragma unroll
  for (int h = 0; h < kGroup; ++h)
#pragma unroll
    for (int i = 0; i < 8; ++i) q[h][i] = q_s[h][8 * lane + i] * (kLog2e / 16.f);

  float m_run = -INFINITY, l_run = 0.f;  // warp h: head slot h's running max and sum
  float acc[kGroup] = {};                 // thread d: dim d of each head slot
  const uint16_t* kbase = p.k_cache + size_t(kv) * kHeadDim;
  const uint16_t* vbase = p.v_cache + size_t(kv) * kHeadDim;
  const size_t row_stride = size_t(p.nkv) * kHeadDim;

  for (int base = r0; base < r1; base += kTile) {
    const int n = min(kTile, r1 - base);
    // (1) scores of rows 8w .. 8w+7 of the tile
    uint4 kr[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int j = warp * kRowsPerWarp + i;
      kr[i] = j < n ? reinterpret_cast<const uint4*>(kbase + size_t(base + j) * row_stride)[lane] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int j = warp * kRowsPerWarp + i;
      const uint32_t w[4] = {kr[i].x, kr[i].y, kr[i].z, kr[i].w};
      float kf[8];
#pragma unroll
      for (int e = 0; e < 4; ++e) kf[2 * e] = __uint_as_float(w[e] << 16), kf[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
      float dot[kGroup];
#pragma unroll
      for (int h = 0; h < kGroup; ++h) {
        dot[h] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot[h] += q[h][e] * kf[e];
      }
      const float s = reduce8(dot);
      if ((lane & 3) == 0) s_s[lane >> 2][j] = j < n ? s : -INFINITY;
    }
    __syncthreads();
    // (2) online softmax of head slot `warp` over the tile
    {
      const float s0 = s_s[warp][lane], s1 = s_s[warp][lane + 32];
      const float m_new = fmaxf(m_run, warp_max(fmaxf(s0, s1)));  // finite: the tile has a row
      const float p0 = exp2f(s0 - m_new), p1 = exp2f(s1 - m_new);
      const float alpha = exp2f(m_run - m_new);
      l_run = l_run * alpha + warp_sum(p0 + p1);
      m_run = m_new;
      p_s[lane][warp] = p0;
      p_s[lane + 32][warp] = p1;
      if (lane == 0) alpha_s[warp] = alpha;
    }
    __syncthreads();
    // (3) acc = alpha acc + sum_j p_j V_j, thread = dim
#pragma unroll
    for (int h = 0; h < kGroup; ++h) acc[h] *= alpha_s[h];
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
      const float vj = bf16_to_float(vbase[size_t(base + j) * row_stride + tid]);
      const float4 pa = *reinterpret_cast<const float4*>(&p_s[j][0]);
      const float4 pb = *reinterpret_cast<const float4*>(&p_s[j][4]);
      acc[0] += pa.x * vj, acc[1] += pa.y * vj, acc[2] += pa.z * vj, acc[3] += pa.w * vj;
      acc[4] += pb.x * vj, acc[5] += pb.y * vj, acc[6] += pb.z * vj, acc[7] += pb.w * vj;
    }
  }
  if (lane == 0) m_s[warp] = m_run, l_s[warp] = l_run;
  __syncthreads();

  const float* gate = p.qg + size_t(t) * p.nq * 2 * kHeadDim + kHeadDim;  // + h * 512
  float* out = p.out + size_t(t) * p.nq * kHeadDim;
  if (n_active == 1) {
#pragma unroll
    for (int h = 0; h < kGroup; ++h) {
      if (h >= p.group) break;
      const int head = kv * p.group + h;
      out[head * kHeadDim + tid] = acc[h] / l_s[h] * sigmoid(gate[head * 2 * kHeadDim + tid]);
    }
    return;
  }

  // Split-KV: publish this split's partials; the last split of this KV head to arrive combines.
  const size_t slot = size_t(kv) * nsplit + split;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) p.part_acc[(slot * kGroup + h) * kHeadDim + tid] = acc[h];
  if (tid < kGroup) p.part_ml[(slot * kGroup + tid) * 2] = m_s[tid], p.part_ml[(slot * kGroup + tid) * 2 + 1] = l_s[tid];
  __threadfence();
  __syncthreads();
  if (tid == 0) last_s = atomicAdd(&p.counters[kv], 1u) == unsigned(n_active - 1);
  __syncthreads();
  if (!last_s) return;
  __threadfence();
  if (tid == 0) p.counters[kv] = 0;  // every active split has arrived: ready for the next launch

  // o_h = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s,  M = max_s m_s
  // (L2 reads only: __ldcg, as other blocks wrote them during this launch.)
  const float* ml = p.part_ml + size_t(kv) * nsplit * kGroup * 2;
  for (int i = tid; i < n_active * kGroup; i += kThreads) {  // (split, slot) pairs
    ml_s[i / kGroup][i % kGroup][0] = __ldcg(ml + 2 * i);
    ml_s[i / kGroup][i % kGroup][1] = __ldcg(ml + 2 * i + 1);
  }
  __syncthreads();
  if (tid < kGroup) {
    float M = -INFINITY, den = 0.f;
    for (int s = 0; s < n_active; ++s) M = fmaxf(M, ml_s[s][tid][0]);
    for (int s = 0; s < n_active; ++s) {
      const float w = exp2f(ml_s[s][tid][0] - M);
      ml_s[s][tid][0] = w;  // now the weight
      den += w * ml_s[s][tid][1];
    }
    l_s[tid] = den;
  }
  __syncthreads();
  const float* part = p.part_acc + size_t(kv) * nsplit * kGroup * kHeadDim + tid;
  float o[kGroup] = {};
#pragma unroll 4
  for (int s = 0; s < n_active; ++s)
#pragma unroll
    for (int h = 0; h < kGroup; ++h) o[h] += ml_s[s][h][0] * __ldcg(part + (size_t(s) * kGroup + h) * kHeadDim);
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    if (h >= p.group) break;
    const int head = kv * p.group + h;
    out[head * kHeadDim + tid] = o[h] / l_s[h] * sigmoid(gate[head * 2 * kHeadDim + tid]);
  }
}

// Prefill: the T new K/V rows into the caches; block t, warp w prepares KV heads w, w+8, ...
__global__ void __launch_bounds__(kThreads) kv_prep_kernel(AttnArgs p) {
  __shared__ __align__(16) float k_s[kThreads / 32][kHeadDim];
  const int t = blockIdx.x, warp = threadIdx.x / 32;
  const int pos = *p.position + t;
  if (pos >= p.capacity) return;
  for (int kv = warp; kv < p.nkv; kv += kThreads / 32) {
    const size_t off = (size_t(t) * p.nkv + kv) * kHeadDim;
    norm_rope_head(p, p.k + off, p.k_norm, pos, k_s[warp]);
    store_kv_row(p, k_s[warp], p.v + off, pos, kv);
  }
}

int num_splits(const AttentionParams& p) {
  return std::clamp((p.capacity + kSplitMinRows - 1) / kSplitMinRows, 1, kMaxSplits);
}

// (fmt's compile-time format check does not build under nvcc: fmt::runtime.)
void check_params(const AttentionParams& p) {
  const auto check = [](bool ok, const char* what, int value) {
    if (!ok) ::lily::fail(fmt::runtime("gated_attention_core: {} = {} is not implemented"), what, value);
  };
  check(p.T >= 1, "T", p.T);
  check(p.head_dim == kHeadDim, "head_dim (only 256)", p.head_dim);
  check(p.num_kv_heads >= 1 && p.num_heads % p.num_kv_heads == 0, "num_heads (a multiple of nkv)", p.num_heads);
  check(p.num_heads / p.num_kv_heads <= kGroup, "query heads per KV head (at most 8)", p.num_heads / p.num_kv_heads);
  check(p.rotary_dim >= 0 && p.rotary_dim % 2 == 0 && p.rotary_dim <= kHeadDim, "rotary_dim", p.rotary_dim);
  check(p.capacity >= 1, "capacity", p.capacity);
}

// The grow-only scratch of the overload without one, zero-filled when (re)allocated.
void* own_scratch(size_t bytes, cudaStream_t stream) {
  static void* buffer = nullptr;
  static size_t size = 0;
  if (bytes > size) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone)
      ::lily::fail(fmt::runtime("gated_attention_core: run once before graph capture (scratch of {} bytes)"), bytes);
    if (buffer) CUDA_CHECK(cudaFreeAsync(buffer, stream));
    CUDA_CHECK(cudaMallocAsync(&buffer, bytes, stream));
    CUDA_CHECK(cudaMemsetAsync(buffer, 0, bytes, stream));
    size = bytes;
  }
  return buffer;
}

constexpr size_t kCounterBytes = 256;  // the counters' slot at the start of the scratch (alignment)

}  // namespace

size_t gated_attention_scratch_bytes(const AttentionParams& p) {
  const size_t partials = size_t(p.num_kv_heads) * num_splits(p) * kGroup * (kHeadDim + 2) * sizeof(float);
  return std::max(kCounterBytes, size_t(p.num_kv_heads) * sizeof(unsigned) + 255) / 256 * 256 + partials;
}

void gated_attention_core(const AttentionParams& p, const float* qg, const float* k, const float* v, bf16* k_cache,
                          bf16* v_cache, float* out, void* scratch, cudaStream_t stream) {
  check_params(p);
  AttnArgs args{p.T, p.num_heads, p.num_kv_heads, p.num_heads / p.num_kv_heads, p.rotary_dim, p.capacity, p.eps,
                p.rope_theta, p.q_norm, p.k_norm, p.position, qg, k, v, reinterpret_cast<uint16_t*>(k_cache),
                reinterpret_cast<uint16_t*>(v_cache), out, nullptr, nullptr, nullptr};
  if (p.T == 1) {
    if (!scratch) ::lily::fail(fmt::runtime("gated_attention_core: decode needs scratch"));
    const int S = num_splits(p);
    char* base = static_cast<char*>(scratch);
    const size_t counter_bytes = gated_attention_scratch_bytes(p) -
                                 size_t(p.num_kv_heads) * S * kGroup * (kHeadDim + 2) * sizeof(float);
    args.counters = reinterpret_cast<unsigned*>(base);
    args.part_acc = reinterpret_cast<float*>(base + counter_bytes);
    args.part_ml = args.part_acc + size_t(p.num_kv_heads) * S * kGroup * kHeadDim;
    attention_kernel<true><<<dim3(1, unsigned(p.num_kv_heads), unsigned(S)), kThreads, 0, stream>>>(args);
    CUDA_CHECK_LAUNCH();
    return;
  }
  kv_prep_kernel<<<unsigned(p.T), kThreads, 0, stream>>>(args);
  CUDA_CHECK_LAUNCH();
  attention_kernel<false><<<dim3(unsigned(p.T), unsigned(p.num_kv_heads), 1), kThreads, 0, stream>>>(args);
  CUDA_CHECK_LAUNCH();
}

void gated_attention_core(const AttentionParams& p, const float* qg, const float* k, const float* v, bf16* k_cache,
                          bf16* v_cache, float* out, cudaStream_t stream) {
  void* scratch = p.T == 1 ? own_scratch(gated_attention_scratch_bytes(p), stream) : nullptr;
  gated_attention_core(p, qg, k, v, k_cache, v_cache, out, scratch, stream);
}

}  // namespace lily::cuda
