// batch_rows.h: the rows of a batch step (one token of each of N distinct sequences: parallel
// requests) as the kernels see them: device tables of each row's position, capacity, and every
// layer's KV cache and DeltaNet state. A step's graph reads the tables, so one graph per N
// serves any N sequences: the host writes the tables (pinned, a few KB) and they are copied in
// ahead of the step in stream order.
//
// Layout (device, one allocation):  position [N] int32*  · capacity [N] int32 ·
//   k_cache, v_cache [attention layers][N] bf16*  · conv, ssm [DeltaNet layers][N] float*.
#pragma once

#include <cstdint>
#include <span>

#include "backend/cuda/common/device_buffer.h"
#include "backend/cuda/common/gpu_types.h"
#include "backend/cuda/common/row_tables.h"
#include "backend/cuda/sequence_state.h"
#include "model/config.h"

namespace lily::cuda {

class BatchRows {
 public:
  explicit BatchRows(const ModelConfig& c);
  ~BatchRows();
  BatchRows(const BatchRows&) = delete;
  BatchRows& operator=(const BatchRows&) = delete;

  // The tables of `states` (N <= kMaxBatchRows) into the pinned staging (host only), and the
  // staging to the device in stream order (a captured graph's copy node replays upload). The
  // caller synchronizes before it fills them again.
  void fill(std::span<CudaSequenceState* const> states);
  void upload(cudaStream_t stream) const;

  AttentionRows attention(size_t layer) const;  // layer: its index among the attention layers
  DeltaNetRows deltanet(size_t layer) const;    // among the DeltaNet layers
  int32_t* const* positions() const;

 private:
  size_t attention_layers_ = 0, deltanet_layers_ = 0, words_ = 0;
  DeviceBuffer device_;
  uint64_t* host_ = nullptr;  // pinned [words_]
};

// *position[r] += 1 for r < N, in stream order (a kernel of the captured step: PDL-aware).
void advance_positions(int32_t* const* position, int N, cudaStream_t stream);

}  // namespace lily::cuda
