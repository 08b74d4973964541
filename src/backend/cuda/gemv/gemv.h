// gemv.h: the decode step's projections of one row (T = 1) for affine-quantized W:
//   rms_norm_gemv     y = RMSNorm(x; gain) @ W^T   the input projections, lm_head
//   gemv_accumulate   y += x @ W^T                 out_proj, o_proj (the residual add fused in)
// Three kernels; the kernel plan (kernel_plan.h) picks one per matrix from its format when the
// backend is built, and the launchers check that the pick takes the matrix.
#pragma once

#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

enum class GemvKernel {
  prefetch,  // 4-bit, RMSNorm form: each block's rows bulk-copied into shared memory before
             // the PDL wait (gemv_prefetch.cu); rows per block bounded by its shared memory
  mma,       // 4-bit, at most 4096 columns: tensor cores at fp32-level accuracy (gemv.cu)
  fp32,      // 8-bit, at most 4096 columns: FP32 lane-group dot products (gemv.cu)
};

const char* kernel_name(GemvKernel kernel);

// Whether `kernel` takes W (bits, group size, shape, 16-byte aligned arrays) in the RMSNorm form
// or (accumulate) the accumulating form, on a device of `device.multiprocessors` SMs.
bool gemv_supports(GemvKernel kernel, const QMatrix& W, bool accumulate, const DeviceLimits& device);

// y[r] = sum_c W[r, c] * RMSNorm(x)[c],  RMSNorm(x) = x * rsqrt(mean(x^2) + eps) * gain
// x, gain: [W.cols] fp32, 16-byte aligned;  y: [W.rows] fp32, not overlapping x.
void rms_norm_gemv(GemvKernel kernel, const QMatrix& W, const float* x, const float* gain, float eps, float* y,
                   cudaStream_t stream);

// y[r] += sum_c W[r, c] * x[c]      x: [W.cols] fp32, 16-byte aligned;  y: [W.rows] fp32.
void gemv_accumulate(GemvKernel kernel, const QMatrix& W, const float* x, float* y, cudaStream_t stream);

}  // namespace lily::cuda
