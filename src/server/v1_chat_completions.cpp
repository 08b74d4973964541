// v1_chat_completions.cpp: POST /v1/chat/completions (spec tokenizer-chat-api.md §3-5).
//
// The request's fields, each validated under the line of OpenAI's documentation it implements.
// Unknown fields are ignored; known ones lily cannot honour get a 400 that says so.
#include <ctime>

#include "server/errors.h"
#include "server/job.h"
#include "server/server.h"
#include "server/wire.h"

namespace lily::server {

namespace {

struct ChatCompletionParams {
  ChatRequest chat;
  bool stream = false;
  bool include_usage = false;
  bool logprobs = false;
};

ToolChoice read_tool_choice(const json& v) {
  ToolChoice choice;
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    if (s == "auto") choice.mode = ToolChoice::Mode::automatic;
    else if (s == "none") choice.mode = ToolChoice::Mode::none;
    else if (s == "required") choice.mode = ToolChoice::Mode::required;
    else
      bad_request("tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", ...}",
                  "tool_choice");
    return choice;
  }
  if (!v.is_object()) bad_request("tool_choice must be a string or an object", "tool_choice");
  if (v.value("type", json()) != "function") {
    bad_request("tool_choice objects must have type \"function\" (lily supports no other tool types)", "tool_choice");
  }
  auto f = v.find("function");
  if (f == v.end() || !f->is_object() || !f->contains("name") || !(*f)["name"].is_string()) {
    bad_request("tool_choice.function.name must be a string", "tool_choice.function.name");
  }
  choice.mode = ToolChoice::Mode::function;
  choice.function = (*f)["name"].get<std::string>();
  return choice;
}

void check_tools(const json& tools) {
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) bad_request(at + " must be an object", at);
    if (t.value("type", json("function")) != "function") {
      bad_request(at + ".type must be \"function\" (lily supports no other tool types)", at + ".type");
    }
    auto f = t.find("function");
    if (f == t.end() || !f->is_object()) bad_request(at + ".function must be an object", at + ".function");
    if (!f->contains("name") || !(*f)["name"].is_string() || (*f)["name"].get<std::string>().empty()) {
      bad_request(at + ".function.name must be a non-empty string", at + ".function.name");
    }
    if (f->contains("parameters") && !(*f)["parameters"].is_object() && !(*f)["parameters"].is_null()) {
      bad_request(at + ".function.parameters must be an object", at + ".function.parameters");
    }
  }
}

