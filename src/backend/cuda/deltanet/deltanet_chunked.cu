// deltanet_chunked.cu: the chunked form of the gated delta rule (spec §3.2) for the prefill of
// a Gated DeltaNet layer: the o and final S of deltanet_prefill.cu's token loop, 64 tokens at a time as
// small dense matrix products (HF torch_chunk_gated_delta_rule, FLA chunk_gated_delta_rule; the
// CPU form is backend/cpu delta_rule_chunked).
//
//   per v-head h, per chunk of C = 64 tokens (rows i, j), with the state S [dk, dv] it starts from:
//     gamma_i = sum_{s<=i} g_s (in the chunk),    D[i,j] = exp(gamma_i - gamma_j), j <= i  (<= 1)
//     A[i,j]   = beta_i (k_i . k_j) D[i,j], j < i     Aqk[i,j] = (q_i . k_j) D[i,j], j <= i
//     (I + A) U = diag(beta) V                       (I + A) W = diag(beta exp(gamma)) K
//     V' = U - W S
//     O  = diag(exp(gamma)) Q S + Aqk V'
//     S <- exp(gamma_63) S + sum_j exp(gamma_63 - gamma_j) k_j V'_j^T
//   A short last chunk is padded with q = k = v = 0, beta = g = 0 (zero rows of W, U, V'; gamma
//   stays at gamma_{n-1}); its padded rows are never written out. Decays are exponentials of
//   differences gamma_i - gamma_j <= 0, never quotients of small exp values.
// Shapes:   u [n, conv_dim] = q (l2-normalised, times 1/sqrt(128)) | k (l2-normalised) | v, as
//           deltanet_conv_kernel writes it · b, a [n, Hv] · S [Hv, 128 (dk), 128 (dv)] fp32 ·
//           o [n, Hv*128] raw delta-rule outputs (gated_norm_kernel runs on them next).
//           v-head h reads q/k head h / (Hv/Hk). All fp32; the matrix products run on the tensor
//           cores in tf32 (10-bit mantissa, fp32 accumulation, mma.sync m16n8k8), the forward
//           substitution and the gates in fp32 on the CUDA cores.
// Scratch:  per (v-head, chunk) hc = h * NC + c, NC = ceil(n / 64):
//             W [hc][64][128], U [hc][64][128] (V' after the state pass), Aqk [hc][64][64],
//             H [hc][128][128] (the state at the chunk's start), gamma [hc][64].
// Kernels:  three launches, 256 threads each (the FLA split: the sequential part carries only S):
//   deltanet_chunk_prep_kernel    grid (NC, Hv); everything that does not need S. k and q rows in
//             shared memory ([64][132] floats: float4 row reads without bank conflicts), gates and
//             gamma; the two Gram matrices K K^T, Q K^T on the tensor cores (a 16 x 32 tile of each
//             per warp, the tiles above the diagonal skipped) masked with D into A (shared) and
//             Aqk (global); v rows replace q; then the forward substitution through (I + A), one
//             right-hand-side column per thread (128 of diag(beta) V, 128 of diag(beta exp(gamma)) K),
//             the 64 unknowns of the column in registers, A's rows read as float4 broadcasts.
//   deltanet_chunk_state_kernel   grid (Hv * 4): block = (v-head, 32 dv columns); the chunks in
//             order, S's 128 x 32 slice in the warps' accumulators (16 rows a warp) and in shared
//             memory. The next chunk's W, k rows, U slice and gamma stream in by cp.async (two
//             stages) while this one is computed:
//               store S (the chunk's start state) to H;  V' = U - W S (16 x 16 a warp);
//               V' -> global (over U), V' exp(gamma_63 - gamma_j) -> shared;
//               S = exp(gamma_63) S + K^T (decayed V')   (the k rows past n are zero-filled)
//   deltanet_chunk_output_kernel  grid (2 column slices, NC, Hv); every (chunk, slice) at once:
//             O = exp(gamma) (Q H) + Aqk V' for 64 rows x 64 columns, 16 x 32 a warp; the Aqk V'
//             sum stops at the tile's last row (Aqk is zero above its diagonal).
// Cost:     per v-head and 64 tokens about 5.0 M multiply-adds (prep 1.6 M, state 2.1 M, output
//           1.3 M), all but the forward substitution's 0.5 M on the tensor cores; only the state
//           pass is sequential. tf32 rounds each product's operands to 2^-11: outputs and states
//           within 9e-4 of the largest value of the fp32 token loop's in the tests (the wgmma
//           prefill GEMMs before and after round their activations to bf16, 2^-9).
// Tested:   tests/cuda/test_deltanet.cu (Chunked* vs the CPU recurrent rule, T = 1 .. 1000,
//           carried states across calls, within tf32's bound).
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"

