// split_k.cuh: the device side of split_k.h. Device code only.
#pragma once

#include <cstdint>

#include "backend/cuda/gemm/split_k.h"

namespace lily::cuda {

// The K tiles [begin, end) of this block's split (blockIdx.z of gridDim.z) of k_tiles.
struct KRange {
  int begin, end;
};
__device__ __forceinline__ KRange split_k_range(int k_tiles) {
  const int per = (k_tiles + int(gridDim.z) - 1) / int(gridDim.z);
  const int begin = min(k_tiles, int(blockIdx.z) * per);
  return {begin, min(k_tiles, begin + per)};
}

// With gridDim.z > 1: stores this block's acc (every thread's kRegs floats) for output tile
// `tile`, and returns whether this block finished the tile last; then acc holds the sum of all
// splits' stores, added in split order (deterministic), and the tile's ticket is zero again.
// Call it from every thread of the block (it has barriers) after the K loop.
template <int kRegs>
__device__ __forceinline__ bool split_k_finish(float (&acc)[kRegs], const SplitK& s, int tile) {
  static_assert(kRegs % 4 == 0);
  const int64_t threads = blockDim.x, splits = gridDim.z;
  auto part = [&](int64_t z) {
    return reinterpret_cast<float4*>(s.partial + ((int64_t(tile) * splits + z) * threads + threadIdx.x) * kRegs);
  };
  float4* mine = part(blockIdx.z);
#pragma unroll
  for (int i = 0; i < kRegs / 4; ++i) mine[i] = make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]);
  __threadfence();  // the stores before the ticket
  __syncthreads();
  __shared__ uint32_t ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(s.tickets + tile, 1u);
  __syncthreads();
  if (ticket != uint32_t(splits - 1)) return false;
  __threadfence();  // the other blocks' stores after their tickets
#pragma unroll
  for (int r = 0; r < kRegs; ++r) acc[r] = 0.f;
  // kBatch splits' loads in flight before their adds (one L2 round trip per batch, not per
  // split: with 16 splits one at a time the sum took longer than the product), added in order.
  constexpr int kBatch = kRegs >= 32 ? 2 : kRegs >= 16 ? 4 : 8;
  auto add = [&](const float4& v, int i) {
    acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
  };
  int64_t z = 0;
  for (; z + kBatch <= splits; z += kBatch) {
    float4 v[kBatch][kRegs / 4];
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int i = 0; i < kRegs / 4; ++i) v[b][i] = __ldcg(part(z + b) + i);  // from L2: other SMs wrote it
#pragma unroll
    for (int b = 0; b < kBatch; ++b)
#pragma unroll
      for (int i = 0; i < kRegs / 4; ++i) add(v[b][i], i);
  }
  for (; z < splits; ++z)
#pragma unroll
    for (int i = 0; i < kRegs / 4; ++i) add(__ldcg(part(z) + i), i);
  if (threadIdx.x == 0) s.tickets[tile] = 0;
  return true;
}

}  // namespace lily::cuda
