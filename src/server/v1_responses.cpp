// v1_responses.cpp: POST /v1/responses, OpenAI's Responses API, stateless, over the same chat
// service and session cache as /v1/chat/completions (responses_wire.h says how the fields map).
// Errors keep OpenAI's shape.
#include "server/job.h"
#include "server/responses_wire.h"
#include "server/server.h"

namespace lily::server {

namespace {

// The chat service names a schema it refuses after chat's field, response_format; here the
// client sent it as text.format.
PreparedCompletion prepare(const ChatService& service, ChatRequest chat) {
  try {
    return prepare_chat_within_context(service, std::move(chat));
  } catch (const ApiError& e) {
    const std::string_view chat_field = "response_format";
    if (!e.param.starts_with(chat_field)) throw;
    std::string message = e.what();
    if (message.starts_with(chat_field)) message.replace(0, chat_field.size(), "text.format");
    throw ApiError(e.status, message, "text.format" + e.param.substr(chat_field.size()), e.code);
  }
}

}  // namespace

void handle_responses(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  ResponsesRequest request = read_responses_request(body, ctx.service().default_sampling());
  auto job = std::make_shared<CompletionJob>();
  job->prepared = prepare(ctx.service(), std::move(request.chat));
  job->stream = request.stream;
  job->named_events = true;
  job->done_marker = false;

  const ResponseHead head{new_response_id("resp_"), ctx.options.model_name, std::time(nullptr),
                          std::move(request.settings)};
  job->body = [head](const CompletionResult& r) {
    return response_json(head, response_status(r), response_output_json(r), responses_usage_json(r.usage));
  };
  auto events = std::make_shared<ResponsesEvents>(head);
  job->opening = [events] { return events->opening(); };
  job->delta_events = [events](const ChatDelta& d) { return events->on_delta(d); };
  job->closing = [events](const CompletionResult& r) { return events->closing(r); };
  job->error_event = [events](const ApiError& e) { return events->error_event(e); };
  run_job(ctx, req, res, std::move(job));
}

}  // namespace lily::server
