// server.h: `lily serve`, an OpenAI-compatible HTTP server over one ChatService.
//
//   POST /v1/chat/completions   v1_chat_completions.cpp
//   POST /v1/completions        v1_completions.cpp
//   GET  /v1/models[/{id}]      v1_models.cpp
//   GET  /health, /metrics      health_metrics.cpp
// Transport, auth, limits and shutdown: http.cpp. Docs: docs/server.md.
#pragma once

#include <atomic>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "runtime/chat_service.h"
#include "server/request_queue.h"

namespace httplib {
struct Request;
struct Response;
}  // namespace httplib

namespace lily::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port
  std::string api_key;  // non-empty: requests need "Authorization: Bearer KEY"
  std::string model_name = "lily";
  size_t max_waiting = 16;                  // queue length beyond the running request
  size_t max_body_bytes = size_t(8) << 20;  // larger bodies: 413
  int retry_after_seconds = 1;              // with 503 when the queue is full
};

// Counters for /metrics (Prometheus text format).
class Metrics {
 public:
  void count_request(const std::string& path, int status);
  void count_completion(const CompletionResult& result, double queue_seconds);
  std::string prometheus(size_t queue_depth, bool busy, const PrefixCacheStats& cache) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t completions_ = 0, cancelled_ = 0;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, cached_tokens_ = 0, prefilled_tokens_ = 0;
  double prefill_seconds_ = 0, decode_seconds_ = 0, ttft_seconds_ = 0, queue_seconds_ = 0;
  double last_prefill_tps_ = 0, last_decode_tps_ = 0, last_ttft_ = 0;
};

// What every endpoint gets.
struct ServerContext {
  ChatService& service;
  ServerOptions options;
  RequestQueue queue;
  Metrics metrics;
  std::time_t started = std::time(nullptr);
  std::atomic<bool> ready{false};    // the model is loaded (/health)
  std::atomic<bool> running{false};  // a generation is in progress

  ServerContext(ChatService& s, ServerOptions o) : service(s), options(std::move(o)), queue(options.max_waiting) {}
};

// Whether the client of `req` is still connected (its socket not closed by the peer). Polled
// once per generated token so a client that goes away stops its generation.
class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req);
  bool alive() const;

 private:
  int fd_ = -1;
};

// Endpoint handlers.
void handle_chat_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_models(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_model(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_health(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);
void handle_metrics(ServerContext& ctx, const httplib::Request& req, httplib::Response& res);

// Binds, prints the URL, serves until SIGINT/SIGTERM. Returns the exit code.
// `on_listening(url)` is called once the socket is bound.
int run_server(ChatService& service, const ServerOptions& options);

}  // namespace lily::server
