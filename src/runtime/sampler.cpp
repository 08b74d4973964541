#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <unordered_map>

#include "base/error.h"

namespace lily {

namespace {

// The first index of the largest value among the first `limit`.
int32_t argmax(std::span<const float> logits, int32_t limit) {
  const float* v = logits.data();
  int32_t best = 0;
  float best_value = v[0];
  for (int32_t i = 1; i < limit; ++i)
    if (v[i] > best_value) best_value = v[i], best = i;
  return best;
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> history, const SamplingParams& p) {
  if (history.empty()) return;
  std::unordered_map<int32_t, int> counts;
  for (int32_t t : history) ++counts[t];
  for (auto [token, count] : counts) {
    if (token < 0 || size_t(token) >= logits.size()) continue;
    logits[size_t(token)] = penalized_logit(logits[size_t(token)], count, p.penalties());
  }
}

// Descending logit, ties to the lower id: the candidates' order.
struct ByLogit {
  std::span<const float> logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b);
  }
};

// The largest of the first n logits (NaN logits ignored). Not inlined: inlined into
// sample_whole_vocabulary, g++ 12 kept the running maximum in a stack slot (a store-to-load
// chain per token: 1.8 instead of 1.1 ms per sample at 248K logits).
[[gnu::noinline]] float max_logit(std::span<const float> logits, int32_t n) {
  float best = -INFINITY;
  for (float v : logits.first(size_t(n))) best = std::max(best, v);
  return best;
}

// How many of the first n logits are above -inf (not NaN, not masked out by a grammar).
size_t count_finite(std::span<const float> logits, int32_t n) {
  size_t k = 0;
  for (float v : logits.first(size_t(n))) k += v > -INFINITY;
  return k;
}

// The `count` best of the first n tokens in ByLogit order, without sorting the vocabulary: the
// candidates are the tokens within `margin` of the best logit `best` (the margin grows until at
// least `count` are in; tokens below it cannot be among the best), then a partial sort of those.
// Fewer than `count` only if some logits are NaN or -inf (never candidates: a grammar's mask
// leaves most of the row at -inf, and fewer allowed tokens than `count` is then common).
void best_tokens(std::span<const float> logits, int32_t n, size_t count, float best, std::vector<int32_t>& ids) {
  const float* v = logits.data();
  count = std::min(count, size_t(n));
  for (float margin = 8.0f;; margin *= 8.0f) {
    const float floor = best - margin;  // -inf once the margin overflows: every non-NaN token
    ids.clear();
    for (int32_t i = 0; i < n; ++i)
      if (v[i] >= floor) ids.push_back(i);
    if (ids.size() >= count || std::isinf(floor)) break;
    // Too few within the margin: counted once, so that a row with fewer usable tokens than
    // `count` stops here instead of widening the margin ~40 times to the float range.
    if (margin == 8.0f) count = std::min(count, count_finite(logits, n));
    if (ids.size() >= count) break;
  }
  count = std::min(count, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(count), ids.end(), ByLogit{logits});
  ids.resize(count);
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, int32_t vocab_limit) : params_(params), vocab_limit_(vocab_limit) {
  LILY_CHECK(vocab_limit > 0, "sampler needs a vocabulary");
  seed_ = params.seed ? *params.seed : (uint64_t(std::random_device{}()) << 32) ^ std::random_device{}();
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  const int32_t n = std::min<int32_t>(vocab_limit_, int32_t(logits.size()));
  apply_penalties(logits, history, params_);
  if (params_.greedy()) return argmax(logits, n);
  if (params_.top_k > 0 && params_.top_k < n) return sample_top_k(logits, n);
  return sample_whole_vocabulary(logits, n);
}

// top-k on: the k best tokens (a partial sort of k), then the draw from them.
int32_t Sampler::sample_top_k(std::span<const float> logits, int32_t n) {
  best_tokens(logits, n, size_t(params_.top_k), max_logit(logits, n), ids_);
  candidates_.clear();
  for (int32_t id : ids_) candidates_.push_back({id, logits[size_t(id)]});
  return sample_candidates(candidates_);
}

