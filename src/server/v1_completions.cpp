// v1_completions.cpp: POST /v1/completions, the legacy raw-prompt endpoint (spec §6). No chat
// template: the prompt's text (or token ids) goes to the model as it is.
#include <ctime>

#include "server/errors.h"
#include "server/job.h"
#include "server/server.h"
#include "server/wire.h"

namespace lily::server {

namespace {

struct CompletionParams {
  TextRequest text;
  bool stream = false;
  bool include_usage = false;
  int logprobs = -1;
};

// A prompt as token ids, if it is a list of integers.
std::optional<std::vector<int32_t>> token_list(const json& v) {
  if (!v.is_array() || v.empty()) return std::nullopt;
  std::vector<int32_t> ids;
  for (const json& x : v) {
    if (!x.is_number_integer()) return std::nullopt;
    const int64_t id = x.get<int64_t>();
    if (id < 0 || id > INT32_MAX) bad_request("prompt token ids must be non-negative 32-bit integers", "prompt");
    ids.push_back(int32_t(id));
  }
  return ids;
}

CompletionParams read_params(const json& body, const ChatService& service) {
  CompletionParams p;
  Fields f(body);

  // prompt: string or array, required. The prompt(s) to generate completions for, encoded as a
  // string, array of strings, array of tokens, or array of token arrays. (lily: one prompt.)
  const json* prompt = f.get("prompt");
  if (!prompt) bad_request("prompt is required", "prompt");
  if (prompt->is_string()) {
    p.text.prompt = prompt->get<std::string>();
  } else if (auto ids = token_list(*prompt)) {
    p.text.prompt_tokens = *ids;
  } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
    p.text.prompt = (*prompt)[0].get<std::string>();
  } else if (prompt->is_array() && prompt->size() == 1 && token_list((*prompt)[0])) {
    p.text.prompt_tokens = *token_list((*prompt)[0]);
  } else if (prompt->is_array() && prompt->size() > 1) {
    bad_request("lily completes one prompt per request: prompt must hold a single string or token list", "prompt");
  } else {
    bad_request("prompt must be a string, an array of token ids, or a one-element array of either", "prompt");
  }
  if (p.text.prompt.empty() && p.text.prompt_tokens.empty()) bad_request("prompt must not be empty", "prompt");

  // model: string, required by OpenAI; lily answers under its own name.
  f.string("model");
  // max_tokens: integer or null, defaults to 16. The maximum number of tokens that can be
  // generated in the completion.
  p.text.options.max_tokens = f.integer("max_tokens", 1, INT64_MAX / 2).value_or(16);
  // temperature, top_p, presence_penalty, frequency_penalty, seed (+ top_k, min_p,
  // repetition_penalty): see read_sampling.
  p.text.options.sampling = read_sampling(f, service.default_sampling());
  // stop: string / array / null. Up to 4 sequences where the API will stop generating further
  // tokens. The returned text will not contain the stop sequence. (lily allows up to 16.)
  p.text.options.stop = f.stop_strings(16);
  // stream: boolean or null. Whether to stream back partial progress as server-sent events.
  p.stream = f.boolean("stream").value_or(false);
  // stream_options: object or null. include_usage: an extra chunk with the usage before [DONE].
  p.include_usage = read_include_usage(f, p.stream);
  // logprobs: integer or null, maximum 5. Include the log probabilities on the logprobs most
  // likely output tokens, as well the chosen tokens.
  if (auto lp = f.integer("logprobs", 0, 5)) p.logprobs = int(*lp);
  p.text.options.top_logprobs = p.logprobs;
  // response_format (not in OpenAI's legacy completions; vLLM, llama.cpp): as for chats.
  p.text.response_format = read_response_format(f);
  // ignore_eos (vLLM, llama.cpp): boolean. Keep generating after the end-of-turn token.
  p.text.options.ignore_eos = f.boolean("ignore_eos").value_or(false);
  // cache_prompt (llama.cpp): boolean, default true. false runs cold and keeps nothing.
  p.text.options.use_cache = f.boolean("cache_prompt").value_or(true);

  // Fields OpenAI documents that lily does not do.
  // n: integer or null, defaults to 1. How many completions to generate for each prompt.
  if (auto n = f.integer("n", 1, INT32_MAX); n && *n != 1)
    bad_request("lily generates one choice per request: n must be 1", "n");
  // best_of: integer or null, defaults to 1. Generates best_of completions server-side.
  if (auto b = f.integer("best_of", 1, INT32_MAX); b && *b != 1)
    bad_request("lily does not support best_of > 1", "best_of");
  // echo: boolean or null. Echo back the prompt in addition to the completion.
  if (f.boolean("echo").value_or(false)) bad_request("lily does not support echo", "echo");
  // suffix: string or null. The suffix that comes after a completion of inserted text.
  if (auto s = f.string("suffix"); s && !s->empty()) bad_request("lily does not support suffix", "suffix");
  // logit_bias: map. Modify the likelihood of specified tokens appearing in the completion.
  if (const json* bias = f.object("logit_bias"); bias && !bias->empty())
    bad_request("lily does not support logit_bias", "logit_bias");
  return p;
}

// The legacy logprobs object: tokens, token_logprobs, top_logprobs [{token: logprob}], text_offset.
json legacy_logprobs(const std::vector<TokenLogprobs>& logprobs, size_t offset) {
  json tokens = json::array(), values = json::array(), tops = json::array(), offsets = json::array();
  for (const TokenLogprobs& t : logprobs) {
    tokens.push_back(t.chosen.token);
    values.push_back(t.chosen.logprob);
    json top = json::object();
    for (const LogprobAlternative& a : t.top) top[a.token] = a.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += t.chosen.token.size();
  }
  return json{{"tokens", tokens}, {"token_logprobs", values}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace

void handle_completions(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  CompletionParams params = read_params(body, ctx.service());
  auto job = std::make_shared<CompletionJob>();
  try {
    job->prepared = ctx.service().prepare_text(params.text);
  } catch (const RequestError& e) {
    bad_request(e.what(), e.param, e.code);
  }
  job->stream = params.stream;

  const std::string id = new_response_id("cmpl-");
  const std::time_t created = std::time(nullptr);
  const std::string model = ctx.options.model_name;
  const bool logprobs = params.logprobs >= 0, include_usage = params.include_usage;
  const ResponseEnvelope envelope{id, "text_completion", created, model, include_usage};
  auto chunk = [envelope](json choices) { return envelope.chunk(std::move(choices)); };

  job->body = [=](const CompletionResult& r) {
    json choice{{"text", r.content},
                {"index", 0},
                {"logprobs", logprobs ? legacy_logprobs(r.logprobs, 0) : json(nullptr)},
                {"finish_reason", r.finish_reason}};
    json out = chunk(json::array({choice}));
    out["usage"] = usage_json(r.usage);
    return out;
  };
  auto offset = std::make_shared<size_t>(0);
  job->opening = [] { return std::vector<json>{}; };
  job->delta_events = [=](const ChatDelta& d) {
    json lp = logprobs ? legacy_logprobs(d.logprobs, *offset) : json(nullptr);
    *offset += d.content.size();
    return std::vector<json>{
        chunk(json::array({json{{"text", d.content}, {"index", 0}, {"logprobs", lp}, {"finish_reason", nullptr}}}))};
  };
  job->closing = [=](const CompletionResult& r) {
    std::vector<json> events{chunk(
        json::array({json{{"text", ""}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", r.finish_reason}}}))};
    if (include_usage) events.push_back(envelope.usage_event(r.usage));
    return events;
  };
  run_job(ctx, req, res, std::move(job));
}

}  // namespace lily::server
