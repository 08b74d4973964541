// token_draw.h: the draw of a sampled token from its best candidates, one function for the host
// sampler (runtime/sampler.cpp) and the GPU's chained decode steps (cuda/sampling/choose_token.cu),
// so that a seed gives the same tokens wherever the draw runs; and the penalties applied to the
// logits of the tokens generated so far before the candidates are selected.
//
//   l'       = penalized_logit(l, c) for a token generated c > 0 times: l / r (l > 0) or l · r
//              (repetition r), then minus presence + frequency · c (in double, rounded once)
//   u_i      = draw_uniform(seed, i): the i-th uniform of a request, in [0, 1) (53 bits), from a
//              counter (splitmix64 of seed + i·golden), so any draw can be made without the
//              draws before it
//   w_j      = exp((l_j - l_0) / T) over candidates l_0 >= l_1 >= ... (candidate_weight)
//   p_j      = w_j / sum(w); the cut (filter_cut): top-p keeps the smallest prefix whose mass
//              reaches top_p, min-p stops before the first p_j < min_p · p_0; the smaller cut wins
//   token    = the first j with w_0 + ... + w_j > u · (w_0 + ... + w_{cut-1}) (draw_index;
//              pick_weighted both)
//
// Plain arithmetic in double, in candidate order: the host and the device compute the same sums
// (exp may differ in its last bit between the two libraries, moving a draw only when u falls
// within ~1e-16 of a boundary).
// Tested: tests/runtime/test_sampler.cpp (distributions, filters, seeds), tests/runtime/
// test_generate.cpp (chained steps = stepwise draws), tests/cuda/test_cuda_forward.cpp (the GPU).
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define LILY_HOST_DEVICE __host__ __device__
#else
#define LILY_HOST_DEVICE
#endif

namespace lily {

// The penalties on the logits of tokens already generated (SamplingParams').
struct Penalties {
  float presence = 0.0f;
  float frequency = 0.0f;
  float repetition = 1.0f;  // 1: off
  LILY_HOST_DEVICE bool any() const { return presence != 0.0f || frequency != 0.0f || repetition != 1.0f; }
};

// The logit of a token generated `count` > 0 times so far. The sum presence + frequency * count is
// exact in double (a float times an int below 2^29), so no compiler's contraction changes it.
LILY_HOST_DEVICE inline float penalized_logit(float logit, int count, const Penalties& p) {
  if (p.repetition != 1.0f) logit = logit > 0 ? logit / p.repetition : logit * p.repetition;
  const double penalty = double(p.presence) + double(p.frequency) * double(count);
  return float(double(logit) - penalty);
}

// How a sampled token is drawn from its candidates (SamplingParams' filters after top-k).
struct DrawParams {
  float temperature = 1.0f;  // > 0 (temperature 0 is greedy: no draw)
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
};

LILY_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The index-th uniform of the stream `seed`, in [0, 1).
LILY_HOST_DEVICE inline double draw_uniform(uint64_t seed, uint64_t index) {
  const uint64_t x = splitmix64(seed ^ splitmix64(index * 0x9E3779B97F4A7C15ull));
  return double(x >> 11) * 0x1.0p-53;
}

// The unnormalized weight of a candidate of logit `logit` when the best is `best`.
LILY_HOST_DEVICE inline double candidate_weight(float logit, float best, float temperature) {
  return ::exp((double(logit) - double(best)) / double(temperature));
}

// Where top-p and min-p cut candidates of weights w[0 .. n) (w[0] the best, descending) whose
// probabilities are w / total: the number kept, or 0 when neither filter cuts inside the n.
LILY_HOST_DEVICE inline int filter_cut(const double* w, int n, double total, float top_p, float min_p) {
  const double p0 = w[0] / total;
  double mass = 0;
  for (int j = 0; j < n; ++j) {
    const double p = w[j] / total;
    if (min_p > 0.0f && j > 0 && p < double(min_p) * p0) return j;
    mass += p;
    if (top_p < 1.0f && mass >= double(top_p)) return j + 1;
  }
  return 0;
}

// The index u in [0, 1) draws among weights w[0 .. n): the first whose running sum passes u times
// their sum.
LILY_HOST_DEVICE inline int draw_index(const double* w, int n, double u) {
  double kept = 0;
  for (int j = 0; j < n; ++j) kept += w[j];
  const double target = u * kept;
  double acc = 0;
  for (int j = 0; j < n; ++j) {
    acc += w[j];
    if (acc > target) return j;
  }
  return n - 1;  // u · kept within rounding of the sum
}

// The candidate drawn by u in [0, 1) among w[0 .. n) after the filters' cut.
LILY_HOST_DEVICE inline int pick_weighted(const double* w, int n, const DrawParams& p, double u) {
  double total = 0;
  for (int j = 0; j < n; ++j) total += w[j];
  const int cut = filter_cut(w, n, total, p.top_p, p.min_p);
  return draw_index(w, cut > 0 ? cut : n, u);
}

}  // namespace lily
