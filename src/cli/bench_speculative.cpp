// bench_speculative.cpp: `lily bench --speculate K` (bench_speculative.h), random or chat context.
#include "cli/bench_speculative.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "chat/chat_template.h"
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

// Round r's request on `state` (the prompt and stop tokens; Side::round sets the rest), which it
// may create or replace: where each round of a measurement decodes from.
using StartRound = std::function<GenerateRequest(Backend&, std::unique_ptr<SequenceState>&, int round)>;

// One side of the comparison, plain (drafts 0) or speculative: rounds of greedy generate() of
// up to o.tokens tokens from `start`, the first a warm-up (caches, and, with random context,
// where the head catches up with the fill).
class Side {
 public:
  Side(Backend& backend, int drafts, StartRound start) : backend_(backend), drafts_(drafts), start_(std::move(start)) {}

  void round(const SpeculativeBench& o, int r) {
    GenerateRequest request = start_(backend_, state_, r);
    request.max_new_tokens = o.tokens;
    request.sampling.temperature = 0;
    request.speculate = drafts_;
    const GenerateResult result = generate(backend_, *state_, request, [](const GeneratedToken&) { return true; });
    LILY_CHECK(result.tokens.size() >= 2,
               "--speculate: the reply ended after {} token(s), too few to time a decode; a longer one is needed",
               result.tokens.size());
    if (r == 0) return;
    times_.push_back(result.decode_seconds / double(result.tokens.size() - 1));
    m_.stats.add(result.speculation);
    m_.tokens = result.tokens;
  }

  Measured measured() {
    std::sort(times_.begin(), times_.end());
    m_.seconds_per_token = times_[times_.size() / 2];
    return m_;
  }

 private:
  Backend& backend_;
  int drafts_;
  StartRound start_;
  std::unique_ptr<SequenceState> state_;
  std::vector<double> times_;
  Measured m_;
};

// Plain and speculative rounds in turns, so that a load that comes and goes on a shared machine
// falls on both alike: {plain, speculative}.
std::pair<Measured, Measured> measure(Side plain, Side spec, const SpeculativeBench& o) {
  for (int r = 0; r <= o.repeats; ++r) plain.round(o, r), spec.round(o, r);
  return {plain.measured(), spec.measured()};
}

// Random context: D tokens `fill`ed into one state, each round going on from where the last
// ended, its prompt random ids the state already holds but the last (the state: its head).
StartRound random_start(int32_t D, const SpeculativeBench& o,
                        const std::function<void(SequenceState&, int32_t)>& fill) {
  return [D, &o, &fill](Backend& backend, std::unique_ptr<SequenceState>& state, int round) {
    if (!state) {
      state = backend.new_sequence(int64_t(D) + int64_t(o.repeats + 1) * (o.tokens + 1) + 1);
      fill(*state, D);
    }
    GenerateRequest request;
    request.prompt = random_ids(state->length() + 1, backend.config().vocab_size, uint32_t(round));
    return request;
  };
}

// Chat context: every round the same prompt on a fresh state, the reply ending at a stop token.
StartRound chat_start(const ChatContext& c, const SpeculativeBench& o) {
  return [&c, &o](Backend& backend, std::unique_ptr<SequenceState>& state, int) {
    state = backend.new_sequence(int64_t(c.prompt.size()) + o.tokens + 1);
    GenerateRequest request;
    request.prompt = c.prompt;
    request.stop_tokens = c.stop_tokens;
    return request;
  };
}

std::string acceptance_text(const SpeculationStats& s) {
  std::string out;
  for (size_t k = 0; k < s.drafted.size(); ++k)
    out += fmt::format("{}{:.2f}", k ? " " : "", s.drafted[k] ? double(s.accepted[k]) / double(s.drafted[k]) : 0.0);
  return out;
}

// Where two token lists first differ ("" when they are equal).
std::string first_difference(const std::vector<int32_t>& plain, const std::vector<int32_t>& spec) {
  const size_t n = std::min(plain.size(), spec.size());
  for (size_t i = 0; i < n; ++i)
    if (plain[i] != spec[i]) return fmt::format("token {}: plain {}, speculative {}", i, plain[i], spec[i]);
  if (plain.size() != spec.size())
    return fmt::format("plain generated {} tokens, speculative {}", plain.size(), spec.size());
  return "";
}

// The table (or JSON rows) of plain vs speculative decoding from each context, then a failure
// if the model's greedy tokens differ anywhere (not with assumed rates: those are not the model's).
class Report {
 public:
  Report(const SpeculativeBench& o, std::string title, bool json) : o_(o), json_(json), title_(std::move(title)) {
    if (!o.assumed.empty()) {
      title_ += "; acceptance ASSUMED (--assume-acceptance";
      for (double r : o.assumed) title_ += fmt::format(" {:.2f}", r);
      title_ += "): the pipeline's cost, not the model's tokens";
    }
    if (json_) return;
    std::printf("%s\n", title_.c_str());
    std::printf(
        "| depth   | plain tok/s | spec tok/s | speedup | tokens/step | accepted per position | same tokens |\n");
    std::printf(
        "|--------:|------------:|-----------:|--------:|------------:|-----------------------|-------------|\n");
  }

