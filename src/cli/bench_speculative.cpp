// bench_speculative.cpp: `lily bench --speculate K` (bench_speculative.h).
#include "cli/bench_speculative.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "runtime/generate.h"
#include "runtime/speculative.h"

namespace lily::cli {

namespace speculative_bench {

// A backend over a real one whose verify steps (forward_hidden with every row's logits: the
// speculative loop's) keep draft k with the assumed rate: row k - 1's logits get the draft on
// top when drafts 1..k are kept (with probability rate_k / rate_{k-1} given the ones before), and
// never on top otherwise. Measurement only: the tokens are the drafts', not the model's.
class AssumedAcceptance : public Backend {
 public:
  AssumedAcceptance(Backend& inner, std::vector<double> rates) : inner_(inner), rates_(std::move(rates)) {}
  std::string name() const override { return inner_.name(); }
  const ModelConfig& config() const override { return inner_.config(); }
  std::string mtp_unavailable() const override { return inner_.mtp_unavailable(); }
  std::unique_ptr<SequenceState> new_sequence(int64_t capacity) override { return inner_.new_sequence(capacity); }
  void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
               std::vector<float>& logits) override {
    inner_.forward(state, tokens, wanted, logits);
  }
  void forward_mtp(SequenceState& state, std::span<const float> hidden, std::span<const int32_t> tokens,
                   LogitsWanted wanted, std::vector<float>& logits, std::vector<float>& mtp_hidden) override {
    inner_.forward_mtp(state, hidden, tokens, wanted, logits, mtp_hidden);
  }
  void forward_hidden(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
                      std::vector<float>& logits, LogitsWanted hidden_rows, std::vector<float>& hidden) override {
    inner_.forward_hidden(state, tokens, wanted, logits, hidden_rows, hidden);
    if (wanted == LogitsWanted::all && tokens.size() > 1) force(tokens, logits);
  }

 private:
  void force(std::span<const int32_t> tokens, std::vector<float>& logits) {
    const size_t V = size_t(config().vocab_size);
    bool keeping = true;
    for (size_t k = 1; k < tokens.size(); ++k) {
      const double before = k == 1 ? 1.0 : rates_[k - 2], rate = k - 1 < rates_.size() ? rates_[k - 1] : 0.0;
      keeping = keeping && before > 0 && uniform_(rng_) < rate / before;
      float* row = logits.data() + (k - 1) * V;
      const auto [lo, hi] = std::minmax_element(row, row + V);
      row[size_t(tokens[k])] = keeping ? *hi + 1.0f : *lo - 1.0f;
    }
  }

  Backend& inner_;
  std::vector<double> rates_;
  std::mt19937_64 rng_{7};
  std::uniform_real_distribution<double> uniform_{0.0, 1.0};
};

std::vector<int32_t> random_ids(int64_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, vocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = d(rng);
  return t;
}

struct Measured {
  double seconds_per_token = 0;  // the decode after the first token, median over the rounds
  SpeculationStats stats;        // over the timed rounds
  std::vector<int32_t> tokens;   // the last round's
};

// Rounds of greedy generate() of `n` tokens on one state filled with D tokens (the first round a
// warm-up, and where the head catches up with the fill).
Measured measure(Backend& backend, int32_t D, int drafts, const SpeculativeBench& o,
                 const std::function<void(SequenceState&, int32_t)>& fill) {
  auto state = backend.new_sequence(int64_t(D) + int64_t(o.repeats + 1) * (o.tokens + 1) + 1);
  fill(*state, D);
  Measured m;
  std::vector<double> times;
  for (int r = 0; r <= o.repeats; ++r) {
    GenerateRequest request;
    request.prompt = random_ids(state->length() + 1, backend.config().vocab_size, uint32_t(r));  // the state: its head
    request.max_new_tokens = o.tokens;
    request.sampling.temperature = 0;
    request.speculate = drafts;
    const GenerateResult result = generate(backend, *state, request, [](const GeneratedToken&) { return true; });
    if (r == 0) continue;
    times.push_back(result.decode_seconds / double(std::max<size_t>(result.tokens.size(), 2) - 1));
    m.stats.add(result.speculation);
    m.tokens = result.tokens;
  }
  std::sort(times.begin(), times.end());
  m.seconds_per_token = times[times.size() / 2];
  return m;
}

std::string acceptance_text(const SpeculationStats& s) {
  std::string out;
  for (size_t k = 0; k < s.drafted.size(); ++k)
    out += fmt::format("{}{:.2f}", k ? " " : "", s.drafted[k] ? double(s.accepted[k]) / double(s.drafted[k]) : 0.0);
  return out;
}

}  // namespace speculative_bench

