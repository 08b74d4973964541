// speculative.cpp: speculative_generate() (speculative.h), one request's draft-verify-cut steps.
#include "runtime/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "base/error.h"
#include "grammar/matcher.h"
#include "runtime/decode_token.h"

namespace lily {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool grammar_ended(const grammar::GrammarMatcher& g) { return g.must_stop() || g.is_finished(); }

// The head's input rows for positions [mtp_length, first + rows of `hidden`): the post-norm rows
// the main model computed from `first` on ([rows, H]), after zero rows for the positions a state
// filled without the head left out (mtp_length < first). A zero row carries only its token:
// drafts near it are worse, never the answer.
std::vector<float> head_rows(int64_t mtp_length, int64_t first, std::span<const float> hidden, int64_t H) {
  std::vector<float> rows(size_t((first - mtp_length) * H), 0.0f);
  rows.insert(rows.end(), hidden.begin(), hidden.end());
  return rows;
}

class Speculation {
 public:
  Speculation(Backend& backend, SequenceState& state, const GenerateRequest& request, const TokenCallback& on_token,
              int32_t limit)
      : backend_(backend),
        state_(state),
        request_(request),
        on_token_(on_token),
        limit_(limit),
        H_(backend.config().hidden_size),
        V_(backend.config().vocab_size),
        sampler_(request.sampling, limit) {
    result_.speculation.drafted.assign(size_t(request.speculate), 0);
    result_.speculation.accepted.assign(size_t(request.speculate), 0);
  }

  GenerateResult run() {
    bool going = start();
    const auto t1 = std::chrono::steady_clock::now();
    while (going) going = next();
    result_.decode_seconds = seconds_since(t1);
    return std::move(result_);
  }

  // SpeculativeDecoder's: the prefill and first token; then one step while the request goes on.
  bool start() {
    result_.prompt_tokens = int64_t(request_.prompt.size());
    result_.cached_tokens = state_.length();
    result_.finish = FinishReason::length;
    return prefill() && going_on();
  }
  bool next() { return step() && going_on(); }
  GenerateResult& result() { return result_; }

 private:
  bool going_on() const { return int64_t(result_.tokens.size()) < request_.max_new_tokens; }

  // The fresh prompt through the main model (its hidden rows kept), the first token from its
  // logits, the head's rows up to the prompt's last (whose token is the first generated), then
  // the first token delivered. False when the generation ended with it.
  bool prefill() {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t cached = state_.length(), head = state_.mtp_length();
    LILY_CHECK(head <= cached, "internal: the MTP head's cache holds {} positions, past the sequence's {}", head,
               cached);
    const std::span<const int32_t> prompt(request_.prompt);
    backend_.forward_hidden(state_, prompt.subspan(size_t(cached)), LogitsWanted::last, logits_, LogitsWanted::all,
                            hidden_);
    result_.prefill_seconds = seconds_since(t0);
    GeneratedToken first = decode_token::sample_row(sampler_, logits_, request_, limit_, mask_, result_);
    std::vector<int32_t> next(prompt.begin() + head + 1, prompt.end());  // row i's token: x_{i+1}
    next.push_back(first.id);
    feed_head(head_rows(head, cached, hidden_, H_), next);
    return decode_token::deliver(first, request_, on_token_, result_);
  }

  // Appends head rows (hidden [T, H], their tokens [T]); keeps the last row's logits (the next
  // draft's) and post-norm row m (the chain's).
  void feed_head(std::span<const float> hidden, std::span<const int32_t> tokens) {
    backend_.forward_mtp(state_, hidden, tokens, LogitsWanted::last, head_logits_, head_m_);
  }

  bool is_stop(int32_t id) const {
    return std::find(request_.stop_tokens.begin(), request_.stop_tokens.end(), id) != request_.stop_tokens.end();
  }

  // The head's choice from its logits (modified): the arg max over [0, limit) among the ids
  // `g` allows; -1 when none is usable (the grammar has ended or allows no finite logit).
  int32_t choose_draft(grammar::GrammarMatcher* g) {
    if (g) {
      if (grammar_ended(*g)) return -1;
      result_.grammar_seconds += decode_token::mask_logits(*g, mask_, head_logits_);
    }
    int32_t best = -1;
    float best_logit = -INFINITY;
    for (int32_t i = 0; i < limit_; ++i)
      if (head_logits_[size_t(i)] > best_logit) best_logit = head_logits_[size_t(i)], best = i;
    return best;
  }