#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/deltanet/deltanet_prefill.h"

#include <algorithm>

namespace lily::cuda {

namespace {

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;

constexpr int kD = 128;  // dk = dv
constexpr int kC = 64;   // tokens per chunk (spec §3.2)
constexpr int kThreads = 256;
constexpr int kCols = 32;  // dv columns per block of the state pass
constexpr int kSlices = kD / kCols;
constexpr int kTileLoads = kC * kD / 4 / kThreads;  // float4 per thread for a [64][128] tile (8)
// Floats per shared row, chosen so that the tf32 fragment loads below hit 32 different banks:
// a tile read along its rows (an A operand, or B = tile^T) wants a row length = 4 (mod 32), one
// read down its columns (B = tile, or A = tile^T) a row length = 8 (mod 32).
constexpr int kLd = kD + 4;         // [64][128] tiles read along rows: q, k (prep), W, Q
constexpr int kLdT = kD + 8;        // the state pass's k rows, read as K^T
constexpr int kLdA = kC + 4;        // Aqk in the output kernel
constexpr int kLdS = kCols + 8;     // [rows][32] slices read down columns: S, U, V' (state pass)
constexpr int kOutCols = 64;        // dv columns per block of the output kernel
constexpr int kLdO = kOutCols + 8;  // its [rows][64] slices read down columns: H, V'

// Floats of scratch per (v-head, chunk): W, U, Aqk, H, gamma.
constexpr size_t kScratchFloats = size_t(kC) * kD * 2 + size_t(kC) * kC + size_t(kD) * kD + kC;

// Shared memory per kernel, in floats.
constexpr int kPrepFloats = 2 * kC * kLd + kC * kC + 3 * kC;            // K, Q|V, A, gamma, beta, beta exp(gamma)
constexpr int kStageFloats = kC * kLd + kC * kLdT + kC * kLdS + kC;     // W, K, U slice, gamma
constexpr int kStateFloats = 2 * kStageFloats + kD * kLdS + kC * kLdS;  // 2 stages, S slice, decayed V'
constexpr int kOutFloats = kC * kLd + kD * kLdO + kC * kLdA + kC * kLdO + kC;  // Q, H, Aqk, V', gamma
constexpr size_t kPrepSmem = kPrepFloats * sizeof(float);                      // 84,736 bytes: 2 blocks per SM
constexpr size_t kStateSmem = kStateFloats * sizeof(float);                    // 188,928 bytes
constexpr size_t kOutSmem = kOutFloats * sizeof(float);                        // 106,752 bytes: 2 blocks per SM

struct ChunkArgs {
  int n, Hk, Hv, C, NC;          // tokens, key heads, value heads, conv_dim, chunks
  const float* u;                // [n, C]
  const float* b;                // [n, Hv]
  const float* a;                // [n, Hv]
  const float* A_log;            // [Hv]
  const float* dt_bias;          // [Hv]
  float* S;                      // [Hv, 128, 128]
  float* o;                      // [n, Hv*128]
  float *W, *U, *Aqk, *H, *gam;  // scratch, see the header
};

__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ float at(const float4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }
// A float4 of shared memory in one 16-byte load. The solve's A addresses are compile-time
// constants, and NVVM splits a plain float4 load from a constant address into four scalar ones.
__device__ __forceinline__ float4 lds4(const float* p) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(ptx::smem_addr(p))
               : "memory");
  return v;
}

