// deltanet.cu: the core of a Gated DeltaNet layer (spec §2.6, §3.1, §3.2): causal conv + SiLU,
// l2norm of q/k, gates, the delta rule and the gated RMSNorm, for any T >= 1.
//
//   u = silu(conv_K([conv_state; mixed]))         q, k, v = u split [Hk*128 | Hk*128 | Hv*128]
//   q = l2norm(q) / sqrt(128),  k = l2norm(k),  beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
//   per v-head h, per token:   S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
//   y = norm_w * rmsnorm(o) * silu(z)          (per v-head, over its 128 outputs)
// Shapes:   mixed [T, conv_dim] · z, y [T, Hv*128] · b, a [T, Hv] · conv_state [K-1, conv_dim] ·
//           S [Hv, 128 (dk), 128 (dv)] fp32, all fp32.  v-head h reads q/k head h / (Hv/Hk).
// Layout:   one block owns (v-head h, a slice of 32 dv columns): 128 threads, warp w holds the
//           state rows a in [32w, 32w+32) of the block's columns, lane = column, so each thread
//           keeps 32 state values in registers and every warp load/store is one 128-byte line.
//           S^T k and S^T q are per-thread partial dots, summed over the 4 warps in shared memory.
// Variants: deltanet_decode_kernel (T = 1): everything fused in one launch. The 4 slice blocks
//             of a v-head, and the Hv/Hk v-heads sharing one q/k head, form one thread-block
//             cluster (size 4 * Hv/Hk <= 8): the gated norm sums the 4 blocks' squares through
//             distributed shared memory, and the cluster barrier also orders the q/k conv-state
//             write (done by the cluster's rank 0) after every block of the cluster has read it.
//             The v channels' conv state is written by the one block that owns them.
//             Grid Hv*4 blocks; reads and writes the 2 MB state once.
//           prefill (T > 1), per chunk of <= 512 tokens (bounded scratch: u [chunk, conv_dim]):
//             deltanet_conv_kernel     conv + SiLU (+ l2norm for q/k heads) of every (token, head):
//                                      a warp per (head, run of 16 tokens), 4 heads per block, lane =
//                                      4 channels (float4), the K-tap window slides in registers and
//                                      the l2norm is a shuffle sum; mixed read once, u written once
//             conv_state_kernel        the last K-1 inputs become the new conv state
//             the delta rule over the chunk, raw o written into y, by DeltaNetParams::prefill:
//               chunked (default)      delta_rule_chunked (deltanet_chunked.cu, spec §3.2: three
//                                      launches of 64-token matrix products)
//               recurrent              deltanet_scan_kernel: the token loop, state in registers
//             gated_norm_kernel        y <- norm_w * rmsnorm(y) * silu(z) in place: a warp per
//                                      (token, v-head) row, 8 rows per block, float4, shuffle sum
//             The conv and the gated norm are memory-bound; the layout before (a 128-thread block per
//             (token, head), a barrier reduction) ran at a third of the bandwidth: 41 and 22 us per 512
//             tokens at the real size, where the bytes allow about 10 and 7.
// Tested:   tests/cuda/test_deltanet.cu vs backend/cpu (delta_rule_recurrent, gated_rms_norm).
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/grow_only_scratch.h"

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/common/deltanet.h"

namespace lily::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kHeadDim = 128;                 // dk = dv
constexpr int kConvK = 4;                     // the model's conv kernel (template parameter K)
constexpr int kCols = 32;                     // dv columns per block, one per lane
constexpr int kSlices = kHeadDim / kCols;     // blocks per v-head
constexpr int kThreads = 128;                 // 4 warps x 32 dk rows
constexpr int kRows = kHeadDim / (kThreads / 32);  // state rows per thread
constexpr int kPrefillChunk = 512;            // tokens per prefill chunk (bounds the scratch)
constexpr int kConvRun = 16;                  // deltanet_conv_kernel: tokens per warp
constexpr int kConvWarps = 4;                 // deltanet_conv_kernel: heads (warps) per block
constexpr int kNormRows = 8;                  // gated_norm_kernel: rows (warps) per block

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
};

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
// q_s, k_s: [128] shared; v: v[col]; red: [2][4][32] shared. Two block barriers inside.
__device__ __forceinline__ float delta_step(float (&s)[kRows], const float* q_s, const float* k_s, float v, float alpha,
                                            float beta, float (*red)[4][kCols]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, a0 = warp * kRows;
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    s[i] *= alpha;  // decay first
    m += s[i] * k_s[a0 + i];
  }
  red[0][warp][lane] = m;
  __syncthreads();
  m = red[0][0][lane] + red[0][1][lane] + red[0][2][lane] + red[0][3][lane];
  const float delta = beta * (v - m);
  float o = 0.f;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    s[i] += k_s[a0 + i] * delta;  // rank-1 write
    o += s[i] * q_s[a0 + i];      // read with the updated state
  }
  red[1][warp][lane] = o;
  __syncthreads();
  return red[1][0][lane] + red[1][1][lane] + red[1][2][lane] + red[1][3][lane];
}

