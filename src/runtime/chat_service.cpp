// chat_service.cpp: ChatService (chat_service.h): preparing a request, and a completion on the
// calling thread; the parallel completions' side is chat_batch.cpp.
#include "runtime/chat_service.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "base/log.h"
#include "runtime/chat_completion.h"
#include "runtime/speculative.h"

namespace lily {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_nonempty_array(const json& j) { return j.is_array() && !j.empty(); }

// Grammar refusals become a 400 on the request field they came from: a SchemaError ("json_schema:
// unsupported keyword 'pattern' at #/properties/a"), or a grammar past the builder's size limits
// (a schema whose bounds make it too large).
RequestError schema_refusal(const OutputConstraint& c, const std::string& what, const std::string& refused_at) {
  const std::string param = c.param(refused_at);
  if (param == "tools") return RequestError(fmt::format("tools cannot be compiled into a grammar: {}", what), param);
  return RequestError(fmt::format("{}: {}", param, what), param);
}

bool has_tool_named(const json& tools, const std::string& name) {
  if (!tools.is_array()) return false;
  for (const json& t : tools) {
    const json& f = tool_function(t);
    if (f.is_object() && f.contains("name") && f["name"] == name) return true;
  }
  return false;
}

}  // namespace

std::string new_tool_call_id() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* hex = "0123456789abcdef";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += hex[rng() % 16];
  return id;
}

ChatService::ChatService(Engine& engine, Tokenizer tokenizer, ChatServiceOptions options)
    : engine_(engine),
      backend_(options.backend ? *options.backend : engine.backend()),
      tokenizer_(std::move(tokenizer)),
      context_size_(options.context_size > 0 ? options.context_size : engine.config().max_position_embeddings),
      cache_(backend_, context_size_, options.cache_bytes),
      grammars_(tokenizer_, engine.config().vocab_size, options.grammar_cache_entries) {
  LILY_CHECK(tokenizer_.vocab_size() <= engine.config().vocab_size, "the tokenizer has {} ids but the model only {}",
             tokenizer_.vocab_size(), engine.config().vocab_size);
  LILY_CHECK(options.parallel >= 1, "parallel completions: {} (at least 1)", options.parallel);
  check_speculate(backend_, options.speculate);
  speculate_ = options.speculate;
  stats_ = cache_.stats();
  if (options.parallel > 1) {
    const uint64_t free_bytes = backend_.name() == "cpu" ? available_host_memory() : 0;
    const SlotBudget budget = SlotBudget::of(engine.config(), context_size_, options.parallel, stats_.budget_bytes,
                                             free_bytes);
    if (budget.fit < options.parallel) {
      LILY_CHECK(options.fewer_slots_if_short, "{}", budget.shortfall(options.parallel, context_size_));
      LILY_LOG_WARN("{}; running {} at once", budget.shortfall(options.parallel, context_size_), budget.fit);
    }
    // Even one slot that fits runs here: the callers may be several threads.
    scheduler_ = std::make_unique<BatchScheduler>(backend_, BatchGenerateOptions{budget.fit, options.prefill_chunk});
  }
}

ChatService::~ChatService() = default;

SlotStats ChatService::slots() const {
  if (!scheduler_) return SlotStats{};  // the serial path: its caller's queue knows
  return SlotStats{scheduler_->slots(), scheduler_->running(), scheduler_->waiting()};
}

PrefixCacheStats ChatService::cache_stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void ChatService::clear_cache() {
  std::lock_guard cache_lock(cache_mutex_);
  cache_.clear();
  std::lock_guard lock(stats_mutex_);
  stats_ = cache_.stats();
}

SamplingParams ChatService::default_sampling() const {
  const GenerationConfig& g = engine_.generation_config();
  SamplingParams s;
  if (g.temperature) s.temperature = *g.temperature;
  if (g.top_p) s.top_p = *g.top_p;
  if (g.top_k) s.top_k = *g.top_k;
  if (g.min_p) s.min_p = *g.min_p;
  if (g.repetition_penalty) s.repetition_penalty = *g.repetition_penalty;
  if (g.presence_penalty) s.presence_penalty = *g.presence_penalty;
  if (g.do_sample && !*g.do_sample) s.temperature = 0;
  return s;
}

int ChatService::speculate(const CompletionOptions& options) const {
  if (options.speculate < 0) return speculate_;
  check_speculate(backend_, options.speculate);
  return options.speculate;
}

std::vector<int32_t> ChatService::stop_tokens() const {
  std::vector<int32_t> ids;
  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = tokenizer_.token_id(name)) ids.push_back(*id);
  }
  for (int id : engine_.generation_config().eos_token_ids) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

