// chat_service.h: one chat or text completion, from request structs to streamed deltas.
//
// The layer between the wire (server/, cli/) and the engine: it renders the chat template
// (chat/), tokenizes, reuses cached conversation state (prefix_cache.h), runs generate(),
// decodes the tokens incrementally, applies stop strings (completion_text.h), splits the text
// into reasoning / content / tool calls (chat/output_parser.h) and counts usage. It never sees
// JSON bodies or HTTP; the engine never sees it.
//
// Parallel completions (ChatServiceOptions::parallel > 1): complete() may run on several threads
// at once. Each completion then joins the batch of a scheduler thread (batch_scheduler.h), which
// runs every completion's prefill chunks, batch steps, template and reply work (stop strings,
// the output parser, the session-cache entry); the deltas come back to the calling thread, where
// on_delta runs (chat_batch.cpp). With parallel 1 (the default) complete() runs the completion on
// the calling thread, one at a time (the server's request queue makes sure), on generate()'s
// chained decode. The prepare_*() functions are const and may run on any thread.
//
// How complete() is put together: SequenceTokens (sequence_tokens.h) owns which tokens the
// sequence state holds; ReplyStream (reply_stream.h) turns tokens into deltas; a grammar
// (output_constraint.h, which also says what tool_choice and response_format do) holds the
// reply to a tool call or a JSON answer when the request asks for one.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "chat/chat_template.h"
#include "runtime/batch_scheduler.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/output_constraint.h"
#include "runtime/prefix_cache.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

namespace lily {

// A request the client got wrong (HTTP 400): names the parameter at fault.
class RequestError : public Error {
 public:
  RequestError(std::string message, std::string param, std::string code = "")
      : Error(std::move(message)), param(std::move(param)), code(std::move(code)) {}
  std::string param, code;
};

struct CompletionOptions {
  SamplingParams sampling;
  std::optional<int64_t> max_tokens;  // none: what the context leaves
  std::vector<std::string> stop;
  int top_logprobs = -1;    // -1: no logprobs; 0: the chosen token's; n: and the n best
  bool use_cache = true;    // false: a cold run on a fresh state, not kept afterwards
  bool ignore_eos = false;  // true: the stop tokens do not end the reply (benchmarks, tests)
  // MTP drafts a step (speculative.h; the same answers): -1 the service's default
  // (ChatServiceOptions::speculate), 0 off. Parallel completions (parallel > 1) too: each runs its
  // own steps beside the batch (batch_generate.h).
  int speculate = -1;
};

struct ChatRequest {
  json messages = json::array();
  json tools = nullptr;  // null or an array
  ToolChoice tool_choice;
  bool parallel_tool_calls = true;  // tool_choice required: more than one call allowed
  ResponseFormat response_format;
  ChatTemplateOptions template_options;
  CompletionOptions options;
};

struct TextRequest {
  std::string prompt;  // used when prompt_tokens is empty
  std::vector<int32_t> prompt_tokens;
  CompletionOptions options;
  ResponseFormat response_format;
};

struct ToolCall {
  std::string id;  // call_ + 24 hex digits
  std::string name;
  std::string arguments;  // a JSON object, as a string
};

struct LogprobAlternative {
  std::string token;  // the token's text (U+FFFD for a part of a character)
  std::string bytes;  // its raw bytes
  float logprob = 0;
};

struct TokenLogprobs {
  LogprobAlternative chosen;
  std::vector<LogprobAlternative> top;
};

// A tool call as it streams (chat/output_parser.h's ToolCallPiece, with its id). A call's first
// delta has its id and name; the `arguments` of a call's deltas, concatenated, are the
// arguments of its ToolCall, byte for byte.
struct ToolCallDelta {
  int index = 0;          // the call's place among the reply's calls: 0, 1, ...
  std::string id, name;   // the first delta of a call only
  std::string arguments;  // the next piece of the arguments JSON (may be empty)
};

// What one step of the reply added. Text is whole UTF-8 characters.
struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;             // calls completed by this step (ids as in tool_call_deltas)
  std::vector<ToolCallDelta> tool_call_deltas;  // calls as they stream, in order
  std::vector<TokenLogprobs> logprobs;
  bool empty() const {
    return reasoning.empty() && content.empty() && tool_calls.empty() && tool_call_deltas.empty() && logprobs.empty();
  }
};

