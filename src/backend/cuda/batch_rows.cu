// batch_rows.cu: see batch_rows.h.
#include "backend/cuda/common/cuda_check.h"  // first: it configures fmt for nvcc
#include "backend/cuda/batch_rows.h"

#include <cstring>

#include "backend/cuda/common/pdl.cuh"

namespace lily::cuda {

namespace {

// The tables as 8-byte words: positions, capacities (int32, padded to a whole number of words),
// then the layers' pointer rows.
constexpr size_t kPositions = 0;
constexpr size_t kCapacities = kMaxBatchRows;
constexpr size_t kLayers = kCapacities + kMaxBatchRows / 2;

__global__ void advance_positions_kernel(int32_t* const* position, int N) {
  pdl_wait();
  pdl_launch_dependents();
  if (int(threadIdx.x) < N) *position[threadIdx.x] += 1;
}

}  // namespace

BatchRows::BatchRows(const ModelConfig& c) {
  for (LayerKind kind : c.layer_types) (kind == LayerKind::full_attention ? attention_layers_ : deltanet_layers_)++;
  words_ = kLayers + (2 * attention_layers_ + 2 * deltanet_layers_) * kMaxBatchRows;
  device_ = DeviceBuffer(words_ * 8);
  CUDA_CHECK(cudaMallocHost(&host_, words_ * 8));
  std::memset(host_, 0, words_ * 8);
}

BatchRows::~BatchRows() { cudaFreeHost(host_); }

void BatchRows::fill(std::span<CudaSequenceState* const> states) {
  const size_t N = states.size();
  LILY_CHECK(N >= 1 && N <= size_t(kMaxBatchRows), "a batch step of {} sequences (1 to {})", N, kMaxBatchRows);
  int32_t* capacity = reinterpret_cast<int32_t*>(host_ + kCapacities);
  uint64_t* layer = host_ + kLayers;
  for (size_t r = 0; r < N; ++r) {
    const CudaSequenceState& s = *states[r];
    LILY_CHECK(s.attention_layers() == attention_layers_, "a batch step's sequence {} has {} attention layers, not {}",
               r, s.attention_layers(), attention_layers_);
    host_[kPositions + r] = reinterpret_cast<uint64_t>(s.position());
    capacity[r] = int32_t(s.capacity());
    for (size_t i = 0; i < attention_layers_; ++i) {
      layer[(2 * i) * kMaxBatchRows + r] = reinterpret_cast<uint64_t>(s.k_cache(i));
      layer[(2 * i + 1) * kMaxBatchRows + r] = reinterpret_cast<uint64_t>(s.v_cache(i));
    }
    uint64_t* dn = layer + 2 * attention_layers_ * kMaxBatchRows;
    for (size_t i = 0; i < deltanet_layers_; ++i) {
      dn[(2 * i) * kMaxBatchRows + r] = reinterpret_cast<uint64_t>(s.conv(i));
      dn[(2 * i + 1) * kMaxBatchRows + r] = reinterpret_cast<uint64_t>(s.ssm(i));
    }
  }
}

void BatchRows::upload(cudaStream_t stream) const {
  CUDA_CHECK(cudaMemcpyAsync(device_.get(), host_, words_ * 8, cudaMemcpyHostToDevice, stream));
}

AttentionRows BatchRows::attention(size_t layer) const {
  uint64_t* base = device_.as<uint64_t>();
  AttentionRows r;
  r.position = reinterpret_cast<int32_t* const*>(base + kPositions);
  r.capacity = reinterpret_cast<const int32_t*>(base + kCapacities);
  r.k_cache = reinterpret_cast<bf16* const*>(base + kLayers + (2 * layer) * kMaxBatchRows);
  r.v_cache = reinterpret_cast<bf16* const*>(base + kLayers + (2 * layer + 1) * kMaxBatchRows);
  return r;
}

DeltaNetRows BatchRows::deltanet(size_t layer) const {
  uint64_t* dn = device_.as<uint64_t>() + kLayers + 2 * attention_layers_ * kMaxBatchRows;
  return {reinterpret_cast<float* const*>(dn + (2 * layer) * kMaxBatchRows),
          reinterpret_cast<float* const*>(dn + (2 * layer + 1) * kMaxBatchRows)};
}

int32_t* const* BatchRows::positions() const {
  return reinterpret_cast<int32_t* const*>(device_.as<uint64_t>() + kPositions);
}

void advance_positions(int32_t* const* position, int N, cudaStream_t stream) {
  LILY_CHECK(N >= 1 && N <= kMaxBatchRows, "advance_positions: {} rows", N);
  advance_positions_kernel<<<1, 32, 0, stream>>>(position, N);
  CUDA_CHECK_LAUNCH();
}

}  // namespace lily::cuda
