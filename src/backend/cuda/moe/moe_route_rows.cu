// moe_route_rows.cu: the MoE block's input norm, router logits and shared expert gate for a few
// rows (T = 1 .. 16) in one launch: the routing of a short pass, as moe_route.cu is a decode
// step's.
//
//   x[t] = RMSNorm(h[t]; gain),  logits[t] = x[t] @ Wr^T,  sg[t] = x[t] . w_sg   (fp32)
// Shapes:   h, x [T, H] fp32 · router [E, H] and w_sg [1, H], both 4- or 8-bit alike (8 in mlx),
//           group 64 · logits [T, E] · sg [T] (the raw logit: the combine takes its sigmoid).
//           E <= 256, H <= 2048 (a multiple of 64), T <= 16.
// Numerics: fp32 throughout (dequantized weights in fp32, fp32 x), as the decode route and
//           gemm_exact: a flipped expert near a tie costs far more than the time saved.
// Kernel:   moe_route_rows_kernel<BITS>, grid (ceil((E + 1) / 8), ceil(T / 4)) x 256 threads: a
//           warp per row (row E: the shared expert's gate) and a block per 4 tokens, the row's
//           chunks in registers before the PDL wait (lane l: chunks l, l + 32, ...). After the
//           wait a warp per token normalizes h into shared memory, each chunk's x padded by 4
//           floats (lanes reading chunks side by side then hit distinct banks); the blocks of
//           x = 0 write x for the experts. Each lane's chunks against each token's x, the sums
//           reduced over the warp in a fixed order. (One block for all 16 tokens, 33 blocks at
//           E = 256, took 32 us a layer: too few warps for the FMA chains.)
// Tested:   tests/cuda/test_moe_grouped.cu (RouteRows: x, logits and sg against cpu::rms_norm
//           and cpu::linear; the whole block through WholeBlockMatchesCpu's short passes).
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/moe/moe_route_rows.h"

#include <algorithm>

#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"
#include "backend/cuda/common/quant_dot.cuh"

namespace lily::cuda {

namespace {

using namespace quant;

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kMaxT = 16, kMaxHidden = 2048, kMaxE = 256;
constexpr int kBlockT = 4;            // tokens a block takes: grid (rows / 8, T / 4) fills ~132 SMs at E = 256, T = 16
constexpr int kMaxChunksPerLane = 4;  // 8-bit rows of 2048: 128 chunks over 32 lanes

struct Matrix {
  const uint4* codes;      // [rows, cpr] chunks
  const uint16_t* scales;  // [rows, H / 64] bf16 bits
  const uint16_t* biases;
};

struct RouteRowsParams {
  Matrix router, gate;  // [E, H], [1, H]
  const float* h;       // [T, H]
  const float* gain;    // [H]
  float eps;
  int T, E, H;
  float* x;       // [T, H]
  float* logits;  // [T, E]
  float* sg;      // [T]
};

template <int BITS>
__global__ void __launch_bounds__(kThreads, 1) moe_route_rows_kernel(RouteRowsParams p) {
  constexpr int kCodes = 128 / BITS, kStride = kCodes + 4, kChunksPerGroup = 64 / kCodes;
  extern __shared__ __align__(16) float xs[];  // [kBlockT][cpr][kStride]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cpr = p.H / kCodes, gpr = p.H / 64;
  const int row = blockIdx.x * kWarps + warp;  // E: the shared expert's gate
  const bool has_row = row <= p.E;
  const bool router = row < p.E;  // field by field: a reference into the parameters would copy them to the stack
  const Matrix m{router ? p.router.codes : p.gate.codes, router ? p.router.scales : p.gate.scales,
                 router ? p.router.biases : p.gate.biases};
  const int64_t local = row < p.E ? row : 0;

  // This warp's row: weights only, before the wait.
  uint4 q[kMaxChunksPerLane];
  float sc[kMaxChunksPerLane], bi[kMaxChunksPerLane];
#pragma unroll
  for (int u = 0; u < kMaxChunksPerLane; ++u) {
    const int c = lane + 32 * u;
    const bool ok = has_row && c < cpr;
    q[u] = ok ? load_codes(m.codes + local * cpr + c) : make_uint4(0, 0, 0, 0);
    sc[u] = ok ? load_bf16(m.scales + local * gpr + c / kChunksPerGroup) : 0.f;
    bi[u] = ok ? load_bf16(m.biases + local * gpr + c / kChunksPerGroup) : 0.f;
  }
  pdl_wait();
  pdl_launch_dependents();

  // x[t] = h[t] * rsqrt(mean(h[t]^2) + eps) * gain for the block's tokens t0 + i: a warp per
  // token, h in registers.
  constexpr int kPer = kMaxHidden / 4 / 32;
  const int t0 = blockIdx.y * kBlockT, n = min(kBlockT, p.T - t0);
  for (int slot = warp; slot < n; slot += kWarps) {
    const int t = t0 + slot;
    const float4* h4 = reinterpret_cast<const float4*>(p.h + int64_t(t) * p.H);
    float4 v[kPer];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      v[i] = j < p.H / 4 ? __ldcg(h4 + j) : make_float4(0.f, 0.f, 0.f, 0.f);
      ss = fmaf(v[i].x, v[i].x, fmaf(v[i].y, v[i].y, fmaf(v[i].z, v[i].z, fmaf(v[i].w, v[i].w, ss))));
    }
    ss = group_sum<32>(ss);
    const float inv = 1.f / sqrtf(ss / float(p.H) + p.eps);
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = lane + 32 * i;
      if (j >= p.H / 4) continue;
      const float4 g = __ldg(reinterpret_cast<const float4*>(p.gain) + j);
      const float4 y = make_float4(v[i].x * inv * g.x, v[i].y * inv * g.y, v[i].z * inv * g.z, v[i].w * inv * g.w);
      const int c = 4 * j / kCodes, off = 4 * j % kCodes;
      *reinterpret_cast<float4*>(xs + (int64_t(slot) * cpr + c) * kStride + off) = y;
      if (blockIdx.x == 0) reinterpret_cast<float4*>(p.x + int64_t(t) * p.H)[j] = y;
    }
  }
  __syncthreads();
  if (!has_row) return;

