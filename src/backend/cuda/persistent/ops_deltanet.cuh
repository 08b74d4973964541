// ops_deltanet.cuh: the Gated DeltaNet core as a task of the persistent decode kernel (issue 16):
// value heads [first, first + count) of layer `layer`, rows [row, row + rows) of the step, stepped
// through in order on the one state (verify rows: the state after row r is the input of row r + 1).
// The math of decode/deltanet_decode.cu (spec §2.6, §3.1), its gates and SiLU from
// common/deltanet_common.cuh:
//
//   u = silu(conv_4([conv_state; proj row]))       q, k, v = u split [Hk*128 | Hk*128 | Hv*128]
//   q = l2norm(q) / sqrt(128),  k = l2norm(k),  beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
//   per v-head h, per row:   S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
//   y = gated_norm * rmsnorm(o) * silu(z)          (per v-head, over its 128 outputs, eps = dims.eps)
//
// Shapes:  proj row [q (Hk*128) | k (Hk*128) | v (Hv*128) | z (Hv*128) | b (Hv) | a (Hv)] fp32, rows
//          proj_stride apart (any stride: proj and mixer are read and written a float at a time) ·
//          conv1d [conv_dim, 4] (w[c*4 + 3] multiplies the current row; 16-byte aligned) · A_log,
//          dt_bias [Hv] · gated_norm [128] · conv state [3, conv_dim] oldest tap first · S [Hv, 128
//          (dk), 128 (dv)] · mixer row: y of head h at h*128, rows mixer_stride apart. All fp32.
// Limits:  conv_k == 4, rows <= 8, count <= 4 and a multiple of Hv/Hk (whole key heads): anything
//          else traps (the smem layout below is sized for them). Verify rows only: the state is
//          a.seq's; parallel rows (a state per sequence) are not implemented yet.
// Reads:   proj was written earlier in this kernel by other blocks: __ldcg only (L2; never the
//          non-coherent path, never L1). Weights through __ldg.
//
// Layout (512 threads, 69 KB of the kScratchBytes smem):
//   1. Conv, one unit a thread (a second round only when count > 2): the q/k units of a key head
//      are 8 warps, lanes 0-15 q channels j, lanes 16-31 the k channels of the same j, so one
//      shuffle gives q*k; per row each half-warp sums u^2 and q*k over its 16 channels into smem
//      partials (8 a key head). The v units take one v channel each, the last warp the gates. u
//      (unnormalised q, k; v) goes to smem for every row, the new taps to the conv state; silu(z)
//      to smem after the conv's math. Half the state loads go out with the conv's loads, the other
//      half after the barrier: with all of them or z's loads in flight during the conv, the conv's
//      8 rows of inputs spilled more (measured 2% slower at T = 1).
//   2. The recurrence, value heads in passes of 2, each warp on its own (no block barrier): warp =
//      (head w / 8, 16 columns), lane = (row group g = lane / 4, 4 columns), so a thread holds
//      S[16g + i][c0 .. c0 + 3], i < 16, as 16 float4 in registers (16-byte loads and stores). One
//      pass over the registers a row, fused with the next row's reads:
//        m = alpha S^T k,  o = alpha S^T q + (q.k) delta     (S the state before the row)
//      S^T k and S^T q over the 8 row groups: a transposing shuffle sum (7 shuffles), one lane a
//      column computes delta and o, 4 shuffles hand delta back. The l2 norms stay scalars: the dots
//      take the raw u and are scaled after, the rank-1 update adds u_k (inv_k delta). k and q come
//      from smem as float4, 2 addresses a quarter-warp. (A column a thread, 64 rows, with a block
//      barrier a row: 4x the smem wavefronts, 23 us at T = 8 against 18.)
//   3. The gated norm: a warp a (row, head), o read back from smem (it replaces v there).
// Barriers: 2 (after the conv, before the norm), whatever the rows.
// Cost: docs/perf.md ("H200, session 16"): ~8 us a task of 2 heads at T = 1, bound by one SM's path for
//   its 128 KB of state in and out.
// Tested: tests/cuda/test_persistent_deltanet.cu, against decode/deltanet_decode.cu's
//         gated_deltanet_decode (y, conv and SSM state) for Hk/Hv 16/32 and 2/4, T = 1, 3, 8,
//         count 1 .. 4.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/common/deltanet_common.cuh"
#include "backend/cuda/persistent/step_args.h"