// tf32 fragments of fp32 tiles in shared memory (mma.cuh: mma_tf32's layouts; g = lane / 4,
// t = lane % 4), rows of ld floats:
//   frag_a:    A [16 x 8] = M[m0 .., k0 ..]          (M row-major [m][k]; ld = 4 mod 32)
//   frag_a_t:  A [16 x 8] = M[k0 .., m0 ..]^T        (M row-major [k][m]; ld = 8 mod 32)
//   frag_b:    B [8 x 8]  = M[k0 .., n0 ..]          (M row-major [k][n]; ld = 8 mod 32)
//   frag_b_t:  B [8 x 8]  = M[n0 .., k0 ..]^T        (M row-major [n][k]; ld = 4 mod 32)
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const float* M, int ld, int m0, int k0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const float* q = M + (m0 + g) * ld + k0 + t;
  a[0] = ptx::tf32(q[0]), a[1] = ptx::tf32(q[8 * ld]), a[2] = ptx::tf32(q[4]), a[3] = ptx::tf32(q[8 * ld + 4]);
}
__device__ __forceinline__ void frag_a_t(uint32_t (&a)[4], const float* M, int ld, int m0, int k0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const float* q = M + (k0 + t) * ld + m0 + g;
  a[0] = ptx::tf32(q[0]), a[1] = ptx::tf32(q[8]), a[2] = ptx::tf32(q[4 * ld]), a[3] = ptx::tf32(q[4 * ld + 8]);
}
__device__ __forceinline__ void frag_b(uint32_t& b0, uint32_t& b1, const float* M, int ld, int k0, int n0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const float* q = M + (k0 + t) * ld + n0 + g;
  b0 = ptx::tf32(q[0]), b1 = ptx::tf32(q[4 * ld]);
}
__device__ __forceinline__ void frag_b_t(uint32_t& b0, uint32_t& b1, const float* M, int ld, int k0, int n0) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const float* q = M + (n0 + g) * ld + k0 + t;
  b0 = ptx::tf32(q[0]), b1 = ptx::tf32(q[4]);
}

// acc[s] += M[m0 .. m0+15, k] N[k, n0 + 8s .. n0 + 8s + 7] over k in [0, k_end) (a multiple of 8):
// M row-major [m][k] with row length ldm, N row-major [k][n] with row length ldn.
template <int NT>
__device__ __forceinline__ void mma_rows(float (&acc)[NT][4], const float* M, int ldm, int m0, const float* N, int ldn,
                                         int n0, int k_end) {
#pragma unroll 4
  for (int k0 = 0; k0 < k_end; k0 += 8) {
    uint32_t a[4];
    frag_a(a, M, ldm, m0, k0);
#pragma unroll
    for (int s = 0; s < NT; ++s) {
      uint32_t b0, b1;
      frag_b(b0, b1, N, ldn, k0, n0 + 8 * s);
      ptx::mma_tf32(acc[s], a, b0, b1);
    }
  }
}

// The (row, column) of accumulator value e of n-tile s (mma.cuh's C layout) in a warp tile at
// (m0, n0): row m0 + g (+8 for e >= 2), column n0 + 8s + 2t (+1 for odd e).
__device__ __forceinline__ int acc_row(int m0, int e) { return m0 + threadIdx.x % 32 / 4 + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int acc_col(int n0, int s) { return n0 + 8 * s + 2 * (threadIdx.x % 4); }

// beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)   (spec §2.6, as deltanet_common.cuh's gates())
__device__ __forceinline__ void gate_logs(const ChunkArgs& p, int t, int h, float& g, float& beta) {
  const float x = p.a[size_t(t) * p.Hv + h] + p.dt_bias[h];
  beta = 1.f / (1.f + expf(-p.b[size_t(t) * p.Hv + h]));
  g = -expf(p.A_log[h]) * (x > 20.f ? x : log1pf(expf(x)));
}

// ---- 1. Per (chunk, v-head): gamma, A, Aqk, W, U ----------------------------------------------

__global__ void __launch_bounds__(kThreads, 2) deltanet_chunk_prep_kernel(ChunkArgs p) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float4 smem4[];
  float* K_s = reinterpret_cast<float*>(smem4);  // [64][kLd] k rows
  float* X_s = K_s + kC * kLd;                   // [64][kLd] q rows, then v rows
  float* A_s = X_s + kC * kLd;                   // [64][64] strictly lower A
  float* gam_s = A_s + kC * kC;                  // [64] g, then gamma
  float* beta_s = gam_s + kC;                    // [64]
  float* bg_s = beta_s + kC;                     // [64] beta exp(gamma)

  const int c = blockIdx.x, h = blockIdx.y, t = threadIdx.x;
  const int kh = h / (p.Hv / p.Hk), key_dim = p.Hk * kD;
  const int i0 = c * kC, nc = min(kC, p.n - i0);
  const size_t hc = size_t(h) * p.NC + c;
  const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);

  // q and k rows (zero past n) into shared memory: lanes of a warp read one 512-byte row.