bool Sampler::has_penalties() const { return params_.penalties().any(); }

int Sampler::candidates_needed() const { return has_penalties() ? 0 : candidates_after_penalties(); }

int Sampler::candidates_after_penalties() const {
  if (params_.greedy()) return 1;
  return params_.top_k > 0 && params_.top_k < vocab_limit_ ? params_.top_k : 0;  // else sample() takes the whole row
}

// Softmax with temperature over the candidates, then top-p (the smallest prefix whose mass
// reaches top_p) and min-p (drop tokens below min_p x the first), then a draw (token_draw.h).
// Greedy: the first.
int32_t Sampler::sample_candidates(std::span<const TokenLogit> candidates) {
  LILY_CHECK(!candidates.empty(), "sampler: no candidates (every logit NaN?)");
  if (params_.greedy()) return candidates[0].token;
  std::vector<double> w(candidates.size());
  for (size_t i = 0; i < w.size(); ++i)
    w[i] = candidate_weight(candidates[i].logit, candidates[0].logit, params_.temperature);
  return candidates[size_t(pick_weighted(w.data(), int(w.size()), params_.draw(), next_uniform()))].token;
}

// top-k off: the softmax over the whole vocabulary. One pass computes every weight and the
// total; with no top-p / min-p the draw walks the tokens in id order (no sort at all), otherwise
// only the best tokens are sorted, 64 of them, then 512, 4096, ... until the filters' cut falls
// inside the sorted prefix (the prefix and the draw are what sorting everything would give).
int32_t Sampler::sample_whole_vocabulary(std::span<const float> logits, int32_t n) {
  const float best = max_logit(logits, n);  // NaN logits get weight 0 below
  const float inv_t = 1.0f / params_.temperature;
  weights_.resize(static_cast<size_t>(n));
  // Tokens more than 40 temperature-scaled nats below the best get weight 0 (each below 4e-18
  // of it: together less than 1e-12 of the mass) and cost no exp.
  const float floor_logit = best - 40.0f * params_.temperature;
  double total = 0;
  for (int32_t i = 0; i < n; ++i) {
    const float l = logits[size_t(i)];
    total += weights_[size_t(i)] = l >= floor_logit ? std::exp((l - best) * inv_t) : 0.0f;  // NaN: 0
  }

  if (params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
    const double r = next_uniform() * total;
    double acc = 0;
    int32_t last = 0;
    for (int32_t i = 0; i < n; ++i) {
      if (weights_[size_t(i)] <= 0.0f) continue;
      acc += weights_[size_t(i)];
      last = i;
      if (acc > r) return i;
    }
    return last;  // r within rounding of the total
  }

  std::vector<double> probs;
  size_t cut = 0;
  for (size_t want = std::min<size_t>(64, size_t(n));; want = std::min<size_t>(want * 8, size_t(n))) {
    best_tokens(logits, n, want, best, ids_);
    probs.resize(ids_.size());
    for (size_t i = 0; i < ids_.size(); ++i) probs[i] = double(weights_[size_t(ids_[i])]) / total;
    cut = size_t(filter_cut(probs.data(), int(probs.size()), 1.0, params_.top_p, params_.min_p));
    if (cut > 0) break;
    if (want == size_t(n) || ids_.size() < want) {  // everything sorted (NaN and -inf logits aside)
      cut = ids_.size();
      break;
    }
  }
  return ids_[size_t(draw_index(probs.data(), int(cut), next_uniform()))];  // the cut's tokens, descending
}

