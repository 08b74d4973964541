// batch_generate.cpp: see batch_generate.h.
#include "runtime/batch_generate.h"

#include <algorithm>
#include <chrono>
#include <span>
#include <utility>

#include "base/error.h"
#include "grammar/matcher.h"
#include "runtime/decode_token.h"
#include "runtime/speculative.h"

namespace lily {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// One request's generation: where its prompt's prefill is, the row its next token is drawn from,
// the token the next batch step appends.
struct BatchGenerator::Request {
  Request(uint64_t id_, const GenerateRequest& request_, SequenceState& state_, TokenCallback on_token_, int32_t limit_,
          PrefillStop stop_)
      : id(id_),
        request(request_),
        state(&state_),
        on_token(std::move(on_token_)),
        limit(limit_),
        sampler(request_.sampling, limit_),
        stop(std::move(stop_)) {
    if (request.grammar) {
      allowed.words = request.grammar->compiled().vocabulary().mask_words();
      allowed.fill = [this](std::span<uint64_t> words) {
        const auto t = std::chrono::steady_clock::now();
        request.grammar->fill_next_token_bitmask(words);
        result.grammar_seconds += seconds_since(t);
      };
    }
  }

  uint64_t id;
  GenerateRequest request;
  SequenceState* state;
  TokenCallback on_token;
  int32_t limit;  // ids sampled over
  Sampler sampler;
  PrefillStop stop;  // called once, when the prefill reaches it
  GenerateResult result;
  std::vector<float> logits;  // the row the next token is drawn from
  std::vector<uint64_t> mask;
  AllowedTokens allowed;               // the grammar's mask for forward_candidates (words 0: none)
  std::vector<TokenLogit> candidates;  // a lone step's best few
  int32_t pending = -1;                // the token the next batch step appends (-1: none)
  // With request.speculate > 0: the request's own draft-verify-cut steps (speculative.h), one a
  // round, outside the batch step; its prefill feeds the MTP head. speculating: past its start.
  std::unique_ptr<SpeculativeDecoder> speculative;
  bool speculating = false;
  bool ended = false;
  std::exception_ptr error;
  std::chrono::steady_clock::time_point decode_start;

  bool prefilling() const { return !ended && state->length() < int64_t(request.prompt.size()); }

  // Calls the PrefillStop once, when the state has reached it.
  void reach_stop() {
    if (stop.reached && state->length() == stop.length) std::exchange(stop.reached, nullptr)();
  }

  // The next token from `logits`, handed over; true while the request goes on (its token then
  // pending for the next step).
  bool draw() { return hand_over(decode_token::sample_row(sampler, logits, request, limit, mask, result)); }

  // The pending token appended alone, generate()'s step: the backend's best few candidates where
  // they decide the draw (no logprobs asked), so one stream gets no whole row off the device;
  // else the row. True while the request goes on.
  bool step_alone(Backend& backend) {
    const int32_t token = std::exchange(pending, -1);
    const int count = request.top_logprobs < 0 ? sampler.candidates_needed() : 0;
    if (count > 0 &&
        backend.forward_candidates(*state, token, count, limit, request.grammar ? &allowed : nullptr, candidates))
      return hand_over(decode_token::sample_candidates(sampler, candidates, request));
    backend.forward(*state, std::span<const int32_t>(&token, 1), LogitsWanted::last, logits);
    return draw();
  }

