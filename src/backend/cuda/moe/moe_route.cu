// moe_route.cu: the first of the decode MoE's three launches (moe_decode.h): the block's input
// norm, the router logits and the shared expert's gate, for one token.
//
//   x = RMSNorm(h; gain),  logits = x @ Wr^T (fp32),  shared_weight = sigmoid(x . w_sg)
// Shapes:   h, x [H] fp32 · router [E, H] 4- or 8-bit (8 in mlx) · w_sg [1, H] · logits [E].
//           E <= 256, H <= 4096 (a multiple of 64).
// Kernel:   moe_route_norm_kernel, 32 blocks x 256 threads: each block loads its E/32 router rows
//           into registers before the PDL wait (when they fit in one round: the 8-bit router at
//           H = 2048), normalizes h into its shared memory (8 KB at H = 2048, L2-resident) and
//           writes its logits; block 0 writes x for gate/up; the last block's last warp computes
//           the shared expert's gate. The top-k is left to the expert launches.
// Tested:   tests/cuda/test_moe.cu (Route: x, logits and the gate against cpu::rms_norm and
//           cpu::linear; the choice through the expert launches).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/block_rms.cuh"
#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/moe/moe_common.cuh"
#include "backend/cuda/moe/moe_decode.h"

#include <algorithm>

namespace lily::cuda {

namespace {

using namespace quant;
using namespace moe_detail;

constexpr int kRouteBlocks = 32;  // blocks per token in moe_route_norm_kernel
constexpr int kRouteThreads = 256;

struct RouteParams {
  QView router;       // [E, H]
  QView expert_gate;  // the shared expert's gate [1, H]
  int expert_gate_bits;
  const float* h;     // [H] the residual stream (un-normalized)
  const float* gain;  // [H] post_attention_layernorm's effective gain
  float eps;
  int E, H;
  float* normed;         // [H]
  float* logits;         // [E]
  float* shared_weight;  // [1]
};

template <int BITS, int LPR>
__global__ void __launch_bounds__(kRouteThreads) moe_route_norm_kernel(RouteParams p) {
  trace::BlockTrace trace(trace::kind_moe_route);
  constexpr int R = 4, kCodes = 128 / BITS, kChunksPerGroup = 64 / kCodes;
  constexpr int kRowsPerWarp = 32 / LPR * R;
  constexpr int kPre = 4;  // chunks per row loaded before the wait (the 8-bit router at H = 2048: all)
  constexpr int kPerThread = kMaxHidden / 4 / kRouteThreads;  // float4s of h per thread
  __shared__ __align__(16) float xs[kMaxHidden];              // x = RMSNorm(h)
  __shared__ float partial[kRouteThreads / 32];

  const int rank = blockIdx.x;
  float* logits = p.logits;
  const int cpr = p.H / kCodes, gpr = p.H / 64;
  const int per_block = (p.E + kRouteBlocks - 1) / kRouteBlocks;
  const int first = rank * per_block;
  const int count = max(0, min(per_block, p.E - first));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPR;

  // The router rows depend on nothing earlier in the step: when this block's rows fit in one
  // round of loads, they are loaded before the wait, overlapping the predecessor's tail (PDL).
  const bool one_round = cpr <= kPre * LPR && count <= kRouteThreads / 32 * kRowsPerWarp && count > 0;
  const int local0 = warp * kRowsPerWarp + lane / LPR * R;
  uint4 q[kPre][R];
  float sc[kPre][R], bi[kPre][R];
  if (one_round) {
#pragma unroll
    for (int u = 0; u < kPre; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const QRow w = row_of(p.router, first + min(local0 + r, count - 1), cpr, gpr);
        const int c = min(sub + u * LPR, cpr - 1);  // a valid chunk; unused past the end
        q[u][r] = load_codes(w.codes + c);
        sc[u][r] = load_bf16(w.scales + c / kChunksPerGroup);
        bi[u][r] = load_bf16(w.biases + c / kChunksPerGroup);
      }
  }
  const bool gate_warp = rank == kRouteBlocks - 1 && warp == kRouteThreads / 32 - 1;
  if (gate_warp) {  // the shared expert's gate row into L2 (read after the wait, below)
    const int bytes = p.H * p.expert_gate_bits / 8;
    for (int off = lane * 128; off < bytes; off += 32 * 128)
      prefetch_l2(reinterpret_cast<const uint8_t*>(p.expert_gate.codes) + off);
    if (lane < 2)
      prefetch_l2(lane == 0 ? static_cast<const void*>(p.expert_gate.scales)
                            : static_cast<const void*>(p.expert_gate.biases));
  }
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);

