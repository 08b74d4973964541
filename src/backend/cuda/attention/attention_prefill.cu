// attention_prefill.cu: the core of a gated full-attention layer (spec §2.4, §2.5) for a block
// of T tokens (prefill); attention/attention_decode.cu is the one-token path.
//
//   q_h = RoPE(RMSNorm_zc(qg[h, 0:256]; q_norm)),  gate_h = qg[h, 256:512]
//   k_j = RoPE(RMSNorm_zc(k_j; k_norm)) -> k_cache[pos + t],  v_j -> v_cache[pos + t]  (bf16)
//   o_h = softmax(q_h K_g^T / 16) V_g over keys [0, pos + t],  g = h / (nq / nkv)
//   out_h = o_h * sigmoid(gate_h)
// RoPE: NEOX rotate-half on dims [0, 64), pairs (j, j + 32), angle (pos + t) * theta^(-2j/64) in fp32.
// Shapes:   qg [T, nq, 2, 256] · k, v [T, nkv, 256] · caches [capacity, nkv, 256] bf16 · out [T, nq, 256]
// Layout:   the group's <= 8 query heads are handled together, so each K/V row is read once
//           for all of them; the query heads are normalised and rotated by the blocks
//           themselves. Shared pieces (argument struct, preparation, reductions):
//           attention_common.cuh.
// Kernels:  kv_prep_kernel writes the T new K/V rows, then AttentionPrefillKernel::flash,
//           flash_prefill_kernel (below: tensor cores, 64 query rows x 64-key tiles; the group
//           must divide 64), or ::simple, attention_prefill_simple_kernel: one block per (token,
//           KV head) walks keys [0, pos + t], or ::split (a few tokens at depth):
//           attention_prefill_split_kernel, the same walk over S key ranges in S blocks, and
//           attention_prefill_merge_kernel (flash decoding, as the decode step).
// Tested:   tests/cuda/test_attention.cu vs a host reference (backend/cpu rms_norm, apply_rope),
//           each kernel by name, prefill then decode.
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/attention/attention_common.cuh"
#include "backend/cuda/attention/attention_prefill.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/mma.cuh"

namespace lily::cuda {

namespace {

using namespace attention_detail;
using namespace ptx;

constexpr int kMaxPrefillSplits = 64;  // the split form: splits a (token, KV head) at most

// The shared memory of a walk over keys (walk_keys).
struct WalkSmem {
  float q[kGroup][kHeadDim];    // prepared queries
  uint16_t v[kTile][kHeadDim];  // the tile's V rows (bf16)
  float s[kGroup][kTile];       // scores, log2 units
  float p[kTile][kGroup];       // probabilities
  float alpha[kGroup], l[kGroup];
};

// Keys [k0, k1) (k0 < k1) of KV head kv for token t at position pos, the group's query heads
// together: the queries prepared into w.q, then 64-key tiles where (1) warp w loads K and V rows
// 8w..8w+7 (one round of loads a tile), scores its K rows and leaves its V rows in w.v, (2) warp
// h does the online softmax of head slot h, (3) thread d accumulates dim d of the 8 slots. On return warp h holds slot
// h's (m_run, l_run), thread d its dim d of every slot's unnormalised accumulator.
__device__ __forceinline__ void walk_keys(const AttnArgs& p, int t, int kv, int pos, int k0, int k1, WalkSmem& w,
                                          float (&acc)[kGroup], float& m_run, float& l_run) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (warp < p.group) {
    const int h = kv * p.group + warp;
    norm_rope_head(p, p.qg + (size_t(t) * p.nq + h) * 2 * kHeadDim, p.q_norm, pos, w.q[warp]);
  } else {
    for (int i = lane; i < kHeadDim; i += 32) w.q[warp][i] = 0.f;
  }
  __syncthreads();

  // This lane's slice of the queries, pre-scaled by log2(e)/sqrt(256) for exp2.
  float q[kGroup][8];
#pragma unroll
  for (int h = 0; h < kGroup; ++h)
#pragma unroll
    for (int i = 0; i < 8; ++i) q[h][i] = w.q[h][8 * lane + i] * (kLog2e / 16.f);

