// http.cpp: the cpp-httplib wiring of `lily serve`: routes, auth, body limit, error bodies,
// client-disconnect detection, and clean shutdown on SIGINT/SIGTERM.
#include <httplib.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "base/log.h"
#include "server/errors.h"
#include "server/server.h"
#include "server/wire.h"

namespace lily::server {

namespace {

std::string numeric_host(const sockaddr_storage& addr, socklen_t len, int* port) {
  char host[NI_MAXHOST] = {0}, serv[NI_MAXSERV] = {0};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof host, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return {};
  }
  *port = std::atoi(serv);
  return host;
}

}  // namespace

// cpp-httplib 0.11 does not tell a handler whether its client is still there, nor give it the
// socket. The connection's socket is found by its two endpoints (the handler runs while the
// connection is open, so the descriptor cannot be reused meanwhile); alive() then peeks at it:
// a peer that closed reads as end-of-file.
ClientConnection::ClientConnection(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (*end != '\0' || fd < 0) continue;
    struct stat st {};
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t peer_len = sizeof peer, local_len = sizeof local;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0) continue;
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0) continue;
    int peer_port = -1, local_port = -1;
    const std::string peer_host = numeric_host(peer, peer_len, &peer_port);
    numeric_host(local, local_len, &local_port);
    if (peer_port == req.remote_port && local_port == req.local_port && peer_host == req.remote_addr) {
      fd_ = int(fd);
      break;
    }
  }
  closedir(dir);
}

bool ClientConnection::alive() const {
  if (fd_ < 0) return true;  // not found: assume the client stays
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return true;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return false;
  if (p.revents & POLLIN) {
    char c;
    if (recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) return false;
  }
  return true;
}

namespace {

using Handler = void (*)(ServerContext&, const httplib::Request&, httplib::Response&);

void write_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  if (e.status == 503) res.set_header("Retry-After", "1");
  res.set_content(dump(error_json(e)), "application/json");
}

// Client mistakes (ApiError) become their 4xx; anything else is the server's fault (500).
httplib::Server::Handler wrap(ServerContext& ctx, Handler handler) {
  return [&ctx, handler](const httplib::Request& req, httplib::Response& res) {
    try {
      handler(ctx, req, res);
    } catch (const ApiError& e) {
      write_error(res, e);
    } catch (const std::exception& e) {
      LILY_LOG_WARN("{} {}: {}", req.method, req.path, e.what());
      write_error(res, ApiError(500, std::string("internal error: ") + e.what()));
    }
  };
}

std::string default_message(int status) {
  switch (status) {
    case 400: return "bad request";
    case 404: return "not found: no such route";
    case 405: return "method not allowed";
    case 413: return "the request body is too large";
    case 414: return "the request URI is too long";
    default: return status >= 500 ? "internal server error" : "request refused";
  }
}

}  // namespace

int run_server(ChatService& service, const ServerOptions& options) {
  // Writes to a client that has gone must fail with EPIPE, not kill the process.
  std::signal(SIGPIPE, SIG_IGN);
  // SIGINT/SIGTERM are taken by one thread (sigwait); every other thread, httplib's included,
  // inherits the mask set here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  ServerContext ctx(service, options);
  httplib::Server svr;
  const size_t threads = options.max_waiting + 8;  // room for /health and /metrics while the line is full
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(options.max_body_bytes);
  svr.set_keep_alive_timeout(2);
  svr.set_default_headers({{"Access-Control-Allow-Origin", "*"}});

  svr.set_pre_routing_handler([&ctx](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") {  // CORS preflight
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.status = 204;
      return httplib::Server::HandlerResponse::Handled;
    }
    // With --api-key every route but /health needs "Authorization: Bearer KEY".
    if (!ctx.options.api_key.empty() && req.path != "/health" &&
        req.get_header_value("Authorization") != "Bearer " + ctx.options.api_key) {
      write_error(res,
                  ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)", "", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  // httplib's own refusals (unknown route, body too large, bad request line) get an error object.
  svr.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e(res.status, default_message(res.status), "", res.status == 404 ? "not_found" : "");
    res.set_content(dump(error_json(e)), "application/json");
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    write_error(res, ApiError(500, "internal server error"));
  });
  svr.set_logger([&ctx](const httplib::Request& req, const httplib::Response& res) {
    ctx.metrics.count_request(req.path.rfind("/v1/models/", 0) == 0 ? "/v1/models/{id}" : req.path, res.status);
    LILY_LOG_DEBUG("{} {} -> {}", req.method, req.path, res.status);
  });

  svr.Post("/v1/chat/completions", wrap(ctx, handle_chat_completions));
  svr.Post("/v1/completions", wrap(ctx, handle_completions));
  svr.Get("/v1/models", wrap(ctx, handle_models));
  svr.Get(R"(/v1/models/(.+))", wrap(ctx, handle_model));
  svr.Get("/health", wrap(ctx, handle_health));
  svr.Get("/metrics", wrap(ctx, handle_metrics));

  int port = options.port;
  if (port == 0) {
    port = svr.bind_to_any_port(options.host);
  } else if (!svr.bind_to_port(options.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    std::fprintf(stderr, "error: cannot listen on %s:%d\n", options.host.c_str(), options.port);
    return 1;
  }
  ctx.ready = true;
  const bool v6 = options.host.find(':') != std::string::npos;
  std::printf("lily serve: model '%s', context %lld tokens; listening on http://%s%s%s:%d\n",
              options.model_name.c_str(), (long long)service.context_size(), v6 ? "[" : "", options.host.c_str(),
              v6 ? "]" : "", port);
  std::fflush(stdout);

  std::thread signal_thread([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (svr.is_running() || !ctx.queue.shutting_down()) {
      std::fprintf(stderr, "lily serve: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    ctx.queue.shutdown();  // waiting requests give up, the running one stops at its next token
    svr.stop();
  });
  const bool ok = svr.listen_after_bind();
  ctx.queue.shutdown();
  pthread_kill(signal_thread.native_handle(), SIGTERM);  // wakes the sigwait if no signal came
  signal_thread.join();
  std::fprintf(stderr, "lily serve: stopped\n");
  return ok ? 0 : 1;
}

}  // namespace lily::server
