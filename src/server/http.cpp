// http.cpp: `lily serve` over the transport (http_transport.h): the route table, the checks
// every request passes first (request_policy.h, the API key), error bodies, the worker threads
// completions run on, and shutdown on SIGINT/SIGTERM with a drain time.
#include <pthread.h>

#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "base/log.h"
#include "server/errors.h"
#include "server/http_transport.h"
#include "server/request_policy.h"
#include "server/server.h"
#include "server/wire.h"

namespace lily::server {

using Clock = std::chrono::steady_clock;

ChatService& ServerContext::service() const {
  ChatService* s = service_.load();
  if (!s) throw ApiError(503, "the model is loading; try again in a moment (GET /health tells the progress)");
  return *s;
}

void ServerContext::set_phase(std::string phase) {
  std::lock_guard lock(phase_mutex_);
  phase_ = std::move(phase);
}

// One at a time: the generation running, the requests in line. In parallel: the service's slots
// (fewer than --parallel where the memory holds fewer: the requests the line admitted beyond them
// wait in the service's), and the requests in line behind.
SlotStats ServerContext::slots() const {
  SlotStats s;
  if (options.parallel > 1 && ready()) {
    s = service_.load()->slots();
  } else {
    s.slots = std::max(options.parallel, 1);
    s.busy = size_t(std::max(running.load(), 0));
  }
  s.waiting += queue.waiting();
  return s;
}

std::pair<std::string, double> ServerContext::phase() const {
  std::lock_guard lock(phase_mutex_);
  return {phase_, std::chrono::duration<double>(Clock::now() - load_start_).count()};
}

namespace {

using Handler = void (*)(ServerContext&, const HttpRequest&, HttpResponse&);

struct Route {
  const char* method;
  const char* path;  // "{id}" stands for one path segment
  Handler handler;
  bool worker;     // completions: run on a worker thread (they wait in the queue and generate)
  bool json_body;  // the body is JSON: Content-Type application/json required
};

const Route kRoutes[] = {
    {"POST", "/v1/chat/completions", handle_chat_completions, true, true},
    {"POST", "/v1/completions", handle_completions, true, true},
    {"POST", "/v1/messages", handle_messages, true, true},
    {"POST", "/v1/messages/count_tokens", handle_count_tokens, true, true},
    {"POST", "/v1/responses", handle_responses, true, true},
    {"GET", "/v1/models", handle_models, false, false},
    {"GET", "/v1/models/{id}", handle_model, false, false},
    {"GET", "/health", handle_health, false, false},
    {"GET", "/metrics", handle_metrics, false, false},
    {"POST", "/cache/clear", handle_cache_clear, true, false},
    {"GET", "/", handle_chat_page, false, false},
};

// Whether `path` matches `pattern`; the {id} segment goes to `params`.
bool matches(std::string_view pattern, std::string_view path, std::vector<std::string>* params) {
  const size_t brace = pattern.find("{id}");
  if (brace == std::string_view::npos) return pattern == path;
  if (path.substr(0, brace) != pattern.substr(0, brace)) return false;
  const std::string_view id = path.substr(brace);
  if (id.empty() || id.find('/') != std::string_view::npos) return false;
  if (params) params->assign(1, std::string(id));
  return true;
}

// The routes of `path` (any method); empty: no such path.
std::vector<const Route*> routes_of(std::string_view path) {
  std::vector<const Route*> out;
  for (const Route& r : kRoutes) {
    if (matches(r.path, path, nullptr)) out.push_back(&r);
  }
  return out;
}

// The route for the request's method ("HEAD" takes a GET route), or nullptr.
const Route* find_route(const std::vector<const Route*>& routes, const std::string& method) {
  for (const Route* r : routes) {
    if (method == r->method || (method == "HEAD" && std::string_view(r->method) == "GET")) return r;
  }
  return nullptr;
}

std::string allow_header(const std::vector<const Route*>& routes) {
  std::string allow;
  for (const Route* r : routes) {
    allow += allow.empty() ? "" : ", ";
    allow += r->method;
    if (std::string_view(r->method) == "GET") allow += ", HEAD";
  }
  return allow + ", OPTIONS";
}

std::string route_label(const HttpRequest& req) {
  if (req.method == "OPTIONS") return "OPTIONS";
  auto routes = routes_of(req.path);
  return routes.empty() ? "other" : routes.front()->path;
}

// A fixed number of threads for completions; post() is refused (false) when all are taken, so
// nothing waits for a thread: a request is running, waiting in the RequestQueue, or refused.
// A task goes to the worker that went idle last (a stack, not a queue): the threads that run
// requests stay as few as the requests at once, and the others' stacks and malloc caches stay
// untouched. Woken in turn from one queue, every worker of the pool (--queue + --parallel + 2) came to run
// requests and kept the stack pages and thread cache it had touched: the server's memory grew
// with the pool's size, not with the requests at once (tests/server/node/soak.mjs).
class WorkerPool {
 public:
  explicit WorkerPool(size_t n) {
    workers_.reserve(n);
    for (size_t i = 0; i < n; ++i) workers_.push_back(std::make_unique<Worker>());
    for (auto it = workers_.rbegin(); it != workers_.rend(); ++it) idle_.push_back(it->get());  // worker 0 first
    for (auto& w : workers_) w->thread = std::thread([this, w = w.get()] { loop(*w); });
  }
  ~WorkerPool() { join(); }
  bool post(std::function<void()> task) {
    std::lock_guard lock(mutex_);
    if (stopping_ || idle_.empty()) return false;
    Worker* w = idle_.back();
    idle_.pop_back();
    w->task = std::move(task);
    w->wake.notify_one();
    return true;
  }
  size_t busy() const {
    std::lock_guard lock(mutex_);
    return workers_.size() - idle_.size();
  }
  void join() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      for (auto& w : workers_) w->wake.notify_one();
    }
    for (auto& w : workers_) {
      if (w->thread.joinable()) w->thread.join();
    }
  }

