// random_qmatrix.cuh: random affine-quantized matrices on the GPU for the kernel workbench
// programs (bench/kernels/*): random codes, scales and biases around 0.01. Speed does not depend
// on the values. The memory is never freed (a benchmark process's lifetime), except by
// free_random_qmatrix.
#pragma once

#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/gpu_types.h"

namespace lily::bench {

__global__ void fill_random_words(uint32_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    p[i] = x;
  }
}

// n bf16 values around 0.01 (0x3C24) with a random low mantissa.
__global__ void fill_small_bf16(uint16_t* p, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = uint16_t(0x3C20 | (i * 7 & 15));
}

// A [batch, rows, cols] matrix of `bits`-bit codes, group 64.
inline cuda::QMatrix random_qmatrix(int batch, int rows, int cols, int bits, uint32_t seed = 1234) {
  cuda::QMatrix m;
  m.batch = batch, m.rows = rows, m.cols = cols, m.bits = bits;
  const size_t words = size_t(batch) * rows * cols * bits / 32, groups = size_t(batch) * rows * cols / 64;
  uint32_t* c;
  bf16 *s, *b;
  CUDA_CHECK(cudaMalloc(&c, words * 4));
  CUDA_CHECK(cudaMalloc(&s, groups * 2));
  CUDA_CHECK(cudaMalloc(&b, groups * 2));
  fill_random_words<<<1024, 256>>>(c, words, seed);
  fill_small_bf16<<<1024, 256>>>(reinterpret_cast<uint16_t*>(s), groups);
  fill_small_bf16<<<1024, 256>>>(reinterpret_cast<uint16_t*>(b), groups);
  CUDA_CHECK(cudaGetLastError());
  m.codes = c, m.scales = s, m.biases = b;
  return m;
}

inline void free_random_qmatrix(const cuda::QMatrix& m) {
  cudaFree(const_cast<uint32_t*>(m.codes));
  cudaFree(const_cast<bf16*>(m.scales));
  cudaFree(const_cast<bf16*>(m.biases));
}

}  // namespace lily::bench
