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
//           v-head h reads q/k head h / (Hv/Hk). All fp32, fp32 arithmetic (no tensor cores).
// Scratch:  per (v-head, chunk) hc = h * NC + c, NC = ceil(n / 64):
//             W [hc][64][128], U [hc][64][128] (V' after the state pass), Aqk [hc][64][64],
//             H [hc][128][128] (the state at the chunk's start), gamma [hc][64].
// Kernels:  three launches, 256 threads each (the FLA split: the sequential part carries only S):
//   deltanet_chunk_prep_kernel    grid (NC, Hv); everything that does not need S. k and q rows in
//             shared memory ([64][132] floats: float4 row reads without bank conflicts), gates and
//             gamma; the two Gram matrices K K^T, Q K^T (a 4x4 tile of each per thread, rows
//             i = ti + 16r, j = tj + 16s) masked with D into A (shared) and Aqk (global); v rows
//             replace q; then the forward substitution through (I + A), one right-hand-side column
//             per thread (128 of diag(beta) V, 128 of diag(beta exp(gamma)) K), the 64 unknowns of
//             the column in registers, A's rows read as float4 broadcasts.
//   deltanet_chunk_state_kernel   grid (Hv * 4): block = (v-head, 32 dv columns); the chunks in
//             order, S's 128 x 32 slice in registers (4 x 4 per thread) and in shared memory.
//             The next chunk's W, k rows, U slice and gamma stream in by cp.async (two stages,
//             172.5 KB in all) while this one is computed:
//               store S (the chunk's start state) to H;  V' = U - W S (2 x 4 per thread);
//               V' -> global (over U), V' exp(gamma_63 - gamma_j) -> shared;
//               S = exp(gamma_63) S + K^T (decayed V')   (the k rows past n are zero-filled)
//   deltanet_chunk_output_kernel  grid (4 column slices, NC, Hv); every (chunk, slice) at once:
//             O = exp(gamma) (Q H) + Aqk V' for 64 rows x 32 columns, 2 x 4 per thread; the
//             Aqk V' sum stops at the warp's last row (Aqk is zero above its diagonal).
// Cost:     per v-head and 64 tokens about 5.0 M fp32 multiply-adds (prep 1.6 M, state 2.1 M,
//           output 1.3 M): 1.3 G per 512 tokens at Hv = 32, 38 us at the H200's fp32 peak; only
//           the state pass (a third of it) is sequential. fp32
//           on the CUDA cores because the results must match the fp32 token loop to ~1e-5; 3xTF32
//           on the tensor cores is the next step if these kernels show up in the profile.
// Tested:   tests/cuda/test_deltanet.cu (Chunked* vs the CPU recurrent rule, T = 1 .. 1000,
//           carried states across calls).
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"

#include "backend/cuda/common/mma.cuh"
#include "backend/cuda/prefill/deltanet_prefill.h"

#include <algorithm>