// ---- Decode (T = 1): one fused launch ----------------------------------------------------------

template <int K>
__global__ void __launch_bounds__(kThreads) deltanet_decode_kernel(CoreArgs p) {
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ float q_s[kHeadDim], k_s[kHeadDim], v_s[kCols];
  __shared__ float red[2][4][kCols];
  __shared__ float part[2][4];
  __shared__ float sumsq;  // this block's sum of o^2, read by the head's other slices

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.x / kSlices, slice = blockIdx.x % kSlices;
  const int ratio = p.Hv / p.Hk, kh = h / ratio;
  const int col = slice * kCols + lane;  // this thread's dv column
  const int C = p.C, key_dim = p.Hk * kHeadDim;
  const int cq = kh * kHeadDim + tid, ck = key_dim + kh * kHeadDim + tid, cv = 2 * key_dim + h * kHeadDim + col;

  // Before the PDL wait: what no kernel of this step writes before this one: the recurrent state
  // (32 independent coalesced loads per thread), the conv state's K-1 older rows, the weights.
  float* S = p.ssm_state + size_t(h) * kHeadDim * kHeadDim + size_t(warp * kRows) * kHeadDim + col;
  float s[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) s[i] = S[size_t(i) * kHeadDim];
  // Conv + SiLU of channel c: X = [conv_state rows 0..K-2 ; mixed], w[c, K-1] on the current token.
  float xq[K], xk[K], xv[K], wq[K], wk[K], wv[K];
#pragma unroll
  for (int i = 0; i < K; ++i) {
    if (i < K - 1) {
      xq[i] = p.conv_state[size_t(i) * C + cq];
      xk[i] = p.conv_state[size_t(i) * C + ck];
      xv[i] = warp == 0 ? p.conv_state[size_t(i) * C + cv] : 0.f;
    }
    wq[i] = p.conv_weight[size_t(cq) * K + i];
    wk[i] = p.conv_weight[size_t(ck) * K + i];
    wv[i] = warp == 0 ? p.conv_weight[size_t(cv) * K + i] : 0.f;
  }
  const float wc = p.norm_weight[col], A_log = p.A_log[h], dt_bias = p.dt_bias[h];
  pdl_wait();
  pdl_launch_dependents();

  const float zc = p.z[h * kHeadDim + col];
  float alpha, beta;  // loaded here with z and mixed: one round of loads after the wait, not two
  gate_values(p.b[h], p.a[h], A_log, dt_bias, alpha, beta);  // A_log, dt_bias loaded before the wait
  auto conv = [&](int c, float (&x)[K], const float (&w)[K]) {
    x[K - 1] = p.mixed[c];
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < K; ++i) acc += w[i] * x[i];
    return silu(acc);
  };
  const float uq = conv(cq, xq, wq), uk = conv(ck, xk, wk);
  if (warp == 0) {  // the v channel of this column: owned by this block alone, so update it now
    v_s[lane] = conv(cv, xv, wv);
#pragma unroll
    for (int i = 0; i < K - 1; ++i) p.conv_state[size_t(i) * C + cv] = xv[i + 1];
  }

  // q = l2norm(q) / sqrt(128), k = l2norm(k): x * rsqrt(sum x^2 + 1e-6) (spec §2.6)
  const float ssq = warp_sum(uq * uq), ssk = warp_sum(uk * uk);
  if (lane == 0) part[0][warp] = ssq, part[1][warp] = ssk;
  __syncthreads();
  const float inv_q = 1.f / sqrtf(part[0][0] + part[0][1] + part[0][2] + part[0][3] + 1e-6f) * (1.f / sqrtf(128.f));
  const float inv_k = 1.f / sqrtf(part[1][0] + part[1][1] + part[1][2] + part[1][3] + 1e-6f);
  q_s[tid] = uq * inv_q;
  k_s[tid] = uk * inv_k;
  __syncthreads();

  const float o = delta_step(s, q_s, k_s, v_s[lane], alpha, beta, red);