  m_run = -INFINITY, l_run = 0.f;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) acc[h] = 0.f;
  const uint16_t* kbase = p.k_cache + size_t(kv) * kHeadDim;
  const uint16_t* vbase = p.v_cache + size_t(kv) * kHeadDim;
  const size_t row_stride = size_t(p.nkv) * kHeadDim;

  for (int base = k0; base < k1; base += kTile) {
    const int n = min(kTile, k1 - base);
    uint4 kr[kRowsPerWarp], vr[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int j = warp * kRowsPerWarp + i;
      const size_t row = size_t(base + j) * row_stride;
      kr[i] = j < n ? reinterpret_cast<const uint4*>(kbase + row)[lane] : make_uint4(0, 0, 0, 0);
      vr[i] = j < n ? reinterpret_cast<const uint4*>(vbase + row)[lane] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) reinterpret_cast<uint4*>(w.v[warp * kRowsPerWarp + i])[lane] = vr[i];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int j = warp * kRowsPerWarp + i;
      float dot[kGroup];
      key_dots(kr[i], q, dot);
      const float sc = reduce8(dot);
      if ((lane & 3) == 0) w.s[lane >> 2][j] = j < n ? sc : -INFINITY;
    }
    __syncthreads();
    {
      const float s0 = w.s[warp][lane], s1 = w.s[warp][lane + 32];
      const float m_new = fmaxf(m_run, warp_max(fmaxf(s0, s1)));  // finite: the tile has a row
      const float p0 = exp2f(s0 - m_new), p1 = exp2f(s1 - m_new);
      const float alpha = exp2f(m_run - m_new);
      l_run = l_run * alpha + warp_sum(p0 + p1);
      m_run = m_new;
      w.p[lane][warp] = p0;
      w.p[lane + 32][warp] = p1;
      if (lane == 0) w.alpha[warp] = alpha;
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < kGroup; ++h) acc[h] *= w.alpha[h];
#pragma unroll 8
    for (int j = 0; j < n; ++j) {
      const float vj = bf16_to_float(w.v[j][tid]);
      const float4 pa = *reinterpret_cast<const float4*>(&w.p[j][0]);
      const float4 pb = *reinterpret_cast<const float4*>(&w.p[j][4]);
      acc[0] += pa.x * vj, acc[1] += pa.y * vj, acc[2] += pa.z * vj, acc[3] += pa.w * vj;
      acc[4] += pb.x * vj, acc[5] += pb.y * vj, acc[6] += pb.z * vj, acc[7] += pb.w * vj;
    }
    __syncthreads();  // w.s, w.p and w.v are rewritten by the next tile
  }
}

// Prefill, the simple form (groups that do not divide flash_prefill_kernel's 64 rows): block
// (token t, KV head kv) walks keys [0, pos] (walk_keys), then out = acc / l * sigmoid(gate).
__global__ void __launch_bounds__(kThreads) attention_prefill_simple_kernel(AttnArgs p) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ __align__(16) WalkSmem w;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t = blockIdx.x, kv = blockIdx.y;
  const int pos = *p.position + t;         // this token's position
  const int L = min(pos + 1, p.capacity);  // visible keys [0, L)
  float acc[kGroup], m_run, l_run;
  walk_keys(p, t, kv, pos, 0, L, w, acc, m_run, l_run);
  if (lane == 0) w.l[warp] = l_run;
  __syncthreads();

  const float* gate = p.qg + size_t(t) * p.nq * 2 * kHeadDim + kHeadDim;  // + h * 512
  float* out = p.out + size_t(t) * p.nq * kHeadDim;
#pragma unroll
  for (int h = 0; h < kGroup; ++h) {
    if (h >= p.group) break;
    const int head = kv * p.group + h;
    out[head * kHeadDim + tid] = acc[h] / w.l[h] * sigmoid(gate[head * 2 * kHeadDim + tid]);
  }
}

