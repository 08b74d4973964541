// http_transport.cpp: HTTP/1.x on Boost.Beast (see http_transport.h). The only file that sees
// Beast or Asio: one connection is a Session on its own strand; every read and write is
// asynchronous with a deadline; endpoints answer through the Exchange interface from any thread.
#include "server/http_transport.h"

#include <poll.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <list>
#include <mutex>
#include <thread>

#include "base/error.h"
#include "base/log.h"

namespace lily::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kBacklogBytes = 256 << 10;  // a streaming writer waits while this much is unsent
constexpr size_t kLingerBytes = 64 << 20;    // discarded after refusing an unread request
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr auto kHeartbeatCheck = std::chrono::seconds(1);

std::chrono::milliseconds millis(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000)); }

std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string percent_decode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += char(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

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

class Session;

struct HttpTransport::Impl {
  RequestHandler& handler;
  TransportLimits limits;
  std::atomic<bool> accepting{true};
  std::atomic<size_t> connections{0}, responses{0};
  bool loopback = false;
  std::mutex sessions_mutex;
  std::list<std::weak_ptr<Session>> sessions;
  // After the sessions' bookkeeping: the io_context is destroyed first, and the handlers it
  // still holds destroy their sessions, which unregister themselves from the list above.
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;

  Impl(RequestHandler& h, TransportLimits l) : handler(h), limits(l) {}
  void accept();
  void refuse_connection(tcp::socket& socket);
  template <typename Fn>
  void for_each_session(Fn fn);
};

// One connection: reads a request, hands it to the handler as an Exchange, writes the response
// the exchange is given, and reads the next request. The strand runs the reading and writing;
// the exchange's calls come from any thread and meet the strand under mutex_.
class Session final : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpTransport::Impl& t)
      : stream_(std::move(socket)),
        t_(t),
        heartbeat_(stream_.get_executor()),
        deadline_(stream_.get_executor()),
        buffer_(t.limits.max_header_bytes + 4096) {
    ++t_.connections;
    fd_ = stream_.socket().native_handle();
  }
  ~Session() {
    {
      std::lock_guard lock(t_.sessions_mutex);
      t_.sessions.erase(registered_);
    }
    --t_.connections;
  }

  void start() {
    {
      std::lock_guard lock(t_.sessions_mutex);
      t_.sessions.push_front(weak_from_this());
      registered_ = t_.sessions.begin();
    }
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->wait_for_request(); });
  }

  // On the strand (posted by HttpTransport).
  void close_if_idle() {
    if (idle_) close();
  }
  // Ends the connection: the socket is shut down (the descriptor stays open until the session
  // is destroyed, so alive() never polls a reused one) and a waiting writer is released.
  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.cancel();
    heartbeat_.cancel();
    deadline_.cancel();
    std::lock_guard lock(mutex_);
    failed_ = true;
    drained_.notify_all();
  }

  // --- what the exchange calls, from any thread ---
  void respond(HttpResponse r) {
    std::string out = head(r, std::to_string(r.body.size()));
    if (!head_request_) out += r.body;
    queue(std::move(out), /*done=*/true);
  }

  bool start_stream(const HttpResponse& r) {
    {
      std::lock_guard lock(mutex_);
      chunked_ = version_ >= 11;
      if (!chunked_) close_after_ = true;  // HTTP/1.0: the body ends when the connection does
    }
    const bool sse = r.content_type.rfind("text/event-stream", 0) == 0;
    const bool ok = queue(head(r, ""), false);
    if (ok && sse) net::post(stream_.get_executor(), [self = shared_from_this()] { self->arm_heartbeat(); });
    return ok;
  }

  bool write(std::string_view data) {
    std::unique_lock lock(mutex_);
    drained_.wait(lock, [&] { return failed_ || pending_.size() < kBacklogBytes; });
    if (failed_) return false;
    if (data.empty()) return true;
    append_body(data);
    kick(lock);
    return true;
  }

  void end_stream() {
    bool chunked;
    {
      std::lock_guard lock(mutex_);
      chunked = chunked_;
    }
    queue(chunked ? "0\r\n\r\n" : "", true);
  }

  bool alive() const {
    {
      std::lock_guard lock(mutex_);
      if (failed_) return false;
    }
    // A peer that closed its side reads as end-of-file (it may have sent nothing else).
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) < 0) return true;
    if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) return false;
    if (p.revents & POLLIN) {
      char c;
      if (recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0) return false;
    }
    return true;
  }

  void close_after_response() {
    std::lock_guard lock(mutex_);
    close_after_ = true;
  }

 private:
  static constexpr auto kHeartbeatInterval = std::chrono::seconds(10);

  // The head of a response; content_length "" for a streamed one.
  std::string head(const HttpResponse& r, const std::string& content_length) {
    ++t_.responses;
    std::lock_guard lock(mutex_);
    response_counted_ = true;
    const bool v10 = version_ < 11;
    std::string out = fmt::format("HTTP/1.{} {} {}\r\n", v10 ? 0 : 1, r.status, reason_phrase(r.status));
    for (const auto& [name, value] : r.headers) out += name + ": " + value + "\r\n";
    if (!r.content_type.empty()) out += "Content-Type: " + r.content_type + "\r\n";
    if (!content_length.empty()) {
      out += "Content-Length: " + content_length + "\r\n";
    } else if (!v10) {
      out += "Transfer-Encoding: chunked\r\n";
    }
    if (!keep_alive_) close_after_ = true;
    out += close_after_ ? "Connection: close\r\n\r\n" : "\r\n";
    return out;
  }

  void append_body(std::string_view data) {
    if (chunked_) pending_ += fmt::format("{:x}\r\n", data.size());
    pending_ += data;
    if (chunked_) pending_ += "\r\n";
    last_queued_ = Clock::now();
  }

  // Adds bytes to send (done: the response's last). Returns false once the client is gone.
  bool queue(std::string bytes, bool done) {
    std::unique_lock lock(mutex_);
    if (done) response_done_ = true;
    const bool ok = !failed_;
    if (ok) {
      pending_ += bytes;
      last_queued_ = Clock::now();
    }
    // A failed response still ends: the strand finishes it (counts, closes).
    if (ok || done) kick(lock);
    return ok;
  }

  void kick(std::unique_lock<std::mutex>& lock) {
    if (writing_) return;
    writing_ = true;
    lock.unlock();
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->flush(); });
  }

  // On the strand: writes what is pending; when nothing is and the response is complete, the
  // exchange is over.
  void flush() {
    std::unique_lock lock(mutex_);
    if (failed_ || pending_.empty()) {
      writing_ = false;
      if (response_done_) {
        lock.unlock();
        response_written();
      }
      return;
    }
    inflight_.swap(pending_);
    pending_.clear();
    drained_.notify_all();
    lock.unlock();
    stream_.expires_after(millis(t_.limits.write_timeout));
    net::async_write(stream_, net::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) self->close();
      self->flush();
    });
  }

  void response_written() {
    heartbeat_.cancel();
    bool close_now;
    {
      std::lock_guard lock(mutex_);
      if (response_counted_) --t_.responses;
      response_counted_ = false;
      close_now = failed_ || close_after_;
      response_done_ = false;
      chunked_ = false;
    }
    if (!close_now) return wait_for_request();
    if (body_unread_) return linger();
    close();
  }

  void arm_heartbeat() {
    heartbeat_.expires_after(kHeartbeatCheck);
    heartbeat_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (ec) return;
      {
        std::unique_lock lock(self->mutex_);
        if (self->failed_ || self->response_done_) return;
        if (!self->writing_ && self->pending_.empty() && Clock::now() - self->last_queued_ >= kHeartbeatInterval) {
          self->append_body(": keep-alive\n\n");
          self->kick(lock);
        }
      }
      self->arm_heartbeat();
    });
  }

  // --- reading, on the strand ---
  void wait_for_request() {
    idle_ = true;
    if (!t_.accepting) return close();
    parser_.emplace();
    parser_->header_limit(uint32_t(t_.limits.max_header_bytes));
    parser_->body_limit(std::numeric_limits<uint64_t>::max());  // checked once the head is in
    body_unread_ = false;
    {
      std::lock_guard lock(mutex_);
      keep_alive_ = true;
      close_after_ = false;
    }
    if (buffer_.size() > 0) return read_head();
    arm_deadline(t_.limits.idle_timeout);
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->close();  // idled out, or the client left between requests
      self->buffer_.commit(n);
      self->read_head();
    });
  }

  // The reads' deadline. When it passes, the receiving side of the socket is shut down: the read
  // in progress, and any read after it, ends at once as end-of-file, so that a request too slow
  // to arrive is answered 408 (read_failed) before the connection closes. A cancel alone is not
  // enough: async_read_header is many reads, and a deadline that falls between two of them (a
  // header line just read, its handler queued on the strand) cancels nothing. Beast's own
  // stream timeout would close the socket, with no 408. A deadline re-armed after its timer
  // fired but before its handler ran is recognised by its generation.
  void arm_deadline(double seconds) {
    stream_.expires_never();  // the last write's timeout does not apply to the reads
    deadline_hit_ = false;
    const uint64_t generation = ++deadline_generation_;
    deadline_.expires_after(millis(seconds));
    deadline_.async_wait([self = shared_from_this(), generation](beast::error_code ec) {
      if (ec || generation != self->deadline_generation_) return;  // re-armed or cancelled
      self->deadline_hit_ = true;
      beast::error_code ignored;
      self->stream_.socket().shutdown(tcp::socket::shutdown_receive, ignored);
      self->stream_.socket().cancel(ignored);
    });
  }

  void read_head() {
    idle_ = false;
    arm_deadline(t_.limits.read_timeout);  // for the whole request, body included
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_head(ec); });
  }

  void on_head(beast::error_code ec) {
    if (ec) return read_failed(ec);
    const auto& msg = parser_->get();
    head_ = HttpRequest();
    head_.method = std::string(sv(msg.method_string()));
    head_.target = std::string(sv(msg.target()));
    head_.version = int(msg.version());
    for (const auto& field : msg)
      head_.headers.emplace_back(lower(sv(field.name_string())), std::string(sv(field.value())));
    const std::string_view target = head_.target;
    head_.path = percent_decode(target.substr(0, target.find('?')));
    beast::error_code rec;
    const auto peer = stream_.socket().remote_endpoint(rec);
    if (!rec) head_.remote = peer.address().to_string();
    body_unread_ = !parser_->is_done();
    head_request_ = head_.method == "HEAD";
    {
      std::lock_guard lock(mutex_);
      version_ = head_.version;
      keep_alive_ = msg.keep_alive() && head_.version == 11;
    }

    if (head_.headers.size() > t_.limits.max_header_count) {
      return refuse(431, fmt::format("the request has {} header fields; lily takes at most {}", head_.headers.size(),
                                     t_.limits.max_header_count));
    }
    if (head_.version != 10 && head_.version != 11) return refuse(505, "lily speaks HTTP/1.0 and HTTP/1.1 only");
    if (auto length = parser_->content_length(); length && *length > t_.limits.max_body_bytes) {
      return refuse(413, fmt::format("the request body has {} bytes; the limit is {} (--max-body-mib)", *length,
                                     t_.limits.max_body_bytes));
    }
    if (auto refusal = t_.handler.check_head(head_)) {
      if (body_unread_) close_after_response();
      return respond(std::move(*refusal));
    }
    parser_->body_limit(t_.limits.max_body_bytes);
    if (!body_unread_) return on_body({});
    if (lower(head_.header("expect")) == "100-continue") {
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      net::async_write(stream_, net::buffer(kContinue), [self = shared_from_this()](beast::error_code ec, size_t) {
        if (ec) return self->close();
        self->read_body();
      });
      return;
    }
    read_body();
  }

  void read_body() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(beast::error_code ec);

  void read_failed(beast::error_code ec) {
    ++deadline_generation_;
    deadline_.cancel();
    if (deadline_hit_) {
      return refuse(408,
                    fmt::format("the request did not arrive within {} s of its first byte", t_.limits.read_timeout));
    }
    if (ec == http::error::header_limit) {
      return refuse(431, fmt::format("the request line and headers exceed {} bytes", t_.limits.max_header_bytes));
    }
    if (ec == http::error::body_limit) {
      return refuse(413, fmt::format("the request body exceeds {} bytes (--max-body-mib)", t_.limits.max_body_bytes));
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
        ec == net::error::operation_aborted || ec == http::error::partial_message) {
      return close();
    }
    refuse(400, "malformed HTTP request: " + ec.message());
  }

  // The transport's own refusals: the handler words the body; the connection closes after it.
  void refuse(int status, const std::string& message) {
    body_unread_ = true;  // whatever is left of the request, it is not read
    idle_ = false;
    if (head_.version != 10) {
      std::lock_guard lock(mutex_);
      version_ = 11;
    }
    HttpResponse r = t_.handler.transport_error(status, message);
    close_after_response();
    respond(std::move(r));
  }

  // After refusing a request whose body was not read: stop sending, read and drop what the
  // client still sends for a moment (so that it reads the refusal, not a reset), then close.
  void linger() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    linger_deadline_ = Clock::now() + kLingerTime;
    linger_read();
  }
  void linger_read() {
    if (lingered_ > kLingerBytes || Clock::now() >= linger_deadline_) return close();
    stream_.expires_at(linger_deadline_);
    stream_.async_read_some(net::buffer(discard_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->close();
      self->lingered_ += n;
      self->linger_read();
    });
  }

  beast::tcp_stream stream_;
  HttpTransport::Impl& t_;
  net::steady_timer heartbeat_;
  net::steady_timer deadline_;  // of the read in progress (arm_deadline)
  beast::flat_buffer buffer_;
  std::list<std::weak_ptr<Session>>::iterator registered_;
  std::optional<http::request_parser<http::string_body>> parser_;
  int fd_ = -1;
  // Strand only.
  HttpRequest head_;                  // the request being read
  bool idle_ = true;                  // waiting for the next request
  bool body_unread_ = false;          // the request's body is still on the wire
  bool head_request_ = false;         // HEAD: no body in the response
  bool deadline_hit_ = false;         // the read was cut by its deadline
  uint64_t deadline_generation_ = 0;  // arm_deadline's count
  std::string inflight_;              // the bytes of the write in flight
  Clock::time_point linger_deadline_;
  size_t lingered_ = 0;
  char discard_[16384];

  mutable std::mutex mutex_;  // what the exchange's threads share with the strand
  std::condition_variable drained_;
  std::string pending_;
  int version_ = 11;
  bool writing_ = false, failed_ = false, response_done_ = false, response_counted_ = false;
  bool close_after_ = false, keep_alive_ = true, chunked_ = false;
  Clock::time_point last_queued_ = Clock::now();

  friend struct HttpTransport::Impl;
};