namespace {

// The prompt plus max_tokens must fit the context: a request that does not is refused (400),
// never truncated.
void fit_context(PreparedCompletion& p, int64_t context_size, const char* param) {
  const int64_t n = int64_t(p.prompt.size());
  if (n == 0) throw RequestError("the prompt is empty", param);
  if (n >= context_size) {
    throw RequestError(fmt::format("the prompt has {} tokens, but the context size is {} (leaving no room for "
                                   "a reply)",
                                   n, context_size),
                       param, "context_length_exceeded");
  }
  if (p.options.max_tokens) {
    if (n + *p.options.max_tokens > context_size) {
      throw RequestError(fmt::format("the prompt has {} tokens and max_tokens is {}: {} in all, more than the "
                                     "context size of {}",
                                     n, *p.options.max_tokens, n + *p.options.max_tokens, context_size),
                         "max_tokens", "context_length_exceeded");
    }
    p.max_tokens = *p.options.max_tokens;
  } else {
    p.max_tokens = context_size - n;
  }
}

}  // namespace

PreparedCompletion ChatService::prepare_chat(const ChatRequest& request) const {
  PreparedCompletion p;
  p.chat = true;
  p.options = request.options;
  if (!request.tools.is_null() && !request.tools.is_array()) throw RequestError("tools must be an array", "tools");
  const bool have_tools = is_nonempty_array(request.tools);
  const ToolChoice& choice = request.tool_choice;
  if (choice.mode == ToolChoice::Mode::required && !have_tools) {
    throw RequestError("tool_choice \"required\" needs a non-empty tools array", "tool_choice");
  }
  if (choice.mode == ToolChoice::Mode::function && !has_tool_named(request.tools, choice.function)) {
    throw RequestError(fmt::format("tool_choice names the function \"{}\", which is not in tools", choice.function),
                       "tool_choice");
  }

  const std::string text = render_chat_template(request.messages, request.tools, request.template_options);
  p.prompt = tokenizer_.encode(text);
  p.starts_in_reasoning = ends_with(text, "<think>\n");
  p.tools = request.tools;
  p.parse_tool_calls = have_tools && choice.mode != ToolChoice::Mode::none;
  p.grammar = compile(chat_constraint(request.response_format, request.tools, choice, request.parallel_tool_calls,
                                      p.starts_in_reasoning));
  // The template boundary: the generation prompt's <|im_start|> (see prefix_cache.h).
  if (auto im_start = tokenizer_.token_id("<|im_start|>")) {
    auto it = std::find(p.prompt.rbegin(), p.prompt.rend(), *im_start);
    if (it != p.prompt.rend()) p.reuse_boundary = int64_t(p.prompt.rend() - it) - 1;
  }
  fit_context(p, context_size_, "messages");
  return p;
}

PreparedCompletion ChatService::prepare_text(const TextRequest& request) const {
  PreparedCompletion p;
  p.options = request.options;
  if (!request.prompt_tokens.empty()) {
    const int32_t limit = tokenizer_.vocab_size();
    for (int32_t id : request.prompt_tokens) {
      if (id < 0 || id >= limit) throw RequestError(fmt::format("token id {} is outside [0, {})", id, limit), "prompt");
    }
    p.prompt = request.prompt_tokens;
  } else {
    p.prompt = tokenizer_.encode(request.prompt);
  }
  p.grammar = compile(text_constraint(request.response_format));
  fit_context(p, context_size_, "prompt");
  return p;
}

std::shared_ptr<const grammar::CompiledGrammar> ChatService::compile(
    const std::optional<OutputConstraint>& constraint) const {
  if (!constraint) return nullptr;
  try {
    return grammars_.get(*constraint);
  } catch (const grammar::SchemaError& e) {
    throw schema_refusal(*constraint, e.what(), e.path());
  } catch (const Error& e) {  // the grammar past its size limits
    throw schema_refusal(*constraint, e.what(), "");
  } catch (const json::exception& e) {  // a schema value of a type the compiler did not expect
    throw schema_refusal(*constraint, e.what(), "");
  }
}

namespace {

// The template boundary (prefix_cache.h): the prompt up to it is computed on its own and
// snapshotted there, because the next turn renders this one differently from that point on.
// Speculating, the MTP head is fed beside it (prefill_with_head), so that its cache has no gap.
void snapshot_boundary(Backend& backend, SequenceTokens& seq, int64_t boundary, bool with_head) {
  if (boundary <= seq.in_state() || boundary >= seq.prompt_length()) return;
  seq.prefill_to(backend, boundary, with_head);
  seq.snapshot_here();
}

std::optional<OutputParserOptions> parser_options(const PreparedCompletion& p) {
  if (!p.chat) return std::nullopt;
  return OutputParserOptions{p.starts_in_reasoning, p.tools, p.parse_tool_calls};
}

// "stop" when a stop token or a stop string ended the reply ("tool_calls" when it made calls);
// else "length", a cancelled generation included.
std::string finish_reason(FinishReason finish, bool stop_string, const std::vector<ToolCall>& calls) {
  if (!stop_string && finish != FinishReason::stop) return "length";
  return calls.empty() ? "stop" : "tool_calls";
}

}  // namespace

