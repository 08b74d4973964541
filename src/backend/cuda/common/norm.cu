// norm.cu: row-wise kernels of the forward: embedding lookup, RMSNorm.
//
//   embed_tokens:  h[t, c] = scale[tok, c/64] * q[tok, c] + bias[tok, c/64]     tok = tokens[t]
//   rms_norm:      y[r, i] = x[r, i] * rsqrt(mean_i(x[r]^2) + eps) * gain[i]    (spec §2.2)
// Shapes:   table [V, H] affine 4/8-bit (mlx layout) · tokens [T] int32 on the device · h [T, H]
//           fp32 · x, y [rows, n] fp32 (y may alias x) · gain [n] fp32.
// Kernels:  embed_kernel   one block of 128 threads per token; a thread expands one 16-byte
//                          chunk of codes (32 or 16 values) and writes it with float4 stores.
//           rms_norm_kernel one block per row (256 threads, 128 or 32 for short rows); fp32
//                          sum of squares, warp shuffles then shared memory; each thread reads
//                          then writes the same elements, so y may alias x.
// Tested:   tests/cuda/test_norm.cu against backend/cpu (rms_norm) and host loops.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/norm.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/common/pdl_launch.cuh"

#include <algorithm>

namespace lily::cuda {

namespace {

// ---- Embedding ------------------------------------------------------------------------------

struct EmbedParams {
  const uint4* codes;      // [V, cpr] chunks of 16 bytes
  const uint16_t* scales;  // [V, H/64] bf16 bits
  const uint16_t* biases;
  const int32_t* tokens;  // [T]
  int V, H;
  float* h;  // [T, H]
};

template <int BITS>
__global__ void __launch_bounds__(128) embed_kernel(EmbedParams p) {
  pdl_wait();
  pdl_launch_dependents();
  constexpr int kCodes = 128 / BITS, kChunksPerGroup = 64 / kCodes;
  constexpr uint32_t kMask = (1u << BITS) - 1u;
  const int t = blockIdx.x;
  const int cpr = p.H / kCodes, gpr = p.H / 64;
  const int64_t tok = min(max(p.tokens[t], 0), p.V - 1);  // out-of-range ids read a valid row
  float4* dst = reinterpret_cast<float4*>(p.h + int64_t(t) * p.H);
  for (int c = threadIdx.x; c < cpr; c += blockDim.x) {
    const uint4 q = __ldg(p.codes + tok * cpr + c);
    const float s = __uint_as_float(uint32_t(__ldg(p.scales + tok * gpr + c / kChunksPerGroup)) << 16);
    const float b = __uint_as_float(uint32_t(__ldg(p.biases + tok * gpr + c / kChunksPerGroup)) << 16);
    const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Word i holds columns i*(32/BITS) .. of this chunk, low bits first.
#pragma unroll
      for (int j = 0; j < 32 / BITS; j += 4) {
        float4 v;
        v.x = s * float((w[i] >> (BITS * (j + 0))) & kMask) + b;
        v.y = s * float((w[i] >> (BITS * (j + 1))) & kMask) + b;
        v.z = s * float((w[i] >> (BITS * (j + 2))) & kMask) + b;
        v.w = s * float((w[i] >> (BITS * (j + 3))) & kMask) + b;
        dst[(c * kCodes + i * (32 / BITS) + j) / 4] = v;
      }
    }
  }
}

// ---- RMSNorm --------------------------------------------------------------------------------

struct RmsNormParams {
  const float* x;     // [rows, n]
  const float* gain;  // [n]
  float* y;           // [rows, n]
  int n;
  float eps;
};

__global__ void __launch_bounds__(256) rms_norm_kernel(RmsNormParams p) {
  pdl_wait();
  pdl_launch_dependents();
  __shared__ float partial[8];
  __shared__ float inv_rms;
  const float* x = p.x + int64_t(blockIdx.x) * p.n;
  float* y = p.y + int64_t(blockIdx.x) * p.n;
  float ss = 0.f;
  for (int i = threadIdx.x; i < p.n; i += blockDim.x) ss = fmaf(x[i], x[i], ss);
#pragma unroll
  for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0) partial[warp] = ss;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < warps; ++w) total += partial[w];
    inv_rms = 1.f / sqrtf(total / float(p.n) + p.eps);  // as the CPU: 1 / sqrt(mean + eps)
  }
  __syncthreads();
  const float inv = inv_rms;
  for (int i = threadIdx.x; i < p.n; i += blockDim.x) y[i] = x[i] * inv * p.gain[i];
}

}  // namespace

void embed_tokens(const QMatrix& table, const int32_t* tokens, int T, float* h, cudaStream_t stream) {
  LILY_CHECK(table.bits == 4 || table.bits == 8, "embed_tokens: {}-bit table is not supported (4 or 8)", table.bits);
  LILY_CHECK(table.group_size == 64 && table.cols > 0 && table.cols % 64 == 0,
             "embed_tokens: table [{}, {}] group {} (cols must be a multiple of 64, group 64)", table.rows, table.cols,
             table.group_size);
  LILY_CHECK(aligned16(h), "embed_tokens: h must be 16-byte aligned");
  if (T <= 0) return;
  const EmbedParams p{reinterpret_cast<const uint4*>(table.codes),
                      reinterpret_cast<const uint16_t*>(table.scales),
                      reinterpret_cast<const uint16_t*>(table.biases),
                      tokens,
                      table.rows,
                      table.cols,
                      h};
  if (table.bits == 4) embed_kernel<4><<<T, 128, 0, stream>>>(p);
  else embed_kernel<8><<<T, 128, 0, stream>>>(p);
  CUDA_CHECK_LAUNCH();
}

void rms_norm(const float* x, const float* gain, int rows, int n, float eps, float* y, cudaStream_t stream) {
  LILY_CHECK(n > 0 && rows >= 0, "rms_norm: rows {} n {}", rows, n);
  if (rows == 0) return;
  const int threads = n >= 2048 ? 256 : n >= 256 ? 128 : 32;
  launch_after_wait(rms_norm_kernel, dim3(rows), dim3(threads), 0, stream, RmsNormParams{x, gain, y, n, eps});
}

}  // namespace lily::cuda