  // Up to `count` drafts into drafts_, chaining the head from the row that holds the last token
  // (head_logits_, head_m_): draft k + 1 comes from the row (m_k, draft k) at the next position.
  // Under a grammar each draft is chosen among what a copy of it, advanced by the drafts before,
  // allows. Drafting stops after a stop token (nothing follows one).
  void draft(int count) {
    drafts_.clear();
    std::optional<grammar::GrammarMatcher> g;
    if (request_.grammar && count > 0) g.emplace(*request_.grammar);
    for (int k = 0; k < count; ++k) {
      if (k > 0) {
        const std::vector<float> m = head_m_;
        feed_head(m, std::span<const int32_t>(&drafts_.back(), 1));
      }
      const int32_t d = choose_draft(g ? &*g : nullptr);
      if (d < 0) break;
      drafts_.push_back(d);
      if (g && !g->accept_token(d)) break;  // allowed by the mask: not expected
      if (is_stop(d)) break;
    }
  }

  // The token of verify row `row` (its logits, modified), where the step's draft for it is
  // `draft` (-1: none, the bonus row). Greedy: sample()'s pick, the draft kept iff it is that.
  // Sampling: the draft kept with its probability under the sampler's processed distribution,
  // else a draw from that distribution without it.
  GeneratedToken verify_row(std::span<const float> row, int32_t draft, bool& accepted) {
    row_.assign(row.begin(), row.end());
    if (draft < 0 || request_.sampling.greedy()) {
      GeneratedToken token = decode_token::sample_row(sampler_, row_, request_, limit_, mask_, result_);
      accepted = draft >= 0 && token.id == draft;
      return token;
    }
    GeneratedToken token;
    std::vector<float> raw;
    if (request_.top_logprobs >= 0) token.top = top_logprobs(row_, request_.top_logprobs, limit_), raw = row_;
    if (request_.grammar) result_.grammar_seconds += decode_token::mask_logits(*request_.grammar, mask_, row_);
    sampler_.distribution(row_, result_.tokens, distribution_);
    auto it = std::find_if(distribution_.begin(), distribution_.end(),
                           [&](const TokenProbability& t) { return t.token == draft; });
    const double p_draft = it == distribution_.end() ? 0.0 : it->probability;
    accepted = sampler_.uniform() < p_draft;
    if (accepted) {
      token.id = draft;
    } else {
      if (it != distribution_.end()) distribution_.erase(it);  // normalize(max(0, p - q)), q the point at draft
      token.id = sampler_.draw_from(distribution_);
    }
    if (request_.grammar) decode_token::advance(*request_.grammar, token.id);
    if (request_.top_logprobs >= 0) token.logprob = token_logprob(raw, token.id, limit_);
    return token;
  }

  // Delivers the verify's tokens row by row until a draft is refused (that row's own token is
  // the last) or the generation ends. Returns how many were delivered; `going` false on the end.
  int64_t deliver_verified(bool& going) {
    const int D = int(drafts_.size());
    int64_t delivered = 0;
    for (int i = 0; i <= D; ++i) {
      bool accepted = false;
      const int32_t draft = i < D ? drafts_[size_t(i)] : -1;
      const GeneratedToken token = verify_row(std::span<const float>(logits_).subspan(size_t(i * V_), size_t(V_)),
                                              draft, accepted);
      if (i < D) {
        ++result_.speculation.drafted[size_t(i)];
        result_.speculation.accepted[size_t(i)] += accepted;
      }
      ++delivered;
      going = decode_token::deliver(token, request_, on_token_, result_);
      if (!going || !accepted) break;
    }
    for (int i = int(delivered); i < D; ++i) ++result_.speculation.drafted[size_t(i)];  // refused unseen
    return delivered;
  }

  // One step: drafts, the verify of the last token and the drafts, the tokens delivered, the
  // state cut back to them (every one but the last in the sequence) and the head's teacher-forced
  // rows in place of the chained ones. False when the generation ended.
  bool step() {
    const int64_t L = state_.length();  // the last token delivered is position L, not yet in the state
    const int64_t left = request_.max_new_tokens - int64_t(result_.tokens.size());
    const int budget = int(std::min<int64_t>(request_.speculate, left - 1));
    // keep_row_states holds through the next forward call: the head's calls below do not spend it.
    const bool rewindable = budget > 0 && state_.keep_row_states(budget + 1);
    std::unique_ptr<RecurrentSnapshot> snapshot;
    if (budget > 0 && !rewindable) snapshot = state_.snapshot();
    draft(budget);
    const int D = int(drafts_.size());
    // Without rewind, the chained rows leave the head's cache now: the snapshot's restore cuts it
    // back to L while the sequence is still at L.
    if (snapshot && D >= 2) state_.restore(*snapshot);

    std::vector<int32_t> verify{result_.tokens.back()};
    verify.insert(verify.end(), drafts_.begin(), drafts_.end());
    backend_.forward_hidden(state_, verify, LogitsWanted::all, logits_, LogitsWanted::all, hidden_);
    bool going = true;
    const int64_t n = deliver_verified(going);
    ++result_.speculation.steps;
    result_.speculation.step_tokens += n;

    cut(L, n, D, rewindable, snapshot.get());
    const std::span<const int32_t> kept = std::span<const int32_t>(result_.tokens).last(size_t(n));
    feed_head(std::span<const float>(hidden_).first(size_t(n * H_)), kept);
    return going;
  }