#pragma unroll
  for (int it = 0; it < kTileLoads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kD / 4), col = idx % (kD / 4) * 4;
    const float* src = p.u + size_t(i0 + row) * p.C + kh * kD + col;
    st4(X_s + row * kLd + col, row < nc ? ld4(src) : zero);
    st4(K_s + row * kLd + col, row < nc ? ld4(src + key_dim) : zero);
  }
  if (t < kC) {
    float g = 0.f, beta = 0.f;  // padding rows: g = 0, beta = 0
    if (t < nc) gate_logs(p, i0 + t, h, g, beta);
    gam_s[t] = g;
    beta_s[t] = beta;
  }
  __syncthreads();

  // Gram products on the tensor cores: kk = K K^T, qk = Q K^T, 64 x 64 each. Warp w owns rows
  // r0 .. r0 + 15 and columns c0 .. c0 + 31 (four n-tiles of 8); tiles wholly above the diagonal
  // are masked to zero below and skipped here.
  const int warp = t / 32, r0 = 16 * (warp / 2), c0 = 32 * (warp % 2);
  float kk[4][4] = {}, qk[4][4] = {};
#pragma unroll 2
  for (int k0 = 0; k0 < kD; k0 += 8) {
    uint32_t ak[4], aq[4];
    frag_a(ak, K_s, kLd, r0, k0);
    frag_a(aq, X_s, kLd, r0, k0);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      if (c0 + 8 * n > r0 + 15) continue;  // warp-uniform
      uint32_t b0, b1;
      frag_b_t(b0, b1, K_s, kLd, k0, c0 + 8 * n);
      ptx::mma_tf32(kk[n], ak, b0, b1);
      ptx::mma_tf32(qk[n], aq, b0, b1);
    }
  }
  // (after the Gram loop, so that gamma is not live across it)
  float gamma = 0.f;
  if (t < kC) {  // gamma_t = g_0 + ... + g_t in token order, as the CPU reference (+0 past t)
#pragma unroll 4
    for (int s = 0; s < kC; s += 4) {
      const float4 g4 = ld4(gam_s + s);
#pragma unroll
      for (int e = 0; e < 4; ++e) gamma += s + e <= t ? at(g4, e) : 0.f;
    }
  }
  __syncthreads();  // gam_s (g) read by all, q rows done with
  if (t < kC) {
    gam_s[t] = gamma;
    bg_s[t] = beta_s[t] * expf(gamma);
    p.gam[hc * kC + t] = gamma;
  }
  // v rows over the q rows.
#pragma unroll
  for (int it = 0; it < kTileLoads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kD / 4), col = idx % (kD / 4) * 4;
    const float* src = p.u + size_t(i0 + row) * p.C + 2 * key_dim + h * kD + col;
    st4(X_s + row * kLd + col, row < nc ? ld4(src) : zero);
  }
  __syncthreads();  // gamma visible
  float* Aqk = p.Aqk + hc * kC * kC;
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = acc_row(r0, e), j = acc_col(c0, n) + (e & 1);
      const float d = j <= i ? expf(gam_s[i] - gam_s[j]) : 0.f;  // never exp of a positive difference
      A_s[i * kC + j] = j < i ? beta_s[i] * kk[n][e] * d : 0.f;
      Aqk[i * kC + j] = j <= i ? qk[n][e] * d : 0.f;
    }
  __syncthreads();

  // (I + A) X = R by forward substitution, column `col` of R per thread:
  //   threads 0..127:   R = diag(beta) V                -> U
  //   threads 128..255: R = diag(beta exp(gamma)) K     -> W
  // x_i = R_i - sum_{j<i} A[i,j] x_j  (j in order, as the CPU reference); A[i, j >= i] = 0 and
  // x_j = 0 for j >= i, so the float4 groups may run past j = i - 1.
  const bool is_u = t < kD;  // warp-uniform
  const int col = t % kD;
  const float* R = is_u ? X_s : K_s;
  const float* coef = is_u ? beta_s : bg_s;
  float x[kC];
