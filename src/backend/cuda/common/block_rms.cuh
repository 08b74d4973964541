// block_rms.cuh: the inverse RMS of one row that a thread block holds in registers, as rms_norm
// computes it (spec §2.2): 1 / sqrt(mean(x^2) + eps). Shared by the decode kernels that normalize
// their input row themselves (quant_mma.cuh's stage_input_row, gemv.cu's staged_gemv_kernel,
// moe_route.cu's router). Internal to backend/cuda.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/common/quant_dot.cuh"

namespace lily::cuda {

// Block-wide (all THREADS threads call it): v = this thread's PER float4s of the row (zeros past
// its end), cols = the row's length. Order of the sums, fixed: each thread's fmaf chain over its
// float4s, a warp shuffle sum, the warps' sums added in warp order. red: THREADS / 32 floats of
// shared memory, free again once the block has passed a later barrier.
template <int PER, int THREADS>
__device__ __forceinline__ float block_inv_rms(const float4 (&v)[PER], int cols, float eps, float* red) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < PER; ++i)
    ss = fmaf(v[i].x, v[i].x, fmaf(v[i].y, v[i].y, fmaf(v[i].z, v[i].z, fmaf(v[i].w, v[i].w, ss))));
  ss = quant::group_sum<32>(ss);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < THREADS / 32; ++w) total += red[w];
  return 1.f / sqrtf(total / float(cols) + eps);
}

}  // namespace lily::cuda
