// moe_route.cu: the MoE block's input norm and router for the decode and fp32 paths (spec §2.7),
// the first of moe.cu's three launches.
//
//   x = RMSNorm(h; post_attention_layernorm)             (zero-centred: gain = 1 + w, spec §2.2)
//   p = softmax(x @ Wr^T) (fp32);  S = top-k of p (ties to the lower index);  w_e = p_e / sum_S p
//   slot k (the shared expert): weight sigmoid(x . w_sg)
// Shapes:   h, x [T, H] fp32 · router [E, H] (8-bit in mlx) · logits scratch [T, E] fp32 · ids
//           [T, k+1] int32 · weights [T, k+1] fp32.  E <= 256, k <= 8, H <= 4096.
// Kernels:  moe_route_norm_kernel 32 blocks x 256 threads per token (the first form, a cluster
//                                 of 8 blocks, took 17.4 us in ncu while its blocks were active
//                                 for ~8.5 us): each block loads its E/32 router rows into
//                                 registers before the PDL wait (when they fit in one round: the
//                                 8-bit router at H = 2048), normalizes h[t] into its shared
//                                 memory (8 KB at H = 2048, L2-resident) and writes its logits to
//                                 global scratch; block 0 writes x for the expert launches; the
//                                 last block's last warp computes the shared expert's gate
//                                 sigmoid(x . w_sg) into slot k. The last block to finish (an
//                                 atomic ticket per token) does softmax, k rounds of warp argmax
//                                 and renormalisation from the logits in L2.
//           With choose = false (one token, decode) the kernel stops after the logits: the
//           expert launches choose from them (moe.cu, moe_gate_up_staged.cu).
// Tested:   tests/cuda/test_moe.cu (Route, RouteTiesToLowerIndex, WholeBlockMatchesCpu).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/block_rms.cuh"
#include "backend/cuda/common/grow_only_scratch.h"
#include "backend/cuda/decode/moe.h"
#include "backend/cuda/decode/moe_common.cuh"
#include "backend/cuda/common/quant_dot.cuh"
#include "backend/cuda/common/route_topk.cuh"

#include <algorithm>

namespace lily::cuda {

namespace {

using namespace quant;
using namespace moe_detail;

constexpr int kRouteBlocks = 32;    // blocks per token in moe_route_norm_kernel
constexpr int kRouteThreads = 256;

struct RouteParams {
  QView router;        // [E, H]
  QView expert_gate;   // the shared expert's gate [1, H]
  int expert_gate_bits;
  const float* h;      // [T, H] the residual stream (un-normalized)
  const float* gain;   // [H] post_attention_layernorm's effective gain
  float eps;
  int E, H, k;
  float* normed;       // [T, H]
  float* logits;       // [T, E] scratch
  unsigned* counters;  // [T] scratch, zero between launches (the last block resets)
  int32_t* ids;        // [T, k + 1]
  float* weights;      // [T, k + 1]
  bool choose;         // top-k here (else the expert kernels choose from the logits)
};

template <int BITS, int LPR>
__global__ void __launch_bounds__(kRouteThreads) moe_route_norm_kernel(RouteParams p) {
  constexpr int R = 4, kCodes = 128 / BITS, kChunksPerGroup = 64 / kCodes;
  constexpr int kRowsPerWarp = 32 / LPR * R;
  constexpr int kPre = 4;  // chunks per row loaded before the wait (the 8-bit router at H = 2048: all)
  constexpr int kPerThread = kMaxHidden / 4 / kRouteThreads;  // float4s of h per thread
  __shared__ __align__(16) float xs[kMaxHidden];  // x = RMSNorm(h[t])
  __shared__ float partial[kRouteThreads / 32];
  __shared__ float all[kMaxExperts];     // the last block: every logit of token t
  __shared__ bool is_last;

  const int rank = blockIdx.x;
  const int t = blockIdx.y;
  float* logits = p.logits + int64_t(t) * p.E;  // this token's logits (global scratch)
  const int cpr = p.H / kCodes, gpr = p.H / 64;
  const int per_block = (p.E + kRouteBlocks - 1) / kRouteBlocks;
  const int first = rank * per_block;
  const int count = max(0, min(per_block, p.E - first));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, sub = lane % LPR;
  const int slots = p.k + 1;

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
    if (lane < 2) prefetch_l2(lane == 0 ? static_cast<const void*>(p.expert_gate.scales)
                                        : static_cast<const void*>(p.expert_gate.biases));
  }
  pdl_wait();
  pdl_launch_dependents();