#pragma unroll
  for (int i = 0; i < kC; ++i) x[i] = 0.f;
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    float acc = coef[i] * R[i * kLd + col];
#pragma unroll
    for (int j = 0; j < i; j += 4) {
      const float4 a4 = lds4(A_s + i * kC + j);
      acc = fmaf(-a4.x, x[j], acc);
      acc = fmaf(-a4.y, x[j + 1], acc);
      acc = fmaf(-a4.z, x[j + 2], acc);
      acc = fmaf(-a4.w, x[j + 3], acc);
    }
    x[i] = acc;
  }
  float* dst = (is_u ? p.U : p.W) + hc * kC * kD + col;
#pragma unroll
  for (int i = 0; i < kC; ++i) dst[i * kD] = x[i];
}

// ---- 2. Per (v-head, 32 columns): the state through the chunks -------------------------------

__global__ void __launch_bounds__(kThreads, 1) deltanet_chunk_state_kernel(ChunkArgs p) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float4 smem4[];
  float* stages = reinterpret_cast<float*>(smem4);  // 2 x {W [64][kLd], K [64][kLdT], U [64][kLdS], gamma [64]}
  float* S_s = stages + 2 * kStageFloats;           // [128][kLdS] S slice
  float* V_s = S_s + kD * kLdS;                     // [64][kLdS] V'_j exp(gamma_63 - gamma_j)

  const int h = blockIdx.x / kSlices, col0 = blockIdx.x % kSlices * kCols, t = threadIdx.x;
  const int kh = h / (p.Hv / p.Hk), key_dim = p.Hk * kD, warp = t / 32;
  // Warp tiles: V' [64 x 32] in 16 x 16 tiles (rows vr, columns vc), S [128 x 32] in 16 x 32 ones
  // (rows 16 warp), the S tile in registers from chunk to chunk.
  const int vr = 16 * (warp / 2), vc = 16 * (warp % 2), sr = 16 * warp;

  // Chunk c's W, k rows (zero past n), U slice and gamma into a stage; one cp.async group.
  auto issue = [&](int c, float* stage) {
    float *W_s = stage, *K_s = W_s + kC * kLd, *U_s = K_s + kC * kLdT, *g_s = U_s + kC * kLdS;
    const int i0 = c * kC, nc = min(kC, p.n - i0);
    const size_t hc = size_t(h) * p.NC + c;
#pragma unroll
    for (int it = 0; it < kTileLoads; ++it) {
      const int idx = t + it * kThreads, row = idx / (kD / 4), col = idx % (kD / 4) * 4;
      cp_async16(W_s + row * kLd + col, p.W + hc * kC * kD + row * kD + col);
      if (row < nc) cp_async16(K_s + row * kLdT + col, p.u + size_t(i0 + row) * p.C + key_dim + kh * kD + col);
      else st4(K_s + row * kLdT + col, make_float4(0.f, 0.f, 0.f, 0.f));
    }
#pragma unroll
    for (int it = 0; it < kC * kCols / 4 / kThreads; ++it) {
      const int idx = t + it * kThreads, row = idx / (kCols / 4), col = idx % (kCols / 4) * 4;
      cp_async16(U_s + row * kLdS + col, p.U + hc * kC * kD + row * kD + col0 + col);
    }
    if (t < kC / 4) cp_async16(g_s + 4 * t, p.gam + hc * kC + 4 * t);
    cp_async_commit();
  };
  issue(0, stages);

  // S[sr + row, col0 + column] of the warp's tile, in mma_tf32's C layout; and in S_s.
  float s[4][4];
  float* S_g = p.S + size_t(h) * kD * kD + col0;
  auto store_tile = [&](float* dst, int ld) {
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; e += 2)
        *reinterpret_cast<float2*>(dst + acc_row(sr, e) * ld + acc_col(0, n)) = make_float2(s[n][e], s[n][e + 1]);
  };
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const float2 v = *reinterpret_cast<const float2*>(S_g + acc_row(sr, e) * kD + acc_col(0, n));
      s[n][e] = v.x, s[n][e + 1] = v.y;
    }
  store_tile(S_s, kLdS);

  for (int c = 0; c < p.NC; ++c) {
    const float* stage = stages + (c & 1) * kStageFloats;
    const float *W_s = stage, *K_s = W_s + kC * kLd, *U_s = K_s + kC * kLdT, *g_s = U_s + kC * kLdS;
    const size_t hc = size_t(h) * p.NC + c;
    cp_async_wait<0>();
    __syncthreads();  // chunk c landed for all threads; S_s written; the other stage is free
    if (c + 1 < p.NC) issue(c + 1, stages + ((c + 1) & 1) * kStageFloats);

    store_tile(p.H + hc * kD * kD + col0, kD);  // the state the chunk starts from

    // V' = U - W S  (spec §3.2); rows past n are zero (W and U are)
    float v[2][4] = {};
    mma_rows<2>(v, W_s, kLd, vr, S_s, kLdS, vc, kD);
    const float last = g_s[kC - 1];
    float* Vg = p.U + hc * kC * kD + col0;
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; e += 2) {
        const int row = acc_row(vr, e), col = acc_col(vc, n);
        const float2 u = *reinterpret_cast<const float2*>(U_s + row * kLdS + col);
        const float2 vv = make_float2(u.x - v[n][e], u.y - v[n][e + 1]);
        *reinterpret_cast<float2*>(Vg + row * kD + col) = vv;
        const float d = expf(last - g_s[row]);
        *reinterpret_cast<float2*>(V_s + row * kLdS + col) = make_float2(vv.x * d, vv.y * d);
      }
    __syncthreads();  // V_s complete; everyone is done reading S_s

    // S <- exp(gamma_63) S + K^T (decayed V')   (the k rows past n are zero-filled)
    const float decay = expf(last);
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= decay;
#pragma unroll 2
    for (int k0 = 0; k0 < kC; k0 += 8) {
      uint32_t a[4];
      frag_a_t(a, K_s, kLdT, sr, k0);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        uint32_t b0, b1;
        frag_b(b0, b1, V_s, kLdS, k0, 8 * n);
        ptx::mma_tf32(s[n], a, b0, b1);
      }
    }
    store_tile(S_s, kLdS);
  }
  store_tile(S_g, kD);
}