namespace lily::cuda::persistent {

namespace deltanet_task {

constexpr int kD = 128;         // dk = dv
constexpr int kTaps = 3;        // conv_k - 1 state rows
constexpr int kMaxRows = 8;     // kMaxDecodeRows
constexpr int kMaxHeads = 4;    // value heads a task (so at most 4 key heads)
constexpr int kStateRows = 16;  // state rows a thread (dk / 8), 4 columns each
constexpr int kPad = 16;        // k_s after q_s by 16 words: the conv's q and k half-warps hit other banks

// Scratch, in floats.
constexpr int kUWidth = kMaxHeads * kD;                       // one row of q_s, k_s, v_s, z_s
constexpr int kQ = 0;                                         // q_s [rows][key head][128]: raw u_q
constexpr int kK = kQ + kMaxRows * kUWidth + kPad;            // k_s [rows][key head][128]: raw u_k
constexpr int kV = kK + kMaxRows * kUWidth;                   // v_s [rows][head][128]: u_v, then o
constexpr int kZ = kV + kMaxRows * kUWidth;                   // z_s [rows][head][128]: silu(z)
constexpr int kPart = kZ + kMaxRows * kUWidth;                // part [rows][key head][3][8]: sum u_q^2,
constexpr int kAlpha = kPart + kMaxRows * kMaxHeads * 3 * 8;  //   sum u_k^2, sum u_q u_k per half-warp
constexpr int kBeta = kAlpha + kMaxRows * kMaxHeads;          // alpha, beta [rows][head]
constexpr int kNormW = kBeta + kMaxRows * kMaxHeads;          // gated_norm [128]
constexpr int kFloats = kNormW + kD;
static_assert(kFloats * 4 <= kScratchBytes, "deltanet task scratch");
static_assert(kK % 4 == 0 && kPart % 4 == 0, "float4 alignment of the scratch arrays");

using State = float4[kStateRows];  // S[r0 + i][c0 .. c0 + 3]

// m[j] = sum_i S[i][j] x[i], n[j] = sum_i S[i][j] y[i] over the thread's 16 rows (x, y: smem, 16-byte
// aligned; 2 addresses a quarter-warp, so one wavefront each).
__device__ __forceinline__ void dots(const State& s, const float* x, const float* y, float (&m)[4], float (&n)[4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) m[j] = 0.f, n[j] = 0.f;
#pragma unroll
  for (int i = 0; i < kStateRows / 4; ++i) {
    const float4 a = reinterpret_cast<const float4*>(x)[i], b = reinterpret_cast<const float4*>(y)[i];
    const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float4 r = s[4 * i + e];
      m[0] += r.x * av[e], m[1] += r.y * av[e], m[2] += r.z * av[e], m[3] += r.w * av[e];
      n[0] += r.x * bv[e], n[1] += r.y * bv[e], n[2] += r.z * bv[e], n[3] += r.w * bv[e];
    }
  }
}

// S <- alpha S + k d^T (k: raw u_k rows, d[j] = inv_k delta[j]); with kNext, the next row's dots on the
// updated state in the same pass.
template <bool kNext>
__device__ __forceinline__ void update(State& s, float alpha, const float (&d)[4], const float* k, const float* kn,
                                       const float* qn, float (&m)[4], float (&n)[4]) {
  if (kNext) {
#pragma unroll
    for (int j = 0; j < 4; ++j) m[j] = 0.f, n[j] = 0.f;
  }
#pragma unroll
  for (int i = 0; i < kStateRows / 4; ++i) {
    const float4 a = reinterpret_cast<const float4*>(k)[i];
    const float av[4] = {a.x, a.y, a.z, a.w};
    float bv[4] = {}, cv[4] = {};
    if (kNext) {
      const float4 b = reinterpret_cast<const float4*>(kn)[i], c = reinterpret_cast<const float4*>(qn)[i];
      bv[0] = b.x, bv[1] = b.y, bv[2] = b.z, bv[3] = b.w, cv[0] = c.x, cv[1] = c.y, cv[2] = c.z, cv[3] = c.w;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float4& r = s[4 * i + e];  // decay, then the rank-1 write
      r.x = r.x * alpha + av[e] * d[0], r.y = r.y * alpha + av[e] * d[1];
      r.z = r.z * alpha + av[e] * d[2], r.w = r.w * alpha + av[e] * d[3];
      if (kNext) {
        m[0] += r.x * bv[e], m[1] += r.y * bv[e], m[2] += r.z * bv[e], m[3] += r.w * bv[e];
        n[0] += r.x * cv[e], n[1] += r.y * cv[e], n[2] += r.z * cv[e], n[3] += r.w * cv[e];
      }
    }
  }
}

// The 8 row groups' (lane bits 2-4) partial m[0..3], n[0..3] summed, transposed: lane with row group
// g ends with the total of m[g] (g < 4) or n[g - 4]. 7 shuffles.
__device__ __forceinline__ float transpose_sum(const float (&m)[4], const float (&n)[4], int lane) {
  const bool b = lane & 16, c = lane & 8, e = lane & 4;
  float x[4], y[2];
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] = (b ? n[k] : m[k]) + __shfl_xor_sync(0xffffffffu, b ? m[k] : n[k], 16);
#pragma unroll
  for (int k = 0; k < 2; ++k) y[k] = (c ? x[2 + k] : x[k]) + __shfl_xor_sync(0xffffffffu, c ? x[k] : x[2 + k], 8);
  return (e ? y[1] : y[0]) + __shfl_xor_sync(0xffffffffu, e ? y[0] : y[1], 4);
}