#pragma unroll
  for (int i = 0; i < kRows; ++i) S[size_t(i) * kHeadDim] = s[i];

  if (warp == 0) {
    const float ss = warp_sum(o * o);
    if (lane == 0) sumsq = ss;
  }
  // After this barrier every block of the cluster has read the old conv state and published sumsq.
  cluster.sync();
  if (cluster.block_rank() == 0) {  // the q/k conv state of key head kh, written once
#pragma unroll
    for (int i = 0; i < K - 1; ++i) {
      p.conv_state[size_t(i) * C + cq] = xq[i + 1];
      p.conv_state[size_t(i) * C + ck] = xk[i + 1];
    }
  }
  if (warp == 0) {
    // y = w * (o * rsqrt(mean(o^2) + eps)) * silu(z), the mean over the head's 4 slices (spec §2.2.2)
    const unsigned first = (h % ratio) * kSlices;
    float total = 0.f;
#pragma unroll
    for (int j = 0; j < kSlices; ++j) total += *cluster.map_shared_rank(&sumsq, first + j);
    const float inv = 1.f / sqrtf(total / float(kHeadDim) + p.eps);
    p.y[h * kHeadDim + col] = wc * (o * inv) * silu(zc);
  }
  cluster.sync();  // keep this block's shared memory alive until the others have read it
}

// ---- Prefill (T > 1), one chunk of n tokens starting at t0 ------------------------------------

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
  if (head >= C / kHeadDim) return;  // warp-uniform, and no barrier below
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
  __shared__ float q_s[kHeadDim], k_s[kHeadDim], v_s[kCols];
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
// loads of y and z), the row's sum of squares is a warp shuffle sum: no barrier.
__global__ void __launch_bounds__(kNormRows * 32) gated_norm_kernel(CoreArgs p, int t0, int n) {
  pdl_wait();
  pdl_launch_dependents();
  const int row = blockIdx.x * kNormRows + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= n * p.Hv) return;  // warp-uniform, and no barrier below
  const size_t i = (size_t(t0) * p.Hv + row) * kHeadDim + 4 * lane;
  const float4 x4 = ld4(p.y + i), z4 = ld4(p.z + i), w4 = ld4(p.norm_weight + 4 * lane);
  const float ss = warp_sum(x4.x * x4.x + x4.y * x4.y + x4.z * x4.z + x4.w * x4.w);
  const float inv = 1.f / sqrtf(ss / float(kHeadDim) + p.eps);
  st4(p.y + i, make_float4(w4.x * (x4.x * inv) * silu(z4.x), w4.y * (x4.y * inv) * silu(z4.y),
                           w4.z * (x4.z * inv) * silu(z4.z), w4.w * (x4.w * inv) * silu(z4.w)));
}

// (fmt's compile-time format check does not build under nvcc: fmt::runtime.)
void check_params(const DeltaNetParams& p) {
  const auto check = [](bool ok, const char* what, int value) {
    if (!ok) ::lily::fail(fmt::runtime("gated_deltanet_core: {} = {} is not implemented"), what, value);
  };
  check(p.T >= 1, "T", p.T);
  check(p.head_dim == kHeadDim, "head_dim (only 128)", p.head_dim);
  check(p.conv_kernel == kConvK, "conv_kernel (only 4)", p.conv_kernel);
  check(p.num_key_heads >= 1 && p.num_value_heads % p.num_key_heads == 0, "num_value_heads (a multiple of Hk)",
        p.num_value_heads);
  // The decode cluster holds every block reading one q/k head: 4 slices x (Hv/Hk) <= 8 (portable size).
  check(p.num_value_heads / p.num_key_heads * kSlices <= 8, "Hv/Hk (at most 2)", p.num_value_heads / p.num_key_heads);
}

// The grow-only scratch of the overload without one (stream-ordered allocation).
void* own_scratch(size_t bytes, cudaStream_t stream) {
  static GrowOnlyScratch scratch("gated_deltanet_core", false);
  return scratch.get(bytes, stream);
}

}  // namespace

// The conv outputs u [min(T, 512), conv_dim], then (chunked) the chunked rule's scratch.
size_t gated_deltanet_scratch_bytes(const DeltaNetParams& p) {
  if (p.T <= 1) return 0;
  const int n = std::min(p.T, kPrefillChunk);
  const size_t u_bytes = size_t(n) * size_t(p.conv_dim()) * sizeof(float);
  if (p.prefill == DeltaRulePrefill::recurrent) return u_bytes;
  return u_bytes + delta_rule_chunked_scratch_bytes(n, p.num_value_heads);
}