  // x = h * rsqrt(mean(h^2) + eps) * gain, as rms_norm (every block; h is L2-resident): h and
  // gain are loaded once, into registers.
  const float4* h4 = reinterpret_cast<const float4*>(p.h + int64_t(t) * p.H);
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
    if (rank == 0) reinterpret_cast<float4*>(p.normed + int64_t(t) * p.H)[j] = y;
  }
  __syncthreads();

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
  // The shared expert's slot: its gate, by the last block's last warp (free: the router rows
  // of a block need at most two warps at E = 256).
  if (gate_warp) {
    const float d = warp_row_dot(p.expert_gate, p.expert_gate_bits, p.H, xs);
    if (lane == 0) {
      p.ids[int64_t(t) * slots + p.k] = 0;
      p.weights[int64_t(t) * slots + p.k] = 1.f / (1.f + expf(-d));
    }
  }
  if (!p.choose) return;  // the expert kernels choose from the logits
  // The last block of token t to finish does the top-k (threadFenceReduction pattern: publish,
  // count, and the block that takes the last ticket reads everyone's logits from L2).
  __threadfence();  // this thread's logits visible device-wide before the ticket
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned ticket = atomicAdd(p.counters + t, 1u);
    is_last = ticket == gridDim.x - 1;
    if (is_last) {
      __threadfence();
      p.counters[t] = 0;  // ready for the next launch (graph replays)
    }
  }
  __syncthreads();
  if (!is_last || warp != 0) return;
  warp_load_logits(logits, p.E, all);
  warp_route_topk(all, p.E, p.k, p.ids + int64_t(t) * slots, p.weights + int64_t(t) * slots);
}

}  // namespace

// The scratch of up to `capacity` tokens: counters [capacity] (16-byte rounded), then logits
// [capacity, E]. The layout depends on the capacity only, so every call with the same scratch
// finds its counters where the previous calls left them (at zero).
size_t route_counter_bytes(int capacity) { return (size_t(capacity) * sizeof(unsigned) + 15) / 16 * 16; }

size_t moe_route_scratch_bytes(int E, int capacity) {
  return route_counter_bytes(capacity) + size_t(capacity) * size_t(E) * sizeof(float);
}

const float* moe_route_logits(const void* scratch, int scratch_tokens) {
  return reinterpret_cast<const float*>(static_cast<const char*>(scratch) + route_counter_bytes(scratch_tokens));
}

void moe_route_norm(const QMatrix& router, const QMatrix& shared_expert_gate, const float* h, const float* gain,
                    float eps, int T, int k, float* normed, int32_t* expert_ids, float* expert_weights, void* scratch,
                    int scratch_tokens, cudaStream_t stream, bool choose) {
  check_matrix(router, "moe_route_norm");
  LILY_CHECK(router.rows <= kMaxExperts, "moe_route_norm: {} experts (at most {})", router.rows, kMaxExperts);
  LILY_CHECK(router.cols <= kMaxHidden, "moe_route_norm: hidden {} (at most {})", router.cols, kMaxHidden);
  LILY_CHECK(k >= 1 && k <= kMaxK && k <= router.rows, "moe_route_norm: top-{} of {} experts", k, router.rows);
  LILY_CHECK(shared_expert_gate.rows == 1 && shared_expert_gate.cols == router.cols &&
                 shared_expert_gate.group_size == 64 && (shared_expert_gate.bits == 4 || shared_expert_gate.bits == 8),
             "moe_route_norm: shared expert gate [{}, {}] q{}", shared_expert_gate.rows, shared_expert_gate.cols,
             shared_expert_gate.bits);
  check_aligned(h, "moe_route_norm: h");
  check_aligned(gain, "moe_route_norm: gain");
  check_aligned(normed, "moe_route_norm: normed");
  if (T <= 0) return;
  LILY_CHECK(scratch != nullptr && T <= scratch_tokens, "moe_route_norm: scratch for {} tokens, {} given",
             scratch_tokens, T);
  unsigned* counters = static_cast<unsigned*>(scratch);
  float* logits = reinterpret_cast<float*>(static_cast<char*>(scratch) + route_counter_bytes(scratch_tokens));
  LILY_CHECK(choose || T == 1, "moe_route_norm: the experts choose only for one token, {} given", T);
  const RouteParams p{view(router), view(shared_expert_gate), shared_expert_gate.bits, h, gain, eps, router.rows,
                      router.cols, k, normed, logits, counters, expert_ids, expert_weights, choose};
  const dim3 grid(kRouteBlocks, unsigned(T));
  dispatch_bits_lanes(router.bits, lanes_per_row(router.cols * router.bits / 128), [&](auto bits, auto lpr) {
    moe_route_norm_kernel<decltype(bits)::value, decltype(lpr)::value><<<grid, kRouteThreads, 0, stream>>>(p);
  });
  CUDA_CHECK_LAUNCH();
}

void moe_route_norm(const QMatrix& router, const QMatrix& shared_expert_gate, const float* h, const float* gain,
                    float eps, int T, int k, float* normed, int32_t* expert_ids, float* expert_weights,
                    cudaStream_t stream) {
  // A grow-only scratch of its own, zeroed when (re)allocated (the counters must start at 0). Its
  // layout depends on the token capacity, which only grows too: a new capacity means more bytes,
  // so a new, zeroed buffer.
  static GrowOnlyScratch scratch("moe_route_norm", true);
  static int capacity = 0, experts = 0;
  capacity = std::max(capacity, T), experts = std::max(experts, router.rows);
  void* buffer = scratch.get(moe_route_scratch_bytes(experts, capacity), stream);
  moe_route_norm(router, shared_expert_gate, h, gain, eps, T, k, normed, expert_ids, expert_weights, buffer, capacity,
                 stream, true);
}

}  // namespace lily::cuda
