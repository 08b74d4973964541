// deltanet_prefill.cu: the core of a Gated DeltaNet layer (spec §2.6, §3.1, §3.2) for a block of
// T tokens (prefill): causal conv + SiLU, l2norm of q/k, gates, the delta rule and the gated
// RMSNorm, in chunks of <= kDeltaNetPrefillChunk tokens (bounded scratch: u [chunk, conv_dim]).
//
//   u = silu(conv_K([conv_state; mixed]))         q, k, v = u split [Hk*128 | Hk*128 | Hv*128]
//   q = l2norm(q) / sqrt(128),  k = l2norm(k),  beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
//   per v-head h, per token:   S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
//   y = norm_w * rmsnorm(o) * silu(z)          (per v-head, over its 128 outputs)
// Shapes:   mixed [T, conv_dim] · z, y [T, Hv*128] · b, a [T, Hv] · conv_state [K-1, conv_dim] ·
//           S [Hv, 128 (dk), 128 (dv)] fp32, all fp32.  v-head h reads q/k head h / (Hv/Hk).
// A pass of at most 16 tokens may instead run the decode kernel (DeltaRulePrefill::rows,
// deltanet/deltanet_decode.h): the whole core in one launch.
// Kernels (per chunk):
//   deltanet_conv_kernel   conv + SiLU (+ l2norm for q/k heads) of every (token, head): a warp per
//                          (head, run of 16 tokens), 4 heads per block, lane = 4 channels
//                          (float4), the K-tap window slides in registers and the l2norm is a
//                          shuffle sum; mixed read once, u written once
//   conv_state_kernel      the last K-1 inputs become the new conv state
//   the delta rule over the chunk, raw o written into y, in the form the caller picks:
//     DeltaRulePrefill::chunked    delta_rule_chunked (deltanet_chunked.cu, spec §3.2: three
//                                  launches of 64-token matrix products)
//     DeltaRulePrefill::recurrent  deltanet_scan_kernel: the token loop, the state in registers
//                                  (deltanet_common.cuh's layout)
//   gated_norm_kernel      y <- norm_w * rmsnorm(y) * silu(z) in place: a warp per (token, v-head);
//                          and y_bf16 (when asked): y as the wgmma out_proj reads it
//                          row, 8 rows per block, float4, shuffle sum
// Tested:   tests/cuda/test_deltanet.cu vs backend/cpu (delta_rule_recurrent, gated_rms_norm), both
//           forms by name, across chunks, carried states, then decode.
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"
#include "backend/cuda/deltanet/deltanet_common.cuh"
#include "backend/cuda/deltanet/deltanet_decode.h"
#include "backend/cuda/deltanet/deltanet_prefill.h"
#include "backend/cuda/gemm/gemm_w4_wgmma_layout.h"

#include <algorithm>
#include <cstdint>
#include <initializer_list>