// Prefill, the split form (a short pass at depth: a few tokens over many keys): block (t, kv, s)
// walks split s of token t's visible keys, ranges of R = max(64, ceil(K / S) rounded up to 64)
// keys with K the keys of the pass's last token, and leaves its unnormalised state in the
// partials (flash decoding, as the decode step; an empty range leaves m = -inf, l = 0);
// attention_prefill_merge_kernel then combines the S states of each (token, head).
//   part_acc [T, nkv, S, 8, 256], part_ml [T, nkv, S, 8, 2] (max in log2 units, sum)
__global__ void __launch_bounds__(kThreads) attention_prefill_split_kernel(AttnArgs p) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ __align__(16) WalkSmem w;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t = blockIdx.x, kv = blockIdx.y, split = blockIdx.z, S = gridDim.z;
  const int pos = *p.position + t, L = min(pos + 1, p.capacity);
  const int K = min(*p.position + p.T, p.capacity);
  const int R = max(kTile, (K + S * kTile - 1) / (S * kTile) * kTile);
  const int k0 = split * R, k1 = min(L, k0 + R);
  const size_t slot = (size_t(t) * p.nkv + kv) * S + split;
  float* acc_out = p.part_acc + slot * kGroup * kHeadDim;
  float* ml = p.part_ml + slot * kGroup * 2;
  if (k0 >= k1) {  // no keys here (block-uniform)
#pragma unroll
    for (int h = 0; h < kGroup; ++h) acc_out[h * kHeadDim + tid] = 0.f;
    if (tid < kGroup) ml[2 * tid] = -INFINITY, ml[2 * tid + 1] = 0.f;
    return;
  }
  float acc[kGroup], m_run, l_run;
  walk_keys(p, t, kv, pos, k0, k1, w, acc, m_run, l_run);
#pragma unroll
  for (int h = 0; h < kGroup; ++h) acc_out[h * kHeadDim + tid] = acc[h];
  if (lane == 0) ml[2 * warp] = m_run, ml[2 * warp + 1] = l_run;
}

// out[t, head] = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s * sigmoid(gate), M = max_s m_s:
// block (t, head); warp 0 turns the S (m, l) pairs into weights, then thread d sums dim d of the
// S accumulators, the splits in order (independent loads, not a chain of them).
__global__ void __launch_bounds__(kThreads) attention_prefill_merge_kernel(AttnArgs p, int S) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float weight[kMaxPrefillSplits];
  __shared__ float inv_den;
  const int tid = threadIdx.x, t = blockIdx.x, head = blockIdx.y;
  const int kv = head / p.group, h = head % p.group;
  const size_t slot0 = (size_t(t) * p.nkv + kv) * S;
  if (tid < 32) {
    float m[kMaxPrefillSplits / 32], l[kMaxPrefillSplits / 32];
#pragma unroll
    for (int i = 0; i < kMaxPrefillSplits / 32; ++i) {
      const int s = tid + 32 * i;
      const float* ml = p.part_ml + ((slot0 + s) * kGroup + h) * 2;
      m[i] = s < S ? ml[0] : -INFINITY;
      l[i] = s < S ? ml[1] : 0.f;
    }
    float M = -INFINITY;
#pragma unroll
    for (int i = 0; i < kMaxPrefillSplits / 32; ++i) M = fmaxf(M, m[i]);
    M = warp_max(M);  // finite: split 0 has keys
    float den = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxPrefillSplits / 32; ++i) {
      const float wgt = m[i] == -INFINITY ? 0.f : exp2f(m[i] - M);
      weight[tid + 32 * i] = wgt;
      den += wgt * l[i];
    }
    den = warp_sum(den);
    if (tid == 0) inv_den = 1.f / den;
  }
  __syncthreads();
  const float* acc = p.part_acc + (slot0 * kGroup + h) * kHeadDim + tid;
  float num = 0.f;
#pragma unroll 8
  for (int s = 0; s < S; ++s) num += weight[s] * acc[size_t(s) * kGroup * kHeadDim];
  const float gate = p.qg[(size_t(t) * p.nq + head) * 2 * kHeadDim + kHeadDim + tid];
  p.out[(size_t(t) * p.nq + head) * kHeadDim + tid] = num * inv_den * sigmoid(gate);
}

// Splits a (token, KV head) of a split pass: about four blocks an SM over the pass's T x nkv
// walks (a block holds ~12 KB of shared memory and 256 threads: eight fit an SM).
int prefill_splits(int T, int nkv) {
  return std::clamp(4 * multiprocessor_count() / std::max(1, T * nkv), 1, kMaxPrefillSplits);
}

