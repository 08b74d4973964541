// responses_response.cpp: a completion as a Responses API object and its event stream (see
// responses_wire.h).
#include "server/responses_wire.h"

namespace lily::server {
namespace {

json reasoning_item(const std::string& id, const std::string& text) {
  json content = json::array();
  if (!text.empty()) content.push_back(json{{"type", "reasoning_text"}, {"text", text}});
  return json{{"type", "reasoning"}, {"id", id}, {"summary", json::array()}, {"content", std::move(content)}};
}

json output_text_part(const std::string& text) {
  return json{{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
}

json message_item(const std::string& id, const char* status, json content) {
  return json{
      {"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"}, {"content", std::move(content)}};
}

json function_call_item(const std::string& id, const std::string& call_id, const std::string& name,
                        const std::string& arguments, const char* status) {
  return json{{"type", "function_call"}, {"id", id},        {"call_id", call_id}, {"name", name},
              {"arguments", arguments},  {"status", status}};
}

// An item id: "fc_" + the call id's random part, so a call's two ids go together.
std::string function_item_id(const std::string& call_id) {
  return "fc_" + (call_id.starts_with("call_") ? call_id.substr(5) : call_id);
}

}  // namespace

json responses_usage_json(const Usage& u) {
  return json{{"input_tokens", u.prompt_tokens},
              {"input_tokens_details", json{{"cached_tokens", u.cached_tokens}}},
              {"output_tokens", u.completion_tokens},
              {"output_tokens_details", completion_tokens_details_json(u)},  // with the drafts, as chat's
              {"total_tokens", u.prompt_tokens + u.completion_tokens}};
}

std::string response_status(const CompletionResult& r) {
  return r.finish_reason == "length" ? "incomplete" : "completed";
}

json response_json(const ResponseHead& head, const std::string& status, json output, json usage) {
  json r{{"id", head.id},
         {"object", "response"},
         {"created_at", int64_t(head.created_at)},
         {"status", status},
         {"error", nullptr},
         {"incomplete_details", status == "incomplete" ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
         {"model", head.model},
         {"output", std::move(output)}};
  for (const auto& [key, value] : head.settings.items()) r[key] = value;
  r["usage"] = std::move(usage);
  return r;
}

json response_output_json(const CompletionResult& r) {
  json output = json::array();
  if (!r.reasoning.empty()) output.push_back(reasoning_item(new_response_id("rs_"), r.reasoning));
  if (!r.content.empty()) {
    output.push_back(message_item(new_response_id("msg_"), "completed", json::array({output_text_part(r.content)})));
  }
  for (const ToolCall& c : r.tool_calls) {
    output.push_back(function_call_item(function_item_id(c.id), c.id, c.name, c.arguments, "completed"));
  }
  return output;
}

// ---- ResponsesEvents ------------------------------------------------------------------------

json ResponsesEvents::event(const char* type, json fields) {
  json e{{"type", type}};
  for (auto& [key, value] : fields.items()) e[key] = std::move(value);
  e["sequence_number"] = sequence_++;
  return e;
}

std::vector<json> ResponsesEvents::opening() {
  const json response = response_json(head_, "in_progress", json::array(), nullptr);
  std::vector<json> out;
  out.push_back(event("response.created", json{{"response", response}}));
  out.push_back(event("response.in_progress", json{{"response", response}}));
  return out;
}

// In a delta, the text order is: reasoning, the rest of a call already open, content and new
// calls (a call cannot be open while reasoning or content is written).
std::vector<json> ResponsesEvents::on_delta(const ChatDelta& d) {
  std::vector<json> out;
  if (!d.reasoning.empty()) {
    if (open_ != Item::kReasoning) open_item(Item::kReasoning, reasoning_item(new_response_id("rs_"), ""), out);
    text_ += d.reasoning;
    json fields = item_fields();
    fields["delta"] = d.reasoning;
    out.push_back(event("response.reasoning_text.delta", std::move(fields)));
  }
  auto write_call = [&](const ToolCallDelta& t) {
    if (!t.name.empty()) {
      open_item(Item::kFunctionCall, function_call_item(function_item_id(t.id), t.id, t.name, "", "in_progress"), out);
    }
    if (t.arguments.empty()) return;
    text_ += t.arguments;
    json fields = item_fields();
    fields["delta"] = t.arguments;
    out.push_back(event("response.function_call_arguments.delta", std::move(fields)));
  };
  size_t next = 0;
  for (; next < d.tool_call_deltas.size() && d.tool_call_deltas[next].name.empty(); ++next) {
    write_call(d.tool_call_deltas[next]);
  }
  if (!d.content.empty()) {
    if (open_ != Item::kMessage) {
      open_item(Item::kMessage, message_item(new_response_id("msg_"), "in_progress", json::array()), out);
    }
    text_ += d.content;
    json fields = item_fields();
    fields["delta"] = d.content;
    fields["logprobs"] = json::array();
    out.push_back(event("response.output_text.delta", std::move(fields)));
  }
  for (; next < d.tool_call_deltas.size(); ++next) write_call(d.tool_call_deltas[next]);
  return out;
}

std::vector<json> ResponsesEvents::closing(const CompletionResult& r) {
  std::vector<json> out;
  close_item(out);
  const std::string status = response_status(r);
  const json response = response_json(head_, status, output_, responses_usage_json(r.usage));
  out.push_back(
      event(status == "completed" ? "response.completed" : "response.incomplete", json{{"response", response}}));
  return out;
}

json ResponsesEvents::error_event(const ApiError& e) {
  return event("error", json{{"code", e.code.empty() ? json(e.type) : json(e.code)},
                             {"message", e.what()},
                             {"param", e.param.empty() ? json(nullptr) : json(e.param)}});
}

json ResponsesEvents::item_fields() const {
  json fields{{"item_id", item_["id"]}, {"output_index", output_.size()}};
  if (open_ != Item::kFunctionCall) fields["content_index"] = 0;
  return fields;
}

// An item opens: output_item.added, and for text its (one) content part.
void ResponsesEvents::open_item(Item kind, json item, std::vector<json>& out) {
  close_item(out);
  open_ = kind;
  item_ = std::move(item);
  text_.clear();
  out.push_back(event("response.output_item.added", json{{"output_index", output_.size()}, {"item", item_}}));
  if (kind == Item::kFunctionCall) return;
  json fields = item_fields();
  fields["part"] = kind == Item::kMessage ? output_text_part("") : json{{"type", "reasoning_text"}, {"text", ""}};
  out.push_back(event("response.content_part.added", std::move(fields)));
}

// The open item ends: its .done events with the whole text, then output_item.done.
void ResponsesEvents::close_item(std::vector<json>& out) {
  if (open_ == Item::kNone) return;
  json fields = item_fields();
  if (open_ == Item::kFunctionCall) {
    item_["arguments"] = text_;
    item_["status"] = "completed";
    fields["name"] = item_["name"];
    fields["arguments"] = text_;
    out.push_back(event("response.function_call_arguments.done", std::move(fields)));
  } else {
    const bool message = open_ == Item::kMessage;
    json part = message ? output_text_part(text_) : json{{"type", "reasoning_text"}, {"text", text_}};
    json done = fields;
    done["text"] = text_;
    if (message) done["logprobs"] = json::array();
    out.push_back(event(message ? "response.output_text.done" : "response.reasoning_text.done", std::move(done)));
    fields["part"] = part;
    out.push_back(event("response.content_part.done", std::move(fields)));
    if (message) {
      item_["status"] = "completed";
      item_["content"] = json::array({part});
    } else {
      item_["content"] = json::array({part});
    }
  }
  out.push_back(event("response.output_item.done", json{{"output_index", output_.size()}, {"item", item_}}));
  output_.push_back(std::move(item_));
  item_ = nullptr;
  open_ = Item::kNone;
}

}  // namespace lily::server
