// deltanet_common.cuh: what the Gated DeltaNet kernels share (deltanet/deltanet_decode.cu,
// deltanet/deltanet_prefill.cu): the argument struct, the block layout of the recurrent state,
// the gates and one token of the delta rule. Internal to backend/cuda; the formulas are in
// deltanet_decode.cu's header (spec §2.6, §3.1).
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>

#include "backend/cuda/deltanet/deltanet.h"

namespace lily::cuda::deltanet_detail {

// One block owns (v-head h, a slice of 32 dv columns): 128 threads, warp w holds the state rows
// a in [32w, 32w + 32) of the block's columns, lane = column, so each thread keeps 32 state
// values in registers and every warp load or store is one 128-byte line.
constexpr int kHeadDim = 128;                      // dk = dv
constexpr int kConvK = 4;                          // the model's conv kernel (template parameter K)
constexpr int kCols = 32;                          // dv columns per block, one per lane
constexpr int kSlices = kHeadDim / kCols;          // blocks per v-head
constexpr int kThreads = 128;                      // 4 warps x 32 dk rows
constexpr int kRows = kHeadDim / (kThreads / 32);  // state rows per thread

struct CoreArgs {
  int T, Hk, Hv, C;  // C = conv_dim
  float eps;
  const float* conv_weight;  // [C, K]
  const float* A_log;        // [Hv]
  const float* dt_bias;      // [Hv]
  const float* norm_weight;  // [128]
  const float* mixed;        // [T, C]
  const float* z;            // [T, Hv*128]
  const float* b;            // [T, Hv]
  const float* a;            // [T, Hv]
  float* conv_state;         // [K-1, C]
  float* ssm_state;          // [Hv, 128, 128]
  float* y;                  // [T, Hv*128]
  float* u;                  // prefill scratch [chunk, C]
  DeltaNetKept kept;         // the states after rows kept.first .. T-1 (deltanet.h)
};

inline CoreArgs core_args(const DeltaNetParams& p, const float* mixed, const float* z, const float* b, const float* a,
                          float* conv_state, float* ssm_state, float* y, float* u) {
  return CoreArgs{p.T,
                  p.num_key_heads,
                  p.num_value_heads,
                  p.conv_dim(),
                  p.eps,
                  p.conv_weight,
                  p.A_log,
                  p.dt_bias,
                  p.norm_weight,
                  mixed,
                  z,
                  b,
                  a,
                  conv_state,
                  ssm_state,
                  y,
                  u,
                  p.kept};
}

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float silu(float x) { return x * sigmoid(x); }
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }  // torch threshold

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// beta = sigmoid(b), alpha = exp(g), g = -exp(A_log) * softplus(a + dt_bias)  (spec §2.6, fp32)
__device__ __forceinline__ void gate_values(float b, float a, float A_log, float dt_bias, float& alpha, float& beta) {
  beta = sigmoid(b);
  const float g = -expf(A_log) * softplus(a + dt_bias);
  alpha = expf(g);
}
__device__ __forceinline__ void gates(const CoreArgs& p, int t, int h, float& alpha, float& beta) {
  gate_values(p.b[size_t(t) * p.Hv + h], p.a[size_t(t) * p.Hv + h], p.A_log[h], p.dt_bias[h], alpha, beta);
}

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// One token of the delta rule (spec §3.1) on this thread's state entries S[32w + i][col]:
//   S <- alpha S;  m = S^T k;  delta = beta (v - m);  S <- S + k delta^T;  returns o[col] = S^T q.
// q_s, k_s: [128] shared (16-byte aligned); v: v[col]; red: [2][4][32] shared. Two block barriers
// inside. The warp's 32 rows of k and q come as float4 broadcasts, and each dot runs as four
// interleaved partial sums (a chain of 32 dependent FMAs was the token's critical path).
__device__ __forceinline__ float delta_step(float (&s)[kRows], const float* q_s, const float* k_s, float v, float alpha,
                                            float beta, float (*red)[4][kCols]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, a0 = warp * kRows;
  const float4* k4 = reinterpret_cast<const float4*>(k_s + a0);
  const float4* q4 = reinterpret_cast<const float4*>(q_s + a0);
  float m[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kRows / 4; ++i) {
    const float4 k = k4[i];
    const float kv[4] = {k.x, k.y, k.z, k.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      s[4 * i + j] *= alpha;  // decay first
      m[j] += s[4 * i + j] * kv[j];
    }
  }
  red[0][warp][lane] = (m[0] + m[1]) + (m[2] + m[3]);
  __syncthreads();
  const float delta = beta * (v - (red[0][0][lane] + red[0][1][lane] + red[0][2][lane] + red[0][3][lane]));
  float o[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int i = 0; i < kRows / 4; ++i) {
    const float4 k = k4[i], q = q4[i];
    const float kv[4] = {k.x, k.y, k.z, k.w}, qv[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      s[4 * i + j] += kv[j] * delta;  // rank-1 write
      o[j] += s[4 * i + j] * qv[j];   // read with the updated state
    }
  }
  red[1][warp][lane] = (o[0] + o[1]) + (o[2] + o[3]);
  __syncthreads();
  return red[1][0][lane] + red[1][1][lane] + red[1][2][lane] + red[1][3][lane];
}

}  // namespace lily::cuda::deltanet_detail