 private:
  struct Worker {
    std::condition_variable wake;
    std::function<void()> task;  // set by post(), under mutex_
    std::thread thread;
  };
  void loop(Worker& w) {
    std::unique_lock lock(mutex_);
    while (true) {
      w.wake.wait(lock, [&] { return stopping_ || w.task; });
      if (!w.task) return;
      auto task = std::move(w.task);
      w.task = nullptr;
      lock.unlock();
      task();
      task = nullptr;  // the task's captures are released before this worker is offered again
      lock.lock();
      idle_.push_back(&w);
    }
  }
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<Worker*> idle_;  // the last one went idle last, and takes the next task
  bool stopping_ = false;
};

// SIGINT/SIGTERM are taken by one thread (sigwait): blocked here, before any thread of the
// server starts, so that every thread started from here on (the workers', the transport's, the
// backend's) inherits the mask and none of them is killed by the signal.
sigset_t block_stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

// The error in the shape of the API the request was for (errors.h: error_json_for_path).
HttpResponse error_response(const ApiError& e, int retry_after, std::string_view path = {}) {
  HttpResponse res;
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", std::to_string(retry_after));
  res.set_content(dump(error_json_for_path(e, path)), "application/json");
  return res;
}

// With --api-key: "Authorization: Bearer KEY" (OpenAI's clients) or "x-api-key: KEY" (Anthropic's).
bool has_api_key(const HttpRequest& req, const std::string& key) {
  return req.header("authorization") == "Bearer " + key ||
         (req.has_header("x-api-key") && req.header("x-api-key") == key);
}

}  // namespace

struct Server::Impl final : RequestHandler {
  sigset_t stop_signals;  // first: blocked before the workers start
  ServerContext ctx;
  std::unique_ptr<HttpTransport> transport;
  WorkerPool workers;
  std::thread signal_thread;
  std::mutex stop_mutex;
  std::condition_variable stop_cv;
  int stop_signal = 0;
  std::atomic<bool> closing{false};  // the destructor wakes the signal thread: not a signal

  explicit Impl(ServerOptions options)
      : stop_signals(block_stop_signals()),
        ctx(std::move(options)),
        workers(ctx.options.max_waiting + size_t(std::max(ctx.options.parallel, 1)) + 2) {}

  // --- RequestHandler ---
  std::optional<HttpResponse> check_head(const HttpRequest& req) override {
    std::optional<ApiError> refusal = refuse_head(req);
    if (!refusal) return std::nullopt;
    HttpResponse res = error_response(*refusal, ctx.options.retry_after_seconds, req.path);
    if (refusal->status == 405) res.set_header("Allow", allow_header(routes_of(req.path)));
    if (refusal->status == 204) res = preflight(req);
    finish(req, res);
    return res;
  }

  void handle(std::shared_ptr<Exchange> exchange) override {
    const HttpRequest& req = exchange->request();
    const Route* route = find_route(routes_of(req.path), req.method);
    if (!route) return respond(*exchange, error_response(ApiError(404, "not found"), 1, req.path));
    if (ctx.shutting_down) {
      exchange->close_after_response();
      return respond(*exchange, error_response(ApiError(503, "the server is shutting down"), 1, req.path));
    }
    if (!route->worker) return run(*exchange, *route);
    const bool posted = workers.post([this, exchange, route] { run(*exchange, *route); });
    if (!posted) {
      respond(*exchange, error_response(ApiError(503, "the server is busy: too many requests are waiting"),
                                        ctx.options.retry_after_seconds, req.path));
    }
  }

