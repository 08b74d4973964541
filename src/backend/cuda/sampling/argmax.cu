// argmax.cu: the greedy pick of the decode graph: the arg max of one row of logits, written where
// the next step reads its token.
//
//   out[0] = argmax_{i < vocab} logits[i], ties to the lowest i; NaN never chosen (all NaN: 0)
// Shapes:   logits [vocab] fp32 · out [1] int32 (device).
// Kernel:   argmax_kernel: a grid-stride pass where each block reduces its share to (value,
//           index) in a static device array; the last block to finish (a counter, reset by that
//           block, so graph replays work) reduces those and writes out[0]. One argmax may run at
//           a time per device.
// Tested:   tests/cuda/test_norm.cu (Argmax*: ties, limits, NaN) against host loops.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/common/kernel_trace.cuh"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/sampling/next_token.h"

#include <algorithm>
#include <cfloat>
#include <climits>

namespace lily::cuda {

namespace {

constexpr int kArgmaxThreads = 512;
constexpr int kArgmaxMaxBlocks = 264;

__device__ float g_argmax_value[kArgmaxMaxBlocks];
__device__ int g_argmax_index[kArgmaxMaxBlocks];
__device__ unsigned g_argmax_done = 0;

// (v, i) beats (bv, bi): larger value, or equal value and lower index. NaN never beats.
__device__ __forceinline__ bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }

__device__ __forceinline__ void block_argmax(float& v, int& i) {
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, o);
    const int oi = __shfl_xor_sync(0xFFFFFFFFu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sv[warp] = v, si[warp] = i;
  __syncthreads();
  if (warp == 0) {
    v = lane < kArgmaxThreads / 32 ? sv[lane] : -INFINITY;
    i = lane < kArgmaxThreads / 32 ? si[lane] : INT_MAX;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) {
      const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, o);
      const int oi = __shfl_xor_sync(0xFFFFFFFFu, i, o);
      if (better(ov, oi, v, i)) v = ov, i = oi;
    }
  }
  __syncthreads();  // sv/si may be reused by a second call
}

__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* logits, int vocab, int32_t* out) {
  trace::BlockTrace trace(trace::kind_argmax);
  pdl_wait();
  pdl_launch_dependents();
  trace.mark(1);
  // Each thread scans ascending indices, so a strict > keeps the lowest index of a tie.
  float v = -INFINITY;
  int i = INT_MAX;
  const int stride = gridDim.x * kArgmaxThreads;
  for (int j = blockIdx.x * kArgmaxThreads + threadIdx.x; j < vocab; j += stride) {
    const float x = __ldg(logits + j);
    if (better(x, j, v, i)) v = x, i = j;
  }
  block_argmax(v, i);

  __shared__ bool last;
  if (threadIdx.x == 0) {
    g_argmax_value[blockIdx.x] = v;
    g_argmax_index[blockIdx.x] = i;
    __threadfence();  // the partial is visible before the count says so
    last = atomicAdd(&g_argmax_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  v = -INFINITY, i = INT_MAX;
  for (int b = threadIdx.x; b < gridDim.x; b += kArgmaxThreads) {
    const float bv = __ldcg(g_argmax_value + b);
    const int bi = __ldcg(g_argmax_index + b);
    if (better(bv, bi, v, i)) v = bv, i = bi;
  }
  block_argmax(v, i);
  if (threadIdx.x == 0) {
    out[0] = i == INT_MAX ? 0 : i;  // all NaN: token 0
    g_argmax_done = 0;
  }
}

}  // namespace

void argmax(const float* logits, int vocab_limit, int32_t* out, cudaStream_t stream) {
  LILY_CHECK(vocab_limit > 0, "argmax: vocab {}", vocab_limit);
  // About 4 values per thread, at most two blocks per SM of an H200.
  const int blocks = std::min(kArgmaxMaxBlocks, (vocab_limit + 4 * kArgmaxThreads - 1) / (4 * kArgmaxThreads));
  argmax_kernel<<<blocks, kArgmaxThreads, 0, stream>>>(logits, vocab_limit, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