// ---- 3. Per (64 columns, chunk, v-head): the outputs ------------------------------------------

__global__ void __launch_bounds__(kThreads, 2) deltanet_chunk_output_kernel(ChunkArgs p) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float4 smem4[];
  float* Q_s = reinterpret_cast<float*>(smem4);  // [64][kLd] q rows (rows past n unset: they only reach
                                                 // output rows that are never stored)
  float* H_s = Q_s + kC * kLd;                   // [128][kLdO] start state, this slice
  float* A_s = H_s + kD * kLdO;                  // [64][kLdA] Aqk
  float* V_s = A_s + kC * kLdA;                  // [64][kLdO] V', this slice
  float* g_s = V_s + kC * kLdO;                  // [64] gamma

  const int col0 = blockIdx.x * kOutCols, c = blockIdx.y, h = blockIdx.z, t = threadIdx.x;
  const int kh = h / (p.Hv / p.Hk);
  const int i0 = c * kC, nc = min(kC, p.n - i0);
  const size_t hc = size_t(h) * p.NC + c;
#pragma unroll
  for (int it = 0; it < kTileLoads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kD / 4), col = idx % (kD / 4) * 4;
    if (row < nc) cp_async16(Q_s + row * kLd + col, p.u + size_t(i0 + row) * p.C + kh * kD + col);
  }
#pragma unroll
  for (int it = 0; it < kD * kOutCols / 4 / kThreads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kOutCols / 4), col = idx % (kOutCols / 4) * 4;
    cp_async16(H_s + row * kLdO + col, p.H + hc * kD * kD + row * kD + col0 + col);
  }