  HttpResponse transport_error(int status, const std::string& message) override {
    ctx.metrics.count_request("other", status);
    return error_response(ApiError(status, message), ctx.options.retry_after_seconds);
  }

  // --- the checks of a request's head, in order ---
  std::optional<ApiError> refuse_head(const HttpRequest& req) {
    const ServerOptions& o = ctx.options;
    if (ctx.shutting_down) return ApiError(503, "the server is shutting down");
    if (auto r = check_host(req.header("host"), transport->loopback())) return ApiError(r->status, r->message);
    if (auto r = check_origin(req.header("origin"), req.has_header("origin"), req.header("host"), o.cors_origins)) {
      return ApiError(r->status, r->message);
    }
    const auto routes = routes_of(req.path);
    if (req.method == "OPTIONS") return ApiError(204, "");  // answered by preflight()
    if (routes.empty()) return ApiError(404, "not found: no route " + req.path, "", "not_found");
    const Route* route = find_route(routes, req.method);
    if (!route) {
      return ApiError(405, fmt::format("{} takes {}, not {}", req.path, allow_header(routes), req.method));
    }
    // With --api-key every route but /health and the chat page (/: no data; it asks for the key
    // and sends it) needs "Authorization: Bearer KEY" or "x-api-key: KEY".
    const bool open_route = req.path == "/health" || req.path == "/";
    if (!o.api_key.empty() && !open_route && !has_api_key(req, o.api_key)) {
      return ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY, or x-api-key: KEY)", "",
                      "invalid_api_key");
    }
    if (route->json_body) {
      if (auto r = check_json_content_type(req.header("content-type"), req.has_header("content-type"))) {
        return ApiError(r->status, r->message);
      }
    }
    if (!ctx.ready() && !open_route && req.path != "/metrics") {
      return ApiError(503, "the model is loading; try again in a moment (GET /health tells the progress)");
    }
    return std::nullopt;
  }

  HttpResponse preflight(const HttpRequest& req) {
    HttpResponse res;
    res.status = 204;
    const auto routes = routes_of(req.path);
    res.set_header("Allow", routes.empty() ? "OPTIONS" : allow_header(routes));
    if (req.has_header("origin")) {  // allowed, or check_origin refused it
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      // x-api-key and anthropic-*: what Anthropic's clients send (anthropic-dangerous-direct-browser-access
      // from a page).
      res.set_header("Access-Control-Allow-Headers",
                     "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, "
                     "anthropic-dangerous-direct-browser-access");
      res.set_header("Access-Control-Max-Age", "600");
    }
    return res;
  }

  // CORS header for an allowed origin; the request counted.
  void finish(const HttpRequest& req, HttpResponse& res) {
    if (req.has_header("origin") && origin_allowed(req.header("origin"), ctx.options.cors_origins)) {
      res.set_header("Access-Control-Allow-Origin", req.header("origin"));
      res.set_header("Vary", "Origin");
    }
    ctx.metrics.count_request(route_label(req), res.status);
    LILY_LOG_DEBUG("{} {} -> {}", req.method, req.path, res.status);
  }

  void respond(Exchange& exchange, HttpResponse res) {
    finish(exchange.request(), res);
    exchange.respond(std::move(res));
  }

  // Runs an endpoint. Client mistakes (ApiError) become their 4xx; anything else is the
  // server's fault (500).
  void run(Exchange& exchange, const Route& route) {
    const HttpRequest& req = exchange.request();
    HttpResponse res;
    try {
      std::vector<std::string> params;
      matches(route.path, req.path, &params);
      if (params.empty()) {
        route.handler(ctx, req, res);
      } else {  // GET /v1/models/{id}: no body to copy
        HttpRequest with_params = req;
        with_params.path_params = std::move(params);
        route.handler(ctx, with_params, res);
      }
    } catch (const ApiError& e) {
      res = error_response(e, ctx.options.retry_after_seconds, req.path);
    } catch (const std::exception& e) {
      LILY_LOG_WARN("{} {}: {}", req.method, req.path, e.what());
      res = error_response(ApiError(500, std::string("internal error: ") + e.what()), 1, req.path);
    }
    if (!res.stream) return respond(exchange, std::move(res));
    finish(req, res);
    if (exchange.start_stream(res)) res.stream(exchange);
    exchange.end_stream();
  }

  // --- signals and shutdown ---
  void wait_for_signal() {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (closing) return;
    if (!ctx.ready()) {
      std::fprintf(stderr, "lily serve: %s while loading the model, exiting\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
      std::fflush(stderr);
      std::_Exit(0);
    }
    std::lock_guard lock(stop_mutex);
    stop_signal = sig;
    stop_cv.notify_all();
  }

  template <typename Pred>
  bool wait_until(Clock::time_point deadline, Pred done) {
    while (!done()) {
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return true;
  }

  // Stops accepting; waiting requests are answered 503 (streams: an error event and [DONE]);
  // the running generations may finish within --drain-seconds, then they are stopped and their
  // streams ended the same way; the last bytes are written; the threads are joined.
  void drain() {
    ctx.shutting_down = true;
    transport->stop_accepting();
    ctx.queue.shutdown();
    const auto deadline = Clock::now() + std::chrono::milliseconds(int64_t(ctx.options.drain_seconds * 1000));
    if (!wait_until(deadline, [&] { return workers.busy() == 0; })) {
      std::fprintf(stderr, "lily serve: the drain time (%.1f s) is over; stopping the running generation\n",
                   ctx.options.drain_seconds);
      ctx.stop_generation = true;
      wait_until(Clock::now() + std::chrono::seconds(5), [&] { return workers.busy() == 0; });
    }
    wait_until(Clock::now() + std::chrono::seconds(2), [&] { return transport->responses_in_progress() == 0; });
    transport->stop();
    workers.join();
  }
};

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  // Writes to a client that has gone must fail with EPIPE, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  const ServerOptions& o = impl_->ctx.options;
  TransportLimits limits;
  limits.idle_timeout = o.idle_timeout_seconds;
  limits.read_timeout = o.read_timeout_seconds;
  limits.write_timeout = o.write_timeout_seconds;
  limits.max_header_bytes = o.max_header_bytes;
  limits.max_header_count = o.max_header_count;
  limits.max_body_bytes = o.max_body_bytes;
  limits.max_connections = o.max_connections;
  impl_->transport = std::make_unique<HttpTransport>(o.host, o.port, limits, *impl_);
  HttpTransport* t = impl_->transport.get();
  impl_->ctx.open_connections = [t] { return t->connections(); };
  if (!t->loopback() && o.api_key.empty()) {
    std::fprintf(stderr,
                 "lily serve: warning: listening on %s, beyond loopback, without an API key: anyone who can reach "
                 "this machine can use the model. Set LILY_API_KEY (or --api-key) to require one.\n",
                 o.host.c_str());
  }
  impl_->transport->start(2);
  impl_->signal_thread = std::thread([this] { impl_->wait_for_signal(); });
}

