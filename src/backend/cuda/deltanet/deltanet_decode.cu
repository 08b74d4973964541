// deltanet_decode.cu: the core of a Gated DeltaNet layer (spec §2.6, §3.1) for a few consecutive
// tokens of one sequence (T = 1 .. 16: a decode step, a short pass, later a step of several rows):
// causal conv + SiLU, l2norm of q/k, gates, the delta rule token by token and the gated RMSNorm in
// one launch. deltanet/deltanet_prefill.cu is the path of longer passes.
//
//   u = silu(conv_K([conv_state; mixed]))         q, k, v = u split [Hk*128 | Hk*128 | Hv*128]
//   q = l2norm(q) / sqrt(128),  k = l2norm(k),  beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
//   per v-head h, per token:   S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
//   y = norm_w * rmsnorm(o) * silu(z)          (per v-head, over its 128 outputs)
// Shapes:   mixed [T, conv_dim] · z, y [T, Hv*128] · b, a [T, Hv] · conv_state [K-1, conv_dim] ·
//           S [Hv, 128 (dk), 128 (dv)] fp32, all fp32.  v-head h reads q/k head h / (Hv/Hk).
// Layout:   deltanet_common.cuh's: a block owns (v-head, 32 dv columns), the state in registers;
//           S^T k and S^T q are per-thread partial dots, summed over the 4 warps in shared memory.
// Kernel:   deltanet_decode_kernel<K, MAXT>: the 4 slice blocks of a v-head, and the Hv/Hk v-heads
//           sharing one q/k head, form one thread-block cluster (size 4 * Hv/Hk <= 8). Before the
//           PDL wait: the state, the older conv rows and the weights (nothing earlier in the step
//           or pass writes them). After it, one round of loads of every token's inputs; the conv
//           window slides over the tokens in registers and the l2 norms of all tokens take one
//           barrier (none of it depends on the state); then the delta rule token by token (two
//           barriers a token), q, k, v of every token in shared memory. The gated norm sums the 4
//           blocks' squares of each token through distributed shared memory after one cluster
//           barrier, which also orders the q/k conv-state write (by the cluster's rank 0) after
//           every block of the cluster has read it; the v channels' conv state is written by the
//           one block that owns them. Grid Hv * 4 blocks; reads and writes the 2 MB state once.
//           With p.kept (a verify's rewind), the conv window and the registers' state after each
//           kept token are also written out (deltanet.h's DeltaNetKept); passes of 2+ tokens only.
//           deltanet_decode_rows_kernel<K>: one token of each of N sequences (grid y: the row), each
//           row's conv and recurrent state from the tables (DeltaNetRows), the same code.
// Tested:   tests/cuda/test_deltanet.cu vs backend/cpu (delta_rule_recurrent, gated_rms_norm),
//           decode steps alone and after prefills, passes of 1 .. 16 tokens through this kernel.
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/arch.cuh"
#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/programmatic_launches.h"
#include "backend/cuda/deltanet/deltanet_common.cuh"
#include "backend/cuda/deltanet/deltanet_decode.h"

#include <cooperative_groups.h>

namespace lily::cuda {

namespace {

namespace cg = cooperative_groups;
using namespace deltanet_detail;

// The arguments of row r of a batch step (row_tables.h: one token of each of N sequences): its
// states from the tables, its mixed, z, b, a and y at r times a token's size.
__device__ __forceinline__ CoreArgs row_args(const CoreArgs& args, const DeltaNetRows& rows, int r) {
  CoreArgs p = args;
  const int width = p.Hv * kHeadDim;
  p.conv_state = rows.conv[r], p.ssm_state = rows.ssm[r];
  p.mixed += size_t(r) * p.C, p.z += size_t(r) * width, p.y += size_t(r) * width;
  p.b += size_t(r) * p.Hv, p.a += size_t(r) * p.Hv;
  return p;
}

// The core of p.T <= MAXT tokens of one sequence (the kernels below).
template <int K, int MAXT>
__device__ __forceinline__ void deltanet_decode(const CoreArgs& p) {
#if LILY_SM90_CODE
  trace::BlockTrace trace(trace::kind_deltanet);
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ __align__(16) float q_s[MAXT][kHeadDim], k_s[MAXT][kHeadDim];
  __shared__ float v_s[MAXT][kCols];
  __shared__ float red[2][4][kCols];
  __shared__ float part[MAXT][2][4];
  __shared__ float alpha_s[MAXT], beta_s[MAXT];
  __shared__ float o_s[MAXT][kCols];
  __shared__ float sumsq[MAXT];  // this block's sums of o^2, read by the head's other slices

  const int T = MAXT == 1 ? 1 : p.T;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int h = blockIdx.x / kSlices, slice = blockIdx.x % kSlices;
  const int ratio = p.Hv / p.Hk, kh = h / ratio;
  const int col = slice * kCols + lane;  // this thread's dv column
  const int C = p.C, key_dim = p.Hk * kHeadDim, width = p.Hv * kHeadDim;
  const int cq = kh * kHeadDim + tid, ck = key_dim + kh * kHeadDim + tid, cv = 2 * key_dim + h * kHeadDim + col;

  // Before the PDL wait: what no earlier kernel of the step writes: the recurrent state (32
  // independent coalesced loads per thread), the conv state's K-1 older rows, the weights.
  float* S = p.ssm_state + size_t(h) * kHeadDim * kHeadDim + size_t(warp * kRows) * kHeadDim + col;
  float s[kRows];
#pragma unroll
  for (int i = 0; i < kRows; ++i) s[i] = S[size_t(i) * kHeadDim];
  // Conv window of channel c: x[1 .. K-1] the older rows; each token shifts itself in at x[K-1].
  float xq[K], xk[K], xv[K], wq[K], wk[K], wv[K];
#pragma unroll
  for (int i = 0; i < K; ++i) {
    if (i < K - 1) {
      xq[i + 1] = p.conv_state[size_t(i) * C + cq];
      xk[i + 1] = p.conv_state[size_t(i) * C + ck];
      xv[i + 1] = warp == 0 ? p.conv_state[size_t(i) * C + cv] : 0.f;
    }
    wq[i] = p.conv_weight[size_t(cq) * K + i];
    wk[i] = p.conv_weight[size_t(ck) * K + i];
    wv[i] = warp == 0 ? p.conv_weight[size_t(cv) * K + i] : 0.f;
  }
  const float wc = p.norm_weight[col], A_log = p.A_log[h], dt_bias = p.dt_bias[h];
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);

