// http_session.h: one connection of HttpTransport (http_transport.cpp), private to the server's
// transport: the Impl the transport and its sessions share, and Session, the connection's state
// machine on its own strand. http_session_write.cpp holds what the exchange calls from any
// thread and the writing (responses, streams, heartbeats); http_session_read.cpp the reading
// (requests, deadlines, refusals, lingering) and the Exchange a request is handed over as.
#pragma once

#include <utility>  // before Boost.Asio, whose headers use std::exchange without including it

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "server/http_transport.h"

namespace lily::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

inline std::chrono::milliseconds millis(double seconds) { return std::chrono::milliseconds(int64_t(seconds * 1000)); }

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

  void start();
  // On the strand (posted by HttpTransport).
  void close_if_idle();
  // Ends the connection: the socket is shut down (the descriptor stays open until the session
  // is destroyed, so alive() never polls a reused one) and a waiting writer is released.
  void close();

  // --- what the exchange calls, from any thread ---
  void respond(HttpResponse r);
  bool start_stream(const HttpResponse& r);
  bool write(std::string_view data);
  void end_stream();
  bool alive() const;
  void close_after_response();

 private:
  static constexpr auto kHeartbeatInterval = std::chrono::seconds(10);

  // The head of a response; content_length "" for a streamed one.
  std::string head(const HttpResponse& r, const std::string& content_length);
  void append_body(std::string_view data);

  // Adds bytes to send (done: the response's last). Returns false once the client is gone.
  bool queue(std::string bytes, bool done);
  void kick(std::unique_lock<std::mutex>& lock);

  // On the strand: writes what is pending; when nothing is and the response is complete, the
  // exchange is over.
  void flush();
  void response_written();
  void arm_heartbeat();

  // --- reading, on the strand ---
  void wait_for_request();

  // The reads' deadline. When it passes, the receiving side of the socket is shut down: the read
  // in progress, and any read after it, ends at once as end-of-file, so that a request too slow
  // to arrive is answered 408 (read_failed) before the connection closes. A cancel alone is not
  // enough: async_read_header is many reads, and a deadline that falls between two of them (a
  // header line just read, its handler queued on the strand) cancels nothing. Beast's own
  // stream timeout would close the socket, with no 408. A deadline re-armed after its timer
  // fired but before its handler ran is recognised by its generation.
  void arm_deadline(double seconds);
  void read_head();
  void on_head(beast::error_code ec);
  void read_body();
  void on_body(beast::error_code ec);
  void read_failed(beast::error_code ec);

  // The transport's own refusals: the handler words the body; the connection closes after it.
  void refuse(int status, const std::string& message);

  // After refusing a request whose body was not read: stop sending, read and drop what the
  // client still sends for a moment (so that it reads the refusal, not a reset), then close.
  void linger();
  void linger_read();

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

}  // namespace lily::server
