// split_k.cpp: see split_k.h.
#include "backend/cuda/gemm/split_k.h"

#include <algorithm>

#include "backend/cuda/common/device_info.h"

namespace lily::cuda {

namespace {

constexpr int64_t kPartialFloats = int64_t(4) << 20;  // 16 MB
constexpr int64_t kTickets = 1024;
constexpr int kBlocksPerSm = 4;  // enough loads in flight to stream the weights of a short pass

}  // namespace

SplitKScratch::SplitKScratch() : partial_(uint64_t(kPartialFloats) * 4), tickets_(uint64_t(kTickets) * 4) {
  CUDA_CHECK(cudaMemset(tickets_.get(), 0, uint64_t(kTickets) * 4));
  view_ = SplitK{partial_.as<float>(), tickets_.as<uint32_t>(), kPartialFloats, kTickets};
}

int split_k_count(const SplitK* split, int64_t tiles, int k_tiles, int min_k_tiles, int64_t floats_per_block) {
  const int sms = multiprocessor_count();
  if (!split || tiles >= sms || tiles > split->tickets_count || k_tiles < 2 * min_k_tiles) return 1;
  int64_t z = (int64_t(kBlocksPerSm) * sms + tiles - 1) / tiles;
  z = std::min<int64_t>(z, k_tiles / min_k_tiles);
  z = std::min<int64_t>(z, split->partial_floats / (tiles * floats_per_block));
  z = std::max<int64_t>(std::min<int64_t>(z, 65535), 1);  // gridDim.z
  // No empty split: z splits of ceil(k_tiles / z) tiles, the last one shorter.
  const int64_t per = (k_tiles + z - 1) / z;
  return int((k_tiles + per - 1) / per);
}

}  // namespace lily::cuda