namespace lily::cuda {

namespace {

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;

constexpr int kD = 128;  // dk = dv
constexpr int kC = 64;   // tokens per chunk (spec §3.2)
constexpr int kThreads = 256;
constexpr int kLd = kD + 4;   // floats per shared row of a [64][128] tile
constexpr int kLdA = kC + 4;  // floats per shared row of Aqk in the output kernel
constexpr int kCols = 32;     // dv columns per block of the state pass and the output
constexpr int kSlices = kD / kCols;
constexpr int kTileLoads = kC * kD / 4 / kThreads;  // float4 per thread for a [64][128] tile (8)

// Floats of scratch per (v-head, chunk): W, U, Aqk, H, gamma.
constexpr size_t kScratchFloats = size_t(kC) * kD * 2 + size_t(kC) * kC + size_t(kD) * kD + kC;

// Shared memory per kernel, in floats.
constexpr int kPrepFloats = 2 * kC * kLd + kC * kC + 3 * kC;              // K, Q|V, A, gamma, beta, beta exp(gamma)
constexpr int kStageFloats = 2 * kC * kLd + kC * kCols + kC;              // W, K, U slice, gamma
constexpr int kStateFloats = 2 * kStageFloats + kD * kCols + kC * kCols;  // 2 stages, S slice, decayed V'
constexpr int kOutFloats = kC * kLd + kD * kCols + kC * kLdA + kC * kCols + kC;  // Q, H, Aqk, V', gamma
constexpr size_t kPrepSmem = kPrepFloats * sizeof(float);                        // 84,736 bytes: 2 blocks per SM
constexpr size_t kStateSmem = kStateFloats * sizeof(float);                      // 176,640 bytes
constexpr size_t kOutSmem = kOutFloats * sizeof(float);                          // 76,032 bytes

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

// beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)   (spec §2.6, as deltanet_common.cuh's gates())
__device__ __forceinline__ void gate_logs(const ChunkArgs& p, int t, int h, float& g, float& beta) {
  const float x = p.a[size_t(t) * p.Hv + h] + p.dt_bias[h];
  beta = 1.f / (1.f + expf(-p.b[size_t(t) * p.Hv + h]));
  g = -expf(p.A_log[h]) * (x > 20.f ? x : log1pf(expf(x)));
}

// acc[r][c] += sum_k A[row_r][k] B[k][4 cg + c] over k < K (a multiple of 4), rows row0, row0 + 1:
// A rows of lda floats, B rows of kCols floats, both in shared memory.
template <int K>
__device__ __forceinline__ void mul_2x4(float (&acc)[2][4], const float* A, int lda, int row0, const float* B, int cg,
                                        int k_end = K) {
#pragma unroll 4
  for (int k = 0; k < k_end; k += 4) {
    const float4 a0 = ld4(A + row0 * lda + k), a1 = ld4(A + (row0 + 1) * lda + k);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      const float4 bv = ld4(B + (k + kk) * kCols + 4 * cg);
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        acc[0][c] = fmaf(at(a0, kk), at(bv, c), acc[0][c]);
        acc[1][c] = fmaf(at(a1, kk), at(bv, c), acc[1][c]);
      }
    }
  }
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

