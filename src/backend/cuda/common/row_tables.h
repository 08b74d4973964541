// row_tables.h: how the kernels of a batch step (one token of each of N distinct sequences) find
// each row's state: device tables, one entry a row (batch_rows.h builds them). Host and device.
#pragma once

#include <cstdint>

#include "backend/cuda/common/gpu_types.h"

namespace lily::cuda {

constexpr int kMaxBatchRows = 16;  // sequences a batch step takes (gemv_rows' rows)

// One attention layer's view: row r's state is entry r of each table.
struct AttentionRows {
  int32_t* const* position = nullptr;  // [N] each row's device position (= its cached length)
  const int32_t* capacity = nullptr;   // [N] rows each row's caches hold
  bf16* const* k_cache = nullptr;      // [N] this layer's [capacity, nkv, head_dim] caches
  bf16* const* v_cache = nullptr;
};

// One DeltaNet layer's view.
struct DeltaNetRows {
  float* const* conv = nullptr;  // [N] this layer's [K-1, conv_dim] conv states
  float* const* ssm = nullptr;   // [N] this layer's [Hv, 128, 128] recurrent states
};

}  // namespace lily::cuda
