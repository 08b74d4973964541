// v1_responses.cpp: POST /v1/responses, OpenAI's Responses API, stateless, over the same chat
// service and session cache as /v1/chat/completions (responses_wire.h says how the fields map).
// Errors keep OpenAI's shape.
#include "server/job.h"
#include "server/responses_wire.h"
#include "server/server.h"

namespace lily::server {

void handle_responses(ServerContext& ctx, const HttpRequest& req, HttpResponse& res) {
  const json body = parse_body(req.body);
  ResponsesRequest request = read_responses_request(body, ctx.service().default_sampling());
  auto job = std::make_shared<CompletionJob>();
  job->prepared = prepare_chat_within_context(ctx.service(), std::move(request.chat));
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