  // Every token's inputs in one round of loads; thread t < T computes token t's gates.
  float mq[MAXT], mk[MAXT], mv[MAXT], zc[MAXT];
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    if (t >= T) break;
    const float* m = p.mixed + size_t(t) * C;
    mq[t] = m[cq], mk[t] = m[ck], mv[t] = warp == 0 ? m[cv] : 0.f;
    zc[t] = warp == 0 ? p.z[size_t(t) * width + h * kHeadDim + col] : 0.f;
  }
  if (tid < T)
    gate_values(p.b[size_t(tid) * p.Hv + h], p.a[size_t(tid) * p.Hv + h], A_log, dt_bias, alpha_s[tid], beta_s[tid]);
  auto conv = [&](float(&x)[K], const float(&w)[K], float m) {
#pragma unroll
    for (int i = 0; i < K - 1; ++i) x[i] = x[i + 1];
    x[K - 1] = m;
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < K; ++i) acc += w[i] * x[i];
    return silu(acc);
  };
  // u = silu(conv) of every token, and its q / k sums of squares per warp.
  float uq[MAXT], uk[MAXT];
  const bool keep = MAXT > 1 && p.kept.conv != nullptr;
  const bool keep_qk = keep && h % ratio == 0 && slice == 0;  // one block of the key head writes its q/k rows
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    if (t >= T) break;
    uq[t] = conv(xq, wq, mq[t]), uk[t] = conv(xk, wk, mk[t]);
    if (warp == 0) v_s[t][lane] = conv(xv, wv, mv[t]);
    if (keep && t >= p.kept.first) {  // the conv state after token t: the window's newest K-1 inputs
      float* kept = p.kept.conv + size_t(t - p.kept.first) * (K - 1) * C;
#pragma unroll
      for (int i = 0; i < K - 1; ++i) {
        if (keep_qk) kept[size_t(i) * C + cq] = xq[i + 1], kept[size_t(i) * C + ck] = xk[i + 1];
        if (warp == 0) kept[size_t(i) * C + cv] = xv[i + 1];
      }
    }
    const float ssq = warp_sum(uq[t] * uq[t]), ssk = warp_sum(uk[t] * uk[t]);
    if (lane == 0) part[t][0][warp] = ssq, part[t][1][warp] = ssk;
  }
  if (warp == 0) {  // the v channel of this column: owned by this block alone, so update it now
#pragma unroll
    for (int i = 0; i < K - 1; ++i) p.conv_state[size_t(i) * C + cv] = xv[i + 1];
  }
  __syncthreads();
  // q = l2norm(q) / sqrt(128), k = l2norm(k): x * rsqrt(sum x^2 + 1e-6) (spec §2.6)
#pragma unroll
  for (int t = 0; t < MAXT; ++t) {
    if (t >= T) break;
    const float(&pq)[4] = part[t][0];
    const float(&pk)[4] = part[t][1];
    const float inv_q = 1.f / sqrtf(pq[0] + pq[1] + pq[2] + pq[3] + 1e-6f) * (1.f / sqrtf(128.f));
    const float inv_k = 1.f / sqrtf(pk[0] + pk[1] + pk[2] + pk[3] + 1e-6f);
    q_s[t][tid] = uq[t] * inv_q;
    k_s[t][tid] = uk[t] * inv_k;
  }
  __syncthreads();
  trace.mark(2);

  // The recurrence, a rolled loop: unrolled over 16 tokens its code measured 1.8 us a token
  // (the instruction cache), against about 1 us.
