#include "runtime/chat_service.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "chat/output_parser.h"
#include "runtime/completion_text.h"
#include "runtime/generate.h"

namespace lily {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_nonempty_array(const json& j) { return j.is_array() && !j.empty(); }

bool has_tool_named(const json& tools, const std::string& name) {
  if (!tools.is_array()) return false;
  for (const json& t : tools) {
    const json& f = t.contains("function") ? t["function"] : t;
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
      tokenizer_(std::move(tokenizer)),
      context_size_(options.context_size > 0 ? options.context_size : engine.config().max_position_embeddings),
      cache_(engine.backend(), context_size_, options.cache_bytes),
      think_end_(tokenizer_.token_id("</think>")) {
  LILY_CHECK(tokenizer_.vocab_size() <= engine.config().vocab_size, "the tokenizer has {} ids but the model only {}",
             tokenizer_.vocab_size(), engine.config().vocab_size);
  stats_ = cache_.stats();
}

PrefixCacheStats ChatService::cache_stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void ChatService::clear_cache() {
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
  if (choice.mode == ToolChoice::Mode::function) {
    p.forced_text = "<tool_call>\n<function=" + choice.function + ">\n";
  } else if (choice.mode == ToolChoice::Mode::required) {
    p.forced_text = "<tool_call>\n<function=";
    if (request.tools.size() == 1) {
      const json& t = request.tools[0];
      const json& f = t.contains("function") ? t["function"] : t;
      if (f.is_object() && f.contains("name") && f["name"].is_string()) {
        p.forced_text += f["name"].get<std::string>() + ">\n";
      }
    }
  }
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
  fit_context(p, context_size_, "prompt");
  return p;
}

LogprobAlternative ChatService::alternative(int32_t token, float logprob) const {
  LogprobAlternative a;
  a.token = tokenizer_.decode(std::span<const int32_t>(&token, 1));
  a.bytes = tokenizer_.token_bytes(token);
  a.logprob = logprob;
  return a;
}

CompletionResult ChatService::complete(const PreparedCompletion& p, const DeltaCallback& on_delta) {
  const CompletionOptions& options = p.options;
  const auto t_start = Clock::now();
  CompletionResult r;
  Backend& backend = engine_.backend();

  CachedSequence seq = options.use_cache ? cache_.acquire(p.prompt) : cache_.fresh();
  const int64_t prompt_len = int64_t(p.prompt.size());
  r.usage.prompt_tokens = prompt_len;
  r.usage.cached_tokens = seq.state->length();
  r.timings.prefilled_tokens = prompt_len - seq.state->length();

  // Snapshot at the template boundary on the way through the prompt.
  if (options.use_cache && p.reuse_boundary > seq.state->length() && p.reuse_boundary < prompt_len) {
    std::vector<float> unused;
    std::span<const int32_t> part(p.prompt.data() + seq.state->length(),
                                  size_t(p.reuse_boundary - seq.state->length()));
    backend.forward(*seq.state, part, LogitsWanted::none, unused);
    seq.tokens.assign(p.prompt.begin(), p.prompt.begin() + p.reuse_boundary);
    seq.snapshot_here();
  }
  r.timings.prefill_seconds = seconds_since(t_start);

  StreamingDecoder decoder(tokenizer_);
  StopStrings stops(options.stop);
  std::optional<OutputParser> parser;
  if (p.chat) parser.emplace(OutputParserOptions{p.starts_in_reasoning, p.tools, p.parse_tool_calls});
  std::vector<TokenLogprobs> pending_logprobs;

  // Sends released model text (through the parser for chats) to the caller.
  auto emit = [&](std::string_view text, bool at_end) -> bool {
    ChatDelta d;
    if (parser) {
      ParserOutput out = parser->push(text);
      if (at_end) {
        ParserOutput tail = parser->finish();
        out.reasoning += tail.reasoning;
        out.content += tail.content;
        for (auto& c : tail.tool_calls) out.tool_calls.push_back(std::move(c));
      }
      d.reasoning = std::move(out.reasoning);
      d.content = std::move(out.content);
      for (auto& c : out.tool_calls)
        d.tool_calls.push_back({new_tool_call_id(), std::move(c.name), std::move(c.arguments_json)});
    } else {
      d.content = std::string(text);
    }
    d.logprobs = std::move(pending_logprobs);
    pending_logprobs.clear();
    r.reasoning += d.reasoning;
    r.content += d.content;
    r.tool_calls.insert(r.tool_calls.end(), d.tool_calls.begin(), d.tool_calls.end());
    r.logprobs.insert(r.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
    if (d.empty()) return true;
    return on_delta(d);
  };

  const std::vector<int32_t> stop_ids = options.ignore_eos ? std::vector<int32_t>{} : stop_tokens();
  auto is_stop_id = [&](int32_t id) { return std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end(); };
  std::vector<int32_t> context = p.prompt;  // the prompt, then every token generated or forced
  bool forced_done = p.forced_text.empty();
  bool stop_string_hit = false, first_token = true;
  int64_t remaining = p.max_tokens;
  FinishReason finish = FinishReason::length;

  // Puts text in the model's mouth: appended to its context and to the output.
  auto force = [&](const std::string& text) -> bool {
    std::vector<int32_t> ids = tokenizer_.encode(text);
    context.insert(context.end(), ids.begin(), ids.end());
    r.usage.completion_tokens += int64_t(ids.size());
    remaining -= int64_t(ids.size());
    forced_done = true;
    const bool ok = emit(stops.push(text), false);
    if (stops.stopped()) stop_string_hit = true;
    else if (!ok) r.cancelled = true;
    return ok && !stop_string_hit;
  };
  if (!forced_done && !p.starts_in_reasoning) force(p.forced_text);

  while (!r.cancelled && !stop_string_hit && remaining > 0) {
    GenerateRequest g;
    g.prompt = context;
    g.max_new_tokens = remaining;
    g.sampling = options.sampling;
    g.stop_tokens = stop_ids;
    const bool stop_at_think_end = !forced_done && think_end_;
    if (stop_at_think_end) g.stop_tokens.push_back(*think_end_);
    g.vocab_limit = tokenizer_.vocab_size();
    g.top_logprobs = options.top_logprobs;

    GenerateResult gr = generate(backend, *seq.state, g, [&](const GeneratedToken& t) {
      if (first_token) {
        first_token = false;
        r.timings.first_token_seconds = seconds_since(t_start);
        if (options.use_cache && seq.state->length() == prompt_len) seq.snapshot_here();  // end of the prompt
      }
      if (is_stop_id(t.id)) return true;  // ends the reply; never part of the text
      if (t.logprob) {
        TokenLogprobs lp{alternative(t.id, t.logprob->logprob), {}};
        for (const TokenLogprob& alt : t.top) lp.top.push_back(alternative(alt.token, alt.logprob));
        pending_logprobs.push_back(std::move(lp));
      }
      const bool ok = emit(stops.push(decoder.push(t.id)), false);
      if (stops.stopped()) {
        stop_string_hit = true;
        return false;
      }
      if (!ok) r.cancelled = true;
      return ok;
    });

    r.timings.prefill_seconds += gr.prefill_seconds;
    r.timings.decode_seconds += gr.decode_seconds;
    r.timings.decoded_tokens += int64_t(gr.tokens.size());
    r.usage.completion_tokens += int64_t(gr.tokens.size());
    remaining -= int64_t(gr.tokens.size());
    context.insert(context.end(), gr.tokens.begin(), gr.tokens.end());
    seq.tokens.assign(context.begin(), context.begin() + seq.state->length());
    finish = gr.finish;
    if (finish != FinishReason::stop || stop_string_hit || r.cancelled || gr.tokens.empty()) break;

    const int32_t last = gr.tokens.back();
    if (!stop_at_think_end || remaining <= 0) break;
    // tool_choice required / named: the model reached its answer; start the call for it.
    if (last == *think_end_) {
      if (!force("\n\n" + p.forced_text)) break;
    } else {  // it ended without closing its reasoning: close it, then start the call
      context.pop_back();
      --r.usage.completion_tokens;
      if (!force("\n</think>\n\n" + p.forced_text)) break;
    }
    if (remaining <= 0) finish = FinishReason::length;
  }
  if (!stop_string_hit && stops.stopped()) stop_string_hit = true;
  r.tokens.assign(context.begin() + prompt_len, context.end());

  if (!r.cancelled) {
    std::string tail = stop_string_hit ? std::string() : stops.push(decoder.flush());
    tail += stops.flush();
    if (!emit(tail, true)) r.cancelled = true;
  }
  if (stop_string_hit || finish == FinishReason::stop) r.finish_reason = "stop";
  else r.finish_reason = "length";
  if (r.finish_reason == "stop" && !r.tool_calls.empty()) r.finish_reason = "tool_calls";

  if (options.use_cache) cache_.release(std::move(seq));
  std::lock_guard lock(stats_mutex_);
  stats_ = cache_.stats();
  return r;
}

}  // namespace lily