  // Gram products: kk[r][s] = k_i . k_j, qk[r][s] = q_i . k_j for i = ti + 16r, j = tj + 16s.
  const int ti = t / 16, tj = t % 16;
  float kk[4][4] = {}, qk[4][4] = {};
#pragma unroll 2
  for (int k = 0; k < kD; k += 4) {
    float4 qi[4], ki[4], kj[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      qi[r] = ld4(X_s + (ti + 16 * r) * kLd + k);
      ki[r] = ld4(K_s + (ti + 16 * r) * kLd + k);
      kj[r] = ld4(K_s + (tj + 16 * r) * kLd + k);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          kk[r][s] = fmaf(at(ki[r], e), at(kj[s], e), kk[r][s]);
          qk[r][s] = fmaf(at(qi[r], e), at(kj[s], e), qk[r][s]);
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
  for (int r = 0; r < 4; ++r)
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const int i = ti + 16 * r, j = tj + 16 * s;
      const float d = j <= i ? expf(gam_s[i] - gam_s[j]) : 0.f;  // never exp of a positive difference
      A_s[i * kC + j] = j < i ? beta_s[i] * kk[r][s] * d : 0.f;
      Aqk[i * kC + j] = j <= i ? qk[r][s] * d : 0.f;
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
  float* stages = reinterpret_cast<float*>(smem4);  // 2 x {W [64][kLd], K [64][kLd], U [64][32], gamma [64]}
  float* S_s = stages + 2 * kStageFloats;           // [128][32] S slice
  float* V_s = S_s + kD * kCols;                    // [64][32] V'_j exp(gamma_63 - gamma_j)

  const int h = blockIdx.x / kSlices, col0 = blockIdx.x % kSlices * kCols, t = threadIdx.x;
  const int kh = h / (p.Hv / p.Hk), key_dim = p.Hk * kD;
  const int cg = t % 8, rg = t / 8;  // S rows 4rg .. 4rg+3 (V' rows 2rg, 2rg+1), columns 4cg .. 4cg+3

  // Chunk c's W, k rows (zero past n), U slice and gamma into a stage; one cp.async group.
  auto issue = [&](int c, float* stage) {
    float *W_s = stage, *K_s = stage + kC * kLd, *U_s = K_s + kC * kLd, *g_s = U_s + kC * kCols;
    const int i0 = c * kC, nc = min(kC, p.n - i0);
    const size_t hc = size_t(h) * p.NC + c;
#pragma unroll
    for (int it = 0; it < kTileLoads; ++it) {
      const int idx = t + it * kThreads, row = idx / (kD / 4), col = idx % (kD / 4) * 4;
      cp_async16(W_s + row * kLd + col, p.W + hc * kC * kD + row * kD + col);
      if (row < nc) cp_async16(K_s + row * kLd + col, p.u + size_t(i0 + row) * p.C + key_dim + kh * kD + col);
      else st4(K_s + row * kLd + col, make_float4(0.f, 0.f, 0.f, 0.f));
    }
#pragma unroll
    for (int it = 0; it < kC * kCols / 4 / kThreads; ++it) {
      const int idx = t + it * kThreads, row = idx / (kCols / 4), col = idx % (kCols / 4) * 4;
      cp_async16(U_s + row * kCols + col, p.U + hc * kC * kD + row * kD + col0 + col);
    }
    if (t < kC / 4) cp_async16(g_s + 4 * t, p.gam + hc * kC + 4 * t);
    cp_async_commit();
  };
  issue(0, stages);

  float s[4][4];  // S[4rg + r][col0 + 4cg + e]
  float* S_g = p.S + size_t(h) * kD * kD + col0 + 4 * cg;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const float4 v = ld4(S_g + (4 * rg + r) * kD);
    s[r][0] = v.x, s[r][1] = v.y, s[r][2] = v.z, s[r][3] = v.w;
    st4(S_s + (4 * rg + r) * kCols + 4 * cg, v);
  }

  for (int c = 0; c < p.NC; ++c) {
    const float* stage = stages + (c & 1) * kStageFloats;
    const float *W_s = stage, *K_s = stage + kC * kLd, *U_s = K_s + kC * kLd, *g_s = U_s + kC * kCols;
    const int nc = min(kC, p.n - c * kC);
    const size_t hc = size_t(h) * p.NC + c;
    cp_async_wait<0>();
    __syncthreads();  // chunk c landed for all threads; S_s written; the other stage is free
    if (c + 1 < p.NC) issue(c + 1, stages + ((c + 1) & 1) * kStageFloats);

    float* H = p.H + hc * kD * kD + col0 + 4 * cg;  // the state the chunk starts from
#pragma unroll
    for (int r = 0; r < 4; ++r) st4(H + (4 * rg + r) * kD, make_float4(s[r][0], s[r][1], s[r][2], s[r][3]));

    // V' = U - W S  (spec §3.2), rows 2rg, 2rg + 1
    float acc[2][4] = {};
    mul_2x4<kD>(acc, W_s, kLd, 2 * rg, S_s, cg);
    const float last = g_s[kC - 1];
    float* Vg = p.U + hc * kC * kD + col0 + 4 * cg;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 2 * rg + r;
      const float4 u4 = ld4(U_s + row * kCols + 4 * cg);
      const float4 v = make_float4(u4.x - acc[r][0], u4.y - acc[r][1], u4.z - acc[r][2], u4.w - acc[r][3]);
      st4(Vg + row * kD, v);
      const float d = expf(last - g_s[row]);
      st4(V_s + row * kCols + 4 * cg, make_float4(v.x * d, v.y * d, v.z * d, v.w * d));
    }
    __syncthreads();  // V_s complete; everyone is done reading S_s

    // S <- exp(gamma_63) S + sum_j k_j (exp(gamma_63 - gamma_j) V'_j)^T
    const float decay = expf(last);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[r][e] *= decay;
#pragma unroll 4
    for (int j = 0; j < nc; ++j) {
      const float4 kv = ld4(K_s + j * kLd + 4 * rg), vv = ld4(V_s + j * kCols + 4 * cg);
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[r][e] = fmaf(at(kv, r), at(vv, e), s[r][e]);
    }
#pragma unroll
    for (int r = 0; r < 4; ++r)
      st4(S_s + (4 * rg + r) * kCols + 4 * cg, make_float4(s[r][0], s[r][1], s[r][2], s[r][3]));
  }
#pragma unroll
  for (int r = 0; r < 4; ++r) st4(S_g + (4 * rg + r) * kD, make_float4(s[r][0], s[r][1], s[r][2], s[r][3]));
}

