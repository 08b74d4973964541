// fake_fill.cu: a sequence's KV cache filled with random bf16 and its length set, nothing
// computed (bench/cuda_bench.h): decode at a context depth without prefilling it.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "backend/cuda/bench/cuda_bench.h"
#include "backend/cuda/sequence_state.h"

namespace lily::cuda::bench {

namespace {

// bf16 values uniform in [-0.1, 0.1) from a hash of the index.
__global__ void fill_bf16(uint16_t* p, uint64_t n, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u + seed;
    x ^= x >> 15;
    const float f = (float(x & 0xffff) / 65536.f - 0.5f) * 0.2f;
    p[i] = uint16_t(__float_as_uint(f) >> 16);
  }
}

}  // namespace

void fake_fill(SequenceState& state, int64_t length) {
  CudaSequenceState& s = as_cuda(state);
  LILY_CHECK(length >= 0 && length <= s.capacity(), "fake_fill: {} tokens, capacity {}", length, s.capacity());
  for (size_t i = 0; i < s.attention_layers(); ++i) {
    const uint64_t n = s.kv_cache_bytes(i) / 2;
    fill_bf16<<<1024, 256>>>(reinterpret_cast<uint16_t*>(s.k_cache(i)), n, uint32_t(i));
    fill_bf16<<<1024, 256>>>(reinterpret_cast<uint16_t*>(s.v_cache(i)), n, uint32_t(i + 99));
  }
  CUDA_CHECK_LAUNCH();
  s.set_length(length);
}

}  // namespace lily::cuda::bench
