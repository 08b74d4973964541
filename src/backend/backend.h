// backend.h: the contract between the runtime and a compute backend (CPU, CUDA).
//
// A backend owns the whole forward of the model: it receives token ids and returns logits,
// so it is free to fuse and schedule layers its own way. The state of one sequence (KV cache
// of the attention layers, conv and recurrent state of the DeltaNet layers, spec §4; the MTP
// head's KV cache, spec §6) lives in a SequenceState that the backend creates; the runtime only
// appends to it, copies it and rolls it back to snapshots.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/token_draw.h"
#include "base/error.h"
#include "model/config.h"

namespace lily {

struct ModelWeights;

// The recurrent part of a sequence at some length: DeltaNet conv + SSM state. Restoring it
// and cutting the KV cache to `length` returns the sequence to that point, provided the
// tokens before `length` are unchanged (KV rows are append-only).
class RecurrentSnapshot {
 public:
  virtual ~RecurrentSnapshot() = default;
  virtual int64_t length() const = 0;
  virtual uint64_t memory_bytes() const = 0;
};

class SequenceState {
 public:
  virtual ~SequenceState() = default;
  virtual int64_t length() const = 0;         // tokens processed so far (= next position)
  virtual int64_t capacity() const = 0;       // most tokens the state can hold
  virtual uint64_t memory_bytes() const = 0;  // memory the state occupies (what a cache of states must budget)
  // A deep copy (KV cache up to length() and recurrent state).
  virtual std::unique_ptr<SequenceState> clone() const = 0;
  virtual std::unique_ptr<RecurrentSnapshot> snapshot() const = 0;
  // Rolls back to `snapshot` (taken from this sequence, or from one sharing its first
  // snapshot.length() tokens): KV cut to that length, recurrent state copied back.
  virtual void restore(const RecurrentSnapshot& snapshot) = 0;
  virtual void reset() = 0;  // back to the empty sequence

  // Positions the MTP head has appended (Backend::forward_mtp; = its next position), 0 where the
  // backend has none. Its KV cache is append-only like the main one and goes with the state:
  // clone() copies it, snapshot() records this length, restore() cuts the cache back to it (it
  // must not be past the current one), reset() empties it. It may run ahead of length() by the
  // chained drafts.
  virtual int64_t mtp_length() const { return 0; }

  // A speculative verify (spec §6): the runtime appends a token and its drafts in one forward,
  // then keeps only the accepted prefix. keep_row_states(rows) asks the state to keep, through
  // the next forward / forward_hidden call on it, what it needs to be cut back to any length that
  // call passes through within its last `rows` rows (each of those rows' DeltaNet conv and SSM
  // states); it holds for that one call. rewind(length, mtp_length) then cuts the sequence back
  // to such a length (KV rows cut, that row's recurrent state restored) and the MTP cache back to
  // mtp_length (at most its current length). Both return false where the state cannot (the
  // default; rewind then changes nothing): the caller restores a snapshot and runs the kept
  // tokens again, which gives the same state.
  virtual bool keep_row_states(int rows) {
    (void)rows;
    return false;
  }
  virtual bool rewind(int64_t length, int64_t mtp_length) {
    (void)length, (void)mtp_length;
    return false;
  }
};

enum class LogitsWanted { none, last, all };

// One candidate of the next token: its id and raw logit.
struct TokenLogit {
  int32_t token = 0;
  float logit = 0;
};

// The tokens a grammar allows next, for Backend::forward_candidates: `fill` writes a bitmask into
// the `words` 64-bit words it is given, bit (i % 64) of word i / 64 set iff token i may be
// chosen (grammar::GrammarMatcher::fill_next_token_bitmask's layout); words * 64 covers at least
// the vocab_limit ids selected over. A backend calls `fill` once per step, when it likes: the
// CUDA backend after launching the step, so that the host computes the mask while the GPU runs,
// straight into the pinned buffer it uploads from.
struct AllowedTokens {
  size_t words = 0;
  std::function<void(std::span<uint64_t> mask)> fill;
};

// How the steps of a chain (Backend::chain_tokens) choose their tokens: the penalties applied
// to the logits of the tokens generated so far (those of `history`, generated before the chain,
// then the chain's own, counted with repeats; token_draw.h's penalized_logit), then the `count`
// best logits over ids [0, vocab_limit) (forward_candidates' selection), among the ids `allowed`
// allows when it is set (a grammar's mask; candidates at -inf are then left out too), the first
// when count is 1 (greedy), else the draw of token_draw.h with `draw` and the uniform
// draw_uniform(seed, first_draw + i) for the chain's i-th token (i from 0): the host sampler's
// draws, continued.
struct ChainChoice {
  int count = 1;
  int32_t vocab_limit = 0;
  DrawParams draw;
  uint64_t seed = 0;
  uint64_t first_draw = 0;
  Penalties penalties;
  std::vector<int32_t> history;
  // Under a grammar: its fill is called once for each step, when next() is called for that
  // step's token (the caller has advanced its grammar by every token returned before), and the
  // step's selection waits for the mask; its own computation does not.
  const AllowedTokens* allowed = nullptr;
  // Log-probabilities with each token (ChainedToken), 0 .. kMaxChainLogprobs most likely
  // alternatives; -1: none.
  int top_logprobs = -1;
};

constexpr int kMaxChainLogprobs = 20;  // the API's most alternatives a token (OpenAI: 20)

// A chained step's token; with ChainChoice::top_logprobs >= 0, its log-probability under the
// model's own distribution over ids [0, vocab_limit) (the raw logits: before penalties and mask)
// and the top_logprobs most likely ids of that distribution, descending, ties to the lower id,
// as (id, log-probability) pairs.
struct ChainedToken {
  int32_t id = 0;
  float logprob = 0;
  std::vector<TokenLogit> top;
};

// Decode steps chained where the logits are (Backend::chain_tokens): each step appends its input
// token and chooses the next, which the following step reads without the host.
class TokenChain {
 public:
  // Waits for the steps still running; never throws.
  virtual ~TokenChain() = default;
  // The next chosen token, in order (waits for its step).
  virtual ChainedToken next() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual const ModelConfig& config() const = 0;