// Prefill: the T new K/V rows into the caches; block t, warp w prepares KV heads w, w+8, ...
__global__ void __launch_bounds__(kThreads) kv_prep_kernel(AttnArgs p) {
  pdl_wait();
  pdl_launch_dependents();
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

// ---- Prefill: flash attention on the tensor cores ----------------------------------------
//
// Block (64 query rows, KV head kv). The rows are (token, head slot) pairs of the KV head's
// group: row r of block b is token (64 b + r) / group, head kv * group + (64 b + r) % group, so
// every K/V tile read serves all the group's heads (group divides 64). 4 warps x 16 rows.
//   Q: normalised, rotated and scaled by log2(e)/16 by the block itself, bf16 in shared memory.
//   K, V: tiles of 64 keys from the caches (bf16) through a double buffer (cp.async).
//   S = Q K^T and O += P V on mma.sync m16n8k16 (bf16 in, fp32 accumulate); online softmax in
//   fp32 (exp2); P rounded to bf16 for the P V product (its fragments come straight from the S
//   accumulators: the m16n8 accumulator layout of two adjacent key tiles is the m16k16 operand
//   layout). Causal: a row at position P + t sees keys [0, P + t].
//   Epilogue: O / l * sigmoid(gate) -> out (fp32).
// Shared memory: Q, K[2], V[2] tiles of 64 rows x (256 + 8) bf16 (528-byte rows: ldmatrix
// without bank conflicts) and 4 KB of fp32 rows for the Q preparation: 173,056 bytes, one
// block per SM.

constexpr int kFlashRows = 64, kFlashKeys = 64, kFlashWarps = 4, kFlashThreads = 32 * kFlashWarps;
constexpr int kFlashStride = kHeadDim + 8;
constexpr int kFlashTile = kFlashRows * kFlashStride;  // bf16 elements of one tile
constexpr size_t kFlashSmem = size_t(5) * kFlashTile * 2 + size_t(kFlashWarps) * kHeadDim * 4;

__global__ void __launch_bounds__(kFlashThreads, 1) flash_prefill_kernel(AttnArgs p) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ uint4 flash_smem[];
  uint16_t* Qs = reinterpret_cast<uint16_t*>(flash_smem);
  uint16_t* Ks = Qs + kFlashTile;                               // [2][64][stride]
  uint16_t* Vs = Ks + 2 * kFlashTile;                           // [2][64][stride]
  float* prep = reinterpret_cast<float*>(Vs + 2 * kFlashTile);  // [4][256] fp32

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int kv = blockIdx.y, group = p.group;
  const int row0 = blockIdx.x * kFlashRows;  // first (token, head slot) pair of the block
  const int P = *p.position;
  const int t_last = min(p.T - 1, (row0 + kFlashRows - 1) / group);
  const int L = min(P + t_last + 1, p.capacity);  // keys any row of the block can see
  const size_t row_stride = size_t(p.nkv) * kHeadDim;

  // K/V tile j into buffer b: 64 keys x 512 bytes each, 16 chunks of 16 bytes per thread per
  // matrix; keys past L read the last visible row (masked below).
  auto issue_tile = [&](int j, int b) {
#pragma unroll 4
    for (int c = tid; c < kFlashKeys * (kHeadDim / 8); c += kFlashThreads) {
      const int key = c / (kHeadDim / 8), part = c % (kHeadDim / 8);
      const size_t src = size_t(min(j * kFlashKeys + key, L - 1)) * row_stride + size_t(kv) * kHeadDim + part * 8;
      const int dst = b * kFlashTile + key * kFlashStride + part * 8;
      cp_async16(Ks + dst, p.k_cache + src);
      cp_async16(Vs + dst, p.v_cache + src);
    }
    cp_async_commit();
  };
  const int ntiles = (L + kFlashKeys - 1) / kFlashKeys;
  issue_tile(0, 0);

  // Q: warp w prepares rows w, w + 4, ...: RMSNorm + RoPE in fp32, then bf16 x log2(e)/16.
  for (int r = warp; r < kFlashRows; r += kFlashWarps) {
    const int pair = row0 + r, t = pair / group;
    uint4* dst = reinterpret_cast<uint4*>(Qs + r * kFlashStride) + lane;  // dims 8 lane .. 8 lane + 7
    if (t < p.T) {
      const int h = kv * group + pair % group;
      norm_rope_head(p, p.qg + (size_t(t) * p.nq + h) * 2 * kHeadDim, p.q_norm, P + t, prep + warp * kHeadDim);
      const float* q = prep + warp * kHeadDim + 8 * lane;
      const float sc = kLog2e / 16.f;
      *dst = make_uint4(pack_bf16(q[0] * sc, q[1] * sc), pack_bf16(q[2] * sc, q[3] * sc),
                        pack_bf16(q[4] * sc, q[5] * sc), pack_bf16(q[6] * sc, q[7] * sc));
      __syncwarp();  // prep is reused by this warp's next row
    } else {
      *dst = make_uint4(0, 0, 0, 0);
    }
  }

  // Rows g and g + 8 of this warp's 16: their positions (rows past T see key 0 only).
  int pos_r[2];
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    const int t = (row0 + warp * 16 + g + 8 * hr) / group;
    pos_r[hr] = t < p.T ? P + t : 0;
  }
  float o[kHeadDim / 8][4];