ChatCompletionParams read_params(const json& body, const ChatService& service) {
  ChatCompletionParams p;
  Fields f(body);

  // messages: array, required. A list of messages comprising the conversation so far.
  const json* messages = f.array("messages");
  if (!messages) bad_request("messages is required", "messages");
  if (messages->empty()) bad_request("messages must not be empty", "messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad_request(at + " must be an object", at);
    if (!m.contains("role") || !m["role"].is_string()) bad_request(at + ".role must be a string", at + ".role");
  }
  p.chat.messages = *messages;

  // model: string, required by OpenAI. lily serves one model and answers under its own name.
  f.string("model");

  // n: integer or null, defaults to 1. How many chat completion choices to generate.
  if (auto n = f.integer("n", 1, INT32_MAX); n && *n != 1)
    bad_request("lily generates one choice per request: n must be 1", "n");

  // max_completion_tokens: integer or null. An upper bound for the number of tokens that can be
  // generated for a completion, including visible output tokens and reasoning tokens.
  // max_tokens: integer or null (deprecated in favour of max_completion_tokens).
  auto max_completion = f.integer("max_completion_tokens", 1, INT64_MAX / 2);
  auto max_tokens = f.integer("max_tokens", 1, INT64_MAX / 2);
  p.chat.options.max_tokens = max_completion ? max_completion : max_tokens;

  // temperature, top_p, presence_penalty, frequency_penalty, seed (+ top_k, min_p,
  // repetition_penalty): see read_sampling.
  p.chat.options.sampling = read_sampling(f, service.default_sampling());

  // stop: string / array / null. Up to 4 sequences where the API will stop generating further
  // tokens. The returned text will not contain the stop sequence. (lily allows up to 16.)
  p.chat.options.stop = f.stop_strings(16);

  // stream: boolean or null. If set to true, the model response data will be streamed to the
  // client as it is generated using server-sent events.
  p.stream = f.boolean("stream").value_or(false);
  // stream_options: object or null. include_usage: an extra chunk with the usage before [DONE].
  p.include_usage = read_include_usage(f, p.stream);

  // logprobs: boolean or null. Whether to return log probabilities of the output tokens.
  p.logprobs = f.boolean("logprobs").value_or(false);
  // top_logprobs: integer 0 to 20, the number of most likely tokens to return at each position.
  // logprobs must be set to true if this parameter is used.
  auto top = f.integer("top_logprobs", 0, 20);
  if (top && !p.logprobs) bad_request("top_logprobs requires logprobs to be true", "top_logprobs");
  p.chat.options.top_logprobs = p.logprobs ? int(top.value_or(0)) : -1;

  // tools: array. A list of tools the model may call (type "function" only).
  if (const json* tools = f.array("tools")) {
    check_tools(*tools);
    p.chat.tools = *tools;
  }
  // tool_choice: string or object. "none", "auto" (default with tools), "required", or
  // {"type": "function", "function": {"name": "my_function"}} to force that function. (lily:
  // required / named / none are grammars the reply is decoded under, output_constraint.h.)
  if (const json* choice = f.get("tool_choice")) p.chat.tool_choice = read_tool_choice(*choice);
  // parallel_tool_calls: boolean, default true. Whether to enable parallel function calling
  // during tool use. (lily: false holds tool_choice "required" to one call; with "auto" the
  // model may still write several.)
  p.chat.parallel_tool_calls = f.boolean("parallel_tool_calls").value_or(true);

  // chat_template_kwargs (vLLM, llama.cpp): {enable_thinking, preserve_thinking};
  // reasoning_effort: "none" turns thinking off (other levels keep it on).
  if (auto effort = f.string("reasoning_effort")) {
    static const char* levels[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
    if (std::find(std::begin(levels), std::end(levels), *effort) == std::end(levels)) {
      bad_request("reasoning_effort must be one of none, minimal, low, medium, high, xhigh", "reasoning_effort");
    }
  }
  f.object("chat_template_kwargs");
  try {
    p.chat.template_options = chat_template_options(body);
  } catch (const TemplateError& e) {
    bad_request(e.what(), "chat_template_kwargs");
  }
  p.chat.template_options.add_generation_prompt = true;

  // response_format: see read_response_format. The reply is held to it by constrained decoding
  // (runtime/output_constraint.h); a tool_choice of "required" or a function comes first.
  p.chat.response_format = read_response_format(f);

  // ignore_eos (vLLM, llama.cpp): boolean. Keep generating after the end-of-turn token.
  p.chat.options.ignore_eos = f.boolean("ignore_eos").value_or(false);
  // cache_prompt (llama.cpp): boolean, default true. false runs cold and keeps nothing.
  p.chat.options.use_cache = f.boolean("cache_prompt").value_or(true);

  // Fields OpenAI documents that lily does not do.
  // logit_bias: map. Modify the likelihood of specified tokens appearing in the completion.
  if (const json* bias = f.object("logit_bias"); bias && !bias->empty())
    bad_request("lily does not support logit_bias", "logit_bias");
  // modalities / audio: lily produces text only.
  if (f.get("audio")) bad_request("lily does not produce audio", "audio");
  if (const json* modalities = f.array("modalities")) {
    for (const json& m : *modalities) {
      if (m != "text") bad_request("lily produces text only", "modalities");
    }
  }
  // functions / function_call: deprecated in favour of tools / tool_choice.
  if (f.get("functions") || f.get("function_call")) {
    bad_request("functions and function_call are deprecated; use tools and tool_choice",
                f.get("functions") ? "functions" : "function_call");
  }
  return p;
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls) {
    out.push_back(
        json{{"id", c.id}, {"type", "function"}, {"function", json{{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

}  // namespace

void handle_chat_completions(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  ChatCompletionParams params = read_params(body, ctx.service());
  auto job = std::make_shared<CompletionJob>();
  try {
    job->prepared = ctx.service().prepare_chat(params.chat);
  } catch (const TemplateError& e) {
    bad_request(e.what(), "messages");
  } catch (const RequestError& e) {
    bad_request(e.what(), e.param, e.code);
  }
  job->stream = params.stream;

  const std::string id = new_response_id("chatcmpl-");
  const std::time_t created = std::time(nullptr);
  const std::string model = ctx.options.model_name;
  const bool logprobs = params.logprobs, include_usage = params.include_usage;

  job->body = [=](const CompletionResult& r) {
    json message{{"role", "assistant"}};
    message["content"] = r.content.empty() && !r.tool_calls.empty() ? json(nullptr) : json(r.content);
    // reasoning_content (DeepSeek, llama.cpp, SGLang) and reasoning (vLLM, OpenRouter): clients read one or the other.
    if (!r.reasoning.empty()) {
      message["reasoning_content"] = r.reasoning;
      message["reasoning"] = r.reasoning;
    }
    if (!r.tool_calls.empty()) message["tool_calls"] = tool_calls_json(r.tool_calls);
    json choice{{"index", 0},
                {"message", message},
                {"logprobs", logprobs ? chat_logprobs_json(r.logprobs) : json(nullptr)},
                {"finish_reason", r.finish_reason}};
    return json{{"id", id},
                {"object", "chat.completion"},
                {"created", created},
                {"model", model},
                {"system_fingerprint", "lily"},
                {"choices", json::array({choice})},
                {"usage", usage_json(r.usage)}};
  };

  const ResponseEnvelope envelope{id, "chat.completion.chunk", created, model, include_usage};
  auto chunk = [envelope](json choices) { return envelope.chunk(std::move(choices)); };
  auto choice = [](json delta, json lp, json finish) {
    return json::array({json{
        {"index", 0}, {"delta", std::move(delta)}, {"logprobs", std::move(lp)}, {"finish_reason", std::move(finish)}}});
  };
  job->opening = [=] {
    return std::vector<json>{chunk(choice(json{{"role", "assistant"}, {"content", ""}}, nullptr, nullptr))};
  };
  job->delta_events = [=](const ChatDelta& d) {
    std::vector<json> events;
    json lp = logprobs && !d.logprobs.empty() ? chat_logprobs_json(d.logprobs) : json(nullptr);
    if (!d.reasoning.empty() || !d.content.empty() || !lp.is_null()) {
      json delta = json::object();
      if (!d.reasoning.empty()) {
        delta["reasoning_content"] = d.reasoning;
        delta["reasoning"] = d.reasoning;
      }
      if (!d.content.empty() || !lp.is_null()) delta["content"] = d.content;
      events.push_back(chunk(choice(std::move(delta), std::move(lp), nullptr)));
    }
    // Tool calls as OpenAI streams them: when a call starts, a header (index, id, type, name,
    // empty arguments); then its arguments in pieces as the model writes them.
    for (const ToolCallDelta& t : d.tool_call_deltas) {
      if (!t.name.empty()) {
        json header{{"index", t.index},
                    {"id", t.id},
                    {"type", "function"},
                    {"function", json{{"name", t.name}, {"arguments", ""}}}};
        events.push_back(chunk(choice(json{{"tool_calls", json::array({header})}}, nullptr, nullptr)));
      }
      if (!t.arguments.empty()) {
        json args{{"index", t.index}, {"function", json{{"arguments", t.arguments}}}};
        events.push_back(chunk(choice(json{{"tool_calls", json::array({args})}}, nullptr, nullptr)));
      }
    }
    return events;
  };
  job->closing = [=](const CompletionResult& r) {
    std::vector<json> events{chunk(choice(json::object(), nullptr, r.finish_reason))};
    if (include_usage) events.push_back(envelope.usage_event(r.usage));
    return events;
  };
  run_job(ctx, req, res, std::move(job));
}

}  // namespace lily::server