  virtual std::unique_ptr<SequenceState> new_sequence(int64_t capacity) = 0;

  // The MTP head (spec §6), for the drafts of speculative decoding.
  //
  // Row i of the head takes h_i, the main model's hidden row at position i AFTER its final norm
  // (Backend::forward_hidden), and x_{i+1}, the token after it; it runs at position i and returns
  // the logits of x_{i+2} and m_i, its own post-norm row. A chained draft step feeds m_i back as
  // the hidden row, with the drafted token, at position i + 1. The head attends over every
  // position it has processed, so its cache is filled in order, without gaps: over a prompt
  // x_0..x_{n-1} the runtime appends rows 0..n-2 (hidden rows 0..n-2, tokens x_1..x_{n-1}), then
  // row n-1 with the sampled x_n.
  //
  // Empty when the backend runs the model's MTP head (forward_mtp); else why it cannot, a
  // sentence for the user: the model has no mtp.* weights, or the backend does not run the head
  // (the default).
  virtual std::string mtp_unavailable() const { return "the " + name() + " backend does not run the MTP head"; }
  bool has_mtp() const { return mtp_unavailable().empty(); }

  // Appends `tokens` to the sequence (a prefill of any length, processed in bounded chunks,
  // or a single decode token). Writes float32 logits into `logits`, resized to
  // [rows, vocab_size]: no rows, the last token's row, or one row per token.
  virtual void forward(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
                       std::vector<float>& logits) = 0;

  // forward() that also writes the hidden rows after the final norm (h_i of the MTP head) into
  // `hidden`, resized to [rows, hidden_size] for `hidden_rows` (none, the last token's, every
  // token's), independently of `wanted`. A backend that runs the head offers it; the default
  // throws mtp_unavailable() before touching the state.
  virtual void forward_hidden(SequenceState& state, std::span<const int32_t> tokens, LogitsWanted wanted,
                              std::vector<float>& logits, LogitsWanted hidden_rows, std::vector<float>& hidden) {
    (void)state, (void)tokens, (void)wanted, (void)logits, (void)hidden_rows, (void)hidden;
    fail("{}", mtp_unavailable());
  }

  // Appends T = tokens.size() rows to the MTP head's cache in `state`, at positions
  // state.mtp_length() + t: row t takes hidden[t] ([T, hidden_size]: post-norm rows of
  // forward_hidden, or the `mtp_hidden` of a previous call, to chain) and tokens[t] (the token
  // after that row's position). Writes the head's logits into `logits` ([rows, vocab_size]) and
  // its post-norm rows m into `mtp_hidden` ([rows, hidden_size]) for the rows `wanted`. Where
  // has_mtp() is false it throws mtp_unavailable() before touching the state (the default).
  virtual void forward_mtp(SequenceState& state, std::span<const float> hidden, std::span<const int32_t> tokens,
                           LogitsWanted wanted, std::vector<float>& logits, std::vector<float>& mtp_hidden) {
    (void)state, (void)hidden, (void)tokens, (void)wanted, (void)logits, (void)mtp_hidden;
    fail("{}", mtp_unavailable());
  }

