#include "runtime/generate.h"

#include "runtime/decode_token.h"
#include "runtime/speculative.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/error.h"
#include "grammar/matcher.h"

namespace lily {

void SpeculationStats::add(const SpeculationStats& other) {
  if (drafted.size() < other.drafted.size())
    drafted.resize(other.drafted.size()), accepted.resize(other.drafted.size());
  for (size_t k = 0; k < other.drafted.size(); ++k) drafted[k] += other.drafted[k], accepted[k] += other.accepted[k];
  steps += other.steps;
  step_tokens += other.step_tokens;
  replays += other.replays;
}

const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::cancelled: return "cancelled";
  }
  return "?";
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

using decode_token::advance;
using decode_token::mask_logits;

bool grammar_ended(const grammar::GrammarMatcher* grammar) {
  return grammar && (grammar->must_stop() || grammar->is_finished());
}

// The decode after the first token on a chain of the backend's (Backend::chain_tokens): the
// tokens chosen where the logits are (penalties included; under a grammar among the ids it
// allows, its mask filled while the step computes), the host one step behind. Offered for what
// the chain can choose: a sampler that needs only the best few logits once the
// penalties are applied (logprobs, when asked, come with each token). Returns false, having done
// nothing, when not offered.
bool decode_chained(Backend& backend, SequenceState& state, const GenerateRequest& request, const Sampler& sampler,
                    int32_t limit, int32_t first, const AllowedTokens* allowed, const TokenCallback& on_token,
                    GenerateResult& result) {
  const int count = sampler.candidates_after_penalties();
  if (request.top_logprobs > kMaxChainLogprobs || count < 1) return false;
  ChainChoice choice{.count = count,
                     .vocab_limit = limit,
                     .draw = request.sampling.draw(),
                     .seed = sampler.seed(),
                     .first_draw = sampler.draws(),
                     .penalties = request.sampling.penalties(),
                     .history = {},
                     .allowed = allowed,
                     .top_logprobs = request.top_logprobs};
  if (choice.penalties.any()) choice.history = result.tokens;
  std::unique_ptr<TokenChain> chain = backend.chain_tokens(state, first, request.max_new_tokens - 1, choice);
  if (!chain) return false;
  for (int64_t i = 1; i < request.max_new_tokens; ++i) {
    const ChainedToken chained = chain->next();
    GeneratedToken token;
    token.id = chained.id;
    if (request.top_logprobs >= 0) {
      token.logprob = TokenLogprob{chained.id, chained.logprob};
      for (const TokenLogit& alt : chained.top) token.top.push_back({alt.token, alt.logit});
    }
    if (request.grammar) advance(*request.grammar, token.id);  // before the next step's mask
    if (!decode_token::deliver(token, request, on_token, result)) break;
  }
  return true;
}

}  // namespace

GenerateResult generate(Backend& backend, SequenceState& state, const GenerateRequest& request,
                        const TokenCallback& on_token) {
  if (request.speculate > 0) return speculative_generate(backend, state, request, on_token);
  GenerateResult result;
  const int32_t limit = decode_token::check_request(backend, state, request);
  const int64_t cached = state.length();
  result.prompt_tokens = int64_t(request.prompt.size());
  result.cached_tokens = cached;

  auto t0 = std::chrono::steady_clock::now();
  std::vector<float> logits;
  std::span<const int32_t> fresh(request.prompt.data() + cached, request.prompt.size() - size_t(cached));
  backend.forward(state, fresh, LogitsWanted::last, logits);
  result.prefill_seconds = seconds_since(t0);

  Sampler sampler(request.sampling, limit);
  // Decode steps hand the sampler only the best few logits when that decides its draw and the
  // backend can select them where the logits are (no whole row copied off the GPU). Under a
  // grammar the backend selects among the tokens the grammar allows: it gets the mask as
  // AllowedTokens and fills it while its step runs, so the best few are the best allowed ones
  // and the draw is the whole masked row's (the sampler's filters act on allowed tokens only).
  const int candidate_count = request.top_logprobs < 0 ? sampler.candidates_needed() : 0;
  std::vector<uint64_t> mask;
  AllowedTokens allowed;
  if (request.grammar) {
    allowed.words = request.grammar->compiled().vocabulary().mask_words();
    allowed.fill = [&](std::span<uint64_t> words) {
      const auto t = std::chrono::steady_clock::now();
      request.grammar->fill_next_token_bitmask(words);
      result.grammar_seconds += seconds_since(t);
    };
  }
  std::vector<TokenLogit> candidates;
  bool have_candidates = false;  // this step's input: candidates (true) or logits
  auto t1 = std::chrono::steady_clock::now();
  result.finish = FinishReason::length;
  for (int64_t i = 0; i < request.max_new_tokens; ++i) {
    GeneratedToken token;
    if (have_candidates) {
      token = decode_token::sample_candidates(sampler, candidates, request);
    } else {
      token = decode_token::sample_row(sampler, logits, request, limit, mask, result);
    }
    if (!decode_token::deliver(token, request, on_token, result)) break;
    if (i + 1 == request.max_new_tokens) break;
    // After the first token (drawn from the prefill's logits, delivered before any step runs:
    // the caller may snapshot the state there), the rest on a chain where the backend has one.
    if (i == 0 && decode_chained(backend, state, request, sampler, limit, token.id,
                                 request.grammar ? &allowed : nullptr, on_token, result))
      break;
    have_candidates = candidate_count > 0 &&
                      backend.forward_candidates(state, token.id, candidate_count, limit,
                                                 request.grammar ? &allowed : nullptr, candidates);
    if (!have_candidates) backend.forward(state, std::span<const int32_t>(&token.id, 1), LogitsWanted::last, logits);
  }
  result.decode_seconds = seconds_since(t1);
  return result;
}