// sample()'s three ways, as probabilities: the top-k candidates (double weights, the filters'
// cut), the whole vocabulary without filters (float weights, id order), with filters (the
// sorted prefix the cut falls in).
void Sampler::distribution(std::span<float> logits, std::span<const int32_t> history,
                           std::vector<TokenProbability>& out) {
  const int32_t n = std::min<int32_t>(vocab_limit_, int32_t(logits.size()));
  apply_penalties(logits, history, params_);
  out.clear();
  if (params_.greedy()) {
    out.push_back({argmax(logits, n), 1.0});
    return;
  }
  const float best = max_logit(logits, n);
  auto normalize = [&out](size_t count) {
    out.resize(count);
    double total = 0;
    for (const TokenProbability& t : out) total += t.probability;
    for (TokenProbability& t : out) t.probability /= total;
  };
  if (params_.top_k > 0 && params_.top_k < n) {
    best_tokens(logits, n, size_t(params_.top_k), best, ids_);
    LILY_CHECK(!ids_.empty(), "sampler: no candidates (every logit NaN?)");
    std::vector<double> w(ids_.size());
    for (size_t i = 0; i < w.size(); ++i) {
      w[i] = candidate_weight(logits[size_t(ids_[i])], logits[size_t(ids_[0])], params_.temperature);
      out.push_back({ids_[i], w[i]});
    }
    double total = 0;
    for (double x : w) total += x;
    const int cut = filter_cut(w.data(), int(w.size()), total, params_.top_p, params_.min_p);
    normalize(cut > 0 ? size_t(cut) : w.size());
    return;
  }
  const float inv_t = 1.0f / params_.temperature;
  const float floor_logit = best - 40.0f * params_.temperature;
  weights_.resize(size_t(n));
  double total = 0;
  for (int32_t i = 0; i < n; ++i) {
    const float l = logits[size_t(i)];
    total += weights_[size_t(i)] = l >= floor_logit ? std::exp((l - best) * inv_t) : 0.0f;
  }
  if (params_.top_p >= 1.0f && params_.min_p <= 0.0f) {
    for (int32_t i = 0; i < n; ++i)
      if (weights_[size_t(i)] > 0.0f) out.push_back({i, double(weights_[size_t(i)])});
    LILY_CHECK(!out.empty(), "sampler: no candidates (every logit NaN?)");
    normalize(out.size());
    return;
  }
  std::vector<double> probs;
  size_t cut = 0;
  for (size_t want = std::min<size_t>(64, size_t(n));; want = std::min<size_t>(want * 8, size_t(n))) {
    best_tokens(logits, n, want, best, ids_);
    probs.resize(ids_.size());
    for (size_t i = 0; i < ids_.size(); ++i) probs[i] = double(weights_[size_t(ids_[i])]) / total;
    cut = size_t(filter_cut(probs.data(), int(probs.size()), 1.0, params_.top_p, params_.min_p));
    if (cut > 0) break;
    if (want == size_t(n) || ids_.size() < want) {
      cut = ids_.size();
      break;
    }
  }
  LILY_CHECK(cut > 0, "sampler: no candidates (every logit NaN?)");
  for (size_t i = 0; i < cut; ++i) out.push_back({ids_[i], probs[i]});
  normalize(cut);
}

int32_t Sampler::draw_from(std::span<const TokenProbability> choices) {
  LILY_CHECK(!choices.empty(), "sampler: a draw among no tokens");
  std::vector<double> w(choices.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = choices[i].probability;
  return choices[size_t(draw_index(w.data(), int(w.size()), next_uniform()))].token;
}

namespace {

// log sum_i exp(logits[i]) over the first n, in double; best: their largest.
double log_partition(std::span<const float> logits, int32_t n, float best) {
  double total = 0;
  for (int32_t i = 0; i < n; ++i) total += std::exp(double(logits[size_t(i)]) - best);
  return double(best) + std::log(total);
}

}  // namespace

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t vocab_limit) {
  const int32_t n = std::min<int32_t>(vocab_limit, int32_t(logits.size()));
  return {token, float(double(logits[size_t(token)]) - log_partition(logits, n, max_logit(logits, n)))};
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int count, int32_t vocab_limit) {
  const int32_t n = std::min<int32_t>(vocab_limit, int32_t(logits.size()));
  const float best = max_logit(logits, n);
  std::vector<int32_t> ids;
  best_tokens(logits, n, size_t(std::max(count, 0)), best, ids);
  const double log_z = log_partition(logits, n, best);  // once, not once per entry
  std::vector<TokenLogprob> out;
  for (int32_t id : ids) out.push_back({id, float(double(logits[size_t(id)]) - log_z)});
  return out;
}

}  // namespace lily