  // One decode step for samplers that need only the best few logits (Sampler::candidates_needed):
  // appends `token`, then writes the `count` largest logits of the next token over ids
  // [0, vocab_limit) into `out`, in descending order, ties to the lower id (NaN logits never
  // included). With `allowed` (constrained decoding), only the ids its mask allows are
  // candidates: fewer than `count` when fewer allowed ids have a logit that is not NaN, none
  // when none has. A backend that can select them where the logits are (the GPU) returns true
  // and moves `count` pairs instead of a whole row; the default returns false without touching
  // the state or calling allowed->fill, and the caller runs forward() instead.
  virtual bool forward_candidates(SequenceState& state, int32_t token, int count, int32_t vocab_limit,
                                  const AllowedTokens* allowed, std::vector<TokenLogit>& out) {
    (void)state, (void)token, (void)count, (void)vocab_limit, (void)allowed, (void)out;
    return false;
  }

  // Up to `steps` decode steps chained on the backend (the GPU: the host's work on one token,
  // streaming it to a client, overlaps the next step): step 1 appends `token`, each later step
  // the token chosen (`choice`) by the one before; next() returns the chosen tokens in order, at
  // most `steps`, and throws when a step has no token to choose (every logit it may choose NaN,
  // or -inf under a mask). A chain runs one step ahead of the host: when next() returns a token,
  // the step that appends it is already running (unless it was the chain's last). So while a
  // chain lives the state is the chain's (nothing else may touch it), and once it is destroyed
  // the state holds `token` and every token next() returned, all but the last of a chain run to
  // its end. The default returns null (not offered): the caller steps with forward_candidates
  // instead.
  virtual std::unique_ptr<TokenChain> chain_tokens(SequenceState& state, int32_t token, int64_t steps,
                                                   const ChainChoice& choice) {
    (void)state, (void)token, (void)steps, (void)choice;
    return nullptr;
  }

  // One token for each of several sequences in one step (parallel requests): appends tokens[i]
  // to *states[i] and writes each one's next-token logits, [N, vocab_size] in the states' order.
  // The sequences must be distinct, each with room for a token, the tokens in the vocabulary:
  // checked before anything runs, so a refused step changes no sequence. The default runs them
  // one after another; a backend that batches them (the GPU: the weights read once for all the
  // rows) overrides it.
  virtual void forward_batch(std::span<SequenceState* const> states, std::span<const int32_t> tokens,
                             std::vector<float>& logits) {
    check_batch(states, tokens);
    const size_t V = size_t(config().vocab_size);
    logits.resize(states.size() * V);
    std::vector<float> row;
    for (size_t i = 0; i < states.size(); ++i) {
      forward(*states[i], tokens.subspan(i, 1), LogitsWanted::last, row);
      std::copy(row.begin(), row.end(), logits.begin() + ptrdiff_t(i * V));
    }
  }

 protected:
  // forward_mtp's arguments: a post-norm row of hidden_size values per token, room in the head's
  // cache for the rows, every token in the vocabulary.
  void check_mtp_rows(const SequenceState& state, std::span<const float> hidden,
                      std::span<const int32_t> tokens) const {
    const int64_t T = int64_t(tokens.size()), H = config().hidden_size;
    LILY_CHECK(int64_t(hidden.size()) == T * H,
               "forward_mtp: {} hidden values for {} tokens; expected [{}, {}] (a post-norm row per token)",
               hidden.size(), T, T, H);
    LILY_CHECK(state.mtp_length() + T <= state.capacity(),
               "forward_mtp: the MTP cache of {} positions plus {} new ones exceeds the sequence's capacity of {}",
               state.mtp_length(), T, state.capacity());
    for (int32_t id : tokens)
      LILY_CHECK(id >= 0 && id < config().vocab_size, "token id {} is outside the vocabulary [0, {})", id,
                 config().vocab_size);
  }

  // forward_batch's arguments: a token per state, none null, none twice, each with room for one
  // more token, every token in the vocabulary.
  void check_batch(std::span<SequenceState* const> states, std::span<const int32_t> tokens) const {
    LILY_CHECK(states.size() == tokens.size(), "a batch step of {} sequences with {} tokens", states.size(),
               tokens.size());
    for (size_t i = 0; i < states.size(); ++i) {
      LILY_CHECK(states[i] != nullptr, "a batch step's sequence {} is null", i);
      for (size_t j = 0; j < i; ++j)
        LILY_CHECK(states[j] != states[i], "a batch step names sequence {} twice (rows {} and {})", i, j, i);
      LILY_CHECK(states[i]->length() < states[i]->capacity(),
                 "a batch step's sequence {} is full: {} tokens, its capacity", i, states[i]->length());
      LILY_CHECK(tokens[i] >= 0 && tokens[i] < config().vocab_size,
                 "a batch step's token {} (row {}) is outside the vocabulary [0, {})", tokens[i], i,
                 config().vocab_size);
    }
  }
};

// The CPU backend: the readable reference implementation (backend/cpu/).
std::unique_ptr<Backend> make_cpu_backend(std::shared_ptr<const ModelWeights> weights);

}  // namespace lily
