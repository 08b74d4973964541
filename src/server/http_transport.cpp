// http_transport.cpp: HTTP/1.x on Boost.Beast (see http_transport.h): the listening socket, the
// accept loop, the I/O threads and shutdown. One connection is a Session on its own strand
// (http_session.h); every read and write is asynchronous with a deadline; endpoints answer
// through the Exchange interface from any thread. Only the transport's files see Beast or Asio.
#include "server/http_transport.h"

#include <chrono>
#include <memory>
#include <thread>

#include "base/error.h"
#include "base/log.h"
#include "server/http_session.h"

namespace lily::server {

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "";
  }
}

template <typename Fn>
void HttpTransport::Impl::for_each_session(Fn fn) {
  std::vector<std::shared_ptr<Session>> live;
  {
    std::lock_guard lock(sessions_mutex);
    for (auto& weak : sessions) {
      if (auto s = weak.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) net::post(s->stream_.get_executor(), [s, fn] { fn(*s); });
}

void HttpTransport::Impl::refuse_connection(tcp::socket& socket) {
  HttpResponse r = handler.transport_error(503, "the server has too many connections open; try again");
  std::string out = fmt::format("HTTP/1.1 503 {}\r\nRetry-After: 1\r\nContent-Type: {}\r\nContent-Length: {}\r\n"
                                "Connection: close\r\n\r\n{}",
                                reason_phrase(503), r.content_type, r.body.size(), r.body);
  beast::error_code ignored;
  socket.non_blocking(true, ignored);
  socket.send(net::buffer(out), 0, ignored);
  socket.shutdown(tcp::socket::shutdown_both, ignored);
}

void HttpTransport::Impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      LILY_LOG_WARN("accept failed: {}", ec.message());
      // Out of descriptors and the like: wait a little instead of spinning.
      auto timer = std::make_shared<net::steady_timer>(ioc, std::chrono::milliseconds(100));
      timer->async_wait([this, timer](beast::error_code) { accept(); });
      return;
    }
    if (connections >= limits.max_connections) {
      refuse_connection(socket);
    } else {
      auto session = std::make_shared<Session>(std::move(socket), *this);
      session->start();
    }
    if (accepting) accept();
  });
}

HttpTransport::HttpTransport(const std::string& host, int port, TransportLimits limits, RequestHandler& handler)
    : impl_(std::make_unique<Impl>(handler, limits)) {
  auto fail_listen = [&](const std::string& why) -> void { fail("cannot listen on {}:{}: {}", host, port, why); };
  if (port < 0 || port > 65535) fail_listen("the port must be between 0 and 65535");
  beast::error_code ec;
  tcp::resolver resolver(impl_->ioc);
  auto results = resolver.resolve(host, std::to_string(port), tcp::resolver::passive | tcp::resolver::numeric_service,
                                  ec);
  if (ec || results.empty()) fail_listen(ec ? ec.message() : "no address");
  const tcp::endpoint endpoint = results.begin()->endpoint();
  tcp::acceptor& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (ec) fail_listen(ec.message());
  // SO_REUSEADDR only (restarts while old connections sit in TIME_WAIT); never SO_REUSEPORT,
  // with which a second server would share the port and the kernel split connections.
  a.set_option(net::socket_base::reuse_address(true), ec);
  a.bind(endpoint, ec);
  if (ec) {
    fail_listen(ec == net::error::address_in_use ? "the address is already in use (is another lily serve running?)"
                                                 : ec.message());
  }
  a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail_listen(ec.message());
  impl_->loopback = endpoint.address().is_loopback();
}

HttpTransport::~HttpTransport() { stop(); }

int HttpTransport::port() const {
  beast::error_code ec;
  return impl_->acceptor.is_open() ? impl_->acceptor.local_endpoint(ec).port() : 0;
}

bool HttpTransport::loopback() const { return impl_->loopback; }

std::string HttpTransport::address() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec).address().to_string();
}

void HttpTransport::start(int io_threads) {
  impl_->accept();
  for (int i = 0; i < io_threads; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
}

void HttpTransport::stop_accepting() {
  impl_->accepting = false;
  net::post(impl_->ioc, [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
  impl_->for_each_session([](Session& s) { s.close_if_idle(); });
}

size_t HttpTransport::responses_in_progress() const { return impl_->responses; }

size_t HttpTransport::connections() const { return impl_->connections; }

void HttpTransport::stop() {
  if (impl_->threads.empty()) return;
  stop_accepting();
  impl_->for_each_session([](Session& s) { s.close(); });
  // Let the closes run, then end the loop; handlers left behind are destroyed with it.
  for (int i = 0; i < 50 && impl_->connections > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return "";
}

bool HttpRequest::has_header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return true;
  }
  return false;
}

void HttpResponse::set_header(std::string name, std::string value) {
  headers.emplace_back(std::move(name), std::move(value));
}

}  // namespace lily::server
