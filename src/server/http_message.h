// http_message.h: one HTTP request and its response as the endpoints see them, apart from the
// library that reads and writes them (http_transport.h, Boost.Beast underneath).
//
// A response is either whole (status, headers, body) or streamed: the endpoint sets `stream`,
// the transport sends the head, then calls stream(sink) on the endpoint's worker thread, and
// what the sink is given goes out as it comes (chunked for HTTP/1.1, until the connection closes
// for HTTP/1.0).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lily::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: path and query
  std::string path;     // percent-decoded, without the query
  int version = 11;     // 10: HTTP/1.0, 11: HTTP/1.1
  HttpHeaders headers;  // names lower-cased, in the order sent
  std::string body;
  std::vector<std::string> path_params;  // {id} of /v1/models/{id}
  std::string remote;                    // peer address, for logs
  // Whether the client is still connected; polled once per generated token.
  std::function<bool()> client_alive = [] { return true; };

  // The first header of that (lower-case) name, or "".
  std::string header(std::string_view name) const;
  bool has_header(std::string_view name) const;
};

// Where a streamed body goes. write() blocks while the client is behind by more than a few
// hundred KiB, and returns false once the client is gone (its write failed or timed out).
class StreamSink {
 public:
  virtual ~StreamSink() = default;
  virtual bool write(std::string_view data) = 0;
  virtual bool alive() const = 0;
};

struct HttpResponse {
  int status = 200;
  HttpHeaders headers;
  std::string content_type, body;
  std::function<void(StreamSink&)> stream;  // set: a streamed body (no Content-Length)

  void set_header(std::string name, std::string value);
  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
  void set_stream(std::string type, std::function<void(StreamSink&)> writer) {
    content_type = std::move(type);
    stream = std::move(writer);
  }
};

}  // namespace lily::server