#pragma unroll
  for (int n = 0; n < kHeadDim / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

  for (int j = 0; j < ntiles; ++j) {
    const int b = j & 1;
    if (j + 1 < ntiles) issue_tile(j + 1, b ^ 1);
    else cp_async_commit();  // empty group: keeps the wait count uniform
    cp_async_wait<1>();
    __syncthreads();  // tile j (and, at j = 0, Q) visible to every warp

    // S = Q K^T: 16 rows x 64 keys per warp.
    float s[kFlashKeys / 8][4];
#pragma unroll
    for (int n = 0; n < kFlashKeys / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
    const uint16_t* Kb = Ks + b * kFlashTile;
#pragma unroll
    for (int ks = 0; ks < kHeadDim / 16; ++ks) {
      uint32_t a[4];
      ldmatrix_x4(a, Qs + (warp * 16 + (lane & 15)) * kFlashStride + ks * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int jp = 0; jp < kFlashKeys / 16; ++jp) {
        uint32_t r[4];
        ldmatrix_x4(r,
                    Kb + (jp * 16 + (lane & 7) + ((lane >> 4) << 3)) * kFlashStride + ks * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16(s[2 * jp], a, r[0], r[1]);
        mma_bf16(s[2 * jp + 1], a, r[2], r[3]);
      }
    }

    // Causal mask and online softmax (log2 units); each row is spread over a quad of lanes.
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < kFlashKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = j * kFlashKeys + n * 8 + 2 * t4 + e;
          float& v = s[n][2 * hr + e];
          v = key <= pos_r[hr] ? v : -INFINITY;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[hr], mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no visible key yet
      const float alpha = exp2f(m_run[hr] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kFlashKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& v = s[n][2 * hr + e];
          v = exp2f(v - m_use);
          sum += v;
        }
      l_run[hr] = l_run[hr] * alpha + sum;  // this lane's part; summed over the quad at the end
      m_run[hr] = m_new;
#pragma unroll
      for (int n = 0; n < kHeadDim / 8; ++n) o[n][2 * hr] *= alpha, o[n][2 * hr + 1] *= alpha;
    }

    // O += P V: P from the S accumulators (bf16), V through ldmatrix.trans.
    const uint16_t* Vb = Vs + b * kFlashTile;
#pragma unroll
    for (int kk = 0; kk < kFlashKeys / 16; ++kk) {
      const uint32_t a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int np = 0; np < kHeadDim / 16; ++np) {
        uint32_t r[4];
        ldmatrix_x4_trans(
            r, Vb + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kFlashStride + np * 16 + (lane >> 4) * 8);
        mma_bf16(o[2 * np], a, r[0], r[1]);
        mma_bf16(o[2 * np + 1], a, r[2], r[3]);
      }
    }
    __syncthreads();  // buffer b is refilled by the issue of iteration j + 1
  }
  cp_async_wait<0>();

  // out = O / l * sigmoid(gate)
#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    float l = l_run[hr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int pair = row0 + warp * 16 + g + 8 * hr, t = pair / group;
    if (t >= p.T) continue;
    const int head = kv * group + pair % group;
    const float* gate = p.qg + (size_t(t) * p.nq + head) * 2 * kHeadDim + kHeadDim;
    float* out = p.out + (size_t(t) * p.nq + head) * kHeadDim;
    const float inv = 1.f / l;
#pragma unroll
    for (int n = 0; n < kHeadDim / 8; ++n) {
      const int d = n * 8 + 2 * t4;
      const float2 gv = *reinterpret_cast<const float2*>(gate + d);
      *reinterpret_cast<float2*>(out + d) = make_float2(o[n][2 * hr] * inv * sigmoid(gv.x),
                                                        o[n][2 * hr + 1] * inv * sigmoid(gv.y));
    }
  }
}

