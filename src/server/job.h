// job.h: running one prepared completion in its turn, streamed (SSE) or as one JSON body.
//
// The endpoint builds the job (the prepared prompt and how to encode what comes out); run_job
// queues it (503 + Retry-After when the line is full), waits for a slot (--parallel), runs it,
// and stops it when the client goes away or the drain time of a shutdown is over: at the next
// token one at a time, within a step in parallel (the worker polls the client every 20 ms).
// A stream starts at once, before its turn: the role chunk and a comment saying how many
// requests are ahead go out first, then the transport's ": keep-alive" comments while it waits.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "server/errors.h"
#include "server/server.h"
#include "server/wire.h"

namespace lily::server {

struct CompletionJob {
  PreparedCompletion prepared;
  bool stream = false;
  std::function<std::vector<json>()> opening;                         // stream: first events
  std::function<std::vector<json>(const ChatDelta&)> delta_events;    // stream: per delta
  std::function<std::vector<json>(const CompletionResult&)> closing;  // stream: last events
  std::function<json(const CompletionResult&)> body;                  // not streamed
  // The stream's framing: OpenAI's completions send unnamed events and "data: [DONE]" last;
  // the Anthropic and Responses streams name each event by its "type" and send no [DONE].
  bool named_events = false;
  bool done_marker = true;
  // A failure: the error body (not streamed), and the event that ends a stream (default: the
  // same object). OpenAI's shape unless the endpoint sets them.
  std::function<json(const ApiError&)> error_body = [](const ApiError& e) { return error_json(e); };
  std::function<json(const ApiError&)> error_event;
};

// service.prepare_chat with its refusals as 400s (TemplateError: param "messages"). For the APIs
// whose max_tokens is required (Anthropic's) or habitually large: a max_tokens beyond what the
// context leaves after the prompt is cut to it instead of refused (the reply then ends with
// "length" at the context's end).
PreparedCompletion prepare_chat_within_context(const ChatService& service, ChatRequest chat);

void run_job(ServerContext& ctx, const HttpRequest& req, HttpResponse& res, std::shared_ptr<CompletionJob> job);

}  // namespace lily::server