#pragma unroll
  for (int it = 0; it < kC * kC / 4 / kThreads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kC / 4), col = idx % (kC / 4) * 4;
    cp_async16(A_s + row * kLdA + col, p.Aqk + hc * kC * kC + row * kC + col);
  }
#pragma unroll
  for (int it = 0; it < kC * kOutCols / 4 / kThreads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kOutCols / 4), col = idx % (kOutCols / 4) * 4;
    cp_async16(V_s + row * kLdO + col, p.U + hc * kC * kD + row * kD + col0 + col);
  }
  if (t < kC / 4) cp_async16(g_s + 4 * t, p.gam + hc * kC + 4 * t);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // O = diag(exp(gamma)) Q S + Aqk V'  (spec §3.2); warp tiles of 16 x 32 (rows r0, columns c0).
  const int warp = t / 32, r0 = 16 * (warp / 2), c0 = 32 * (warp % 2);
  float acc[4][4] = {};
  mma_rows<4>(acc, Q_s, kLd, r0, H_s, kLdO, c0, kD);
  const float d_lo = expf(g_s[acc_row(r0, 0)]), d_hi = expf(g_s[acc_row(r0, 2)]);
#pragma unroll
  for (int n = 0; n < 4; ++n) acc[n][0] *= d_lo, acc[n][1] *= d_lo, acc[n][2] *= d_hi, acc[n][3] *= d_hi;
  // Aqk[i, j > i] = 0: the sum over j stops after the tile's last row.
  mma_rows<4>(acc, A_s, kLdA, r0, V_s, kLdO, c0, r0 + 16);
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const int row = acc_row(r0, e);
      if (row < nc)
        *reinterpret_cast<float2*>(p.o + size_t(i0 + row) * p.Hv * kD + h * kD + col0 + acc_col(c0, n)) = make_float2(
            acc[n][e], acc[n][e + 1]);
    }
}

}  // namespace

size_t delta_rule_chunked_scratch_bytes(int n, int num_value_heads) {
  const size_t chunks = size_t((n + kC - 1) / kC);
  return chunks * size_t(num_value_heads) * kScratchFloats * sizeof(float);
}

void delta_rule_chunked(const DeltaRuleChunkedArgs& a, cudaStream_t stream) {
  if (a.n < 1) return;
  static const bool configured = [] {  // once: more than 48 KB of dynamic shared memory
    allow_dynamic_shared(deltanet_chunk_prep_kernel, kPrepSmem, "deltanet_chunk_prep");
    allow_dynamic_shared(deltanet_chunk_state_kernel, kStateSmem, "deltanet_chunk_state");
    allow_dynamic_shared(deltanet_chunk_output_kernel, kOutSmem, "deltanet_chunk_output");
    return true;
  }();
  (void)configured;

  const int NC = (a.n + kC - 1) / kC, Hv = a.num_value_heads;
  const size_t blocks = size_t(NC) * Hv;
  float* scratch = static_cast<float*>(a.scratch);
  ChunkArgs p{a.n,
              a.num_key_heads,
              Hv,
              a.conv_dim,
              NC,
              a.u,
              a.b,
              a.a,
              a.A_log,
              a.dt_bias,
              a.ssm_state,
              a.o,
              scratch,
              scratch + blocks * kC * kD,
              scratch + blocks * kC * kD * 2,
              scratch + blocks * (kC * kD * 2 + kC * kC),
              scratch + blocks * (kC * kD * 2 + kC * kC + kD * kD)};
  launch_after_wait(deltanet_chunk_prep_kernel, dim3(unsigned(NC), unsigned(Hv)), dim3(kThreads), kPrepSmem, stream, p);
  launch_after_wait(deltanet_chunk_state_kernel, dim3(unsigned(Hv * kSlices)), dim3(kThreads), kStateSmem, stream, p);
  launch_after_wait(deltanet_chunk_output_kernel, dim3(unsigned(kD / kOutCols), unsigned(NC), unsigned(Hv)),
                    dim3(kThreads), kOutSmem, stream, p);
}

size_t delta_rule_chunked_shared_bytes() { return std::max({kPrepSmem, kStateSmem, kOutSmem}); }

}  // namespace lily::cuda
