#include "server/sse.h"

namespace lily::server {

bool SseWriter::send(const std::string& text) {
  if (ok_ && !write_(text.data(), text.size())) ok_ = false;
  return ok_;
}

bool SseWriter::event(const json& data, std::string_view name) {
  std::string text;
  if (!name.empty()) text = "event: " + std::string(name) + "\n";
  return send(text + "data: " + dump(data) + "\n\n");
}

bool SseWriter::comment(const std::string& text) { return send(": " + text + "\n\n"); }

bool SseWriter::done() { return send("data: [DONE]\n\n"); }

}  // namespace lily::server
