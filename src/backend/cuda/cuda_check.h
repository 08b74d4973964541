// cuda_check.h: CUDA_CHECK(expr) throws lily::Error naming the call, file and line when a
// CUDA runtime call fails; CUDA_CHECK_LAUNCH() checks the last kernel launch.
#pragma once

#include <cuda_runtime.h>

#include "base/error.h"

#define CUDA_CHECK(expr)                                                                         \
  do {                                                                                           \
    cudaError_t _lily_err = (expr);                                                              \
    if (_lily_err != cudaSuccess)                                                                \
      ::lily::fail("CUDA error at {}:{}: {}: {}", __FILE__, __LINE__, #expr, cudaGetErrorString(_lily_err)); \
  } while (0)

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