namespace lily::cuda {

namespace {

using namespace deltanet_detail;

constexpr int kPrefillChunk = kDeltaNetPrefillChunk;  // tokens per prefill chunk (bounds the scratch)
constexpr int kConvRun = 16;                          // deltanet_conv_kernel: tokens per warp
constexpr int kConvWarps = 4;                         // deltanet_conv_kernel: heads (warps) per block
constexpr int kNormRows = 8;                          // gated_norm_kernel: rows (warps) per block

// One chunk of n tokens starting at t0.

// u[t, c] for the chunk; q/k heads are l2-normalised here. Reads conv_state (not written until
// conv_state_kernel). One warp per (head of 128 channels, run of kConvRun tokens), 4 heads per
// block: lane l owns the channels 4l .. 4l+3 of its head, loads every row of its run (and the
// K-1 rows before it) as float4 up front, so the whole run is in flight at once, and slides the
// K-tap window over them in registers; the conv weights of its 4 channels are 4 float4. A head is
// one warp, so the l2norm of a (token, q/k head) is a warp shuffle sum: no shared memory and no
// barrier. mixed is read once from DRAM (the K-1 rows before a run, also read by the run before
// it, come from L2) and u written once.
template <int K>
__global__ void __launch_bounds__(kConvWarps * 32) deltanet_conv_kernel(CoreArgs p, int t0, int n) {
  pdl_wait();
  pdl_launch_dependents();
  const int lane = threadIdx.x % 32, C = p.C;
  const int head = blockIdx.y * kConvWarps + threadIdx.x / 32;  // q heads, k heads, v heads of 128 channels
  if (head >= C / kHeadDim) return;                             // warp-uniform, and no barrier below
  const int c = head * kHeadDim + 4 * lane;
  const int r0 = blockIdx.x * kConvRun, len = min(kConvRun, n - r0);  // the run's chunk-local tokens

  // X rows r0 .. r0 + len + K - 2 of X = [conv_state; mixed[t0:]]; row r0 + j + i is tap i of token r0 + j.
  float x[kConvRun + K - 1][4];
#pragma unroll
  for (int j = 0; j < kConvRun + K - 1; ++j) {
    const int row = r0 + j;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (j < len + K - 1)
      v = row < K - 1 ? ld4(p.conv_state + size_t(row) * C + c) : ld4(p.mixed + size_t(t0 + row - (K - 1)) * C + c);
    x[j][0] = v.x, x[j][1] = v.y, x[j][2] = v.z, x[j][3] = v.w;
  }
  static_assert(K == 4, "the conv weights of a channel are one float4");
  float w[4][K];  // w[ch][i] = conv_weight[c + ch, i]
#pragma unroll
  for (int ch = 0; ch < 4; ++ch) {
    const float4 v = ld4(p.conv_weight + size_t(c + ch) * K);
    w[ch][0] = v.x, w[ch][1] = v.y, w[ch][2] = v.z, w[ch][3] = v.w;
  }

  const bool qk = head < 2 * p.Hk;
  const float scale = head < p.Hk ? 1.f / sqrtf(128.f) : 1.f;  // q = l2norm(q) / sqrt(128), k = l2norm(k)
#pragma unroll
  for (int j = 0; j < kConvRun; ++j) {
    if (j >= len) break;  // warp-uniform
    float u[4];
#pragma unroll
    for (int ch = 0; ch < 4; ++ch) {
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < K; ++i) acc += w[ch][i] * x[j + i][ch];
      u[ch] = silu(acc);
    }
    if (qk) {  // warp-uniform: x * rsqrt(sum x^2 + 1e-6) over the head's 128 channels (spec §2.6)
      const float ss = warp_sum(u[0] * u[0] + u[1] * u[1] + u[2] * u[2] + u[3] * u[3]);
      const float inv = 1.f / sqrtf(ss + 1e-6f) * scale;
#pragma unroll
      for (int ch = 0; ch < 4; ++ch) u[ch] *= inv;
    }
    st4(p.u + size_t(r0 + j) * C + c, make_float4(u[0], u[1], u[2], u[3]));
  }
}

// conv_state <- the last K-1 rows of [conv_state; mixed[t0 : t0+n]], one thread per channel.
template <int K>
__global__ void conv_state_kernel(CoreArgs p, int t0, int n) {
  pdl_wait();
  pdl_launch_dependents();
  const int c = blockIdx.x * blockDim.x + threadIdx.x, C = p.C;
  if (c >= C) return;
  float next[K - 1];
#pragma unroll
  for (int r = 0; r < K - 1; ++r) {
    const int row = n + r;
    next[r] = row < K - 1 ? p.conv_state[size_t(row) * C + c] : p.mixed[size_t(t0 + row - (K - 1)) * C + c];
  }
#pragma unroll
  for (int r = 0; r < K - 1; ++r) p.conv_state[size_t(r) * C + c] = next[r];
}

// The recurrent rule over n tokens; block (v-head, slice) as in decode; raw o into y.
// The next token's q/k/v and gates are loaded into registers while this one is computed.
__global__ void __launch_bounds__(kThreads) deltanet_scan_kernel(CoreArgs p, int t0, int n) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ __align__(16) float q_s[kHeadDim], k_s[kHeadDim];
  __shared__ float v_s[kCols];
  __shared__ float red[2][4][kCols];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.x / kSlices, slice = blockIdx.x % kSlices;
  const int kh = h / (p.Hv / p.Hk), col = slice * kCols + lane;
  const int C = p.C, key_dim = p.Hk * kHeadDim;

