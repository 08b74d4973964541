// norm.h: row-wise kernels of the forward: embedding lookup, RMSNorm (norm.cu).
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// h[t, :] = dequantized row tokens[t] of the embedding table.  tokens: [T] device int32.
void embed_tokens(const QMatrix& table, const int32_t* tokens, int T, float* h, cudaStream_t stream);

// y = x * rsqrt(mean(x^2) + eps) * gain over rows of n values (zero-centred norms carry
// their effective gain 1 + w).  x, y: [rows, n]; gain: [n] fp32.  y may alias x.
void rms_norm(const float* x, const float* gain, int rows, int n, float eps, float* y, cudaStream_t stream);

}  // namespace lily::cuda