  float acc[kBlockT];
#pragma unroll
  for (int i = 0; i < kBlockT; ++i) acc[i] = 0.f;
#pragma unroll
  for (int u = 0; u < kMaxChunksPerLane; ++u) {
    const int c = lane + 32 * u;
    if (c >= cpr) continue;
#pragma unroll
    for (int i = 0; i < kBlockT; ++i) {
      if (i >= n) continue;
      float xr[kCodes];
      const float sx = load_x<kCodes, false>(xs + (int64_t(i) * cpr + c) * kStride, xr);
      acc[i] += fmaf(sc[u], chunk_dot<BITS>(q[u], xr), bi[u] * sx);
    }
  }
#pragma unroll
  for (int i = 0; i < kBlockT; ++i) {
    if (i >= n) continue;
    const float sum = group_sum<32>(acc[i]);
    if (lane == 0) {
      if (row < p.E) p.logits[int64_t(t0 + i) * p.E + row] = sum;
      else p.sg[t0 + i] = sum;
    }
  }
}

Matrix matrix_of(const QMatrix& W) {
  return {reinterpret_cast<const uint4*>(W.codes), reinterpret_cast<const uint16_t*>(W.scales),
          reinterpret_cast<const uint16_t*>(W.biases)};
}

}  // namespace

bool moe_route_rows_supports(const GpuMoe& w) {
  const QMatrix &r = w.router, &g = w.shared_expert_gate;
  const int H = r.cols;
  return (r.bits == 4 || r.bits == 8) && g.bits == r.bits && r.group_size == 64 && g.group_size == 64 && r.batch == 1 &&
         r.rows >= 1 && r.rows <= kMaxE && H > 0 && H % 64 == 0 && H <= kMaxHidden && g.rows == 1 && g.cols == H &&
         H * r.bits / 128 <= 32 * kMaxChunksPerLane && aligned16(r.codes) && aligned16(g.codes);
}

void moe_route_rows(const GpuMoe& w, const float* h, int T, const float* gain, float eps, float* x, float* logits,
                    float* sg, cudaStream_t stream) {
  LILY_CHECK(moe_route_rows_supports(w), "moe_route_rows: router [{}, {}] q{}, shared expert gate [{}, {}] q{}",
             w.router.rows, w.router.cols, w.router.bits, w.shared_expert_gate.rows, w.shared_expert_gate.cols,
             w.shared_expert_gate.bits);
  LILY_CHECK(T >= 1 && T <= kMaxT, "moe_route_rows: {} rows (1 .. {})", T, kMaxT);
  LILY_CHECK(aligned16(h) && aligned16(gain) && aligned16(x), "moe_route_rows: h, gain and x must be 16-byte aligned");
  const int E = w.router.rows, H = w.router.cols;
  const RouteRowsParams p{matrix_of(w.router), matrix_of(w.shared_expert_gate), h, gain, eps, T, E, H, x, logits, sg};
  const dim3 grid(unsigned((E + 1 + kWarps - 1) / kWarps), unsigned((T + kBlockT - 1) / kBlockT));
  auto go = [&](auto* kernel, int codes) {
    const size_t shared = size_t(std::min(T, kBlockT)) * size_t(H / codes) * size_t(codes + 4) * 4;
    static const bool configured = [&] {  // once per kernel: 4 rows of 2048 (40 KB at 8 bits)
      const size_t most = size_t(kBlockT) * size_t(kMaxHidden / codes) * size_t(codes + 4) * 4;
      allow_dynamic_shared_up_to(kernel, most, "moe_route_rows");
      return true;
    }();
    (void)configured;
    check_dynamic_shared(shared, "moe_route_rows");
    launch_after_wait(kernel, grid, dim3(kThreads), shared, stream, p);
  };
  if (w.router.bits == 8) go(moe_route_rows_kernel<8>, 16);
  else go(moe_route_rows_kernel<4>, 32);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
