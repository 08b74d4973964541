// The HTTP transport's read deadlines on raw sockets, with deadlines short enough to test many
// times over: a request that does not arrive within read_timeout of its first byte is answered
// 408 however its bytes trickle in (regression: when the deadline fell while a header line was
// being read, the cancel found no read pending and the request was never cut, so a client that
// kept sending header lines kept its connection; the soak's slow clients hit it under ASan); a
// request that arrives in time is answered and its connection kept for the next one.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server/http_transport.h"

namespace lily::server {
namespace {

using Clock = std::chrono::steady_clock;

class EchoHandler final : public RequestHandler {
 public:
  std::optional<HttpResponse> check_head(const HttpRequest&) override { return std::nullopt; }
  void handle(std::shared_ptr<Exchange> exchange) override {
    ++handled;
    HttpResponse r;
    r.set_content("path " + exchange->request().path, "text/plain");
    exchange->respond(std::move(r));
  }
  HttpResponse transport_error(int status, const std::string& message) override {
    HttpResponse r;
    r.status = status;
    r.set_content(message, "text/plain");
    return r;
  }
  std::atomic<int> handled{0};
};

// An HttpTransport on a free port of 127.0.0.1 with the EchoHandler, stopped when it goes.
struct EchoServer {
  EchoServer(const TransportLimits& limits, int threads) : transport("127.0.0.1", 0, limits, handler) {
    transport.start(threads);
  }
  ~EchoServer() { transport.stop(); }
  int port() const { return transport.port(); }
  EchoHandler handler;
  HttpTransport transport;
};

int connect_to(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port;
  }
  return fd;
}

// What a client read before the server closed or `limit` passed.
struct Reply {
  std::string data;
  bool closed = false;
  double seconds = 0;
};

// Sends `first`, then `line` every `every` until the server answers (or closes, or `limit`),
// then reads until it closes or `limit`.
Reply trickle(int port, const std::string& first, const std::string& line, std::chrono::microseconds every,
              std::chrono::milliseconds limit) {
  Reply r;
  const int fd = connect_to(port);
  const auto t0 = Clock::now();
  (void)!send(fd, first.data(), first.size(), MSG_NOSIGNAL);
  auto next = t0 + every;
  while (Clock::now() - t0 < limit) {
    pollfd p{fd, POLLIN, 0};
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now());
    if (poll(&p, 1, int(std::max<int64_t>(0, wait.count()))) > 0) {
      char buffer[4096];
      const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) {
        r.closed = true;
        break;
      }
      r.data.append(buffer, size_t(n));
    }
    if (r.data.empty() && Clock::now() >= next && !line.empty()) {
      (void)!send(fd, line.data(), line.size(), MSG_NOSIGNAL);
      next += every;
    }
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  close(fd);
  return r;
}

std::string status_line(const std::string& data) { return data.substr(0, data.find("\r\n")); }

TEST(HttpTransport, EveryTrickledRequestIsCutAtItsDeadlineWith408) {
  TransportLimits limits;
  limits.read_timeout = 0.2;
  limits.max_header_bytes = 4 << 20;  // the header limit must not be what ends the request
  EchoServer server(limits, 2);
  // Header lines every 100-400 us from 24 clients at once: the deadline falls while a line is
  // being read, again and again.
  constexpr int kClients = 24;
  std::vector<Reply> replies(kClients);
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      replies[size_t(c)] = trickle(server.port(), "GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n", "X-Slow: 1\r\n",
                                   std::chrono::microseconds(100 + 100 * (c % 4)), std::chrono::seconds(4));
    });
  }
  for (auto& t : clients) t.join();
  for (int c = 0; c < kClients; ++c) {
    const Reply& r = replies[size_t(c)];
    EXPECT_EQ(status_line(r.data), "HTTP/1.1 408 Request Timeout") << "client " << c << " after " << r.seconds << " s";
    EXPECT_TRUE(r.closed) << "client " << c;
    EXPECT_LT(r.seconds, 2.0) << "client " << c;
    EXPECT_NE(r.data.find("within 0.2 s of its first byte"), std::string::npos) << r.data;
  }
  EXPECT_EQ(server.handler.handled, 0);
}

TEST(HttpTransport, ARequestInTimeIsAnsweredAndItsConnectionKept) {
  TransportLimits limits;
  limits.read_timeout = 0.3;
  limits.idle_timeout = 2;
  EchoServer server(limits, 2);
  const int fd = connect_to(server.port());
  for (int i = 0; i < 3; ++i) {
    // The request in two parts, 100 ms apart: within its deadline.
    const std::string head = "GET /r" + std::to_string(i) + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    ASSERT_EQ(send(fd, head.data(), head.size(), MSG_NOSIGNAL), ssize_t(head.size()));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(send(fd, "\r\n", 2, MSG_NOSIGNAL), 2);
    std::string data;
    const std::string body = "path /r" + std::to_string(i);
    const auto t0 = Clock::now();
    while (data.find(body) == std::string::npos && Clock::now() - t0 < std::chrono::seconds(3)) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char buffer[4096];
      const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
      ASSERT_GT(n, 0) << "the server closed the connection after " << i << " requests: " << data;
      data.append(buffer, size_t(n));
    }
    EXPECT_EQ(status_line(data), "HTTP/1.1 200 OK");
    EXPECT_NE(data.find(body), std::string::npos) << data;
    // Longer than the read deadline between requests: the connection waits (idle_timeout).
    std::this_thread::sleep_for(std::chrono::milliseconds(400));
  }
  close(fd);
  EXPECT_EQ(server.handler.handled, 3);
}

TEST(HttpTransport, AnIdleConnectionIsClosedWithoutAResponse) {
  TransportLimits limits;
  limits.idle_timeout = 0.2;
  EchoServer server(limits, 1);
  const Reply r = trickle(server.port(), "", "", std::chrono::seconds(10), std::chrono::seconds(3));
  EXPECT_TRUE(r.closed);
  EXPECT_EQ(r.data, "");
  EXPECT_LT(r.seconds, 2.0);
}

}  // namespace
}  // namespace lily::server
