// batch_generate.h: several requests decoding in the same steps (parallel requests).
//
// Each request is generate()'s, token for token: its prompt prefilled, its first token drawn from
// the prefill's last row, then one token a step drawn from that step's row (decode_token.h: the
// same draw, logprobs, grammar and hand-over). What differs is who runs the steps: every request
// past its prefill appends its token in one Backend::forward_batch of all of them, so a step of
// N rows reads the weights once where the backend batches (the GPU; the CPU's fast path).
//
//   add()    a request joins the line (FIFO); it holds a slot from its admission to its end
//   step()   one round: admit waiting requests into free slots; up to prefill_chunk prompt
//            tokens of the oldest requests still prefilling (a long prompt holds the running
//            streams for at most one chunk a round; a request whose prompt ends in the round gets
//            its first token in it); one batch step of every request past its prefill
//   take()   a finished request's outcome, once
//   cancel() ends a request at once, waiting or running (its client gone while it prefills)
//
// A request with GenerateRequest::speculate > 0 (the backend running the MTP head: checked in add())
// is speculative_generate()'s instead (speculative.h): its prefill feeds the head, and once past it
// the request runs one draft-verify-cut step of its own each round, after the batch step of the
// plain requests: the tokens of plain decoding (greedy), its distribution (sampling), 1 to K + 1
// tokens a round.
//
// A request ends at its stop token, the grammar's end, max_new_tokens, or when its callback says
// stop (a client gone: its slot is free before the next step). An exception in one request (its
// grammar at a dead end, its callback throwing) ends that request alone, with the error kept in
// its outcome. Afterwards its state holds the prompt and every generated token but the last, as
// generate()'s whole-row path leaves it.
//
// Not thread safe: one thread calls add(), step() and take() (the scheduler's); callbacks run on
// it, between the steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "runtime/generate.h"
#include "runtime/sampler.h"

namespace lily {

struct BatchGenerateOptions {
  int max_running = 4;          // requests holding a slot (prefilling or decoding)
  int64_t prefill_chunk = 512;  // prompt tokens a round prefills, over one or more requests (any >= 1)
};

// A point of the prompt where the prefill cuts its forward and calls `reached` (the state then
// holds prompt[0 : length]), going on in the same round: the chat service snapshots the template
// boundary there. None: length 0.
struct PrefillStop {
  int64_t length = 0;
  std::function<void()> reached;
};

struct BatchOutcome {
  GenerateResult result;
  std::exception_ptr error;  // set when the request ended by an exception (result: up to there)
};

class BatchGenerator {
 public:
  BatchGenerator(Backend& backend, BatchGenerateOptions options);
  ~BatchGenerator();
  BatchGenerator(const BatchGenerator&) = delete;
  BatchGenerator& operator=(const BatchGenerator&) = delete;

  // The request's state must hold a prefix of its prompt and outlive the request; the request
  // (its grammar) too. Checked here (decode_token::check_request): a bad request throws and
  // joins nothing. Returns the request's id.
  uint64_t add(const GenerateRequest& request, SequenceState& state, TokenCallback on_token, PrefillStop stop = {});

  // Ends the request with FinishReason::cancelled: out of the line, or out of its slot before
  // the next step. Its outcome waits for take(). An unknown or ended id: nothing.
  void cancel(uint64_t id);

  // One round (see above). Returns false when no request is left to run.
  bool step();

  // The outcome of a finished request, once; none while it runs (or for an unknown id).
  std::optional<BatchOutcome> take(uint64_t id);

  size_t running() const { return running_.size(); }  // holding a slot
  size_t waiting() const { return waiting_.size(); }  // in line behind the slots
  int64_t steps() const { return steps_; }            // batch steps run so far

 private:
  struct Request;  // one request's generation (batch_generate.cpp)

  void admit();
  void prefill_round();
  int64_t prefill_piece(Request& r, int64_t budget);
  int64_t prefill_speculative(Request& r, int64_t n, bool last, std::chrono::steady_clock::time_point t0);
  void decode_step();
  void batch_step();
  void decode_alone(Request& r);
  void end(Request& r, FinishReason reason);
  void fail(Request& r, std::exception_ptr error);
  void retire_ended();

  Backend& backend_;
  const BatchGenerateOptions options_;
  uint64_t next_id_ = 0;
  int64_t steps_ = 0;
  std::deque<std::unique_ptr<Request>> waiting_;
  std::vector<std::unique_ptr<Request>> running_;  // in admission order
  std::map<uint64_t, BatchOutcome> done_;
};

}  // namespace lily