  // The sequence back to L + n (the verify's first n tokens), the head's cache back to L.
  void cut(int64_t L, int64_t n, int D, bool rewindable, const RecurrentSnapshot* snapshot) {
    const bool sequence_cut = n < D + 1, head_cut = D >= 2;
    if (rewindable) {
      if (sequence_cut || head_cut)
        LILY_CHECK(state_.rewind(L + n, L), "internal: the state kept its rows' states but refused to rewind to {}",
                   L + n);
      return;
    }
    if (!sequence_cut) return;  // the head's cache was cut before the verify
    LILY_CHECK(snapshot, "internal: a verify of {} rows to cut without a snapshot", D + 1);
    state_.restore(*snapshot);
    std::vector<int32_t> replay{result_.tokens.end() - n - 1, result_.tokens.end() - 1};
    std::vector<float> none;
    backend_.forward(state_, replay, LogitsWanted::none, none);
    ++result_.speculation.replays;
  }

  Backend& backend_;
  SequenceState& state_;
  const GenerateRequest& request_;
  const TokenCallback& on_token_;
  int32_t limit_;
  int64_t H_, V_;
  Sampler sampler_;
  GenerateResult result_;
  std::vector<uint64_t> mask_;
  std::vector<float> logits_, hidden_;          // the last main forward's: [rows, V], [rows, H]
  std::vector<float> head_logits_, head_m_;     // the head's last row: [V], [H]
  std::vector<int32_t> drafts_;                 // this step's
  std::vector<float> row_;                      // a verify row's logits, processed
  std::vector<TokenProbability> distribution_;  // a verify row's processed distribution
};

}  // namespace

void check_speculate(const Backend& backend, int drafts) {
  LILY_CHECK(drafts >= 0 && drafts <= kMaxSpeculate, "--speculate {}: drafts a step must be 0 (off) to {}", drafts,
             kMaxSpeculate);
  if (drafts > 0) LILY_CHECK(backend.has_mtp(), "--speculate {}: {}", drafts, backend.mtp_unavailable());
}

GenerateResult speculative_generate(Backend& backend, SequenceState& state, const GenerateRequest& request,
                                    const TokenCallback& on_token) {
  check_speculate(backend, request.speculate);
  const int32_t limit = decode_token::check_request(backend, state, request);
  return Speculation(backend, state, request, on_token, limit).run();
}

struct SpeculativeDecoder::Impl {
  TokenCallback on_token;
  GenerateRequest request;
  Speculation speculation;
  Impl(Backend& backend, SequenceState& state, const GenerateRequest& r, TokenCallback callback, int32_t limit)
      : on_token(std::move(callback)), request(r), speculation(backend, state, request, on_token, limit) {}
};

SpeculativeDecoder::SpeculativeDecoder(Backend& backend, SequenceState& state, const GenerateRequest& request,
                                       TokenCallback on_token) {
  check_speculate(backend, request.speculate);
  LILY_CHECK(request.speculate > 0, "internal: a speculative decoder without drafts");
  const int32_t limit = decode_token::check_request(backend, state, request);
  impl_ = std::make_unique<Impl>(backend, state, request, std::move(on_token), limit);
}

SpeculativeDecoder::~SpeculativeDecoder() = default;

bool SpeculativeDecoder::start() { return impl_->speculation.start(); }
bool SpeculativeDecoder::step() { return impl_->speculation.next(); }
GenerateResult& SpeculativeDecoder::result() { return impl_->speculation.result(); }

void prefill_with_head(Backend& backend, SequenceState& state, std::span<const int32_t> tokens, int64_t count) {
  const int64_t cached = state.length(), head = state.mtp_length();
  LILY_CHECK(cached < count && count < int64_t(tokens.size()),
             "internal: a prefill with the head to {} tokens of {}, {} in the state", count, tokens.size(), cached);
  LILY_CHECK(head <= cached, "internal: the MTP head's cache holds {} positions, past the sequence's {}", head, cached);
  std::vector<float> logits, hidden, m;
  backend.forward_hidden(state, tokens.subspan(size_t(cached), size_t(count - cached)), LogitsWanted::none, logits,
                         LogitsWanted::all, hidden);
  const std::vector<float> rows = head_rows(head, cached, hidden, backend.config().hidden_size);
  backend.forward_mtp(state, rows, tokens.subspan(size_t(head + 1), size_t(count - head)), LogitsWanted::none, logits,
                      m);
}

}  // namespace lily
