// ops_attention.cuh: the gated attention core as two tasks of the persistent decode kernel (issue 16):
// a split of the KV cache (flash decoding) and the combine of the splits into the gated output. The
// math of decode/attention_decode.cu (spec §2.4, §2.5), as test_decode_tasks_on_cpu.cpp's oracle:
//
//   split s of S (t.first) for KV heads [t.slot, t.slot + t.count) and their query heads, n =
//   *position rows cached before the step, rows [s n / S, (s + 1) n / S); split 0 first appends the
//   step's rows r (at n + r) of its KV heads and takes them too, row r those at n .. n + r:
//     k_new = RoPE(RMSNorm(k; k_norm)) -> bf16 K cache,  v -> bf16 V cache
//     q_h = RoPE(RMSNorm(q_h; q_norm)) at n + r,  score_j = q_h . k_j / 16  (k_j, v_j: bf16 cache)
//     m = max_j score_j,  l = sum_j e^(score_j - m),  o = sum_j e^(score_j - m) v_j
//   combine, rows [row, row + rows), heads [first, first + count):
//     M = max_s m_s (splits with l_s > 0),  out = sum_s e^(m_s - M) o_s / sum_s e^(m_s - M) l_s
//     mixer[r][h] = out * sigmoid(gate_h)
//
// Shapes:  proj row r at r * proj_stride (any stride; read a float at a time with __ldcg: other
//          blocks wrote it in this launch): [q_h (256), gate_h (256)] per head h < nq, then k
//          [nkv, 256], then v [nkv, 256] · caches [capacity, nkv, 256] bf16 · partials [T, S, nq,
//          256 + 2] fp32 (o, m in natural units, l) · mixer row r at r * mixer_stride, head h at
//          h * 256. Query head h uses kv head h / (nq / nkv).
// Limits:  head_dim 256, nq % nkv == 0, rows <= 8, n + row + rows <= capacity;
//          anything else traps. Verify rows only (t.row = 0: split 0 appends every row of the step).
//
// Split, 16 warps, on the tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate; exact to
// fp32 level as attention_decode.cu: q and p are split into bf16 hi + lo parts, two products each).
//   Units: (kv head g, chunk of 8 query vectors (row, head) of its group), in passes of at most 8
//     units (T = 1, nq/nkv = 16/2: 2 units, one pass). Each unit gets 8 / units warp pairs; pair k
//     takes 8-key groups k, k + pairs, ... of the split's keys (cached rows, then split 0's new
//     rows). Both warps of a pair compute the same 8 keys: warp half (0, 1) dims [128 half, + 128)
//     of the scores, then (one named barrier a group, double-buffered exchange) both add the two
//     halves and run the same online softmax; each accumulates o for its 128 dims. K and V go from
//     global straight into mma fragments (no shared staging): the dims are permuted, the same way
//     in q and k (a dot product does not care), so a lane's K loads are 4 x 16 contiguous bytes of
//     its key (64 bytes a quad) and its V loads 2 x 16 bytes of each of two keys; one group in
//     flight a warp (a second one in registers made the task spill).
//       S^T = Q K^T: M = the 8 query slots (rows 8..15 zero), N = 8 keys, K = the warp's 128 dims
//       O^T += V^T P^T: M = 16 dims (8 tiles), N = the slots, K = 8 keys (keys 8..15 zero)
//   Shared memory (82.5 KB): the gains; q fragments [unit][half][ks 8][lane 32] uint4 (hi a0,
//     hi a2, lo a0, lo a2), one warp a query vector (times log2(e) / 16: exp2 in the loop); the
//     exchange [pair][2][half][lane] float2; after the loop the pairs' o [pair][dim][slot] (8 floats
//     a dim, 8 more every 16 dims: the writes' banks) and (m, l), merged in pair order.
//   Named barriers 1..8 (a pair each) besides __syncthreads'.
// Combine: thread = (one of up to 4 (row, head) pairs, 2 dims, part 1 to 4 of the splits): an online
//   merge of its splits (all loads independent, 8 splits in flight), then the parts in order
//   through shared memory; times sigmoid(gate) into mixer.
// Tested: tests/cuda/test_persistent_attention.cu (against an fp32 reference in the test with the
//         bf16 caches: nq/nkv 16/2 and 2/1, S 64 and 5, n 0 .. 4096, T 1, 3 and 8).
// Cost: docs/perf.md ("H200, session 16"); a fixed part of ~12 us a split task is not understood yet.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/common/attention_common.cuh"
#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/persistent/step_args.h"
#include "backend/cuda/persistent/trace.cuh"