// Speculative decoding's drafts (speculative.h): those the reply kept (each one of its tokens)
// and those refused (computed, not used); accepted + rejected = the drafts made. OpenAI's
// completion_tokens_details.accepted_prediction_tokens / rejected_prediction_tokens.
struct PredictionTokens {
  int64_t accepted = 0, rejected = 0;
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  // Of completion_tokens: those generated while the reply was in its reasoning (its </think>
  // included; forced text not).
  int64_t reasoning_tokens = 0;
  // The decode drafted with the MTP head (--speculate): what the drafts did; none without.
  std::optional<PredictionTokens> predictions;
};

struct Timings {
  int64_t prefilled_tokens = 0;  // prompt tokens computed (prompt - cached)
  int64_t decoded_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  double first_token_seconds = 0;                   // from the start of the completion to the first token
  double grammar_seconds = 0;                       // of decode_seconds: the grammar's masks (constrained decoding)
  int64_t drafted_tokens = 0, accepted_tokens = 0;  // speculative decoding's MTP drafts
  bool speculative = false;                         // the decode drafted (GenerateRequest::speculate > 0)
  void add(const GenerateResult& r);                // a generation's times, tokens and drafts
};

struct CompletionResult {
  std::string reasoning, content;  // whole texts (text completions: content)
  std::vector<ToolCall> tool_calls;
  std::vector<TokenLogprobs> logprobs;
  std::vector<int32_t> tokens;  // the reply's token ids, the stop token included
  std::string finish_reason;    // "stop", "length", "tool_calls"
  std::string stop_sequence;    // the stop string that ended the reply, if one did
  bool cancelled = false;       // the callback asked to stop (client gone)
  Usage usage;
  Timings timings;
};

// Return false to stop the generation (the client went away).
using DeltaCallback = std::function<bool(const ChatDelta&)>;
// Polled while a parallel completion runs, deltas or not (at least every kKeepGoingPoll): false
// stops it (the client went away, the server's drain time is over).
using KeepGoing = std::function<bool()>;
inline constexpr std::chrono::milliseconds kKeepGoingPoll{20};

// A request turned into tokens, checked against the context size.
struct PreparedCompletion {
  std::vector<int32_t> prompt;
  int64_t max_tokens = 0;
  int64_t reuse_boundary = 0;  // snapshot point before the generation prompt (0: none)
  bool chat = false;
  bool starts_in_reasoning = false;  // the prompt opened <think>
  // Constrained decoding (output_constraint.h): the reply's grammar, or none.
  std::shared_ptr<const grammar::CompiledGrammar> grammar;
  json tools = nullptr;
  bool parse_tool_calls = false;
  CompletionOptions options;
};

struct ChatServiceOptions {
  int64_t context_size = 0;                  // 0: the model's max_position_embeddings
  uint64_t cache_bytes = uint64_t(4) << 30;  // memory budget of the session cache
  size_t grammar_cache_entries = 32;         // compiled grammars kept (schemas, tool sets)
  Backend* backend = nullptr;                // run here instead of on the engine's backend (tests: a
                                             // wrapped one); the engine's model and config stay
  int parallel = 1;                          // completions decoding at once (> 1: in batch steps)
  bool fewer_slots_if_short = false;         // slots beyond the memory: fewer (a warning), not refused
  int64_t prefill_chunk = 512;               // parallel: prompt tokens prefilled between two steps
  // MTP drafts a step for completions that do not say (CompletionOptions::speculate); checked
  // against the backend when the service starts.
  int speculate = 0;
};

// The slots of parallel completions: how many, how many hold a completion, how many wait for one.
struct SlotStats {
  int slots = 1;
  size_t busy = 0, waiting = 0;
};

