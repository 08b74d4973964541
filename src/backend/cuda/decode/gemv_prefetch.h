// gemv_prefetch.h: the one-row GEMV whose weights are copied into shared memory before the PDL
// wait (gemv_prefetch.cu). gemv.cu's rms_norm_gemv routes here when prefetch_gemv_supports;
// internal to backend/cuda. (Measured for out_proj / o_proj, y += x @ W^T, it lost to
// mma_gemv: 4.7 vs 4.2 us exposed after a 10 us predecessor, docs/perf.md.)
#pragma once

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

// W 4-bit, group 64, cols a multiple of 512 up to 4096, each block's rows within its shared
// memory, 16-byte aligned pointers; false also when LILY_PREFETCH_GEMV=0 (read at every call).
bool prefetch_gemv_supports(const QMatrix& W, const float* x);

// y = RMSNorm(x; gain) @ W^T for one row.
void prefetch_rms_norm_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y,
                            cudaStream_t stream);

// The same for matrices whose rows per block do not fit at once (lm_head): each block streams
// its rows through a ring of shared-memory stages, the first ones issued before the PDL wait.
// 4-bit, group 64, cols a multiple of 512 up to 4096; opt-in: false unless LILY_STREAM_GEMV=1
// (measured slower than gemv.cu's mma_gemv on lm_head).
bool stream_gemv_supports(const QMatrix& W, const float* x);
void stream_rms_norm_gemv(const QMatrix& W, const float* x, const float* gain, float eps, float* y,
                          cudaStream_t stream);

}  // namespace lily::cuda
