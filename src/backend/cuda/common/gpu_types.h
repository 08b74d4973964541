// gpu_types.h: plain descriptions of device buffers that host code passes to the CUDA
// launchers. No CUDA headers here, so CPU-only code and tests compile without nvcc.
//
// Conventions for every launcher in backend/cuda/*.h:
// - pointers are device pointers; launches are asynchronous on the given stream;
// - activations are fp32 row-major [T, width]; the KV cache is bf16; DeltaNet state fp32;
// - positions and token ids that change from one decode step to the next are read from
//   device memory, so a captured CUDA graph can be replayed without re-capturing.
#pragma once

#include <cstdint>

#include "base/bf16.h"

typedef struct CUstream_st* cudaStream_t;

namespace lily::cuda {

// Whether p is 16-byte aligned (16-byte vector loads, bulk copies).
inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// An affine-quantized matrix on the GPU in the mlx layout (spec §5b), possibly a stack of
// `batch` matrices of the same shape (the routed experts of one layer):
//   codes  uint32 [batch, rows, cols * bits / 32]   code j of word i = column i*(32/bits)+j, low bits first
//   scales bf16   [batch, rows, cols / group_size]
//   biases bf16   [batch, rows, cols / group_size]
//   w = scale * q + bias
struct QMatrix {
  int batch = 1, rows = 0, cols = 0, bits = 4, group_size = 64;
  const uint32_t* codes = nullptr;
  const bf16* scales = nullptr;
  const bf16* biases = nullptr;

  int64_t words_per_row() const { return int64_t(cols) * bits / 32; }
  int64_t groups_per_row() const { return cols / group_size; }
  // The matrix of one batch entry (one expert).
  QMatrix entry(int i) const {
    QMatrix m = *this;
    m.batch = 1;
    m.codes += int64_t(i) * rows * words_per_row();
    m.scales += int64_t(i) * rows * groups_per_row();
    m.biases += int64_t(i) * rows * groups_per_row();
    return m;
  }
  // Rows [first, first + count) of a single matrix (a part of a row-concatenated one).
  QMatrix row_range(int first, int count) const {
    QMatrix m = *this;
    m.rows = count;
    m.codes += int64_t(first) * words_per_row();
    m.scales += int64_t(first) * groups_per_row();
    m.biases += int64_t(first) * groups_per_row();
    return m;
  }
};

// The matrices of one sparse MoE block (spec §2.7), as the decode and prefill launchers take them.
struct GpuMoe {
  QMatrix router;                    // [E, H] (8-bit in mlx)
  QMatrix experts_gate, experts_up;  // stacks [E, I, H]
  QMatrix experts_down;              // stack [E, H, I]
  QMatrix shared_gate, shared_up;    // [Is, H]
  QMatrix shared_down;               // [H, Is]
  QMatrix shared_expert_gate;        // [1, H] (8-bit in mlx)
};

}  // namespace lily::cuda
