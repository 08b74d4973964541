// split_k.h: the K dimension of a product split over more blocks, for the products of a short
// prefill pass (a few tokens) whose grid would leave most SMs idle: the router's 4 blocks, the
// DeltaNet b/a projections' 1, the shared expert's 16. Each of the Z blocks of an output tile
// sums a contiguous range of K tiles and stores its accumulators; the last to finish (a ticket
// per output tile) adds the Z stores in split order and runs the product's epilogue. Same input,
// same bits: the order of the sum does not depend on which block finishes last.
//
//   partial: [tiles, Z, threads, regs] fp32 (each thread's accumulators, as it holds them)
//   tickets: [tiles] uint32, zero between launches (the last block puts it back)
// Launches on one stream may share a workspace (each finishes before the next starts); two
// streams may not. The device side is split_k.cuh.
#pragma once

#include <cstdint>

#include "backend/cuda/common/device_buffer.h"

namespace lily::cuda {

struct SplitK {
  float* partial = nullptr;
  uint32_t* tickets = nullptr;
  int64_t partial_floats = 0;  // capacity
  int64_t tickets_count = 0;   // capacity: output tiles of one launch
};

// The workspace of one stream's products (16 MB: up to 660 blocks of 4,096 floats).
class SplitKScratch {
 public:
  SplitKScratch();
  const SplitK* get() const { return &view_; }

 private:
  DeviceBuffer partial_, tickets_;
  SplitK view_;
};

// How many blocks share each output tile's K: 1 (no split) without a workspace or when the
// `tiles` blocks already cover the SMs; else enough for ~4 blocks per SM, each at least
// `min_k_tiles` of the `k_tiles`, within the workspace (`floats_per_block` each).
int split_k_count(const SplitK* split, int64_t tiles, int k_tiles, int min_k_tiles, int64_t floats_per_block);

}  // namespace lily::cuda