namespace decode_token {

namespace {

// The backend's candidates among the allowed tokens, those at -inf left out (the whole-row path
// cannot tell them from the masked ones, and does not sample them). None left: no allowed token
// has a usable logit, which the whole-row path reports through advance() too.
void keep_usable(std::vector<TokenLogit>& candidates) {
  std::erase_if(candidates, [](const TokenLogit& c) { return !(c.logit > -INFINITY); });
  if (candidates.empty())
    throw Error("constrained decoding: the model gave no usable logit for any token the grammar allows");
}

}  // namespace

GeneratedToken sample_candidates(Sampler& sampler, std::vector<TokenLogit>& candidates,
                                 const GenerateRequest& request) {
  if (request.grammar) keep_usable(candidates);
  GeneratedToken token;
  token.id = sampler.sample_candidates(candidates);
  if (request.grammar) advance(*request.grammar, token.id);
  return token;
}

double mask_logits(grammar::GrammarMatcher& grammar, std::vector<uint64_t>& mask, std::span<float> logits) {
  const auto t0 = std::chrono::steady_clock::now();
  mask.resize(grammar.compiled().vocabulary().mask_words());
  grammar.fill_next_token_bitmask(mask);
  grammar::apply_token_bitmask(logits, mask);
  return seconds_since(t0);
}

void advance(grammar::GrammarMatcher& grammar, int32_t token) {
  if (!grammar.accept_token(token))
    throw Error(fmt::format("constrained decoding: token {} was sampled but the grammar does not allow it (the "
                            "model gave no usable logit for any allowed token)",
                            token));
}

int32_t check_request(const Backend& backend, const SequenceState& state, const GenerateRequest& request) {
  const int64_t cached = state.length();
  const int64_t prompt_len = int64_t(request.prompt.size());
  LILY_CHECK(cached <= prompt_len, "internal: the state holds {} tokens, more than the prompt's {}", cached,
             prompt_len);
  LILY_CHECK(cached < prompt_len, "the prompt must have at least one token not already processed");
  LILY_CHECK(prompt_len + request.max_new_tokens <= state.capacity(),
             "prompt of {} tokens plus {} new tokens exceeds the context size of {}", prompt_len,
             request.max_new_tokens, state.capacity());
  const int32_t vocab = backend.config().vocab_size;
  const int32_t limit = request.vocab_limit > 0 ? std::min(request.vocab_limit, vocab) : vocab;
  if (request.grammar) {
    const int32_t grammar_ids = request.grammar->compiled().vocabulary().size();
    LILY_CHECK(grammar_ids >= limit,
               "constrained decoding: the grammar's vocabulary has {} ids, fewer than the {} sampled", grammar_ids,
               limit);
    LILY_CHECK(!grammar_ended(request.grammar), "constrained decoding: the grammar has already ended");
  }
  return limit;
}

GeneratedToken sample_row(Sampler& sampler, std::vector<float>& logits, const GenerateRequest& request, int32_t limit,
                          std::vector<uint64_t>& mask, GenerateResult& result) {
  GeneratedToken token;
  if (request.top_logprobs >= 0)  // log-probabilities of the model's distribution, before sampling filters
    token.top = top_logprobs(logits, request.top_logprobs, limit);
  std::vector<float> raw = request.top_logprobs >= 0 ? logits : std::vector<float>{};
  if (request.grammar) result.grammar_seconds += mask_logits(*request.grammar, mask, logits);
  token.id = sampler.sample(logits, result.tokens);
  if (request.grammar) advance(*request.grammar, token.id);
  if (request.top_logprobs >= 0) token.logprob = token_logprob(raw, token.id, limit);
  return token;
}

bool deliver(const GeneratedToken& token, const GenerateRequest& request, const TokenCallback& on_token,
             GenerateResult& result) {
  result.tokens.push_back(token.id);
  const bool is_stop = std::find(request.stop_tokens.begin(), request.stop_tokens.end(), token.id) !=
                           request.stop_tokens.end() ||
                       grammar_ended(request.grammar);
  if (!on_token(token)) {
    result.finish = is_stop ? FinishReason::stop : FinishReason::cancelled;
    return false;
  }
  if (is_stop) {
    result.finish = FinishReason::stop;
    return false;
  }
  return true;
}

}  // namespace decode_token

}  // namespace lily
