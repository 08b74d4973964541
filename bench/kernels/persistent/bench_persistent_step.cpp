// bench_persistent_step.cpp: the full-size decode step (random weights of Qwen3.6-35B-A3B's
// geometry) as the chain of kernels the backend runs (its graph with programmatic edges) against
// the persistent kernel (persistent/persistent_decode.h), at context depths. Each step is one graph
// of the step alone (no argmax), replayed; printed: the median ms a step over 15 timed replays of
// 16 steps each (the depth grows by those steps), tokens/s, and the GB/s of the bytes a step must
// move (runtime/cost_model.h's decode_bytes_per_token, as lily bench) against the copy bandwidth.
//   .carry/bench/bench_persistent_step [depth ...]     (default 4096 32768 131072)
//   .carry/bench/bench_persistent_step --trace DEPTH FILE [LOOKAHEAD_KB [OWN]]: one step's every task
//     (block, op, layer, counters, step_args.h's marks in ns) as CSV, for tools/persistent_trace.py,
//     and the median step of the same kernel settings (StepArgs::lookahead_bytes, prefetch_own)
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda/common/cuda_check.h"
#include "../common/median_ms.cuh"
#include "backend/cuda/bench/cuda_bench.h"
#include "backend/cuda/common/device_info.h"
#include "backend/cuda/common/pdl_graph.h"
#include "backend/cuda/decode_step.h"
#include "backend/cuda/kernel_plan.h"
#include "backend/cuda/persistent/persistent_decode.h"
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

// One step at `depth` (after two untraced ones) with every task's times, as CSV into `path`; the
// median step of the same settings.
void trace_step(const GpuWeights& w, int64_t depth, const char* path, int lookahead_kb, int own) {
  const ModelConfig& c = w.config();
  DeviceBuffer token(4), logits(size_t(c.vocab_size) * 4);
  const int32_t id = 11;
  CUDA_CHECK(cudaMemcpy(token.get(), &id, 4, cudaMemcpyHostToDevice));
  persistent::PersistentDecode p(w, persistent::persistent_decode_tiling(c, multiprocessor_count()),
                                 token.as<int32_t>(), logits.as<float>());
  const std::vector<persistent::DeviceTask>& tasks = p.flat_tasks();
  constexpr int M = persistent::kTraceMarks;
  p.prefetch(uint32_t(lookahead_kb) * 1024, own);
  DeviceBuffer trace(tasks.size() * M * 8);
  CUDA_CHECK(cudaMemset(trace.get(), 0, tasks.size() * M * 8));
  CudaSequenceState s(c, depth + 80);
  cuda::bench::fake_fill(s, depth);
  // Four untimed steps (the third traced), then the median of 20.
  const double ms = lily::bench::median_ms(
      [&](int i) {
        p.trace_into(i == 2 ? trace.as<uint64_t>() : nullptr);
        p.record(s, nullptr);
      },
      20, 4);
  std::vector<uint64_t> t(tasks.size() * M);
  CUDA_CHECK(cudaMemcpy(t.data(), trace.get(), t.size() * 8, cudaMemcpyDeviceToHost));
  uint64_t t0 = ~uint64_t(0);
  for (size_t i = 0; i < tasks.size(); ++i) t0 = std::min(t0, t[M * i]);
  auto rel = [&](uint64_t v) { return v ? (unsigned long long)(v - t0) : 0ull; };
  std::FILE* f = std::fopen(path, "w");
  LILY_CHECK(f, "cannot write {}", path);
  std::fprintf(f, "block,index,op,layer,slot,first,count,signal,wait0,wait1,known,begin,ready,staged,dotted,done\n");
  const std::vector<uint32_t>& begin = p.block_begin();
  for (size_t b = 0; b + 1 < begin.size(); ++b)
    for (uint32_t i = begin[b]; i < begin[b + 1]; ++i) {
      const persistent::DeviceTask& d = tasks[i];
      auto id = [](uint32_t c) { return c == persistent::kNoCounter ? -1 : int64_t(c); };
      std::fprintf(f, "%zu,%u,%s,%d,%d,%u,%u,%d,%lld,%lld,%lld,%llu,%llu,%llu,%llu,%llu\n", b, i - begin[b],
                   persistent::op_name(persistent::DecodeOp(d.op)), d.layer, d.slot, d.first, d.count, d.signal,
                   (long long)id(d.wait[0]), (long long)id(d.wait[1]), (long long)id(d.known), rel(t[M * i]),
                   rel(t[M * i + 1]), rel(t[M * i + 2]), rel(t[M * i + 3]), rel(t[M * i + 4]));
    }
  std::fclose(f);
  std::printf("depth %lld, lookahead %d KB, own prefetch %d: median step %.3f ms (20 steps); traced one into %s\n",
              (long long)depth, lookahead_kb, own, ms, path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "--trace") {
    auto w = cuda::bench::synthetic_weights(qwen36_35b_a3b_config(), 1);
    trace_step(*w, std::atoll(argv[2]), argv[3], argc > 4 ? std::atoi(argv[4]) : 192,
               argc > 5 ? std::atoi(argv[5]) : 1);
    return 0;
  }
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
