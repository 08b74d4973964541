// bench_gemv_gguf.cpp (part of bench_cpu_fast): one GGUF block-format product y = W x on one
// thread (gemv_gguf.h), the integer kernel (x quantized to 16 bits per group of 64, its
// preparation inside the timing) against the fp32 one that widens each code to float (the path
// a type without an integer kernel takes), at an expert's shapes [512, 2048] (gate / up) and
// [2048, 512] (down).
//
//   LILY_THREADS=1 build/bench/cpu_fast/bench_cpu_fast --benchmark_filter=GemvGguf
//
// Args: ggml type, rows, cols, kernel (0 fp32, 1 integer), matrices (1: the same one each
// time, in L2 / L3; 160: cycled through, ~115 MB of Q5_K, so each product reads its weights
// from memory, as a decode step's experts do). bytes_per_second counts the weight bytes read;
// read_GBps is the read bandwidth of cpu_team()'s threads (machine_probe.h, measured once).
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <vector>

#include "backend/cpu_fast/gemv.h"
#include "backend/cpu_fast/gemv_gguf.h"
#include "backend/cpu_fast/machine_probe.h"
#include "model/gguf_types.h"
#include "model/weights.h"

namespace lily {
namespace {

uint64_t next_random(uint64_t& s) {  // xorshift64*
  s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
  return s * 2685821657736338717ull;
}

// Where each block type keeps its f16 scales (the other bytes are codes, any value will do).
std::vector<int> f16_offsets(GgmlType type) {
  switch (type) {
    case GgmlType::Q4_K:
    case GgmlType::Q5_K: return {0, 2};
    case GgmlType::Q6_K: return {208};
    default: return {0};
  }
}

// Random blocks with finite f16 scales of 2^-7 (the value is 0x2000).
std::vector<uint8_t> random_gguf_bytes(GgmlType type, int64_t rows, int64_t cols, uint64_t seed) {
  const GgmlTypeInfo& info = ggml_type_info(type);
  std::vector<uint8_t> bytes(size_t(rows * ggml_row_bytes(type, cols)));
  for (auto& b : bytes) b = uint8_t(next_random(seed) >> 56);
  for (size_t at = 0; at < bytes.size(); at += size_t(info.block_bytes))
    for (int off : f16_offsets(type)) bytes[at + size_t(off)] = 0x00, bytes[at + size_t(off) + 1] = 0x20;
  return bytes;
}

double read_bandwidth_gbps() {
  static const double gbps = cpu_fast::measure_read_bandwidth() / 1e9;
  return gbps;
}

void BM_GemvGguf(benchmark::State& state) {
  const auto type = GgmlType(state.range(0));
  const int64_t rows = state.range(1), cols = state.range(2), count = state.range(4);
  const bool integer = state.range(3) != 0;
  std::vector<std::vector<uint8_t>> stores;
  std::vector<Matrix> mats;
  for (int64_t i = 0; i < count; ++i) {
    stores.push_back(random_gguf_bytes(type, rows, cols, 1 + uint64_t(i)));
    Matrix& m = mats.emplace_back();
    m.rows = rows, m.cols = cols, m.format = MatrixFormat::gguf, m.gguf_type = type, m.data = stores.back().data();
  }
  if (integer && !cpu_fast::gguf_integer_supported(mats[0])) {
    state.SkipWithError("no integer kernel for this type on this processor");
    return;
  }
  std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(rows));
  uint64_t seed = 7;
  for (auto& v : x) v = float(int64_t(next_random(seed) >> 40) - (int64_t(1) << 23)) / float(1 << 23);
  cpu_fast::QuantizedInput in;
  int64_t i = 0;
  for (auto _ : state) {
    const Matrix& m = mats[size_t(i++ % count)];
    if (integer) {
      cpu_fast::prepare_input(m, x.data(), in);
      cpu_fast::gguf_gemv_rows(m, in, 0, rows, y.data());
    } else {
      cpu_fast::gguf_gemv_rows(m, x.data(), 0, rows, y.data());
    }
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(ggml_row_bytes(type, cols) * rows));
  state.counters["read_GBps"] = read_bandwidth_gbps();
  state.SetLabel(fmt::format("{} {}{}", to_string(type), integer ? "integer" : "fp32", count > 1 ? " memory" : ""));
}

void gemv_gguf_args(benchmark::internal::Benchmark* b) {
  for (GgmlType type : {GgmlType::Q5_K, GgmlType::Q4_K, GgmlType::Q4_0})
    for (int64_t count : {1, 160})
      for (int integer = 0; integer < 2; ++integer) {
        b->Args({int64_t(type), 512, 2048, integer, count});
        b->Args({int64_t(type), 2048, 512, integer, count});
      }
}
BENCHMARK(BM_GemvGguf)->Apply(gemv_gguf_args)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace lily