  bool hand_over(const GeneratedToken& token) {
    if (!decode_token::deliver(token, request, on_token, result)) return false;  // result.finish set
    if (int64_t(result.tokens.size()) == request.max_new_tokens) return false;   // length
    pending = token.id;
    return true;
  }
};

BatchGenerator::BatchGenerator(Backend& backend, BatchGenerateOptions options) : backend_(backend), options_(options) {
  LILY_CHECK(options.max_running >= 1, "a batch of {} running requests (at least 1)", options.max_running);
  LILY_CHECK(options.prefill_chunk >= 1, "prefill chunks of {} tokens (at least 1)", options.prefill_chunk);
}

BatchGenerator::~BatchGenerator() = default;

uint64_t BatchGenerator::add(const GenerateRequest& request, SequenceState& state, TokenCallback on_token,
                             PrefillStop stop) {
  const int32_t limit = decode_token::check_request(backend_, state, request);
  check_speculate(backend_, request.speculate);
  if (stop.length <= state.length() || stop.length > int64_t(request.prompt.size())) stop = {};  // nothing to stop at
  auto r = std::make_unique<Request>(next_id_++, request, state, std::move(on_token), limit, std::move(stop));
  if (request.speculate > 0 && request.max_new_tokens > 0)
    r->speculative = std::make_unique<SpeculativeDecoder>(backend_, state, r->request, r->on_token);
  r->result.prompt_tokens = int64_t(request.prompt.size());
  r->result.cached_tokens = state.length();
  const uint64_t id = r->id;
  waiting_.push_back(std::move(r));
  return id;
}

bool BatchGenerator::step() {
  admit();
  prefill_round();
  decode_step();
  retire_ended();
  admit();
  return !running_.empty() || !waiting_.empty();
}

std::optional<BatchOutcome> BatchGenerator::take(uint64_t id) {
  auto it = done_.find(id);
  if (it == done_.end()) return std::nullopt;
  BatchOutcome outcome = std::move(it->second);
  done_.erase(it);
  return outcome;
}

void BatchGenerator::cancel(uint64_t id) {
  auto waiting = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& r) { return r->id == id; });
  if (waiting != waiting_.end()) {
    Request& r = **waiting;
    r.result.finish = FinishReason::cancelled;
    done_[id] = BatchOutcome{std::move(r.result), nullptr};
    waiting_.erase(waiting);
    return;
  }
  auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r->id == id; });
  if (it != running_.end() && !(*it)->ended) end(**it, FinishReason::cancelled);
}

// The line's first requests into the free slots, in order.
void BatchGenerator::admit() {
  while (int(running_.size()) < options_.max_running && !waiting_.empty()) {
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

// Up to prefill_chunk prompt tokens this round, to the requests still prefilling in admission
// order: a request's prefill stops at its PrefillStop and goes on in the same round (the stop is a
// snapshot, not a reason to hold its first token a round), and its last piece gives the row of its
// first token, drawn at once (so the request joins this round's batch step).
void BatchGenerator::prefill_round() {
  int64_t budget = options_.prefill_chunk;
  for (auto& r : running_) {
    while (budget > 0 && r->prefilling()) budget -= prefill_piece(*r, budget);
    if (budget == 0) return;
  }
}

// One forward of at most `budget` of r's prompt tokens, to its stop or its end; returns how many
// (0 when it failed: it has then ended).
int64_t BatchGenerator::prefill_piece(Request& r, int64_t budget) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const int64_t done = r.state->length(), total = int64_t(r.request.prompt.size());
    const int64_t until = r.stop.reached && done < r.stop.length ? r.stop.length : total;
    const int64_t n = std::min(budget, until - done);
    const bool last = done + n == total;
    if (r.speculative) return prefill_speculative(r, n, last, t0);
    backend_.forward(*r.state, std::span<const int32_t>(r.request.prompt.data() + done, size_t(n)),
                     last ? LogitsWanted::last : LogitsWanted::none, r.logits);
    r.result.prefill_seconds += seconds_since(t0);
    r.reach_stop();
    if (last) {
      r.decode_start = std::chrono::steady_clock::now();
      if (r.request.max_new_tokens == 0 || !r.draw()) end(r, r.result.finish);
    }
    return n;
  } catch (...) {
    fail(r, std::current_exception());
    return 0;
  }
}

