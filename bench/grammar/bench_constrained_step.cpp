// bench_constrained_step.cpp: the host's share of one decode step with a JSON schema active, at
// Qwen3.6's vocabulary size (248,320 logits; synthetic_vocabulary.h), piece by piece.
//
// What generate() and the CUDA backend do on the host per token when the whole row comes back
// (the path before the backend took the mask):
//   zero      logits.assign(V, 0) in CudaBackend::forward: a 1 MB memset of a row about to be
//             overwritten;
//   copy      the row from the pinned staging buffer into the caller's vector (std::memcpy 1 MB;
//             the D2H copy into the staging buffer itself is GPU time, not measured here);
//   fill      GrammarMatcher::fill_next_token_bitmask for a warm schema (31 KB);
//   apply     apply_token_bitmask: forbidden logits to -inf;
//   sample    Sampler::sample on the masked row, greedy and at Qwen's thinking settings
//             (temperature 0.6, top_k 20, top_p 0.95).
// The benchmarks add the pieces up in that order (each one's cost is its difference from the
// one before, with the row as warm in the caches as in generate()); *Step is a whole step as
// generate() ran it, with and without the zeroing; CandidateStep is what stays on the host when
// the backend selects the candidates among the allowed tokens (fill + sample_candidates).
// Every benchmark walks the tokens of the document (one step per iteration, cycling), so its
// time is the mean over the document's mask states (dense in strings, sparse around keys).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "grammar/grammars.h"
#include "grammar/matcher.h"
#include "runtime/sampler.h"
#include "synthetic_vocabulary.h"

namespace {

using lily::Sampler;
using lily::SamplingParams;
using lily::TokenLogit;
using lily::grammar::CompiledGrammar;
using lily::grammar::GrammarMatcher;

constexpr int32_t V = lily::bench::kPadded;
constexpr int32_t kLimit = lily::bench::kReal;  // the sampled ids (the tokenizer's)

// The document's walk, warm: the matcher before each token, the mask it fills, and the best
// allowed candidates of the row (what a masked forward_candidates returns), 20 of them.
struct Walk {
  std::vector<GrammarMatcher> matchers;
  std::vector<std::vector<uint64_t>> masks;
  std::vector<std::vector<TokenLogit>> candidates;
  std::vector<float> source;  // the row as it arrives (normal logits, sigma 3)
};

std::vector<TokenLogit> best_allowed(const std::vector<float>& row, const std::vector<uint64_t>& mask, size_t k) {
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < kLimit; ++i)
    if ((mask[size_t(i) >> 6] >> (i & 63)) & 1) ids.push_back(i);
  k = std::min(k, ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), [&](int32_t a, int32_t b) {
    return row[size_t(a)] > row[size_t(b)] || (row[size_t(a)] == row[size_t(b)] && a < b);
  });
  std::vector<TokenLogit> out;
  for (size_t i = 0; i < k; ++i) out.push_back({ids[i], row[size_t(ids[i])]});
  return out;
}

Walk& walk() {
  static Walk w = [] {
    auto vocab = lily::bench::vocabulary();
    auto compiled = std::make_shared<const CompiledGrammar>(lily::grammar::json_schema_grammar(lily::bench::kSchema),
                                                            vocab);
    Walk w;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    w.source.resize(size_t(V));
    for (float& x : w.source) x = normal(rng);
    GrammarMatcher m(compiled);
    for (int32_t id : lily::bench::tokenize(*vocab, lily::bench::kDocument)) {
      w.matchers.push_back(m);
      w.masks.emplace_back(vocab->mask_words());
      m.fill_next_token_bitmask(w.masks.back());  // warms the state's cache entry
      w.candidates.push_back(best_allowed(w.source, w.masks.back(), 20));
      if (!m.accept_token(id)) throw std::runtime_error("the document's walk was refused");
    }
    return w;
  }();
  return w;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

SamplingParams qwen() {
  SamplingParams p;
  p.temperature = 0.6f, p.top_k = 20, p.top_p = 0.95f, p.seed = 1;
  return p;
}

enum Piece { kZero = 1, kCopy = 2, kFill = 4, kApply = 8, kSample = 16 };

// The pieces in `pieces`, in generate()'s order, one document step per iteration.
void pieces(benchmark::State& state, int pieces, SamplingParams params) {
  Walk& w = walk();
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<uint64_t> mask(w.masks[0].size());
  Sampler sampler(params, kLimit);
  const std::vector<int32_t> history;
  size_t step = 0;
  for (auto _ : state) {
    const size_t s = step++ % w.matchers.size();
    if (pieces & kZero) logits.assign(size_t(V), 0.0f);
    if (pieces & kCopy) std::memcpy(logits.data(), w.source.data(), size_t(V) * sizeof(float));
    if (pieces & kFill) w.matchers[s].fill_next_token_bitmask(mask);
    if (pieces & kApply) lily::grammar::apply_token_bitmask(logits, (pieces & kFill) ? mask : w.masks[s]);
    if (pieces & kSample) benchmark::DoNotOptimize(sampler.sample(logits, history));
    benchmark::DoNotOptimize(logits.data());
    benchmark::DoNotOptimize(mask.data());
    benchmark::ClobberMemory();
  }
}

// The host's part of a step where the backend selected the `count` best allowed candidates.
void candidate_step(benchmark::State& state, SamplingParams params, size_t count) {
  Walk& w = walk();
  std::vector<uint64_t> mask(w.masks[0].size());
  Sampler sampler(params, kLimit);
  size_t step = 0;
  for (auto _ : state) {
    const size_t s = step++ % w.matchers.size();
    w.matchers[s].fill_next_token_bitmask(mask);
    const auto& all = w.candidates[s];
    benchmark::DoNotOptimize(sampler.sample_candidates(std::span(all.data(), std::min(count, all.size()))));
    benchmark::DoNotOptimize(mask.data());
  }
}

BENCHMARK_CAPTURE(pieces, zero, kZero, greedy());
BENCHMARK_CAPTURE(pieces, copy, kCopy, greedy());
BENCHMARK_CAPTURE(pieces, fill, kFill, greedy());
BENCHMARK_CAPTURE(pieces, copy_apply, kCopy | kApply, greedy());
BENCHMARK_CAPTURE(pieces, copy_sample_greedy_unmasked, kCopy | kSample, greedy());
BENCHMARK_CAPTURE(pieces, copy_apply_sample_greedy, kCopy | kApply | kSample, greedy());
BENCHMARK_CAPTURE(pieces, copy_sample_qwen_unmasked, kCopy | kSample, qwen());
BENCHMARK_CAPTURE(pieces, copy_apply_sample_qwen, kCopy | kApply | kSample, qwen());
// Whole steps: as generate() ran them (with the zeroing), and without it.
BENCHMARK_CAPTURE(pieces, step_greedy, kZero | kCopy | kFill | kApply | kSample, greedy());
BENCHMARK_CAPTURE(pieces, step_greedy_no_zero, kCopy | kFill | kApply | kSample, greedy());
BENCHMARK_CAPTURE(pieces, step_qwen, kZero | kCopy | kFill | kApply | kSample, qwen());
BENCHMARK_CAPTURE(pieces, step_qwen_no_zero, kCopy | kFill | kApply | kSample, qwen());
BENCHMARK_CAPTURE(candidate_step, greedy, greedy(), 1);
BENCHMARK_CAPTURE(candidate_step, qwen, qwen(), 20);

}  // namespace

BENCHMARK_MAIN();
