#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "base/error.h"

namespace lily {

namespace {

int32_t argmax(std::span<const float> logits, int32_t limit) {
  int32_t best = 0;
  for (int32_t i = 1; i < limit; ++i)
    if (logits[size_t(i)] > logits[size_t(best)]) best = i;
  return best;
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> history, const SamplingParams& p) {
  if (history.empty()) return;
  std::unordered_map<int32_t, int> counts;
  for (int32_t t : history) ++counts[t];
  for (auto [token, count] : counts) {
    if (token < 0 || size_t(token) >= logits.size()) continue;
    float& l = logits[size_t(token)];
    if (p.repetition_penalty != 1.0f) l = l > 0 ? l / p.repetition_penalty : l * p.repetition_penalty;
    l -= p.presence_penalty + p.frequency_penalty * float(count);
  }
}

}  // namespace

Sampler::Sampler(const SamplingParams& params, int32_t vocab_limit) : params_(params), vocab_limit_(vocab_limit) {
  LILY_CHECK(vocab_limit > 0, "sampler needs a vocabulary");
  rng_.seed(params.seed ? *params.seed : std::random_device{}());
}

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  const int32_t n = std::min<int32_t>(vocab_limit_, int32_t(logits.size()));
  apply_penalties(logits, history, params_);
  if (params_.greedy()) return argmax(logits, n);

  // Candidates sorted by logit, highest first; top-k cuts the list.
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); };
  size_t keep = params_.top_k > 0 ? std::min<size_t>(size_t(params_.top_k), ids.size()) : ids.size();
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(keep), ids.end(), by_logit);
  ids.resize(keep);

  // Softmax with temperature over the candidates.
  std::vector<double> probs(ids.size());
  const double max_logit = logits[size_t(ids[0])];
  double total = 0;
  for (size_t i = 0; i < ids.size(); ++i)
    total += probs[i] = std::exp((double(logits[size_t(ids[i])]) - max_logit) / params_.temperature);
  for (auto& p : probs) p /= total;

  // top-p: the smallest prefix whose mass reaches top_p; min-p: drop tokens below min_p * max.
  size_t cut = probs.size();
  if (params_.top_p < 1.0f) {
    double mass = 0;
    for (size_t i = 0; i < probs.size(); ++i) {
      mass += probs[i];
      if (mass >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
  }
  if (params_.min_p > 0.0f) {
    const double floor = params_.min_p * probs[0];
    size_t i = 1;
    while (i < cut && probs[i] >= floor) ++i;
    cut = i;
  }
  std::discrete_distribution<size_t> draw(probs.begin(), probs.begin() + ptrdiff_t(cut));
  return ids[draw(rng_)];
}

TokenLogprob token_logprob(std::span<const float> logits, int32_t token, int32_t vocab_limit) {
  const int32_t n = std::min<int32_t>(vocab_limit, int32_t(logits.size()));
  const float max_logit = *std::max_element(logits.begin(), logits.begin() + n);
  double total = 0;
  for (int32_t i = 0; i < n; ++i) total += std::exp(double(logits[size_t(i)]) - max_logit);
  return {token, float(double(logits[size_t(token)]) - max_logit - std::log(total))};
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int count, int32_t vocab_limit) {
  const int32_t n = std::min<int32_t>(vocab_limit, int32_t(logits.size()));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  std::iota(ids.begin(), ids.end(), 0);
  size_t k = std::min<size_t>(size_t(std::max(count, 0)), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(),
                    [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)] || (logits[size_t(a)] == logits[size_t(b)] && a < b); });
  std::vector<TokenLogprob> out;
  for (size_t i = 0; i < k; ++i) out.push_back(token_logprob(logits, ids[i], vocab_limit));
  return out;
}

}  // namespace lily
