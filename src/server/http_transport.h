// http_transport.h: HTTP/1.x over TCP for `lily serve`, on Boost.Beast (docs/server.md says why
// Beast and not cpp-httplib).
//
// Connection model: every socket operation is asynchronous on a few I/O threads, each under a
// deadline, so a connection costs a socket and its buffers, never a thread:
//   * the next request on a connection must start within idle_timeout;
//   * once its first byte is in, the request line, the headers and the body must all be in
//     within read_timeout (else 408 and the connection is closed);
//   * a write that makes no progress for write_timeout drops the client.
// Limits, checked while reading: header bytes (request line included) and header count (431),
// body bytes (413, also for chunked bodies), connections at once (beyond: 503 and close).
// The listening socket is bound without SO_REUSEPORT: a port in use is an error, never shared.
//
// What happens between reading and writing is the RequestHandler's: check_head() may refuse a
// request from its head alone (before its body is read), handle() gets the whole request as an
// Exchange and answers it, at once or later from another thread.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "server/http_message.h"

namespace lily::server {

struct TransportLimits {
  double idle_timeout = 5;    // seconds
  double read_timeout = 10;   // seconds, first byte to last byte of one request
  double write_timeout = 30;  // seconds without progress
  size_t max_header_bytes = 32 << 10;
  size_t max_header_count = 100;
  size_t max_body_bytes = size_t(8) << 20;
  size_t max_connections = 256;
};

// One request and its response. Thread-safe; answer exactly once: respond(), or
// start_stream() + write()... + end_stream().
class Exchange : public StreamSink {
 public:
  virtual const HttpRequest& request() const = 0;
  virtual void respond(HttpResponse response) = 0;
  // The head of a streamed response (its status, headers and content type; body and stream
  // ignored). Returns false if the client is gone.
  virtual bool start_stream(const HttpResponse& head) = 0;
  virtual void end_stream() = 0;
  // After this, the connection closes once the response is written (no keep-alive).
  virtual void close_after_response() = 0;
};

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;
  // The request's head is in (body empty): a response refuses it now, nullopt reads the body.
  virtual std::optional<HttpResponse> check_head(const HttpRequest& head) = 0;
  virtual void handle(std::shared_ptr<Exchange> exchange) = 0;
  // The response to a request the transport refuses itself (400 malformed, 408 too slow, 413,
  // 431, 505, 503 too many connections): the handler words it (and counts it).
  virtual HttpResponse transport_error(int status, const std::string& message) = 0;
};

class HttpTransport {
 public:
  // Resolves and binds host:port (0: any free port). Throws lily::Error "cannot listen on ...".
  HttpTransport(const std::string& host, int port, TransportLimits limits, RequestHandler& handler);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  int port() const;
  bool loopback() const;        // bound to a loopback address only
  std::string address() const;  // the bound address, numeric

  void start(int io_threads);
  // Shutdown, step 1: no new connections; connections waiting for a request are closed, and
  // requests read from now on are answered by the handler (which refuses them with 503).
  void stop_accepting();
  // Responses started and not yet completely written; connections open.
  size_t responses_in_progress() const;
  size_t connections() const;
  // Shutdown, step 2: every connection closed, the I/O threads joined.
  void stop();

  struct Impl;  // http_session.h (the transport and its connections share it)

 private:
  std::unique_ptr<Impl> impl_;
};

// "Not Found" for 404, ... ("" for a status it does not know).
std::string_view reason_phrase(int status);

}  // namespace lily::server
