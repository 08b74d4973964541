// deltanet_decode.cu: the core of a Gated DeltaNet layer (spec §2.6, §3.1) for one token: causal
// conv + SiLU, l2norm of q/k, gates, the delta rule and the gated RMSNorm in one launch.
// prefill/deltanet_prefill.cu is the T-token path.
//
//   u = silu(conv_K([conv_state; mixed]))         q, k, v = u split [Hk*128 | Hk*128 | Hv*128]
//   q = l2norm(q) / sqrt(128),  k = l2norm(k),  beta = sigmoid(b),  g = -exp(A_log) softplus(a + dt_bias)
//   per v-head h, per token:   S <- exp(g) S;  delta = beta (v - S^T k);  S <- S + k delta^T;  o = S^T q
//   y = norm_w * rmsnorm(o) * silu(z)          (per v-head, over its 128 outputs)
// Shapes:   mixed [conv_dim] · z, y [Hv*128] · b, a [Hv] · conv_state [K-1, conv_dim] ·
//           S [Hv, 128 (dk), 128 (dv)] fp32, all fp32.  v-head h reads q/k head h / (Hv/Hk).
// Layout:   deltanet_common.cuh's: a block owns (v-head, 32 dv columns), the state in registers;
//           S^T k and S^T q are per-thread partial dots, summed over the 4 warps in shared memory.
// Kernel:   deltanet_decode_kernel: the 4 slice blocks of a v-head, and the Hv/Hk v-heads sharing
//           one q/k head, form one thread-block cluster (size 4 * Hv/Hk <= 8): the gated norm sums
//           the 4 blocks' squares through distributed shared memory, and the cluster barrier also
//           orders the q/k conv-state write (done by the cluster's rank 0) after every block of
//           the cluster has read it. The v channels' conv state is written by the one block that
//           owns them. Grid Hv * 4 blocks; reads and writes the 2 MB state once. Before the PDL
//           wait: the state, the older conv rows and the weights (nothing earlier in the step
//           writes them).
// Tested:   tests/cuda/test_deltanet.cu vs backend/cpu (delta_rule_recurrent, gated_rms_norm),
//           decode steps alone and after prefills.
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/deltanet_common.cuh"
#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/decode/deltanet_decode.h"

#include <cooperative_groups.h>

namespace lily::cuda {

namespace {

namespace cg = cooperative_groups;
using namespace deltanet_detail;

template <int K>
__global__ void __launch_bounds__(kThreads) deltanet_decode_kernel(CoreArgs p) {
  trace::BlockTrace trace(trace::kind_deltanet);
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
  trace.mark(1);

  const float zc = p.z[h * kHeadDim + col];
  float alpha, beta;  // loaded here with z and mixed: one round of loads after the wait, not two
  gate_values(p.b[h], p.a[h], A_log, dt_bias, alpha, beta);  // A_log, dt_bias loaded before the wait
  auto conv = [&](int c, float(&x)[K], const float(&w)[K]) {
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
  trace.mark(2);

  const float o = delta_step(s, q_s, k_s, v_s[lane], alpha, beta, red);
#pragma unroll
  for (int i = 0; i < kRows; ++i) S[size_t(i) * kHeadDim] = s[i];
  trace.mark(4);

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

}  // namespace

void gated_deltanet_decode(const DeltaNetParams& p, const float* mixed, const float* z, const float* b, const float* a,
                           float* conv_state, float* ssm_state, float* y, cudaStream_t stream) {
  check_deltanet_params(p);
  LILY_CHECK(p.T == 1, "gated_deltanet_decode: one token, {} given", p.T);
  const CoreArgs args = core_args(p, mixed, z, b, a, conv_state, ssm_state, y, nullptr);
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(unsigned(p.num_value_heads * kSlices));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = unsigned(p.num_value_heads / p.num_key_heads * kSlices);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, deltanet_decode_kernel<kConvK>, args));
}

}  // namespace lily::cuda
