// v1_messages.cpp: POST /v1/messages and POST /v1/messages/count_tokens, Anthropic's Messages
// API over the same chat service and session cache as /v1/chat/completions (anthropic_wire.h
// says how the fields map). The anthropic-version header is accepted whatever it says; the API
// key may come as x-api-key (http.cpp); errors take Anthropic's shape (errors.h).
#include "chat/chat_template.h"
#include "server/anthropic_wire.h"
#include "server/errors.h"
#include "server/job.h"
#include "server/server.h"

namespace lily::server {

void handle_messages(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  AnthropicRequest request = read_anthropic_request(body, ctx.service().default_sampling(), /*count_tokens=*/false);
  auto job = std::make_shared<CompletionJob>();
  job->prepared = prepare_chat_within_context(ctx.service(), std::move(request.chat));
  job->stream = request.stream;
  job->named_events = true;
  job->done_marker = false;
  job->error_body = [](const ApiError& e) { return anthropic_error_json(e); };

  const std::string id = new_response_id("msg_");
  const std::string model = ctx.options.model_name;
  job->body = [=](const CompletionResult& r) { return anthropic_message_json(r, id, model); };
  auto events = std::make_shared<AnthropicEvents>(id, model, int64_t(job->prepared.prompt.size()));
  job->opening = [events] { return events->opening(); };
  job->delta_events = [events](const ChatDelta& d) { return events->on_delta(d); };
  job->closing = [events](const CompletionResult& r) { return events->closing(r); };
  run_job(ctx, req, res, std::move(job));
}

// {"input_tokens": N}: the prompt a create with the same fields would have, template and
// tools included (a create reports it as input_tokens + cache_read_input_tokens). Counted even
// when it is beyond the context.
void handle_count_tokens(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  const AnthropicRequest request = read_anthropic_request(body, ctx.service().default_sampling(),
                                                          /*count_tokens=*/true);
  std::string prompt;
  try {
    prompt = render_chat_template(request.chat.messages, request.chat.tools, request.chat.template_options);
  } catch (const TemplateError& e) {
    bad_request(e.what(), "messages");
  }
  const int64_t tokens = int64_t(ctx.service().tokenizer().encode(prompt).size());
  res.set_content(dump(json{{"input_tokens", tokens}}), "application/json");
}

}  // namespace lily::server