namespace lily::cuda::persistent {

namespace attention_task {

namespace ad = ::lily::cuda::attention_detail;

constexpr int kD = 256;                // head_dim
constexpr int kSlots = 8;              // query vectors a unit (the mma's used rows)
constexpr int kWarps = kThreads / 32;  // 16
constexpr int kPairs = kWarps / 2;     // 8
constexpr int kGroupKeys = 8;          // keys a pair takes at a time
constexpr int kMaxUnits = 8;           // units a pass
constexpr int kMaxRows = 8;            // kMaxDecodeRows
constexpr int kCombineRound = 4;       // (row, head) pairs a combine round
constexpr float kLn2 = 0.6931471805599453f;

// Split scratch, bytes. The q fragments, the pairs' o (after the key loop) and the appended rows'
// staging (before anything else) share the front.
constexpr int kQf = 0;                            // [units][2][8][32] uint4: 8 KB a unit
constexpr int kMerge = 0;                         // [pairs][256 + 16][8] fp32: 68 KB
constexpr int kAppend = 0;                        // [warps][k 256, v 256] fp32: 32 KB
constexpr int kStage = kMaxUnits * 8 * 1024;      // q prep: [warps][256] fp32; loop: exchange
constexpr int kMl = kStage + kWarps * kD * 4;     // [pairs][slots] (m, l) float2
constexpr int kGain = kMl + kPairs * kSlots * 8;  // q_norm, k_norm [256] fp32 each
constexpr int kSplitBytes = kGain + 2 * kD * 4;
constexpr int kMergePair = (kD + kD / 16) * kSlots;  // floats a pair's o
static_assert(kPairs * kMergePair * 4 <= kMl, "merge buffer");
static_assert(kPairs * 2 * 2 * 32 * 8 <= kWarps * kD * 4, "exchange buffer");
static_assert(kSplitBytes <= kScratchBytes, "split scratch");
static_assert(kThreads * 8 + kThreads * 8 <= kScratchBytes, "combine scratch");

// Two 8-key groups a warp: K of key lane / 4, dims 128 half + 32 j + 8 (lane % 4) .. + 8 (k[j]); V of
// keys 2 (lane % 4) + e, dims 128 half + 16 (lane / 4) .. + 16 (v[2 e], v[2 e + 1]).
struct KeyGroup {
  uint4 k[4], v[4];
};

__device__ __forceinline__ uint32_t word(const uint4& x, int i) {
  return i == 0 ? x.x : i == 1 ? x.y : i == 2 ? x.z : x.w;
}

// The two warps of pair `pair` (64 threads); ids 1..8 (0 is __syncthreads').
__device__ __forceinline__ void pair_sync(int pair) { asm volatile("bar.sync %0, 64;\n" ::"r"(pair + 1) : "memory"); }

__device__ __forceinline__ ad::AttnArgs attn_args(const StepArgs& a, int L) {
  ad::AttnArgs p{};
  p.T = a.dims.T, p.nq = a.dims.nq, p.nkv = a.dims.nkv, p.group = a.dims.nq / a.dims.nkv;
  p.rotary_dim = a.dims.rotary_dim, p.capacity = a.seq.capacity, p.eps = a.dims.eps, p.rope_theta = a.dims.rope_theta;
  p.q_norm = a.layers[L].q_norm, p.k_norm = a.layers[L].k_norm, p.position = a.seq.position;
  p.k_cache = a.seq.k_cache[L], p.v_cache = a.seq.v_cache[L];
  return p;
}

// dst[0..256) = src[0..256) through L2, one warp (src written by other blocks in this launch).
// All loads before the first store: dst might alias src as far as the compiler knows, and a
// load after a store would wait for the one before it (8 L2 round trips instead of 1).
__device__ __forceinline__ void load_head(const float* src, float* dst) {
  const int lane = threadIdx.x % 32;
  float x[kD / 32];
#pragma unroll
  for (int i = 0; i < kD / 32; ++i) x[i] = __ldcg(src + lane + 32 * i);
#pragma unroll
  for (int i = 0; i < kD / 32; ++i) dst[lane + 32 * i] = x[i];
  __syncwarp();
}

}  // namespace attention_task

__device__ __forceinline__ void attention_split_task(const StepArgs& a, const DeviceTask& t, unsigned char* smem) {
  using namespace attention_task;
  using namespace ::lily::cuda::ptx;
  const Dims& dm = a.dims;
  const int L = t.layer, S = dm.splits, s = int(t.first), nq = dm.nq, nkv = dm.nkv, G = nq / nkv;
  const int row0 = t.row, rows = t.rows, g0 = t.slot, nkv_task = int(t.count);  // KV heads [g0, g0 + nkv_task)
  const int n = __ldcg(a.seq.position);
  if (dm.head_dim != kD || nq % nkv != 0 || rows < 1 || rows > kMaxRows || n + row0 + rows > a.seq.capacity ||
      nkv_task < 1 || g0 + nkv_task > nkv)
    __trap();
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g8 = lane / 4, t4 = lane % 4;
  const int r0 = int(int64_t(s) * n / S), r1 = int(int64_t(s + 1) * n / S);
  const int nc = r1 - r0, nk = nc + (s == 0 ? row0 + rows : 0);  // cached keys, then the new rows
  const ad::AttnArgs p = attn_args(a, L);
  // The gains once a block (every warp reads them; 64 blocks reading the same 1 KB from L2 queue up).
  float* q_gain = reinterpret_cast<float*>(smem + kGain);
  float* k_gain = q_gain + kD;
  if (tid < kD) q_gain[tid] = __ldg(p.q_norm + tid), k_gain[tid] = s == 0 ? __ldg(p.k_norm + tid) : 0.f;
  __syncthreads();
  const size_t row_stride = size_t(nkv) * kD;  // bf16 a cache row

  // Split 0: the rows' k (normed, rotated) and v into the caches, a warp a (row, kv head).
  if (s == 0) {
    float* st = reinterpret_cast<float*>(smem + kAppend) + warp * 2 * kD;
    for (int i = warp; i < rows * nkv_task; i += kWarps) {
      const int r = row0 + i / nkv_task, g = g0 + i % nkv_task;
      const float* k = a.buf.proj + size_t(r) * dm.proj_stride + 2 * nq * kD + g * kD;
      load_head(k, st);
      load_head(k + nkv * kD, st + kD);
      ad::norm_rope_head(p, st, k_gain, n + r, st);
      ad::store_kv_row(p, st, st + kD, n + r, g);
      __syncwarp();
    }
    __threadfence();  // as attention_decode.cu: the rows in L2 before the block's __ldcg reads
  }
  __syncthreads();

  const int C = (rows * G + kSlots - 1) / kSlots, U = nkv_task * C;  // chunks a kv head, units
  const int Up = U < kMaxUnits ? U : kMaxUnits, P = kPairs / Up;     // units a pass, pairs a unit
  const int ng = (nk + kGroupKeys - 1) / kGroupKeys;
  uint4* qf = reinterpret_cast<uint4*>(smem + kQf);
  float2* ml = reinterpret_cast<float2*>(smem + kMl);
  for (int u0 = 0; u0 < U; u0 += Up) {
    const int nu = U - u0 < Up ? U - u0 : Up;

    // The units' q, a warp a query vector: normed, rotated, times log2(e) / 16, as fragments.
    float* st = reinterpret_cast<float*>(smem + kStage) + warp * kD;
    for (int v = warp; v < nu * kSlots; v += kWarps) {
      const int uu = v / kSlots, slot = v % kSlots, u = u0 + uu, g = g0 + u / C, qi = (u % C) * kSlots + slot;
      if (qi < rows * G) {
        const int r = row0 + qi / G, h = g * G + qi % G;
        load_head(a.buf.proj + size_t(r) * dm.proj_stride + size_t(h) * 2 * kD, st);
        ad::norm_rope_head(p, st, q_gain, n + r, st);
      } else {
        for (int i = lane; i < kD; i += 32) st[i] = 0.f;
        __syncwarp();
      }
      const float sc = ad::kLog2e / 16.f;
#pragma unroll
      for (int e = lane; e < 64; e += 32) {
        const int half = e / 32, ks = e / 4 % 8, q4 = e % 4;
        const int d0 = 128 * half + 32 * (ks / 2) + 8 * q4 + 4 * (ks % 2);  // the dims of lane q4 in k-step ks
        uint4 f;
        split_bf16(st[d0] * sc, st[d0 + 1] * sc, f.x, f.z);
        split_bf16(st[d0 + 2] * sc, st[d0 + 3] * sc, f.y, f.w);
        qf[((uu * 2 + half) * 8 + ks) * 32 + slot * 4 + q4] = f;
      }
      __syncwarp();
    }
    __syncthreads();
    if (u0 == 0) trace_mark(2);

    // The key loop: pair `pair` of unit uu takes groups pk, pk + P, ...
    const int pair = warp / 2, half = warp % 2, uu = pair / P, pk = pair % P;
    float o[8][4];  // O^T tile mt: dims 128 half + 16 g8 + 2 mt (c0, c1), + 1 (c2, c3); slots 2 t4, 2 t4 + 1
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) o[mt][0] = o[mt][1] = o[mt][2] = o[mt][3] = 0.f;
    float m_run = -INFINITY, l_run = 0.f;  // slot g8 (log2 units); l_run this lane's part
    if (uu < nu) {
      const int u = u0 + uu, g = g0 + u / C,
                last_new = row0 + ((u % C) * kSlots + g8) / G;  // slot g8 sees new rows <= it
      const uint16_t* kc = a.seq.k_cache[L] + g * kD + 128 * half + 8 * t4;
      const uint16_t* vc = a.seq.v_cache[L] + g * kD + 128 * half + 16 * g8;
      const uint4* qp = qf + (uu * 2 + half) * 8 * 32 + lane;
      float2* xs = reinterpret_cast<float2*>(smem + kStage) + pair * 2 * 2 * 32;  // [buffer][half][lane]
      int buf = 0;
      auto key_row = [&](int i) { return i < nc ? r0 + i : n + i - nc; };
      auto load_k = [&](KeyGroup& x, int gi) {
        const uint16_t* kr = kc + size_t(key_row(min(gi * kGroupKeys + g8, nk - 1))) * row_stride;
#pragma unroll
        for (int j = 0; j < 4; ++j) x.k[j] = __ldcg(reinterpret_cast<const uint4*>(kr + 32 * j));
      };
      auto load_v = [&](KeyGroup& x, int gi) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint16_t* vr = vc + size_t(key_row(min(gi * kGroupKeys + 2 * t4 + e, nk - 1))) * row_stride;
          x.v[2 * e] = __ldcg(reinterpret_cast<const uint4*>(vr));
          x.v[2 * e + 1] = __ldcg(reinterpret_cast<const uint4*>(vr + 8));
        }
      };
      auto visible = [&](int i) { return i < nk && (i < nc || i - nc <= last_new); };
      // Group gi from x, its K and V loaded together before (one group in flight a warp: the next
      // group's loads in a second KeyGroup made the split spill, docs/perf.md, session 18).
      auto process = [&](const KeyGroup& x, int gi) {
        // S^T = Q K^T over this warp's 128 dims; hi and lo products in separate chains.
        float sh[4] = {0.f, 0.f, 0.f, 0.f}, sl[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int ks = 0; ks < 8; ++ks) {
          const uint4 q = qp[ks * 32];
          const uint32_t ah[4] = {q.x, 0u, q.y, 0u}, al[4] = {q.z, 0u, q.w, 0u};
          const uint32_t b0 = word(x.k[ks / 2], 2 * (ks % 2)), b1 = word(x.k[ks / 2], 2 * (ks % 2) + 1);
          mma_bf16(sh, ah, b0, b1);
          mma_bf16(sl, al, b0, b1);
        }
        float2* xb = xs + buf * 2 * 32;
        xb[half * 32 + lane] = make_float2(sh[0] + sl[0], sh[1] + sl[1]);
        pair_sync(pair);
        const float2 x0 = xb[lane], x1 = xb[32 + lane];  // both warps add in the same order
        buf ^= 1;
        // Online softmax of slot g8 over keys 2 t4, 2 t4 + 1 of the group (a quad holds a slot).
        const int i0 = gi * kGroupKeys + 2 * t4;
        const float s0 = visible(i0) ? x0.x + x1.x : -INFINITY, s1 = visible(i0 + 1) ? x0.y + x1.y : -INFINITY;
        float mx = fmaxf(s0, s1);
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run, mx), m_use = m_new == -INFINITY ? 0.f : m_new;
        const float alpha = exp2f(m_run - m_use), p0 = exp2f(s0 - m_use), p1 = exp2f(s1 - m_use);
        l_run = l_run * alpha + (p0 + p1);
        m_run = m_new;
        // O^T = alpha O^T + V^T P^T. Column 2 t4 + e is slot 2 t4 + e, whose alpha is in lane 4 (2 t4 + e).
        const float alpha0 = __shfl_sync(0xffffffffu, alpha, 8 * t4),
                    alpha1 = __shfl_sync(0xffffffffu, alpha, 8 * t4 + 4);
        uint32_t ph, pl;  // B: keys 2 t4, 2 t4 + 1 of slot g8 (keys 8..15 zero)
        split_bf16(p0, p1, ph, pl);
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) {
          o[mt][0] *= alpha0, o[mt][1] *= alpha1, o[mt][2] *= alpha0, o[mt][3] *= alpha1;
          // A: row g8 = dim 16 g8 + 2 mt (low halves), row g8 + 8 = the next dim (high); keys 2 t4, 2 t4 + 1
          const uint32_t w0 = word(x.v[mt / 4], mt % 4), w1 = word(x.v[2 + mt / 4], mt % 4);
          const uint32_t va[4] = {__byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632), 0u, 0u};
          mma_bf16(o[mt], va, ph, 0u);
          mma_bf16(o[mt], va, pl, 0u);
        }
      };
      for (int gi = pk; gi < ng; gi += P) {
        KeyGroup x;
        load_k(x, gi), load_v(x, gi);
        process(x, gi);
      }
      l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
      l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
    }
    __syncthreads();  // q fragments and the exchange are dead: the merge buffer replaces them
    if (u0 == 0) trace_mark(3);

    float* mo = reinterpret_cast<float*>(smem + kMerge);  // [pair][dim + dim / 16][slot]
    if (uu < nu) {
#pragma unroll
      for (int mt = 0; mt < 8; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int dim = 128 * half + 16 * g8 + 2 * mt + (i >> 1), slot = 2 * t4 + (i & 1);
          mo[pair * kMergePair + (dim + dim / 16) * kSlots + slot] = o[mt][i];
        }
      if (half == 0 && t4 == 0) ml[pair * kSlots + g8] = make_float2(m_run, l_run);
    }
    __syncthreads();
    // Merge the unit's pairs in order into the partials: thread = (slot, dims d0 + 64 j) of each unit.
    const int slot = tid % kSlots, d0 = tid / kSlots;
    for (int uu = 0; uu < nu; ++uu) {
      const int u = u0 + uu, g = g0 + u / C, qi = (u % C) * kSlots + slot;
      if (qi >= rows * G) continue;
      const float2* mlu = ml + uu * P * kSlots + slot;  // pair k: mlu[k * kSlots]
      float M = -INFINITY, l = 0.f, w[kPairs];
#pragma unroll
      for (int k = 0; k < kPairs; ++k)
        if (k < P) M = fmaxf(M, mlu[k * kSlots].x);
#pragma unroll
      for (int k = 0; k < kPairs; ++k)
        if (k < P) {
          const float2 v = mlu[k * kSlots];
          w[k] = v.x == -INFINITY ? 0.f : exp2f(v.x - M);
          l = fmaf(w[k], v.y, l);
        }
      float* out = a.buf.partials + ((size_t(row0 + qi / G) * S + s) * nq + g * G + qi % G) * (kD + 2);
      const float* mou = mo + uu * P * kMergePair + slot;
#pragma unroll
      for (int j = 0; j < kD / 64; ++j) {
        const int dim = d0 + 64 * j;
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < kPairs; ++k)
          if (k < P) acc = fmaf(w[k], mou[k * kMergePair + (dim + dim / 16) * kSlots], acc);
        out[dim] = acc;
      }
      if (d0 == 0) out[kD] = M == -INFINITY ? -INFINITY : M * kLn2, out[kD + 1] = l;
    }
    __syncthreads();  // the next pass rewrites the q fragments
  }
}