// The memory of the slots' states, budgeted up front: each slot may hold a whole context (its KV
// cache, its DeltaNet state and the snapshots a completion takes), against what the host has free
// when the states live there (the CPU backends) beyond the session cache's budget. So a
// --parallel and --ctx-size the host cannot hold are refused (or lowered, with a warning) when
// the service starts, with the figures, not met by an allocation failing mid-stream.
struct SlotBudget {
  uint64_t per_slot = 0;  // bytes of one slot's state at the whole context
  uint64_t room = 0;      // bytes free beyond the session cache (0 with free_bytes 0: unknown)
  int fit = 1;            // slots that fit, 1 to parallel (parallel when the memory is unknown)
  static SlotBudget of(const ModelConfig& config, int64_t context, int parallel, uint64_t cache_budget,
                       uint64_t free_bytes);
  std::string shortfall(int parallel, int64_t context) const;  // what a refusal says
};

class ChatService {
 public:
  ChatService(Engine& engine, Tokenizer tokenizer, ChatServiceOptions options = {});
  ~ChatService();

  // Sampling defaults from generation_config.json.
  SamplingParams default_sampling() const;
  int64_t context_size() const { return context_size_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  // Safe to call from any thread (updated after each completion).
  PrefixCacheStats cache_stats() const;
  void clear_cache();
  SlotStats slots() const;
  // Whether complete() may run on several threads at once (ChatServiceOptions::parallel > 1).
  bool concurrent() const { return scheduler_ != nullptr; }
  GrammarCache::Stats grammar_cache_stats() const { return grammars_.stats(); }

  // Render + tokenize + check, and compile the reply's grammar (from the cache when the same
  // constraint came before). Throws RequestError or TemplateError (both: HTTP 400).
  PreparedCompletion prepare_chat(const ChatRequest& request) const;
  PreparedCompletion prepare_text(const TextRequest& request) const;

  // Runs the completion; on_delta gets its deltas on the calling thread. keep_going: parallel
  // completions only (see KeepGoing); the serial path learns of a client gone from on_delta.
  CompletionResult complete(const PreparedCompletion& prepared, const DeltaCallback& on_delta,
                            const KeepGoing& keep_going = {});
  CompletionResult complete_chat(const ChatRequest& request, const DeltaCallback& on_delta) {
    return complete(prepare_chat(request), on_delta);
  }

 private:
  struct Completion;      // one complete() call's sequence, reply and grammar (chat_completion.h)
  class BatchCompletion;  // one completion in the scheduler's batch (chat_batch.cpp)

  std::vector<int32_t> stop_tokens() const;
  int speculate(const CompletionOptions& options) const;  // the drafts a step of a serial completion
  // The compiled grammar of a constraint; a refused schema is a RequestError naming it.
  std::shared_ptr<const grammar::CompiledGrammar> compile(const std::optional<OutputConstraint>& constraint) const;
  // complete(), by role: the completion's sequence (from the cache) and reply stream, the
  // generation, its request, one generated token, and the result (what goes back into the cache).
  Completion begin(const PreparedCompletion& p, DeltaCallback on_delta, std::chrono::steady_clock::time_point start);
  CompletionResult complete_in_batch(const PreparedCompletion& p, const DeltaCallback& on_delta,
                                     const KeepGoing& keep_going);
  FinishReason generate_reply(Completion& c);
  GenerateRequest reply_request(Completion& c) const;
  bool on_token(Completion& c, const GeneratedToken& token);
  CompletionResult finish(Completion& c, FinishReason reason);

  Engine& engine_;
  Backend& backend_;  // the engine's, or ChatServiceOptions::backend
  Tokenizer tokenizer_;
  int64_t context_size_;
  std::mutex cache_mutex_;  // cache_: completions on several threads, clear_cache on any
  PrefixCache cache_;
  mutable GrammarCache grammars_;  // refers to tokenizer_
  mutable std::mutex stats_mutex_;
  PrefixCacheStats stats_;
  int speculate_ = 0;                          // ChatServiceOptions::speculate
  std::unique_ptr<BatchScheduler> scheduler_;  // parallel > 1; last: stopped before the rest goes
};

// "call_" + 24 random hex digits.
std::string new_tool_call_id();

}  // namespace lily
