// fuzz_request.cpp: a request body as `lily serve` reads it -> the chat template -> the tokenizer,
// with lily-tiny's tokenizer (models/lily-tiny/tokenizer.json, trained with the Qwen3.6 pipeline).
//
// Input: the body of a POST /v1/chat/completions (or, with a string "prompt" and no
// "messages", /v1/completions). The path: server::parse_body and server::Fields (src/server/
// wire.h), the fields read_params of v1_chat_completions.cpp turns into a chat request
// (messages, tools, tool_choice, sampling, stop, chat_template_kwargs), then what
// ChatService::prepare_chat does with them: render_chat_template, Tokenizer::encode, the prompt
// decoded back, and the grammar of the reply's constraint (runtime/output_constraint.h: the
// response_format's JSON schema, the tools of tool_choice required / named) compiled. No
// engine: the harness links only what reads the request, so the fuzz build stays small.
//
// A finding: a crash, a sanitizer report, a leak. An exception the server would answer with 500
// (anything but ApiError 4xx and TemplateError: the server keeps serving, but the client did
// nothing a 400 would not name) is printed once per message; with LILY_FUZZ_STRICT=1 it is a
// finding too.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>

#include "chat/chat_template.h"
#include "runtime/output_constraint.h"
#include "server/errors.h"
#include "server/wire.h"
#include "tokenizer/tokenizer.h"

namespace {

using lily::server::json;

struct Fixture {
  std::unique_ptr<lily::Tokenizer> tokenizer;
  bool strict = false;
  std::set<std::string> reported;
};

Fixture& fixture() {
  static Fixture* f = [] {
    auto* x = new Fixture;
    x->tokenizer = std::make_unique<lily::Tokenizer>(
        lily::Tokenizer::load(std::string(LILY_SOURCE_DIR) + "/models/lily-tiny/tokenizer.json"));
    const char* strict = std::getenv("LILY_FUZZ_STRICT");
    x->strict = strict && std::string(strict) == "1";
    return x;
  }();
  return *f;
}

// As v1_chat_completions.cpp's read_tool_choice (a 400 for anything else).
lily::ToolChoice tool_choice(const json& v) {
  lily::ToolChoice choice;
  if (v == "none") choice.mode = lily::ToolChoice::Mode::none;
  else if (v == "required") choice.mode = lily::ToolChoice::Mode::required;
  else if (v.is_object() && v.contains("function") && v["function"].is_object() && v["function"].contains("name") &&
           v["function"]["name"].is_string()) {
    choice.mode = lily::ToolChoice::Mode::function;
    choice.function = v["function"]["name"].get<std::string>();
  } else if (v != "auto") {
    lily::server::bad_request("tool_choice", "tool_choice");
  }
  return choice;
}

void unexpected(Fixture& f, const std::string& what) {
  if (f.strict) {
    std::fprintf(stderr, "a request the server would answer with 500: %s\n", what.c_str());
    std::abort();
  }
  if (f.reported.insert(what.substr(0, 120)).second) std::fprintf(stderr, "(500) %s\n", what.c_str());
}

void run(Fixture& f, const std::string& body) {
  const lily::Tokenizer& tokenizer = *f.tokenizer;
  const json request = lily::server::parse_body(body);
  const lily::server::Fields fields(request);
  (void)lily::server::read_sampling(fields, lily::SamplingParams{});
  (void)fields.stop_strings(16);
  (void)lily::server::read_include_usage(fields, fields.boolean("stream").value_or(false));
  if (!request.contains("messages") && request.contains("prompt") && request["prompt"].is_string()) {
    const std::vector<int32_t> prompt = tokenizer.encode(request["prompt"].get_ref<const std::string&>());
    (void)tokenizer.decode(prompt);
    return;
  }
  const json* messages = fields.array("messages");
  if (!messages || messages->empty()) return;  // 400
  static const json kNull;
  const json* tools = fields.array("tools");
  const json& tools_or_null = tools ? *tools : kNull;
  lily::ToolChoice choice;
  if (const json* c = fields.get("tool_choice")) choice = tool_choice(*c);
  lily::ChatTemplateOptions options = lily::chat_template_options(request);
  options.add_generation_prompt = true;
  const std::string text = lily::render_chat_template(*messages, tools_or_null, options);
  const std::vector<int32_t> prompt = tokenizer.encode(text);
  (void)tokenizer.decode(prompt);
  const lily::ResponseFormat format = lily::server::read_response_format(fields);
  const bool parallel = fields.boolean("parallel_tool_calls").value_or(true);
  if (auto constraint = lily::chat_constraint(format, tools_or_null, choice, parallel, text.ends_with("<think>\n"))) {
    try {
      (void)constraint->build();
    } catch (const lily::Error&) {
      // ChatService::compile answers these 400 (a refused keyword, a grammar over its size limits,
      // and below, a schema value of a type the compiler did not expect).
    } catch (const json::exception&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Fixture& f = fixture();
  try {
    run(f, std::string(reinterpret_cast<const char*>(data), size));
  } catch (const lily::server::ApiError& e) {
    if (e.status >= 500) unexpected(f, e.what());
  } catch (const lily::TemplateError&) {
  } catch (const std::exception& e) {
    unexpected(f, e.what());
  }
  return 0;
}