  float* S = p.ssm_state + size_t(h) * kHeadDim * kHeadDim + size_t(warp * kRows) * kHeadDim + col;
  float s[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) s[i] = S[size_t(i) * kHeadDim];

  const float* uq = p.u + kh * kHeadDim + tid;
  const float* uk = p.u + key_dim + kh * kHeadDim + tid;
  const float* uv = p.u + 2 * key_dim + h * kHeadDim + col;
  float nq = uq[0], nk = uk[0], nv = warp == 0 ? uv[0] : 0.f, alpha, beta;
  gates(p, t0, h, alpha, beta);
  for (int t = 0; t < n; ++t) {
    q_s[tid] = nq;
    k_s[tid] = nk;
    if (warp == 0) v_s[lane] = nv;
    const float cur_alpha = alpha, cur_beta = beta;
    __syncthreads();
    if (t + 1 < n) {  // prefetch token t+1
      const size_t off = size_t(t + 1) * C;
      nq = uq[off], nk = uk[off];
      if (warp == 0) nv = uv[off];
      gates(p, t0 + t + 1, h, alpha, beta);
    }
    const float o = delta_step(s, q_s, k_s, v_s[lane], cur_alpha, cur_beta, red);
    if (warp == 0) p.y[size_t(t0 + t) * p.Hv * kHeadDim + h * kHeadDim + col] = o;
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) S[size_t(i) * kHeadDim] = s[i];
}

// y <- norm_w * (y * rsqrt(mean(y^2) + eps)) * silu(z) over the n * Hv rows (token, v-head) of
// the chunk: one warp per row, kNormRows rows per block; lane l owns the values 4l .. 4l+3 (float4
// loads of y and z), the row's sum of squares is a warp shuffle sum: no barrier. With yp, the
// row also as bf16 in x_to_bf16_permuted's K order (the wgmma out_proj's input; a head's 128
// values are two K groups): through the warp's shared row, 16 lanes a 16-byte piece each.
__global__ void __launch_bounds__(kNormRows * 32) gated_norm_kernel(CoreArgs p, int t0, int n, uint4* yp) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ __align__(16) float rows[kNormRows][kHeadDim];
  const int warp = threadIdx.x / 32, row = blockIdx.x * kNormRows + warp, lane = threadIdx.x % 32;
  if (row >= n * p.Hv) return;  // warp-uniform, and no barrier below
  const size_t i = (size_t(t0) * p.Hv + row) * kHeadDim + 4 * lane;
  const float4 x4 = ld4(p.y + i), z4 = ld4(p.z + i), w4 = ld4(p.norm_weight + 4 * lane);
  const float ss = warp_sum(x4.x * x4.x + x4.y * x4.y + x4.z * x4.z + x4.w * x4.w);
  const float inv = 1.f / sqrtf(ss / float(kHeadDim) + p.eps);
  const float4 y4 = make_float4(w4.x * (x4.x * inv) * silu(z4.x), w4.y * (x4.y * inv) * silu(z4.y),
                                w4.z * (x4.z * inv) * silu(z4.z), w4.w * (x4.w * inv) * silu(z4.w));
  st4(p.y + i, y4);
  if (!yp) return;
  reinterpret_cast<float4*>(rows[warp])[lane] = y4;
  __syncwarp();
  if (lane < kHeadDim / 8)  // piece `lane`: columns 8 lane .. + 7, K group lane / 8 of the head
    yp[(size_t(t0) * p.Hv + row) * (kHeadDim / 8) + lane] = w4_wgmma::permuted_piece(
        rows[warp] + lane / 8 * w4_wgmma::kGroup, lane % 8 * 8);
}

}  // namespace

const char* kernel_name(DeltaRulePrefill form) {
  switch (form) {
    case DeltaRulePrefill::rows: return "deltanet_decode (rows)";
    case DeltaRulePrefill::recurrent: return "deltanet_scan (recurrent)";
    default: return "delta_rule_chunked";
  }
}