#pragma unroll 1
  for (int t = 0; t < T; ++t) {
    const float o = delta_step(s, q_s[t], k_s[t], v_s[t][lane], alpha_s[t], beta_s[t], red);
    if (warp == 0) o_s[t][lane] = o;
    if (keep && t >= p.kept.first) {  // the recurrent state after token t, where S has it
      float* kept = p.kept.ssm + size_t(t - p.kept.first) * p.Hv * kHeadDim * kHeadDim + (S - p.ssm_state);
#pragma unroll
      for (int i = 0; i < kRows; ++i) kept[size_t(i) * kHeadDim] = s[i];
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) S[size_t(i) * kHeadDim] = s[i];
  trace.mark(4);

  if (warp == 0) {
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
      if (t >= T) break;
      const float ss = warp_sum(o_s[t][lane] * o_s[t][lane]);
      if (lane == 0) sumsq[t] = ss;
    }
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
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
      if (t >= T) break;
      float total = 0.f;
#pragma unroll
      for (int j = 0; j < kSlices; ++j) total += *cluster.map_shared_rank(&sumsq[t], first + j);
      const float inv = 1.f / sqrtf(total / float(kHeadDim) + p.eps);
      p.y[size_t(t) * width + h * kHeadDim + col] = wc * (o_s[t][lane] * inv) * silu(zc[t]);
    }
  }
  cluster.sync();  // keep this block's shared memory alive until the others have read it
#else
  __trap();
#endif
}

// A decode step or a short pass of one sequence; a batch step, one token a row (grid y).
template <int K, int MAXT>
__global__ void __launch_bounds__(kThreads) deltanet_decode_kernel(CoreArgs p) {
  deltanet_decode<K, MAXT>(p);
}

template <int K>
__global__ void __launch_bounds__(kThreads) deltanet_decode_rows_kernel(CoreArgs args, DeltaNetRows rows) {
  deltanet_decode<K, 1>(row_args(args, rows, blockIdx.y));
}

// `kernel` for p.T tokens a row, `rows` rows (grid y).
template <typename Kernel, typename... Args>
void launch_decode(const DeltaNetParams& p, int rows, cudaStream_t stream, Kernel kernel, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(p.num_value_heads * kSlices), unsigned(rows));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = unsigned(p.num_value_heads / p.num_key_heads * kSlices);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  // In a prefill pass with programmatic launches on (pdl_launch.cuh); the decode graph gets its
  // programmatic edges from pdl_graph.h.
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = ProgrammaticLaunches::on() ? 2 : 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace

void gated_deltanet_decode(const DeltaNetParams& p, const float* mixed, const float* z, const float* b, const float* a,
                           float* conv_state, float* ssm_state, float* y, cudaStream_t stream) {
  check_deltanet_params(p);
  LILY_CHECK(p.T >= 1 && p.T <= kDeltaNetDecodeMaxT, "gated_deltanet_decode: {} tokens (1 .. {})", p.T,
             kDeltaNetDecodeMaxT);
  LILY_CHECK(!p.kept.conv == !p.kept.ssm && (!p.kept.conv || (p.T > 1 && p.kept.first >= 0 && p.kept.first < p.T)),
             "gated_deltanet_decode: rows' states kept from row {} of {} (a pass of 2 tokens or more)", p.kept.first,
             p.T);
  auto* kernel = p.T == 1   ? deltanet_decode_kernel<kConvK, 1>
                 : p.T <= 8 ? deltanet_decode_kernel<kConvK, 8>
                            : deltanet_decode_kernel<kConvK, kDeltaNetDecodeMaxT>;
  launch_decode(p, 1, stream, kernel, core_args(p, mixed, z, b, a, conv_state, ssm_state, y, nullptr));
}

void gated_deltanet_decode_rows(const DeltaNetParams& p, const DeltaNetRows& rows, int N, const float* mixed,
                                const float* z, const float* b, const float* a, float* y, cudaStream_t stream) {
  check_deltanet_params(p);
  LILY_CHECK(p.T == 1 && N >= 1 && N <= kMaxBatchRows && rows.conv && rows.ssm && !p.kept.conv,
             "gated_deltanet_decode_rows: {} rows of {} token(s) (1 token, 1 .. {} rows, with tables)", N, p.T,
             kMaxBatchRows);
  launch_decode(p, N, stream, deltanet_decode_rows_kernel<kConvK>,
                core_args(p, mixed, z, b, a, nullptr, nullptr, y, nullptr), rows);
}

}  // namespace lily::cuda