  void add(int64_t depth, const Measured& plain, const Measured& spec) {
    const double per_step = spec.stats.steps ? double(spec.stats.step_tokens) / double(spec.stats.steps) : 0.0;
    const std::string difference = first_difference(plain.tokens, spec.tokens);
    if (o_.assumed.empty() && !difference.empty() && mismatch_.empty())
      mismatch_ = fmt::format("at depth {}, {}", depth, difference);
    std::fprintf(stderr, "speculate %d at depth %lld: plain %.3f ms/token, speculative %.3f ms/token\n", o_.drafts,
                 (long long)depth, plain.seconds_per_token * 1e3, spec.seconds_per_token * 1e3);
    if (json_) {
      rows_.push_back({{"depth", depth},
                       {"generated_tokens", spec.tokens.size()},
                       {"plain_tokens_per_second", 1 / plain.seconds_per_token},
                       {"speculative_tokens_per_second", 1 / spec.seconds_per_token},
                       {"tokens_per_step", per_step},
                       {"drafted", spec.stats.drafted},
                       {"accepted", spec.stats.accepted},
                       {"replays", spec.stats.replays},
                       {"same_tokens", difference.empty()}});
      return;
    }
    std::printf("| %7lld | %11.1f | %10.1f | %6.2fx | %11.2f | %-21s | %-11s |\n", (long long)depth,
                1 / plain.seconds_per_token, 1 / spec.seconds_per_token,
                plain.seconds_per_token / spec.seconds_per_token, per_step, acceptance_text(spec.stats).c_str(),
                o_.assumed.empty() ? (difference.empty() ? "yes" : "NO") : "(assumed)");
  }

  // Prints the JSON; fails when the tokens differed.
  void finish() {
    if (json_) std::printf("%s\n", nlohmann::json{{"title", title_}, {"rows", rows_}}.dump(2).c_str());
    std::fflush(stdout);
    LILY_CHECK(mismatch_.empty(),
               "--speculate {}: greedy speculative decoding did not give plain decoding's tokens, {} (a bug: they "
               "must be equal)",
               o_.drafts, mismatch_);
  }

 private:
  const SpeculativeBench& o_;
  bool json_;
  std::string title_, mismatch_;
  nlohmann::json rows_ = nlohmann::json::array();
};

// The backend the speculative measurement drafts on: the real one, or its verify forced to the
// assumed rates.
struct Drafting {
  AssumedAcceptance assumed;
  Backend& backend;
  Drafting(Backend& real, const SpeculativeBench& o)
      : assumed(real, o.assumed), backend(o.assumed.empty() ? real : static_cast<Backend&>(assumed)) {}
};

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
  Drafting drafting(backend, o);
  Report report(o, o.title + fmt::format("; random context, greedy decode, plain vs --speculate {}", o.drafts), json);
  for (int32_t D : depths) {
    const auto [plain, spec] = measure(Side(backend, 0, random_start(D, o, fill)),
                                       Side(drafting.backend, o.drafts, random_start(D, o, fill)), o);
    report.add(D, plain, spec);
  }
  report.finish();
}

const char* const kDefaultBenchPrompt = "What is 487 + 356?";

ChatContext chat_context(const Tokenizer& tokenizer, const std::vector<int>& eos_token_ids, const std::string& text) {
  LILY_CHECK(!text.empty(), "--prompt: the prompt is empty");
  ChatContext c;
  c.text = text;
  const nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", text}}});
  c.prompt = tokenizer.encode(render_chat_template(messages, nullptr, ChatTemplateOptions{}));
  for (const char* name : {"<|im_end|>", "<|endoftext|>"})
    if (auto id = tokenizer.token_id(name)) c.stop_tokens.push_back(*id);
  for (int id : eos_token_ids)
    if (std::find(c.stop_tokens.begin(), c.stop_tokens.end(), id) == c.stop_tokens.end()) c.stop_tokens.push_back(id);
  return c;
}

std::string chat_prompt_text(const std::string& text, const std::string& file) {
  if (!text.empty() || file.empty()) return text.empty() ? kDefaultBenchPrompt : text;
  std::ifstream in(file, std::ios::binary);
  LILY_CHECK(in, "--prompt-file {}: cannot open it", file);
  std::string contents{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  LILY_CHECK(!in.bad(), "--prompt-file {}: reading it failed", file);
  LILY_CHECK(!contents.empty(), "--prompt-file {}: the file is empty", file);
  return contents;
}

void run_speculative_bench(Backend& backend, const ChatContext& context, const SpeculativeBench& o, bool json) {
  using namespace speculative_bench;
  check_speculate(backend, o.drafts);
  LILY_CHECK(o.tokens >= 2, "--speculate needs --decode-tokens of at least 2");
  Drafting drafting(backend, o);
  const auto [plain, spec] = measure(Side(backend, 0, chat_start(context, o)),
                                     Side(drafting.backend, o.drafts, chat_start(context, o)), o);
  const std::string shown = context.text.size() > 60 ? context.text.substr(0, 57) + "..." : context.text;
  Report report(o,
                o.title + fmt::format("; chat prompt \"{}\" ({} tokens, thinking on), greedy reply of {} tokens "
                                      "(a stop token or --decode-tokens {}), plain vs --speculate {}",
                                      shown, context.prompt.size(), plain.tokens.size(), o.tokens, o.drafts),
                json);
  report.add(int64_t(context.prompt.size()), plain, spec);
  report.finish();
}

}  // namespace lily::cli
