// sse.h: server-sent events for streamed completions (spec tokenizer-chat-api.md §5).
//
// Each event is "data: <one-line JSON>\n\n"; OpenAI's completion streams end with
// "data: [DONE]\n\n". The Anthropic and Responses streams name their events
// ("event: message_start\ndata: {...}\n\n") and end without [DONE]. Lines starting with ':'
// are comments that clients ignore: sent while a request waits in the queue, they keep the
// connection warm and reveal a client that has gone away.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "server/wire.h"

namespace lily::server {

class SseWriter {
 public:
  // write(data, size) returns false once the client is gone.
  explicit SseWriter(std::function<bool(const char*, size_t)> write) : write_(std::move(write)) {}
  bool event(const json& data, std::string_view name = {});  // name: the "event:" line, if any
  bool comment(const std::string& text);
  bool done();  // data: [DONE]
  bool ok() const { return ok_; }

 private:
  bool send(const std::string& text);
  std::function<bool(const char*, size_t)> write_;
  bool ok_ = true;
};

}  // namespace lily::server
