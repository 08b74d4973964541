// http_session_read.cpp: a connection's reading side (see http_session.h): waiting for a
// request, its head and body under one deadline, the transport's own refusals, lingering after a
// refused request, and the Exchange a request is handed to the handler as.
#include "server/http_session.h"

#include <poll.h>
#include <sys/socket.h>

#include "base/error.h"
#include "base/log.h"

namespace lily::server {

namespace {

constexpr size_t kLingerBytes = 64 << 20;  // discarded after refusing an unread request
constexpr auto kLingerTime = std::chrono::seconds(2);

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

void Session::wait_for_request() {
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

void Session::arm_deadline(double seconds) {
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

void Session::read_head() {
  idle_ = false;
  arm_deadline(t_.limits.read_timeout);  // for the whole request, body included
  http::async_read_header(stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_head(ec); });
}

void Session::on_head(beast::error_code ec) {
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

void Session::read_body() {
  http::async_read(stream_, buffer_, *parser_,
                   [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
}

void Session::read_failed(beast::error_code ec) {
  ++deadline_generation_;
  deadline_.cancel();
  if (deadline_hit_) {
    return refuse(408, fmt::format("the request did not arrive within {} s of its first byte", t_.limits.read_timeout));
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

void Session::refuse(int status, const std::string& message) {
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

void Session::linger() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
  linger_deadline_ = Clock::now() + kLingerTime;
  linger_read();
}

void Session::linger_read() {
  if (lingered_ > kLingerBytes || Clock::now() >= linger_deadline_) return close();
  stream_.expires_at(linger_deadline_);
  stream_.async_read_some(net::buffer(discard_), [self = shared_from_this()](beast::error_code ec, size_t n) {
    if (ec) return self->close();
    self->lingered_ += n;
    self->linger_read();
  });
}

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

}  // namespace lily::server
