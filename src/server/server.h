// server.h: `lily serve`, an OpenAI-compatible HTTP server over one ChatService.
//
//   POST /v1/chat/completions   v1_chat_completions.cpp
//   POST /v1/completions        v1_completions.cpp
//   POST /v1/messages[/count_tokens]  v1_messages.cpp (Anthropic's Messages API; anthropic_wire.h)
//   POST /v1/responses          v1_responses.cpp (OpenAI's Responses API; responses_wire.h)
//   GET  /v1/models[/{id}]      v1_models.cpp
//   GET  /health, /metrics      health_metrics.cpp
//   POST /cache/clear           session_cache.cpp (lily's own)
//   GET  /                      chat_page.cpp: the chat page (src/server/web/chat.html)
// Routes, access checks (request_policy.h), worker threads and shutdown: http.cpp; reading and
// writing HTTP with its limits and deadlines: http_transport.cpp. Docs: docs/server.md.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/chat_service.h"
#include "server/http_message.h"
#include "server/request_queue.h"

namespace lily::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port
  std::string api_key;  // non-empty: requests need "Authorization: Bearer KEY" (or "x-api-key: KEY")
  std::string model_name = "lily";
  int parallel = 4;                         // completions at once (the service's slots; 1: one at a time)
  size_t max_waiting = 16;                  // queue length beyond the busy slots
  size_t max_body_bytes = size_t(8) << 20;  // larger bodies: 413
  int retry_after_seconds = 1;              // with 503 when the queue is full
  std::vector<std::string> cors_origins;    // origins that get Access-Control-Allow-Origin ("*": any)
  double drain_seconds = 5;                 // SIGTERM: how long a running generation may go on
  double read_timeout_seconds = 10;         // a request's line, headers and body, from its first byte
  double idle_timeout_seconds = 5;          // keep-alive: the wait for the next request
  double write_timeout_seconds = 30;        // a client that takes nothing for this long is dropped
  size_t max_header_bytes = 32 << 10;       // request line + headers (beyond: 431)
  size_t max_header_count = 100;            // header fields (beyond: 431)
  size_t max_connections = 256;             // beyond: 503 and close
};

// The label of /metrics' lily_requests_total: one of the routes' patterns, "OPTIONS" for
// preflights, "other" for everything else (unknown paths, requests that never named one).
// A bounded set, so random paths cannot add series.
class Metrics {
 public:
  void count_request(const std::string& route_label, int status);
  void count_completion(const CompletionResult& result, double queue_seconds);
  std::string prometheus(size_t queue_depth, const SlotStats& slots, const PrefixCacheStats& cache, bool ready,
                         size_t connections) const;

 private:
  mutable std::mutex mutex_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t completions_ = 0, cancelled_ = 0;
  int64_t prompt_tokens_ = 0, generated_tokens_ = 0, cached_tokens_ = 0, prefilled_tokens_ = 0;
  int64_t drafted_tokens_ = 0, accepted_tokens_ = 0;  // --speculate: the MTP head's drafts
  double prefill_seconds_ = 0, decode_seconds_ = 0, ttft_seconds_ = 0, queue_seconds_ = 0;
  double last_prefill_tps_ = 0, last_decode_tps_ = 0, last_ttft_ = 0;
};

// Prometheus label value escaping (\ " and newline).
std::string escape_label_value(std::string_view value);

// What every endpoint gets.
struct ServerContext {
  ServerOptions options;
  RequestQueue queue;
  Metrics metrics;
  std::time_t started = std::time(nullptr);
  std::atomic<int> running{0};               // generations in progress (at most options.parallel)
  std::atomic<bool> shutting_down{false};    // SIGTERM/SIGINT: no new requests
  std::atomic<bool> stop_generation{false};  // the drain time is over: the running generation stops
  std::function<size_t()> open_connections = [] { return size_t(0); };

  explicit ServerContext(ServerOptions o)
      : options(std::move(o)), queue(options.max_waiting, size_t(std::max(options.parallel, 1))) {}
  // The slots: how many, how many run a completion, how many requests wait for one.
  SlotStats slots() const;

  // The chat service once the model is loaded; before that, ApiError 503 "the model is loading".
  ChatService& service() const;
  bool ready() const { return service_.load() != nullptr; }
  void attach(ChatService& service) { service_ = &service; }
  // While loading: what is being done, and since when.
  void set_phase(std::string phase);
  std::pair<std::string, double> phase() const;

 private:
  std::atomic<ChatService*> service_{nullptr};
  mutable std::mutex phase_mutex_;
  std::string phase_ = "starting";
  std::chrono::steady_clock::time_point load_start_ = std::chrono::steady_clock::now();
};

// Endpoint handlers.
void handle_chat_completions(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_completions(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_messages(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_count_tokens(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_responses(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_models(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_model(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_health(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_metrics(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_cache_clear(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);
void handle_chat_page(ServerContext& ctx, const HttpRequest& req, HttpResponse& res);

// `lily serve`'s server. Constructed before the model loads: it binds at once (a port in use,
// an address that cannot be bound: lily::Error "cannot listen on ..."), answers /health with
// 503 and the loading phase, and takes SIGINT/SIGTERM from then on (while loading they end the
// process at once). serve() attaches the loaded model and serves until a signal, then drains
// (docs/server.md, "Shutdown").
class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  std::string url() const;  // http://HOST:PORT with the port bound
  void set_phase(std::string phase);
  // Prints "lily serve: model 'NAME', context N tokens; listening on URL" and serves. Returns
  // the exit code.
  int serve(ChatService& service);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lily::server
