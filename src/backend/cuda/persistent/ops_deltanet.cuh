// ops_deltanet.cuh: the Gated DeltaNet recurrence as a task of the persistent decode kernel (issue
// 16): value columns [first, first + count) of [Hv, 128] of layer `layer`, rows [row, row + rows)
// of the step in order on the one state (verify rows: the state after row r is row r + 1's input).
// The conv ran in the input projection's tasks (proj holds u for the conv channels) and the gated
// norm runs in out_proj's, so the columns of a head are independent here (spec §2.6, §3.1):
//
//   q = l2norm(u_q) / sqrt(128),  k = l2norm(u_k)   (the column's key head h / (Hv/Hk))
//   beta = sigmoid(b[h]),  alpha = exp(-exp(A_log[h]) softplus(a[h] + dt_bias[h]))
//   per column j:  m = alpha S[:, j] . k;  delta = beta (u_v[j] - m);  S[:, j] <- alpha S[:, j] + k delta
//                  o[j] = S[:, j] . q = alpha S_old[:, j] . q + (k . q) delta
//
// Shapes:  proj row [u_q (Hk*128) | u_k (Hk*128) | u_v (Hv*128) | z (Hv*128) | b (Hv) | a (Hv)] fp32,
//          rows proj_stride apart · A_log, dt_bias [Hv] · S [Hv, 128 (dk), 128 (dv)] fp32 · o into the
//          mixer row at its column (mixer_stride apart).
// Layout:  columns in groups of 32 within a head (a lane a column), the 16 warps 8 dk rows each: a
//          thread keeps S[8w .. 8w + 7][column] in registers for all the rows of the step (one
//          coalesced 128-byte line a warp a state row). Per row: q, k of the head's key head into
//          shared memory and their norms (one barrier), the dots of the warp's 8 rows for S^T k, S^T q
//          and k . q into shared memory (one barrier), each thread sums the 16 warps' parts of its
//          column, updates its 8 entries; warp 0 writes o. A third barrier ends the row.
// Reads:   proj was written earlier in this launch by other blocks: __ldcg (L2), never the
//          non-coherent path. The state is this task's alone.
// Tested:  tests/cuda/test_persistent_deltanet.cu (against the formulas above in the test, and the
//          CPU oracle's decomposition in test_decode_tasks_on_cpu.cpp); the whole step in
//          test_persistent_decode.cpp.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/common/deltanet_common.cuh"
#include "backend/cuda/persistent/step_args.h"

namespace lily::cuda::persistent {

namespace deltanet_task {

constexpr int kD = 128;                             // dk = dv
constexpr int kCols = 32;                           // columns a group (a lane each)
constexpr int kRowsPerWarp = kD / (kThreads / 32);  // 8 state rows a thread

struct Scratch {
  float q[kD], k[kD];                   // normalized q, k of the row's key head
  float v[kCols];                       // u_v of the group's columns
  float sum[2][4];                      // the 4 warps' sums of u_q^2 (0) and u_k^2 (1)
  float part[3][kThreads / 32][kCols];  // per warp: S^T k, S^T q of its rows; k . q in part[2][w][0]
  float alpha, beta;
};

}  // namespace deltanet_task

__device__ inline void deltanet_core_task(const StepArgs& a, const DeviceTask& t, unsigned char* smem) {
  using namespace deltanet_task;
  using deltanet_detail::gate_values;
  using deltanet_detail::warp_sum;
  Scratch& s = *reinterpret_cast<Scratch*>(smem);
  const DeviceLayer& L = a.layers[t.layer];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, r0 = warp * kRowsPerWarp;
  const int Hk = a.dims.Hk, Hv = a.dims.Hv, key_dim = Hk * kD, C = 2 * key_dim + Hv * kD;
  const int b0 = C + Hv * kD, a0 = b0 + Hv;
  for (int g0 = int(t.first); g0 < int(t.first + t.count); g0 += kCols) {
    const int h = g0 / kD, kh = h / (Hv / Hk), ncols = min(kCols, min(int(t.first + t.count) - g0, kD - g0 % kD));
    const int col = g0 + lane;  // this thread's column (of [Hv, 128]); lanes past ncols idle
    const bool active = lane < ncols;
    float* S = a.seq.ssm[t.layer] + size_t(h) * kD * kD + size_t(r0) * kD + (col - h * kD);
    float st[kRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) st[i] = active ? __ldcg(S + size_t(i) * kD) : 0.f;
    for (int r = t.row; r < t.row + t.rows; ++r) {
      const float* p = a.buf.proj + size_t(r) * a.dims.proj_stride;
      // q, k (raw u) and their squares; v of the group; the gates.
      float u = 0.f;
      if (tid < 2 * kD) {
        u = __ldcg(p + (tid < kD ? kh * kD + tid : key_dim + kh * kD + tid - kD));
        const float ss = warp_sum(u * u);
        if (lane == 0) s.sum[tid / kD][warp % 4] = ss;
      } else if (tid < 2 * kD + kCols) {
        s.v[tid - 2 * kD] = tid - 2 * kD < ncols ? __ldcg(p + 2 * key_dim + g0 + tid - 2 * kD) : 0.f;
      } else if (tid == 2 * kD + kCols) {
        gate_values(__ldcg(p + b0 + h), __ldcg(p + a0 + h), __ldg(L.A_log + h), __ldg(L.dt_bias + h), s.alpha, s.beta);
      }
      __syncthreads();
      if (tid < 2 * kD) {  // q = l2norm(u_q) / sqrt(128), k = l2norm(u_k)  (x * rsqrt(sum x^2 + 1e-6))
        const float* ss = s.sum[tid / kD];
        const float inv = 1.f / sqrtf(ss[0] + ss[1] + ss[2] + ss[3] + 1e-6f);
        if (tid < kD) s.q[tid] = u * inv * (1.f / sqrtf(float(kD)));
        else s.k[tid - kD] = u * inv;
      }
      __syncthreads();
      // This warp's rows: S_old^T k, S_old^T q (its column), k . q (its rows).
      float mk = 0.f, mq = 0.f, kq = 0.f;
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const float ki = s.k[r0 + i], qi = s.q[r0 + i];
        mk = fmaf(st[i], ki, mk), mq = fmaf(st[i], qi, mq), kq = fmaf(ki, qi, kq);
      }
      s.part[0][warp][lane] = mk, s.part[1][warp][lane] = mq;
      if (lane == 0) s.part[2][warp][0] = kq;
      __syncthreads();
      float m = 0.f, o = 0.f, k_q = 0.f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) m += s.part[0][w][lane], o += s.part[1][w][lane], k_q += s.part[2][w][0];
      const float alpha = s.alpha, delta = s.beta * (s.v[lane] - alpha * m);
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) st[i] = fmaf(alpha, st[i], s.k[r0 + i] * delta);
      if (warp == 0 && active) a.buf.mixer[size_t(r) * a.dims.mixer_stride + col] = alpha * o + k_q * delta;
      __syncthreads();  // the row's shared values are read; the next row may overwrite them
    }
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i)
      if (active) S[size_t(i) * kD] = st[i];
  }
}

}  // namespace lily::cuda::persistent
