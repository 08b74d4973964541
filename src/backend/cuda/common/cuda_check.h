// cuda_check.h: CUDA_CHECK(expr) throws lily::Error naming the call, file and line when a
// CUDA runtime call fails; CUDA_CHECK_LAUNCH() checks the last kernel launch.
#pragma once

// fmt turns its constexpr off under nvcc, and g++ in C++20 then rejects fmt/format.h's
// constexpr functions that call the non-constexpr ones. Turning it back on compiles (and
// keeps the compile-time format-string check). Include this header before anything that
// includes fmt; the build-wide fix is -DFMT_USE_CONSTEXPR=1 on every CUDA compile.
#if defined(__NVCC__) && !defined(FMT_USE_CONSTEXPR)
#define FMT_USE_CONSTEXPR 1
#endif

#include <cuda_runtime.h>

#include "base/error.h"

#define CUDA_CHECK(expr)                                                                                     \
  do {                                                                                                       \
    cudaError_t _lily_err = (expr);                                                                          \
    if (_lily_err != cudaSuccess)                                                                            \
      ::lily::fail("CUDA error at {}:{}: {}: {}", __FILE__, __LINE__, #expr, cudaGetErrorString(_lily_err)); \
  } while (0)

#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