// One request and its response: owns the request, so that it outlives the connection's next
// read; the response goes to the session.
class SessionExchange final : public Exchange {
 public:
  SessionExchange(std::shared_ptr<Session> session, HttpRequest request)
      : session_(std::move(session)), request_(std::move(request)) {}
  ~SessionExchange() override {
    // An exchange dropped unanswered (never expected) still ends its connection properly.
    if (!answered_) session_->respond(HttpResponse{500, {}, "text/plain", "no response", {}});
  }
  const HttpRequest& request() const override { return request_; }
  void respond(HttpResponse response) override {
    answered_ = true;
    session_->respond(std::move(response));
  }
  bool start_stream(const HttpResponse& head) override {
    answered_ = true;
    return session_->start_stream(head);
  }
  bool write(std::string_view data) override { return session_->write(data); }
  void end_stream() override { session_->end_stream(); }
  bool alive() const override { return session_->alive(); }
  void close_after_response() override { session_->close_after_response(); }

 private:
  std::shared_ptr<Session> session_;
  HttpRequest request_;
  std::atomic<bool> answered_{false};
};

void Session::on_body(beast::error_code ec) {
  if (ec) return read_failed(ec);
  body_unread_ = false;
  ++deadline_generation_;  // a deadline that fell while the body's handler was queued is void
  deadline_.cancel();
  HttpRequest request = std::move(head_);
  head_ = HttpRequest();
  request.body = std::move(parser_->get().body());
  std::weak_ptr<Session> weak = weak_from_this();
  request.client_alive = [weak] {
    auto self = weak.lock();
    return self && self->alive();
  };
  t_.handler.handle(std::make_shared<SessionExchange>(shared_from_this(), std::move(request)));
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
