// gemm_exact.h: y = x @ W^T for affine-quantized W (4 or 8 bits, group 64) and many input rows,
// on the tensor cores but to fp32-level accuracy, for the products whose small errors matter:
// the prefill router (a near-tie between two experts flips with bf16 inputs; issue 7).
// See gemm_exact.cu for the method.
#pragma once

#include "backend/cuda/common/gpu_types.h"
#include "backend/cuda/gemm/split_k.h"

namespace lily::cuda {

// y[t, n] = sum_g scale[n, g] * (sum_{k in g} q[n, k] x[t, k]) + bias[n, g] * (sum_{k in g} x[t, k])
// x: [T, W.cols] fp32 (16-byte aligned, W.cols a multiple of 64), y: [T, W.rows] fp32.
// split: optional workspace; with it, a grid of few blocks splits K (split_k.h).
void gemm_exact(const QMatrix& W, const float* x, float* y, int T, cudaStream_t stream, const SplitK* split = nullptr);

}  // namespace lily::cuda
