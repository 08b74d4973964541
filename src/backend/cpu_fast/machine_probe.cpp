// machine_probe.cpp: the read-bandwidth and FMA probes of machine_probe.h: portable loops that
// the compiler vectorizes, cloned per x86-64 level (base/cpu_clones.h).
#include "backend/cpu_fast/machine_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "base/cpu_clones.h"
#include "base/thread_team.h"

namespace lily::cpu_fast {

namespace {

// The probes measure the machine, not lily's code: the sanitizers stay out of their loops, and the
// FMA is the builtin (in the sanitized build std::fma stayed an out-of-line call to libm's fmaf:
// 0.7 GFLOP/s, a "ceiling" the -O3 kernels beat by 2-3x).
#define LILY_PROBE __attribute__((no_sanitize("address", "undefined")))

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A sum of n words in 8 independent lanes (the loads, not the adds, are what is timed).
LILY_PROBE LILY_CPU_CLONES uint64_t sum_words(const uint64_t* p, int64_t n) {
  uint64_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t i = 0; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += p[i + j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// `steps` rounds of a = a * m + c on 128 independent lanes: 256 FLOP a round.
LILY_PROBE LILY_CPU_CLONES float fma_chains(int64_t steps, float m, float c) {
  float a[128];
  for (int j = 0; j < 128; ++j) a[j] = float(j);
  for (int64_t s = 0; s < steps; ++s)
    for (int j = 0; j < 128; ++j) a[j] = __builtin_fmaf(a[j], m, c);
  float sum = 0;
  for (int j = 0; j < 128; ++j) sum += a[j];
  return sum;
}

}  // namespace

double measure_read_bandwidth() {
  constexpr int64_t kBytes = int64_t(256) << 20, kWords = kBytes / 8, kPageWords = 4096 / 8;
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[size_t(kWords)]);
  ThreadTeam& team = cpu_team();
  // Each member touches its own pages first (first touch places them near it).
  team.run([&](ThreadTeam::Member& m) {
    const auto [w0, w1] = m.share(kWords, kPageWords);
    std::memset(buffer.get() + w0, 1, size_t(w1 - w0) * 8);
  });
  double best = 1e30;
  uint64_t sink = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    team.run([&](ThreadTeam::Member& m) {
      const auto [w0, w1] = m.share(kWords, kPageWords);
      const uint64_t s = sum_words(buffer.get() + w0, w1 - w0);
      if (s == 42) sink += s;  // keeps the sum, never true (every word is 0x0101..)
    });
    best = std::min(best, seconds_since(t0));
  }
  return double(kBytes + int64_t(sink)) / best;
}

double measure_fp32_flops() {
  constexpr int64_t kSteps = 1 << 18;  // 67 MFLOP a member, about 2 ms at 32 GFLOP/s
  ThreadTeam& team = cpu_team();
  double best = 1e30;
  float sink = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    team.run([&](ThreadTeam::Member& m) {
      const float s = fma_chains(kSteps, 0.999999f, 1e-7f * float(m.index() + 1));
      if (std::isnan(s)) sink += s;
    });
    best = std::min(best, seconds_since(t0));
  }
  return 256.0 * double(kSteps) * team.size() / best + double(sink);
}

}  // namespace lily::cpu_fast