Server::~Server() {
  if (impl_->transport) impl_->transport->stop();
  impl_->workers.join();
  if (impl_->signal_thread.joinable()) {
    impl_->closing = true;
    pthread_kill(impl_->signal_thread.native_handle(), SIGTERM);  // wakes the sigwait if no signal came
    impl_->signal_thread.join();
  }
}

std::string Server::url() const {
  const std::string host = impl_->ctx.options.host;
  const bool v6 = host.find(':') != std::string::npos;
  return fmt::format("http://{}{}{}:{}", v6 ? "[" : "", host, v6 ? "]" : "", impl_->transport->port());
}

void Server::set_phase(std::string phase) { impl_->ctx.set_phase(std::move(phase)); }

int Server::serve(ChatService& service) {
  ServerContext& ctx = impl_->ctx;
  LILY_CHECK(service.concurrent() == (ctx.options.parallel > 1),
             "internal: a server of {} slots over a chat service {}", ctx.options.parallel,
             service.concurrent() ? "of parallel completions" : "of one completion at a time");
  ctx.attach(service);
  std::printf("lily serve: model '%s', context %lld tokens, %d parallel; listening on %s\n",
              ctx.options.model_name.c_str(), (long long)service.context_size(), service.slots().slots, url().c_str());
  std::fflush(stdout);
  int sig = 0;
  {
    std::unique_lock lock(impl_->stop_mutex);
    impl_->stop_cv.wait(lock, [&] { return impl_->stop_signal != 0; });
    sig = impl_->stop_signal;
  }
  std::fprintf(stderr, "lily serve: %s, shutting down (a running generation may finish within %.1f s)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM", ctx.options.drain_seconds);
  impl_->drain();
  std::fprintf(stderr, "lily serve: stopped\n");
  return 0;
}

}  // namespace lily::server
