// gemv_prefetch.h: the one-row GEMV whose weights are copied into shared memory before the PDL
// wait (gemv_prefetch.cu): GemvKernel::prefetch of gemv.h. Internal to backend/cuda.
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// W 4-bit, group 64, cols a multiple of 512 up to 4096, 16-byte aligned arrays, and each block's
// rows within its shared memory when the grid has one block per SM of `multiprocessors`.
bool prefetch_gemv_supports(const QMatrix& W, int multiprocessors);

// y = RMSNorm(x; gain) @ W^T for one row (x, gain 16-byte aligned).
void prefetch_rms_norm_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y,
                            cudaStream_t stream);

}  // namespace lily::cuda