// A speculative request's piece of prefill: n prompt tokens with the MTP head fed beside them
// (prefill_with_head), the last through its decoder's start (the rest of the prompt, the first
// token drawn and delivered).
int64_t BatchGenerator::prefill_speculative(Request& r, int64_t n, bool last,
                                            std::chrono::steady_clock::time_point t0) {
  if (!last) {
    prefill_with_head(backend_, *r.state, r.request.prompt, r.state->length() + n);
    r.result.prefill_seconds += seconds_since(t0);
    r.reach_stop();
    return n;
  }
  const bool going = r.speculative->start();
  r.result.prefill_seconds += seconds_since(t0);
  r.decode_start = std::chrono::steady_clock::now();
  r.speculating = true;
  if (!going) end(r, r.speculative->result().finish);
  return n;
}

// One round of every request past its prefill: one token of each plain request in one batch step
// (each draws its next token from its row), then one speculative step of each speculative one.
void BatchGenerator::decode_step() {
  batch_step();
  for (auto& r : running_) {
    if (r->ended || !r->speculating) continue;
    ++steps_;
    try {
      if (!r->speculative->step()) end(*r, r->speculative->result().finish);
    } catch (...) {
      fail(*r, std::current_exception());
    }
  }
}

void BatchGenerator::batch_step() {
  std::vector<Request*> rows;
  for (auto& r : running_)
    if (!r->ended && r->pending >= 0) rows.push_back(r.get());
  if (rows.empty()) return;
  if (rows.size() == 1) return decode_alone(*rows[0]);
  std::vector<SequenceState*> states;
  std::vector<int32_t> tokens;
  for (Request* r : rows) states.push_back(r->state), tokens.push_back(r->pending);
  std::vector<float> logits;
  try {
    backend_.forward_batch(states, tokens, logits);
  } catch (...) {
    for (Request* r : rows) fail(*r, std::current_exception());
    return;
  }
  ++steps_;
  const size_t V = size_t(backend_.config().vocab_size);
  for (size_t i = 0; i < rows.size(); ++i) {
    Request& r = *rows[i];
    r.pending = -1;
    r.logits.assign(logits.begin() + ptrdiff_t(i * V), logits.begin() + ptrdiff_t((i + 1) * V));
    try {
      if (!r.draw()) end(r, r.result.finish);
    } catch (...) {
      fail(r, std::current_exception());
    }
  }
}

// The step of a request decoding alone (the others prefilling, or none): generate()'s own step,
// without the whole row a batch step hands over. On the H100 at 4K a lone stream through lily
// serve took 326 tokens/s on batch steps of one row, where the graph loop ran 551 (session 25).
void BatchGenerator::decode_alone(Request& r) {
  ++steps_;
  try {
    if (!r.step_alone(backend_)) end(r, r.result.finish);
  } catch (...) {
    fail(r, std::current_exception());
  }
}

// reason: what decode_token::deliver set (stop, cancelled), else length (GenerateResult's default).
// A speculative request's tokens, drafts and grammar time are its decoder's; the prompt's counts
// and the prefill time are this request's.
void BatchGenerator::end(Request& r, FinishReason reason) {
  if (r.speculative) {
    GenerateResult result = std::move(r.speculative->result());
    result.prompt_tokens = r.result.prompt_tokens, result.cached_tokens = r.result.cached_tokens;
    result.prefill_seconds = r.result.prefill_seconds;
    r.result = std::move(result);
    r.speculative.reset();
  }
  r.ended = true;
  r.pending = -1;
  r.result.finish = reason;
  if (r.decode_start != std::chrono::steady_clock::time_point{})
    r.result.decode_seconds = seconds_since(r.decode_start);
}

void BatchGenerator::fail(Request& r, std::exception_ptr error) {
  end(r, r.result.finish);
  r.error = std::move(error);
}

// Ended requests leave their slots; their outcomes wait for take().
void BatchGenerator::retire_ended() {
  for (auto& r : running_)
    if (r->ended) done_[r->id] = BatchOutcome{std::move(r->result), r->error};
  std::erase_if(running_, [](const auto& r) { return r->ended; });
}

}  // namespace lily