void launch_flash_prefill(const AttnArgs& args, cudaStream_t stream) {
  static const bool configured = [] {  // once: more than 48 KB of dynamic shared memory
    allow_dynamic_shared(flash_prefill_kernel, kFlashSmem, "flash_prefill");
    return true;
  }();
  (void)configured;
  const int pairs = args.T * args.group;
  const dim3 grid(unsigned((pairs + kFlashRows - 1) / kFlashRows), unsigned(args.nkv));
  launch_after_wait(flash_prefill_kernel, grid, dim3(kFlashThreads), kFlashSmem, stream, args);
}

}  // namespace

const char* kernel_name(AttentionPrefillKernel kernel) {
  switch (kernel) {
    case AttentionPrefillKernel::flash: return "flash_prefill";
    case AttentionPrefillKernel::split: return "attention_prefill_split";
    default: return "attention_prefill_simple";
  }
}

size_t attention_prefill_scratch_bytes(AttentionPrefillKernel kernel, const AttentionParams& p) {
  if (kernel != AttentionPrefillKernel::split || p.T <= 0 || p.num_kv_heads <= 0) return 0;
  const size_t slots = size_t(p.T) * size_t(p.num_kv_heads) * size_t(prefill_splits(p.T, p.num_kv_heads)) * kGroup;
  return slots * (kHeadDim + 2) * sizeof(float);
}

bool attention_prefill_supports(AttentionPrefillKernel kernel, const AttentionParams& p) {
  const int group = p.num_kv_heads > 0 ? p.num_heads / p.num_kv_heads : 0;
  return kernel != AttentionPrefillKernel::flash || (group > 0 && kFlashRows % group == 0);
}

void gated_attention_prefill(AttentionPrefillKernel kernel, const AttentionParams& p, const float* qg, const float* k,
                             const float* v, bf16* k_cache, bf16* v_cache, float* out, cudaStream_t stream,
                             void* scratch) {
  check_attention_params(p);
  LILY_CHECK(attention_prefill_supports(kernel, p),
             "gated_attention_prefill: {} does not take {} query heads per KV head", kernel_name(kernel),
             p.num_heads / p.num_kv_heads);
  LILY_CHECK(kernel != AttentionPrefillKernel::split || (scratch && reinterpret_cast<uintptr_t>(scratch) % 16 == 0),
             "gated_attention_prefill: the split form needs 16-byte aligned scratch (attention_prefill_scratch_bytes)");
  AttnArgs args = attn_args(p, qg, k, v, k_cache, v_cache, out);
  launch_after_wait(kv_prep_kernel, dim3(unsigned(p.T)), dim3(kThreads), 0, stream, args);
  if (kernel == AttentionPrefillKernel::flash) {
    launch_flash_prefill(args, stream);
    return;
  }
  if (kernel == AttentionPrefillKernel::split) {
    const int S = prefill_splits(p.T, p.num_kv_heads);
    args.part_acc = static_cast<float*>(scratch);
    args.part_ml = args.part_acc + size_t(p.T) * p.num_kv_heads * S * kGroup * kHeadDim;
    launch_after_wait(attention_prefill_split_kernel, dim3(unsigned(p.T), unsigned(p.num_kv_heads), unsigned(S)),
                      dim3(kThreads), 0, stream, args);
    launch_after_wait(attention_prefill_merge_kernel, dim3(unsigned(p.T), unsigned(p.num_heads)), dim3(kThreads), 0,
                      stream, args, S);
    return;
  }
  launch_after_wait(attention_prefill_simple_kernel, dim3(unsigned(p.T), unsigned(p.num_kv_heads)), dim3(kThreads), 0,
                    stream, args);
}

size_t flash_prefill_shared_bytes() { return kFlashSmem; }

}  // namespace lily::cuda
