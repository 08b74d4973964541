// responses_wire.h: OpenAI's Responses API (POST /v1/responses), stateless, over the chat
// service: the request turned into a ChatRequest, the response object and its event stream.
//
// Request -> ChatRequest (read_responses_request; every refusal a 400 naming the field):
//   instructions                a system message (with leading system / developer input items)
//   input: a string             one user message
//          message items        {role: user | assistant | system | developer, content: a string
//                               or input_text / output_text parts}; image, file and audio parts: 400
//          reasoning items      the reasoning_content of the assistant turn that follows
//                               (content reasoning_text, else summary summary_text)
//          function_call items  tool_calls of that assistant turn (arguments a JSON string)
//          function_call_output tool messages (output a string or input_text parts)
//          item_reference and hosted-tool items: 400
//   tools: function tools {type: "function", name, description, parameters, strict}; other
//          types 400. tool_choice: auto, none, required, {type: "function", name} (in tools).
//   max_output_tokens (beyond what the context leaves, cut to it), temperature, top_p,
//   reasoning.effort ("none" turns thinking off; other levels leave it on), text.format
//   {type: "text"} (json_schema / json_object: 400 until constrained decoding exists),
//   stream, store (nothing is stored: the response says store false), parallel_tool_calls,
//   metadata, include, user, ... accepted; previous_response_id, conversation, background,
//   prompt: 400 (lily keeps no responses).
//
// Response: {id: "resp_...", object: "response", created_at, status ("completed", or
// "incomplete" with incomplete_details.reason "max_output_tokens"), model, output: [reasoning
// {type: "reasoning", id: "rs_...", summary: [], content: [{type: "reasoning_text", text}]},
// message {type: "message", id: "msg_...", role: "assistant", content: [{type: "output_text",
// text, annotations: []}]}, function_call {type: "function_call", id: "fc_...", call_id, name,
// arguments}], usage {input_tokens, input_tokens_details.cached_tokens, output_tokens,
// output_tokens_details {reasoning_tokens, and with --speculate accepted_prediction_tokens,
// rejected_prediction_tokens}, total_tokens}}, and the request's settings echoed.
//
// Stream (ResponsesEvents), each event with its sequence_number: response.created,
// response.in_progress; per output item response.output_item.added, for reasoning and text
// response.content_part.added, response.reasoning_text.delta / response.output_text.delta,
// .done, response.content_part.done; for calls response.function_call_arguments.delta (as the
// arguments stream) and .done; response.output_item.done; then response.completed (or
// response.incomplete). A failure mid-stream is an "error" event.
#pragma once

#include <ctime>
#include <string>
#include <vector>

#include "server/errors.h"
#include "server/wire.h"

namespace lily::server {

struct ResponsesRequest {
  ChatRequest chat;
  bool stream = false;
  json settings;  // the request's settings as the response object repeats them
};

// A /v1/responses body. Throws ApiError 400.
ResponsesRequest read_responses_request(const json& body, const SamplingParams& defaults);

// The response object around its output and usage (null while in progress).
struct ResponseHead {
  std::string id, model;
  std::time_t created_at = 0;
  json settings;
};
json response_json(const ResponseHead& head, const std::string& status, json output, json usage);
json responses_usage_json(const Usage& usage);
// "completed", or "incomplete" when max_output_tokens (or the context) ended the reply.
std::string response_status(const CompletionResult& r);
// The output items of a whole completion.
json response_output_json(const CompletionResult& r);

// The stream's events, one completion's worth (the job calls it in order).
class ResponsesEvents {
 public:
  explicit ResponsesEvents(ResponseHead head) : head_(std::move(head)) {}
  std::vector<json> opening();  // response.created, response.in_progress
  std::vector<json> on_delta(const ChatDelta& d);
  std::vector<json> closing(const CompletionResult& r);
  json error_event(const ApiError& e);

 private:
  enum class Item { kNone, kReasoning, kMessage, kFunctionCall };
  json event(const char* type, json fields);
  void open_item(Item kind, json item, std::vector<json>& out);
  void close_item(std::vector<json>& out);
  json item_fields() const;  // item_id, output_index (and content_index for text parts)

  ResponseHead head_;
  int64_t sequence_ = 0;
  json output_ = json::array();  // the items done
  Item open_ = Item::kNone;
  json item_;         // the open item
  std::string text_;  // its text or arguments so far
};

}  // namespace lily::server