ChatService::Completion ChatService::begin(const PreparedCompletion& p, DeltaCallback on_delta,
                                           Clock::time_point start) {
  const CompletionOptions& options = p.options;
  CachedSequence sequence;
  {
    std::lock_guard lock(cache_mutex_);
    sequence = options.use_cache ? cache_.acquire(p.prompt) : cache_.fresh();
  }
  Completion c{
      .p = p,
      .start = start,
      .seq = SequenceTokens(std::move(sequence), p.prompt),
      .reply = ReplyStream(tokenizer_, parser_options(p), options.stop, std::move(on_delta)),
      .grammar = std::nullopt,
      // ignore_eos keeps generating past the stop tokens, except under a grammar: there a stop
      // token is where the grammar has ended, and nothing may follow it.
      .stop_ids = options.ignore_eos && !p.grammar ? std::vector<int32_t>{} : stop_tokens(),
      .usage = {},
      .timings = {},
  };
  if (p.grammar) c.grammar.emplace(p.grammar);
  c.usage.prompt_tokens = c.seq.prompt_length();
  c.usage.cached_tokens = c.seq.in_state();
  c.timings.prefilled_tokens = c.usage.prompt_tokens - c.usage.cached_tokens;
  return c;
}

CompletionResult ChatService::complete(const PreparedCompletion& p, const DeltaCallback& on_delta,
                                       const KeepGoing& keep_going) {
  if (scheduler_) return complete_in_batch(p, on_delta, keep_going);
  const Clock::time_point start = Clock::now();
  Completion c = begin(p, on_delta, start);
  if (p.options.use_cache) snapshot_boundary(backend_, c.seq, p.reuse_boundary, speculate(p.options) > 0);
  c.timings.prefill_seconds = seconds_since(start);
  const FinishReason reason = generate_reply(c);
  return finish(c, reason);
}

// One generation: it ends at a stop token, at the grammar's end, a stop string, the client
// leaving, or max_tokens.
FinishReason ChatService::generate_reply(Completion& c) {
  if (c.remaining() <= 0) return FinishReason::length;
  GenerateResult r = c.seq.generate(backend_, reply_request(c),
                                    [&](const GeneratedToken& t) { return on_token(c, t); });
  c.timings.add(r);
  return r.finish;
}

void Timings::add(const GenerateResult& r) {
  prefill_seconds += r.prefill_seconds;
  decode_seconds += r.decode_seconds;
  grammar_seconds += r.grammar_seconds;
  decoded_tokens += int64_t(r.tokens.size());
  speculative = speculative || !r.speculation.drafted.empty();  // [speculate] when it drafted
  for (size_t k = 0; k < r.speculation.drafted.size(); ++k)
    drafted_tokens += r.speculation.drafted[k], accepted_tokens += r.speculation.accepted[k];
}

// The generation of the reply (its prompt set by SequenceTokens).
GenerateRequest ChatService::reply_request(Completion& c) const {
  GenerateRequest g;
  g.max_new_tokens = c.remaining();
  g.sampling = c.p.options.sampling;
  g.stop_tokens = c.stop_ids;
  g.vocab_limit = tokenizer_.vocab_size();
  g.top_logprobs = c.p.options.top_logprobs;
  g.grammar = c.grammar ? &*c.grammar : nullptr;
  g.speculate = speculate(c.p.options);
  return g;
}

bool ChatService::on_token(Completion& c, const GeneratedToken& token) {
  if (c.first_token) {
    c.first_token = false;
    c.timings.first_token_seconds = seconds_since(c.start);
    // The end of the prompt, where a tool result or a regenerated answer resumes.
    if (c.p.options.use_cache && c.seq.in_state() == c.seq.prompt_length()) c.seq.snapshot_here();
  }
  if (c.is_stop_id(token.id)) return true;  // ends the reply; never part of its text
  return c.reply.push_token(token);
}

CompletionResult ChatService::finish(Completion& c, FinishReason reason) {
  c.reply.finish();
  CompletionResult r;
  ChatDelta whole = c.reply.take_whole();
  r.reasoning = std::move(whole.reasoning);
  r.content = std::move(whole.content);
  r.tool_calls = std::move(whole.tool_calls);
  r.logprobs = std::move(whole.logprobs);
  r.tokens.assign(c.seq.reply().begin(), c.seq.reply().end());
  r.finish_reason = finish_reason(reason, c.reply.stopped(), r.tool_calls);
  if (c.reply.stopped()) r.stop_sequence = c.reply.stop_string();
  r.cancelled = c.reply.cancelled() || c.cancelled;
  r.usage = c.usage;
  r.usage.completion_tokens = int64_t(r.tokens.size());
  r.usage.reasoning_tokens = c.reply.reasoning_tokens();
  if (c.timings.speculative)
    r.usage.predictions = PredictionTokens{c.timings.accepted_tokens,
                                           c.timings.drafted_tokens - c.timings.accepted_tokens};
  r.timings = c.timings;

  std::lock_guard cache_lock(cache_mutex_);
  if (c.p.options.use_cache) cache_.release(std::move(c.seq).take());
  std::lock_guard lock(stats_mutex_);
  stats_ = cache_.stats();
  return r;
}

}  // namespace lily