// The conv outputs u [min(T, chunk), conv_dim], then (chunked) the chunked rule's scratch.
size_t deltanet_prefill_scratch_bytes(DeltaRulePrefill form, const DeltaNetParams& p) {
  if (form == DeltaRulePrefill::rows) return 0;
  const int n = std::min(std::max(p.T, 1), kPrefillChunk);
  const size_t u_bytes = size_t(n) * size_t(p.conv_dim()) * sizeof(float);
  if (form == DeltaRulePrefill::recurrent) return u_bytes;
  return u_bytes + delta_rule_chunked_scratch_bytes(n, p.num_value_heads);
}

void gated_deltanet_prefill(DeltaRulePrefill form, const DeltaNetParams& p, const float* mixed, const float* z,
                            const float* b, const float* a, float* conv_state, float* ssm_state, float* y,
                            void* scratch, cudaStream_t stream, bf16* y_bf16) {
  LILY_CHECK(!y_bf16 || (form != DeltaRulePrefill::rows && reinterpret_cast<uintptr_t>(y_bf16) % 16 == 0),
             "gated_deltanet_prefill: a bf16 y is written by the recurrent and chunked forms, 16-byte aligned");
  if (form == DeltaRulePrefill::rows) {  // the decode kernel, the tokens one after another
    gated_deltanet_decode(p, mixed, z, b, a, conv_state, ssm_state, y, stream);
    return;
  }
  check_deltanet_params(p);
  LILY_CHECK(!p.kept.conv, "gated_deltanet_prefill: only the rows form keeps its rows' states");
  LILY_CHECK(scratch != nullptr, "gated_deltanet_prefill: a prefill of {} tokens needs scratch", p.T);
  // The conv and gated-norm kernels move float4s: every prefill buffer starts on 16 bytes (the
  // row lengths C, Hv*128 and the weights' 4 taps, 128 values are multiples of 4 floats).
  for (const void* q : {static_cast<const void*>(mixed), static_cast<const void*>(z), static_cast<const void*>(y),
                        static_cast<const void*>(conv_state), static_cast<const void*>(p.conv_weight),
                        static_cast<const void*>(p.norm_weight), static_cast<const void*>(scratch)})
    LILY_CHECK(reinterpret_cast<uintptr_t>(q) % 16 == 0, "gated_deltanet_prefill: buffers must be 16-byte aligned");
  const CoreArgs args = core_args(p, mixed, z, b, a, conv_state, ssm_state, y, static_cast<float*>(scratch));
  const int Hv = p.num_value_heads, heads = args.C / kHeadDim;  // q, k and v heads of 128 channels
  DeltaRuleChunkedArgs chunked;
  chunked.num_key_heads = p.num_key_heads, chunked.num_value_heads = Hv, chunked.conv_dim = args.C;
  chunked.u = args.u, chunked.A_log = p.A_log, chunked.dt_bias = p.dt_bias, chunked.ssm_state = ssm_state;
  chunked.scratch = static_cast<char*>(scratch) + size_t(std::min(p.T, kPrefillChunk)) * args.C * sizeof(float);
  for (int t0 = 0; t0 < p.T; t0 += kPrefillChunk) {
    const int n = std::min(kPrefillChunk, p.T - t0);
    const dim3 conv_grid(unsigned((n + kConvRun - 1) / kConvRun), unsigned((heads + kConvWarps - 1) / kConvWarps));
    launch_after_wait(deltanet_conv_kernel<kConvK>, dim3(conv_grid), dim3(kConvWarps * 32), 0, stream, args, t0, n);
    launch_after_wait(conv_state_kernel<kConvK>, dim3(unsigned((args.C + 255) / 256)), dim3(256), 0, stream, args, t0,
                      n);
    if (form == DeltaRulePrefill::chunked) {
      chunked.n = n, chunked.b = b + size_t(t0) * Hv, chunked.a = a + size_t(t0) * Hv;
      chunked.o = y + size_t(t0) * Hv * kHeadDim;
      delta_rule_chunked(chunked, stream);
    } else {
      launch_after_wait(deltanet_scan_kernel, dim3(unsigned(Hv * kSlices)), dim3(kThreads), 0, stream, args, t0, n);
    }
    launch_after_wait(gated_norm_kernel, dim3(unsigned((n * Hv + kNormRows - 1) / kNormRows)), dim3(kNormRows * 32), 0,
                      stream, args, t0, n, reinterpret_cast<uint4*>(y_bf16));
  }
}

}  // namespace lily::cuda