__device__ __forceinline__ void attention_combine_task(const StepArgs& a, const DeviceTask& t, unsigned char* smem) {
  using namespace attention_task;
  const int S = a.dims.splits, nq = a.dims.nq, heads = int(t.count), pairs = t.rows * heads;
  if (a.dims.head_dim != kD) __trap();
  const int tid = threadIdx.x;
  float2* red_o = reinterpret_cast<float2*>(smem);  // [part][round pair][128]
  float2* red_ml = red_o + kThreads;                // [part][round pair] (M, L)
  const size_t split_stride = size_t(nq) * (kD + 2);
  for (int p0 = 0; p0 < pairs; p0 += kCombineRound) {
    const int nr = pairs - p0 < kCombineRound ? pairs - p0 : kCombineRound, parts = kThreads / (nr * kD / 2);
    // The gates of the outputs this thread writes, early (independent of everything else).
    float gate[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = tid + j * kThreads, pair = p0 + i / kD, e = i % kD;
      gate[j] = i < nr * kD ? __ldcg(a.buf.proj + size_t(t.row + pair / heads) * a.dims.proj_stride +
                                     size_t(int(t.first) + pair % heads) * 2 * kD + kD + e)
                            : 0.f;
    }
    // Thread = (part, pair, 2 dims): an online merge of splits part, part + parts, ... (batches of 8
    // loads in flight), skipping empty splits (l = 0).
    const int part = tid / (nr * kD / 2), pr = tid / (kD / 2) % nr, e2 = tid % (kD / 2);
    if (part < parts) {
      const int pair = p0 + pr;
      const float* ps = a.buf.partials +
                        (size_t(t.row + pair / heads) * S * nq + int(t.first) + pair % heads) * (kD + 2);
      float M = -INFINITY, L = 0.f;
      float2 acc = make_float2(0.f, 0.f);
      for (int s0 = part; s0 < S; s0 += 8 * parts) {
        float mb[8], lb[8];
        float2 ob[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int s = s0 + j * parts;
          const float* p = ps + size_t(s < S ? s : s0) * split_stride;
          mb[j] = __ldcg(p + kD), lb[j] = s < S ? __ldcg(p + kD + 1) : 0.f;
          ob[j] = __ldcg(reinterpret_cast<const float2*>(p + 2 * e2));
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          if (lb[j] == 0.f) continue;  // an empty split (NaN poison still propagates)
          if (mb[j] > M) {
            const float f = expf(M - mb[j]);  // 0 while M = -inf
            acc.x *= f, acc.y *= f, L *= f, M = mb[j];
          }
          const float w = expf(mb[j] - M);
          acc.x = fmaf(w, ob[j].x, acc.x), acc.y = fmaf(w, ob[j].y, acc.y), L = fmaf(w, lb[j], L);
        }
      }
      red_o[(part * nr + pr) * (kD / 2) + e2] = acc;
      if (e2 == 0) red_ml[part * nr + pr] = make_float2(M, L);
    }
    __syncthreads();
    // The parts in order: out = sum_k acc_k e^(M_k - M) / sum_k L_k e^(M_k - M), gated.
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int i = tid + j * kThreads, q = i / kD, e = i % kD, pair = p0 + q;
      if (i >= nr * kD) break;
      float M = -INFINITY;
      for (int k = 0; k < parts; ++k) M = fmaxf(M, red_ml[k * nr + q].x);
      float o = 0.f, den = 0.f;
      for (int k = 0; k < parts; ++k) {
        const float2 ml = red_ml[k * nr + q];
        const float w = ml.x == -INFINITY ? 0.f : expf(ml.x - M);
        const float2 v = red_o[(k * nr + q) * (kD / 2) + e / 2];
        o = fmaf(w, e % 2 ? v.y : v.x, o), den = fmaf(w, ml.y, den);
      }
      a.buf.mixer[size_t(t.row + pair / heads) * a.dims.mixer_stride + size_t(int(t.first) + pair % heads) * kD + e] =
          o / den * ad::sigmoid(gate[j]);
    }
    __syncthreads();
  }
}

}  // namespace lily::cuda::persistent
