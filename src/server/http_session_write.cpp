// http_session_write.cpp: a connection's writing side (see http_session.h): what the exchange
// calls from any thread (respond, streams, alive), the queue the strand writes from, and the
// heartbeat of a quiet event stream.
#include "server/http_session.h"

#include <poll.h>
#include <sys/socket.h>

#include "base/error.h"
#include "base/log.h"

namespace lily::server {

namespace {

constexpr size_t kBacklogBytes = 256 << 10;  // a streaming writer waits while this much is unsent
constexpr auto kHeartbeatCheck = std::chrono::seconds(1);

}  // namespace

void Session::start() {
  {
    std::lock_guard lock(t_.sessions_mutex);
    t_.sessions.push_front(weak_from_this());
    registered_ = t_.sessions.begin();
  }
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->wait_for_request(); });
}

void Session::close_if_idle() {
  if (idle_) close();
}

void Session::close() {
  beast::error_code ec;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream_.cancel();
  heartbeat_.cancel();
  deadline_.cancel();
  std::lock_guard lock(mutex_);
  failed_ = true;
  drained_.notify_all();
}

void Session::respond(HttpResponse r) {
  std::string out = head(r, std::to_string(r.body.size()));
  if (!head_request_) out += r.body;
  queue(std::move(out), /*done=*/true);
}

bool Session::start_stream(const HttpResponse& r) {
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

bool Session::write(std::string_view data) {
  std::unique_lock lock(mutex_);
  drained_.wait(lock, [&] { return failed_ || pending_.size() < kBacklogBytes; });
  if (failed_) return false;
  if (data.empty()) return true;
  append_body(data);
  kick(lock);
  return true;
}

void Session::end_stream() {
  bool chunked;
  {
    std::lock_guard lock(mutex_);
    chunked = chunked_;
  }
  queue(chunked ? "0\r\n\r\n" : "", true);
}

bool Session::alive() const {
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

void Session::close_after_response() {
  std::lock_guard lock(mutex_);
  close_after_ = true;
}

std::string Session::head(const HttpResponse& r, const std::string& content_length) {
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

void Session::append_body(std::string_view data) {
  if (chunked_) pending_ += fmt::format("{:x}\r\n", data.size());
  pending_ += data;
  if (chunked_) pending_ += "\r\n";
  last_queued_ = Clock::now();
}

bool Session::queue(std::string bytes, bool done) {
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

void Session::kick(std::unique_lock<std::mutex>& lock) {
  if (writing_) return;
  writing_ = true;
  lock.unlock();
  net::post(stream_.get_executor(), [self = shared_from_this()] { self->flush(); });
}

void Session::flush() {
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

void Session::response_written() {
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

void Session::arm_heartbeat() {
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

}  // namespace lily::server
