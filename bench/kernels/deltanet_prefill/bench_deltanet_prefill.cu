// bench_deltanet_prefill.cu: microseconds per gated_deltanet_prefill call (conv, delta rule, gated
// norm) at the model's size (Hk 16, Hv 32), both forms of the delta rule, per prompt length: the
// table the kernel plan's crossover (PrefillPlan::chunked_delta_rule_from) comes from; and for
// passes of 1 .. 16 tokens the decode kernel (rows) against the token loop (deltanet_rows_up_to); the
// chunked rule alone on 64 and 512 tokens. Random
// inputs; the median of 20 (5 from 1024 tokens) calls after 3 warm-ups, timed with events.
// The kernels one by one: nsys profile --stats=true, or ncu -k regex:'conv|gated_norm|chunk'.
#include "backend/cuda/common/cuda_check.h"  // first: it sets up fmt for nvcc
#include "../common/median_ms.cuh"
#include "backend/cuda/deltanet/deltanet_prefill.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

using namespace lily;

namespace {

// n floats uniform in [center - spread, center + spread] from a hash of the index.
__global__ void fill(float* p, size_t n, uint32_t seed, float center, float spread) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = uint32_t(i) * 2654435761u ^ seed;
    x ^= x >> 13, x *= 0x5bd1e995u, x ^= x >> 15;
    p[i] = center + spread * (float(x) * (2.f / 4294967296.f) - 1.f);
  }
}

float* random_floats(size_t n, uint32_t seed, float center, float spread) {
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(n, 4) * 4));
  fill<<<256, 256>>>(p, n, seed, center, spread);
  CUDA_CHECK_LAUNCH();
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  // `bench_deltanet_prefill rule`: only the chunked rule alone (for ncu -k regex:deltanet_chunk).
  const bool rule_only = argc > 1 && std::string(argv[1]) == "rule";
  const int Tmax = 4096, Hk = 16, Hv = 32;
  cuda::DeltaNetParams p;
  p.num_key_heads = Hk, p.num_value_heads = Hv;
  const int C = p.conv_dim();
  p.conv_weight = random_floats(size_t(C) * 4, 1, 0.f, 0.3f);
  p.A_log = random_floats(Hv, 2, 1.f, 1.f);
  p.dt_bias = random_floats(Hv, 3, 0.f, 0.5f);
  p.norm_weight = random_floats(128, 4, 1.f, 0.1f);
  float* conv = random_floats(size_t(3) * C, 5, 0.f, 1.f);
  float* ssm = random_floats(size_t(Hv) * 128 * 128, 6, 0.f, 0.01f);
  float* mixed = random_floats(size_t(Tmax) * C, 7, 0.f, 1.f);
  float* z = random_floats(size_t(Tmax) * Hv * 128, 8, 0.f, 1.f);
  float* b = random_floats(size_t(Tmax) * Hv, 9, 0.f, 1.f);
  float* a = random_floats(size_t(Tmax) * Hv, 10, 0.f, 1.f);
  float* y = random_floats(size_t(Tmax) * Hv * 128, 11, 0.f, 1.f);
  p.T = Tmax;
  void* scratch = nullptr;  // the chunked form's is the larger
  CUDA_CHECK(cudaMalloc(&scratch, cuda::deltanet_prefill_scratch_bytes(cuda::DeltaRulePrefill::chunked, p)));
  auto time_us = [&](cuda::DeltaRulePrefill form, int T) {
    p.T = T;
    auto call = [&] { cuda::gated_deltanet_prefill(form, p, mixed, z, b, a, conv, ssm, y, scratch, nullptr); };
    return float(1000.0 * bench::median_ms(call, T <= 512 ? 20 : 5, 3));
  };
  std::printf("%6s %14s %14s %8s\n", "T", "rows us", "recurrent us", "ratio");
  for (int T : {1, 2, 4, 5, 8, 9, 12, 16}) {
    if (rule_only) break;
    const float rows = time_us(cuda::DeltaRulePrefill::rows, T), loop = time_us(cuda::DeltaRulePrefill::recurrent, T);
    std::printf("%6d %14.1f %14.1f %8.2f\n", T, rows, loop, rows / loop);
  }
  std::printf("%6s %14s %14s %8s\n", "T", "recurrent us", "chunked us", "ratio");
  for (int T : {2, 16, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096}) {
    if (rule_only) break;
    const float loop = time_us(cuda::DeltaRulePrefill::recurrent, T),
                chunked = time_us(cuda::DeltaRulePrefill::chunked, T);
    std::printf("%6d %14.1f %14.1f %8.2f\n", T, loop, chunked, loop / chunked);
  }
  // The chunked rule alone (deltanet_chunked.cu's three launches) on one prefill window: the rest
  // of a call is the conv, the conv state and the gated norm.
  std::printf("%6s %14s\n", "n", "rule alone us");
  for (int n : {512, 64}) {
    cuda::DeltaRuleChunkedArgs r;
    r.n = n, r.num_key_heads = Hk, r.num_value_heads = Hv, r.conv_dim = C;
    r.u = mixed, r.b = b, r.a = a, r.A_log = p.A_log, r.dt_bias = p.dt_bias, r.ssm_state = ssm, r.o = y;
    r.scratch = scratch;  // the prefill's scratch for 4096 tokens holds the rule's for 512
    std::printf("%6d %14.1f\n", n, 1000.0 * bench::median_ms([&] { cuda::delta_rule_chunked(r, nullptr); }, 20, 3));
  }
  return 0;
}