// The sums of squares and the q.k of half-warps: 16 lanes each.
__device__ __forceinline__ float half_warp_sum(float v) {
#pragma unroll
  for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace deltanet_task

__device__ __forceinline__ void deltanet_core_task(const StepArgs& a, const DeviceTask& t, unsigned char* smem) {
  using namespace deltanet_task;
  namespace dn = deltanet_detail;
  const Dims& d = a.dims;
  const int rows = t.rows, count = int(t.count), v0 = int(t.first), L = t.layer;
  const int ratio = d.Hv / d.Hk, nk = count / ratio, k0 = v0 / ratio;
  if (d.conv_k != kTaps + 1 || rows < 1 || rows > kMaxRows || count < 1 || count > kMaxHeads || count % ratio != 0)
    __trap();
  const int key_dim = d.Hk * kD, C = 2 * key_dim + d.Hv * kD;  // conv_dim
  const int z0 = C, b0 = z0 + d.Hv * kD, a0 = b0 + d.Hv;
  const DeviceLayer& w = a.layers[L];
  float* conv_state = a.seq.conv[L];                               // [3, C]
  float* ssm = a.seq.ssm[L];                                       // [Hv, 128, 128]
  const float* proj = a.buf.proj + size_t(t.row) * d.proj_stride;  // the task's row 0
  float* const f = reinterpret_cast<float*>(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;

  // Recurrence warp: head 2 pass + hl, columns [cb*16, cb*16 + 16); lane: state rows [g*16, g*16 + 16)
  // of columns [c0, c0 + 4).
  const int hl = warp / 8, g = lane / 4, c0 = (warp % 8) * 16 + (lane % 4) * 4;
  State s;
  auto state_at = [&](int pass) {
    return reinterpret_cast<float4*>(ssm + size_t(v0 + 2 * pass + hl) * kD * kD + size_t(g * kStateRows) * kD + c0);
  };
  // Rows [i0, i1) of the thread's 16 (constants after inlining).
  auto load_state = [&](int pass, int i0, int i1) {
    if (2 * pass + hl >= count) return;
    const float4* S = state_at(pass);
#pragma unroll
    for (int i = i0; i < i1; ++i) s[i] = __ldcg(S + i * (kD / 4));
  };

  // 1. Conv units: [0, nk*256) q/k (lanes 0-15 q, 16-31 k of channel j), then count*128 v.
  const int qk_units = nk * 2 * kD, units = qk_units + count * kD;
  struct Unit {
    int c = 0;  // conv channel
    float x[kTaps], w[kTaps + 1], m[kMaxRows];
  };
  auto load_unit = [&](int u, Unit& n) {
    const bool qk = u < qk_units;
    if (qk) {
      const int uw = u / 32, kh = uw / 8, j = (uw % 8) * 16 + lane % 16;
      n.c = (lane >= 16 ? key_dim : 0) + (k0 + kh) * kD + j;
    } else {
      n.c = 2 * key_dim + v0 * kD + (u - qk_units);
    }
    const float4 wc = __ldg(reinterpret_cast<const float4*>(w.conv1d) + n.c);
    n.w[0] = wc.x, n.w[1] = wc.y, n.w[2] = wc.z, n.w[3] = wc.w;
#pragma unroll
    for (int i = 0; i < kTaps; ++i) n.x[i] = __ldcg(conv_state + size_t(i) * C + n.c);
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if (r >= rows) break;
      n.m[r] = __ldcg(proj + size_t(r) * d.proj_stride + n.c);
    }
  };
  auto run_unit = [&](int u, Unit& n) {
    const bool qk = u < qk_units;
    const int uw = u / 32, kh = uw / 8, j = (uw % 8) * 16 + lane % 16;
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if (r >= rows) break;
      // conv over [x0, x1, x2, m]: the order of decode/deltanet_decode.cu's window
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < kTaps; ++i) acc += n.w[i] * n.x[i];
      acc += n.w[kTaps] * n.m[r];
#pragma unroll
      for (int i = 0; i + 1 < kTaps; ++i) n.x[i] = n.x[i + 1];
      n.x[kTaps - 1] = n.m[r];
      const float y = dn::silu(acc);
      if (qk) {
        const float other = __shfl_xor_sync(0xffffffffu, y, 16);
        const float sq = half_warp_sum(y * y), qk_dot = half_warp_sum(y * other);
        f[(lane >= 16 ? kK : kQ) + r * kUWidth + kh * kD + j] = y;
        float* part = f + kPart + (r * kMaxHeads + kh) * 24 + uw % 8;
        if (lane == 0) part[0] = sq, part[16] = qk_dot;  // sum u_q^2, sum u_q u_k
        if (lane == 16) part[8] = sq;                    // sum u_k^2
      } else {
        f[kV + r * kUWidth + u - qk_units] = y;
      }
    }
#pragma unroll
    for (int i = 0; i < kTaps; ++i) conv_state[size_t(i) * C + n.c] = n.x[i];
  };

  {
    Unit first;
    if (tid < units) load_unit(tid, first);
    // The gates of (row, head) by the last warp; gated_norm to smem by the last 128 threads.
    const int gi = kThreads - 1 - tid;
    float gb = 0.f, ga = 0.f, A_log = 0.f, dt_bias = 0.f, norm_w = 0.f;
    if (gi < rows * count) {
      const int r = gi / count, h = v0 + gi % count;
      gb = __ldcg(proj + size_t(r) * d.proj_stride + b0 + h);
      ga = __ldcg(proj + size_t(r) * d.proj_stride + a0 + h);
      A_log = __ldg(w.A_log + h), dt_bias = __ldg(w.dt_bias + h);
    }
    if (gi < kD) norm_w = __ldg(w.gated_norm + gi);
    // Half the state in flight while the conv runs, the other half after its math: all of it
    // with the conv's registers (rows of 8: m, z) spilled in the persistent kernel's loop.
    load_state(0, 0, kStateRows / 2);
    if (tid < units) run_unit(tid, first);
    for (int u = tid + kThreads; u < units; u += kThreads) {  // count > 2 only
      Unit n;
      load_unit(u, n);
      run_unit(u, n);
    }
    // silu(z) of the v units' columns, loaded only now: with the conv's loads (8 rows of m and z)
    // the persistent kernel's loop spilled.
    for (int v = tid; v < count * kD; v += kThreads) {
      float z[kMaxRows];
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r)
        if (r < rows) z[r] = __ldcg(proj + size_t(r) * d.proj_stride + z0 + v0 * kD + v);
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r)
        if (r < rows) f[kZ + r * kUWidth + v] = dn::silu(z[r]);
    }
    if (gi < rows * count) {
      const int r = gi / count, h = gi % count;
      dn::gate_values(gb, ga, A_log, dt_bias, f[kAlpha + r * kMaxHeads + h], f[kBeta + r * kMaxHeads + h]);
    }
    if (gi < kD) f[kNormW + gi] = norm_w;
  }
  __syncthreads();
  load_state(0, kStateRows / 2, kStateRows);  // after the barrier, which the compiler keeps them behind

  // 2. The recurrence, heads 2 pass + hl, each warp on its own: no block barrier.
  for (int pass = 0; 2 * pass < count; ++pass) {
    if (pass > 0) load_state(pass, 0, kStateRows);
    const int h = 2 * pass + hl, kh = h / ratio;  // local value and key head
    if (h >= count) continue;                     // count odd: the second half of the block waits
    // The rows' l2 norms and q.k from the 8 half-warp partials: lane 4r + {0, 1, 2} sums row r's
    // sum u_q^2, sum u_k^2, sum u_q u_k; lane 4r ends with row r's inv_q, inv_k, q.k.
    float inv_q = 0.f, inv_k = 0.f, qk = 0.f;
    {
      float sum = 0.f;
      if (lane / 4 < rows && lane % 4 < 3) {
        const float4* p = reinterpret_cast<const float4*>(f + kPart + ((lane / 4) * kMaxHeads + kh) * 24 +
                                                          (lane % 4) * 8);
        const float4 x = p[0], y = p[1];
        sum = ((x.x + x.y) + (x.z + x.w)) + ((y.x + y.y) + (y.z + y.w));
      }
      const float ssk = __shfl_down_sync(0xffffffffu, sum, 1), sqk = __shfl_down_sync(0xffffffffu, sum, 2);
      // q = l2norm(q) / sqrt(128), k = l2norm(k): x * rsqrt(sum x^2 + 1e-6) (spec §2.6)
      inv_q = 1.f / sqrtf(sum + 1e-6f) * (1.f / sqrtf(float(kD)));
      inv_k = 1.f / sqrtf(ssk + 1e-6f);
      qk = sqk * inv_q * inv_k;
    }
    const float* k_row = f + kK + kh * kD + g * kStateRows;  // + r * kUWidth
    const float* q_row = f + kQ + kh * kD + g * kStateRows;
    float m[4], n[4];  // partial S^T k, S^T q over this thread's rows, its 4 columns
    dots(s, k_row, q_row, m, n);
#pragma unroll 1
    for (int r = 0; r < rows; ++r) {
      const float nq = __shfl_sync(0xffffffffu, inv_q, 4 * r), nk_r = __shfl_sync(0xffffffffu, inv_k, 4 * r);
      const float qk_r = __shfl_sync(0xffffffffu, qk, 4 * r);
      const float alpha = f[kAlpha + r * kMaxHeads + h], beta = f[kBeta + r * kMaxHeads + h];
      // Lane with row group g < 4 has column c0 + g's S^T k total, and takes its S^T q total.
      const float sk = transpose_sum(m, n, lane), sq = __shfl_xor_sync(0xffffffffu, sk, 16);
      float* vo = f + kV + r * kUWidth + h * kD + (c0 & ~3) + (g & 3);
      // delta = beta (v - (alpha S)^T k);  o = (alpha S + k delta^T)^T q = alpha S^T q + (k.q) delta
      const float delta = beta * ((g < 4 ? *vo : 0.f) - alpha * nk_r * sk);
      if (g < 4) *vo = alpha * nq * sq + qk_r * delta;  // o replaces v (read only by this lane)
      float dk[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) dk[j] = __shfl_sync(0xffffffffu, delta, 4 * j + lane % 4) * nk_r;
      const float* k_cur = k_row + r * kUWidth;
      if (r + 1 < rows) update<true>(s, alpha, dk, k_cur, k_cur + kUWidth, q_row + (r + 1) * kUWidth, m, n);
      else update<false>(s, alpha, dk, k_cur, nullptr, nullptr, m, n);
    }
    float4* S = state_at(pass);
#pragma unroll
    for (int i = 0; i < kStateRows; ++i) S[i * (kD / 4)] = s[i];
  }
  __syncthreads();

  // 3. y = gated_norm * (o * rsqrt(mean(o^2) + eps)) * silu(z), a warp a (row, head).
  for (int gi = warp; gi < rows * count; gi += kThreads / 32) {
    const int r = gi / count, h = gi % count;
    const float* o = f + kV + r * kUWidth + h * kD;
    const float* z = f + kZ + r * kUWidth + h * kD;
    float ov[4], ss = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) ov[j] = o[lane + 32 * j], ss += ov[j] * ov[j];
    const float inv = 1.f / sqrtf(dn::warp_sum(ss) / float(kD) + d.eps);
    float* y = a.buf.mixer + size_t(t.row + r) * d.mixer_stride + size_t(v0 + h) * kD;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = lane + 32 * j;
      y[c] = f[kNormW + c] * (ov[j] * inv) * z[c];
    }
  }
}

}  // namespace lily::cuda::persistent