  // x = h * rsqrt(mean(h^2) + eps) * gain, as rms_norm (every block; h is L2-resident): h and
  // gain are loaded once, into registers.
  const float4* h4 = reinterpret_cast<const float4*>(p.h);
  const float4* g4 = reinterpret_cast<const float4*>(p.gain);
  float4 hv[kPerThread], gv[kPerThread];
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int j = threadIdx.x + i * kRouteThreads;
    hv[i] = j < p.H / 4 ? __ldg(h4 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
    gv[i] = j < p.H / 4 ? __ldg(g4 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const float inv = block_inv_rms<kPerThread, kRouteThreads>(hv, p.H, p.eps, partial);
#pragma unroll
  for (int i = 0; i < kPerThread; ++i) {
    const int j = threadIdx.x + i * kRouteThreads;
    if (j >= p.H / 4) break;
    const float4 y = make_float4(hv[i].x * inv * gv[i].x, hv[i].y * inv * gv[i].y, hv[i].z * inv * gv[i].z,
                                 hv[i].w * inv * gv[i].w);
    reinterpret_cast<float4*>(xs)[j] = y;
    if (rank == 0) reinterpret_cast<float4*>(p.normed)[j] = y;
  }
  __syncthreads();
  trace.mark(2);

  // logits = x @ Wr^T for rows [first, first + count); warp-uniform loops, rows past the end
  // read a valid row and are not stored.
  if (one_round) {
    float acc[R] = {};
#pragma unroll
    for (int u = 0; u < kPre; ++u) {
      const int c = sub + u * LPR;
      if (c >= cpr) break;
      float xr[kCodes];
      const float sx = load_x<kCodes, false>(xs + c * kCodes, xr);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += fmaf(sc[u][r], chunk_dot<BITS>(q[u][r], xr), bi[u][r] * sx);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      acc[r] = group_sum<LPR>(acc[r]);
      if (sub == 0 && local0 + r < count) logits[first + local0 + r] = acc[r];
    }
  } else {
    for (int base = warp * kRowsPerWarp; base < count; base += kRouteThreads / 32 * kRowsPerWarp) {
      const int row0 = base + lane / LPR * R;
      QRow w[R];
      float acc[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        w[r] = row_of(p.router, first + min(row0 + r, count - 1), cpr, gpr);
        acc[r] = 0.f;
      }
      rows_dot<BITS, LPR, R, true, 4>(w, xs, cpr, sub, acc);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        acc[r] = group_sum<LPR>(acc[r]);
        if (sub == 0 && row0 + r < count) logits[first + row0 + r] = acc[r];
      }
    }
  }
  // The shared expert's gate, by the last block's last warp (free: the router rows of a block
  // need at most two warps at E = 256).
  if (gate_warp) {
    const float d = warp_row_dot(p.expert_gate, p.expert_gate_bits, p.H, xs);
    if (lane == 0) p.shared_weight[0] = 1.f / (1.f + expf(-d));
  }
}

}  // namespace

bool moe_detail::route_supports(const GpuMoe& w) {
  const QMatrix &r = w.router, &g = w.shared_expert_gate;
  return (r.bits == 4 || r.bits == 8) && r.group_size == 64 && r.batch == 1 && r.rows >= 1 && r.rows <= kMaxExperts &&
         r.cols > 0 && r.cols % 64 == 0 && r.cols <= kMaxHidden && g.rows == 1 && g.cols == r.cols &&
         g.group_size == 64 && (g.bits == 4 || g.bits == 8);
}

void moe_route(const MoeDecodeArgs& a, cudaStream_t stream) {
  const GpuMoe& w = *a.w;
  LILY_CHECK(route_supports(w), "moe_route: router [{}, {}] q{}, shared expert gate [{}, {}] q{} not supported",
             w.router.rows, w.router.cols, w.router.bits, w.shared_expert_gate.rows, w.shared_expert_gate.cols,
             w.shared_expert_gate.bits);
  LILY_CHECK(a.rows == 1 && !a.shared_gate_logit, "moe_route: one row with the gate's sigmoid (rows: moe_route_rows)");
  const MoeDecodeBuffers& b = a.buffers;
  check_aligned(b.h, "moe_route: h");
  check_aligned(a.gain, "moe_route: gain");
  check_aligned(b.x, "moe_route: x");
  const RouteParams p{view(w.router),
                      view(w.shared_expert_gate),
                      w.shared_expert_gate.bits,
                      b.h,
                      a.gain,
                      a.eps,
                      w.router.rows,
                      w.router.cols,
                      b.x,
                      b.logits,
                      b.shared_weight};
  dispatch_bits_lanes(w.router.bits, lanes_per_row(w.router.cols * w.router.bits / 128), [&](auto bits, auto lpr) {
    moe_route_norm_kernel<decltype(bits)::value, decltype(lpr)::value><<<kRouteBlocks, kRouteThreads, 0, stream>>>(p);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