void gated_deltanet_core(const DeltaNetParams& p, const float* mixed, const float* z, const float* b, const float* a,
                         float* conv_state, float* ssm_state, float* y, void* scratch, cudaStream_t stream) {
  check_params(p);
  CoreArgs args{p.T, p.num_key_heads, p.num_value_heads, p.conv_dim(), p.eps, p.conv_weight, p.A_log, p.dt_bias,
                p.norm_weight, mixed, z, b, a, conv_state, ssm_state, y, static_cast<float*>(scratch)};
  const int Hv = p.num_value_heads, ratio = p.num_value_heads / p.num_key_heads;

  if (p.T == 1) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(unsigned(Hv * kSlices));
    config.blockDim = dim3(kThreads);
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeClusterDimension;
    attribute[0].val.clusterDim.x = unsigned(ratio * kSlices);
    attribute[0].val.clusterDim.y = 1;
    attribute[0].val.clusterDim.z = 1;
    config.attrs = attribute;
    config.numAttrs = 1;
    CUDA_CHECK(cudaLaunchKernelEx(&config, deltanet_decode_kernel<kConvK>, args));
    return;
  }

  if (!scratch) ::lily::fail(fmt::runtime("gated_deltanet_core: a prefill of {} tokens needs scratch"), p.T);
  // The conv and gated-norm kernels move float4s: every prefill buffer starts on 16 bytes (the
  // row lengths C, Hv*128 and the weights' 4 taps, 128 values are multiples of 4 floats).
  for (const void* q : {static_cast<const void*>(mixed), static_cast<const void*>(z), static_cast<const void*>(y),
                        static_cast<const void*>(conv_state), static_cast<const void*>(p.conv_weight),
                        static_cast<const void*>(p.norm_weight), static_cast<const void*>(scratch)})
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0)
      ::lily::fail(fmt::runtime("gated_deltanet_core: prefill buffers must be 16-byte aligned"));
  const int heads = args.C / kHeadDim;  // q, k and v heads of 128 channels
  DeltaRuleChunkedArgs chunked;
  chunked.num_key_heads = p.num_key_heads, chunked.num_value_heads = Hv, chunked.conv_dim = args.C;
  chunked.u = args.u, chunked.A_log = p.A_log, chunked.dt_bias = p.dt_bias, chunked.ssm_state = ssm_state;
  chunked.scratch = static_cast<char*>(scratch) + size_t(std::min(p.T, kPrefillChunk)) * args.C * sizeof(float);
  for (int t0 = 0; t0 < p.T; t0 += kPrefillChunk) {
    const int n = std::min(kPrefillChunk, p.T - t0);
    const dim3 conv_grid(unsigned((n + kConvRun - 1) / kConvRun), unsigned((heads + kConvWarps - 1) / kConvWarps));
    deltanet_conv_kernel<kConvK><<<conv_grid, kConvWarps * 32, 0, stream>>>(args, t0, n);
    CUDA_CHECK_LAUNCH();
    conv_state_kernel<kConvK><<<unsigned((args.C + 255) / 256), 256, 0, stream>>>(args, t0, n);
    CUDA_CHECK_LAUNCH();
    if (p.prefill == DeltaRulePrefill::chunked) {
      chunked.n = n, chunked.b = b + size_t(t0) * Hv, chunked.a = a + size_t(t0) * Hv;
      chunked.o = y + size_t(t0) * Hv * kHeadDim;
      delta_rule_chunked(chunked, stream);
    } else {
      deltanet_scan_kernel<<<unsigned(Hv * kSlices), kThreads, 0, stream>>>(args, t0, n);
      CUDA_CHECK_LAUNCH();
    }
    gated_norm_kernel<<<unsigned((n * Hv + kNormRows - 1) / kNormRows), kNormRows * 32, 0, stream>>>(args, t0, n);
    CUDA_CHECK_LAUNCH();
  }
}

void gated_deltanet_core(const DeltaNetParams& p, const float* mixed, const float* z, const float* b, const float* a,
                         float* conv_state, float* ssm_state, float* y, cudaStream_t stream) {
  const size_t bytes = gated_deltanet_scratch_bytes(p);
  gated_deltanet_core(p, mixed, z, b, a, conv_state, ssm_state, y, bytes ? own_scratch(bytes, stream) : nullptr,
                      stream);
}

}  // namespace lily::cuda
