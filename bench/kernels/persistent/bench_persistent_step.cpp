// bench_persistent_step.cpp: the full-size decode step (random weights of Qwen3.6-35B-A3B's
// geometry) as the chain of kernels the backend runs (its graph with programmatic edges) against
// the persistent kernel (persistent/persistent_decode.h), at context depths. Each step is one graph
// of the step alone (no argmax), replayed; printed: the median ms a step over 15 timed replays of
// 16 steps each (the depth grows by those steps), tokens/s, and the GB/s of the bytes a step must
// move (runtime/cost_model.h's decode_bytes_per_token, as lily bench) against the copy bandwidth.
//   .carry/bench/bench_persistent_step [depth ...]     (default 4096 32768 131072)
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/common/cuda_check.h"
#include "../common/median_ms.cuh"
#include "backend/cuda/bench/cuda_bench.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/pdl_graph.h"
#include "backend/cuda/decode_step.h"
#include "backend/cuda/kernel_plan.h"
#include "backend/cuda/sequence_state.h"
#include "runtime/cost_model.h"

using namespace lily;
using namespace lily::cuda;

namespace {

constexpr int kStepsPerGraph = 16;

double ms_per_step(DecodeStep& step, CudaSequenceState& s, bool programmatic, cudaStream_t stream) {
  cudaGraph_t g;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < kStepsPerGraph; ++i) step.record(s, stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &g));
  if (programmatic) make_edges_programmatic(g);
  cudaGraphExec_t e;
  CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  // Each replay adds kStepsPerGraph rows: the depth grows by 272 over the run.
  const double ms = lily::bench::median_ms([&](int) { CUDA_CHECK(cudaGraphLaunch(e, stream)); }, 15, 2, stream);
  CUDA_CHECK(cudaGraphExecDestroy(e));
  CUDA_CHECK(cudaGraphDestroy(g));
  return ms / kStepsPerGraph;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> depths;
  for (int i = 1; i < argc; ++i) depths.push_back(std::atoll(argv[i]));
  if (depths.empty()) depths = {4096, 32768, 131072};
  const ModelConfig c = qwen36_35b_a3b_config();
  auto w = cuda::bench::synthetic_weights(c, 1);
  const KernelPlan plan = plan_kernels(*w, current_device_limits(), 1024);
  DecodePlan persistent_plan = plan.decode;
  persistent_plan.persistent = true;
  DecodeStep chain(*w, plan.decode), persistent(*w, persistent_plan);
  const int32_t token = 11;
  CUDA_CHECK(cudaMemcpy(chain.token(), &token, 4, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(persistent.token(), &token, 4, cudaMemcpyHostToDevice));
  const double copy = cuda::bench::measure_device_copy_bandwidth();
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  std::printf("%s, copy bandwidth %.0f GB/s\n", cuda::bench::device_name().c_str(), copy / 1e9);
  std::printf("%8s %10s %8s %8s %6s %10s %8s %8s %6s\n", "depth", "chain ms", "tok/s", "GB/s", "%", "persist ms",
              "tok/s", "GB/s", "%");
  for (int64_t depth : depths) {
    CudaSequenceState s(c, depth + 40 * kStepsPerGraph);
    cuda::bench::fake_fill(s, depth);
    const double bytes = decode_bytes_per_token(c, depth);  // what lily bench measures against
    const double a = ms_per_step(chain, s, true, stream);
    const double b = ms_per_step(persistent, s, false, stream);
    auto gbs = [&](double ms) { return bytes / (ms * 1e-3) / 1e9; };
    std::printf("%8lld %10.3f %8.1f %8.0f %6.1f %10.3f %8.1f %8.0f %6.1f\n", (long long)depth, a, 1e3 / a, gbs(a),
                100 * gbs(a) * 1e9 / copy, b, 1e3 / b, gbs(b), 100 * gbs(b) * 1e9 / copy);
  }
  CUDA_CHECK(cudaStreamDestroy(stream));
  return 0;
}
