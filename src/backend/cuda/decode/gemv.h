// gemv.h: y = x @ W^T for affine-quantized W (4- or 8-bit), few input rows (decode, and the
// simple prefill). See gemv.cu for the kernel design.
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// y[t, r] = sum_c W[r, c] * x[t, c]      x: [T, W.cols] fp32, y: [T, W.rows] fp32
void gemv(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream);

// y[t, r] += sum_c W[r, c] * x[t, c]     (the residual add fused into the projection)
void gemv_accumulate(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream);

// y[r] = sum_c W[r, c] * RMSNorm(x)[c],  RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * gain
// (one token: the input norm fused into the projection that consumes it).  x, gain: [W.cols]
// fp32, 16-byte aligned, W.cols <= 4096;  y: [W.rows] fp32, must not overlap x.
void rms_norm_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y, cudaStream_t stream);

// Whether rms_norm_gemv takes W (bits 4 or 8, group 64, at most 4096 columns, some rows).
bool rms_norm_gemv_supports(const QMatrix& W);

}  // namespace lily::cuda