// ---- 3. Per (32 columns, chunk, v-head): the outputs ------------------------------------------

__global__ void __launch_bounds__(kThreads, 2) deltanet_chunk_output_kernel(ChunkArgs p) {
  pdl_wait();
  pdl_launch_dependents();
  extern __shared__ float4 smem4[];
  float* Q_s = reinterpret_cast<float*>(smem4);  // [64][kLd] q rows (rows past n unset, never stored)
  float* H_s = Q_s + kC * kLd;                   // [128][32] start state, this slice
  float* A_s = H_s + kD * kCols;                 // [64][kLdA] Aqk
  float* V_s = A_s + kC * kLdA;                  // [64][32] V', this slice
  float* g_s = V_s + kC * kCols;                 // [64] gamma

  const int col0 = blockIdx.x * kCols, c = blockIdx.y, h = blockIdx.z, t = threadIdx.x;
  const int kh = h / (p.Hv / p.Hk);
  const int i0 = c * kC, nc = min(kC, p.n - i0);
  const size_t hc = size_t(h) * p.NC + c;
#pragma unroll
  for (int it = 0; it < kTileLoads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kD / 4), col = idx % (kD / 4) * 4;
    if (row < nc) cp_async16(Q_s + row * kLd + col, p.u + size_t(i0 + row) * p.C + kh * kD + col);
  }
#pragma unroll
  for (int it = 0; it < kD * kCols / 4 / kThreads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kCols / 4), col = idx % (kCols / 4) * 4;
    cp_async16(H_s + row * kCols + col, p.H + hc * kD * kD + row * kD + col0 + col);
  }
#pragma unroll
  for (int it = 0; it < kC * kC / 4 / kThreads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kC / 4), col = idx % (kC / 4) * 4;
    cp_async16(A_s + row * kLdA + col, p.Aqk + hc * kC * kC + row * kC + col);
  }
#pragma unroll
  for (int it = 0; it < kC * kCols / 4 / kThreads; ++it) {
    const int idx = t + it * kThreads, row = idx / (kCols / 4), col = idx % (kCols / 4) * 4;
    cp_async16(V_s + row * kCols + col, p.U + hc * kC * kD + row * kD + col0 + col);
  }
  if (t < kC / 4) cp_async16(g_s + 4 * t, p.gam + hc * kC + 4 * t);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // O = diag(exp(gamma)) Q S + Aqk V'  (spec §3.2), rows 2rg, 2rg + 1, columns 4cg .. 4cg + 3
  const int cg = t % 8, rg = t / 8;
  float acc[2][4] = {};
  mul_2x4<kD>(acc, Q_s, kLd, 2 * rg, H_s, cg);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float decay = expf(g_s[2 * rg + r]);
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[r][e] *= decay;
  }
  // The warp's rows are 8w .. 8w + 7, and Aqk[i, j > i] = 0: the sum stops at j = 8w + 7.
  mul_2x4<kC>(acc, A_s, kLdA, 2 * rg, V_s, cg, 8 * (t / 32) + 8);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = 2 * rg + r;
    if (row < nc)
      st4(p.o + size_t(i0 + row) * p.Hv * kD + h * kD + col0 + 4 * cg,
          make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
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
    CUDA_CHECK(
        cudaFuncSetAttribute(deltanet_chunk_prep_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kPrepSmem)));
    CUDA_CHECK(cudaFuncSetAttribute(deltanet_chunk_state_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    int(kStateSmem)));
    CUDA_CHECK(
        cudaFuncSetAttribute(deltanet_chunk_output_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kOutSmem)));
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
  launch_after_wait(deltanet_chunk_output_kernel, dim3(unsigned(kSlices), unsigned(NC), unsigned(Hv)), dim3(kThreads),
                    kOutSmem, stream, p);
}

}  // namespace lily::cuda