std::vector<double> parse_acceptance(const std::string& text, int drafts) {
  std::vector<double> rates;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    double r = -1;
    try {
      r = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    LILY_CHECK(used == item.size() && !item.empty() && r >= 0 && r <= 1,
               "--assume-acceptance: '{}' is not a rate in [0, 1]", item);
    LILY_CHECK(rates.empty() || r <= rates.back(),
               "--assume-acceptance: {} after {}: a draft is kept only with those before it (rates non-increasing)", r,
               rates.back());
    rates.push_back(r);
  }
  LILY_CHECK(!rates.empty(), "--assume-acceptance is empty");
  LILY_CHECK(int(rates.size()) <= drafts, "--assume-acceptance gives {} rates for --speculate {}", rates.size(),
             drafts);
  return rates;
}

void run_speculative_bench(Backend& backend, const std::vector<int32_t>& depths, const SpeculativeBench& o,
                           const std::function<void(SequenceState&, int32_t)>& fill, bool json) {
  using namespace speculative_bench;
  check_speculate(backend, o.drafts);
  LILY_CHECK(o.tokens >= 2, "--speculate needs --decode-tokens of at least 2");
  AssumedAcceptance assumed(backend, o.assumed);
  Backend& drafting = o.assumed.empty() ? backend : static_cast<Backend&>(assumed);
  std::string title = o.title + fmt::format("; greedy decode, plain vs --speculate {}", o.drafts);
  if (!o.assumed.empty()) {
    title += "; acceptance ASSUMED (--assume-acceptance";
    for (double r : o.assumed) title += fmt::format(" {:.2f}", r);
    title += "): the pipeline's cost, not the model's tokens";
  }
  nlohmann::json rows = nlohmann::json::array();
  if (!json) {
    std::printf("%s\n", title.c_str());
    std::printf(
        "| depth   | plain tok/s | spec tok/s | speedup | tokens/step | accepted per position | same tokens |\n");
    std::printf(
        "|--------:|------------:|-----------:|--------:|------------:|-----------------------|-------------|\n");
  }
  for (int32_t D : depths) {
    const Measured plain = measure(backend, D, 0, o, fill);
    const Measured spec = measure(drafting, D, o.drafts, o, fill);
    const double per_step = spec.stats.steps ? double(spec.stats.step_tokens) / double(spec.stats.steps) : 0.0;
    const bool same = spec.tokens == plain.tokens;
    std::fprintf(stderr, "speculate %d at depth %d: plain %.3f ms/token, speculative %.3f ms/token\n", o.drafts, D,
                 plain.seconds_per_token * 1e3, spec.seconds_per_token * 1e3);
    if (json) {
      rows.push_back({{"depth", D},
                      {"plain_tokens_per_second", 1 / plain.seconds_per_token},
                      {"speculative_tokens_per_second", 1 / spec.seconds_per_token},
                      {"tokens_per_step", per_step},
                      {"drafted", spec.stats.drafted},
                      {"accepted", spec.stats.accepted},
                      {"replays", spec.stats.replays},
                      {"same_tokens", same}});
      continue;
    }
    std::printf("| %7d | %11.1f | %10.1f | %6.2fx | %11.2f | %-21s | %-11s |\n", D, 1 / plain.seconds_per_token,
                1 / spec.seconds_per_token, plain.seconds_per_token / spec.seconds_per_token, per_step,
                acceptance_text(spec.stats).c_str(), o.assumed.empty() ? (same ? "yes" : "NO") : "(assumed)");
  }
  if (json) std::printf("%s\n", nlohmann::json{{"title", title}, {"rows", rows}}.dump(2).c_str());
}

}  // namespace lily::cli
