// Copyright 2026 The ckptd Authors.
//
// The HTTP endpoint (daemon/metrics/http_server.h) under hostile clients, over real
// TCP on 127.0.0.1 port 0: slow (slowloris) and silent connections must not
// delay /healthz (a Kubernetes liveness probe: 1 s per answer), the
// connection table stays bounded, oversized or timed-out requests are
// closed, and Stop() is prompt. Raw sockets throughout: each probe's time
// is measured from connect() to the end of its answer.
//
// (metrics_test covers the endpoints' answers with httplib's client.)

#include "daemon/metrics/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// The requirement: a liveness probe is answered within this.
constexpr absl::Duration kProbeBudget = absl::Seconds(1);

// Long enough that the server never closes a test's slow clients on its own
// while the test runs: what is measured is that they do not get in the way.
void NeverTimeOut(HttpServerOptions& o) {
  o.request_timeout = absl::Seconds(60);
  o.idle_timeout = absl::Seconds(60);
}

// A blocking TCP connection to 127.0.0.1:port; -1 on failure.
int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

// Reads until the peer closes (true) or `deadline` passes / an error other
// than a reset (false); what arrived is appended to *out.
bool ReadUntilClosed(int fd, absl::Time deadline, std::string* out) {
  char buf[4096];
  while (true) {
    // (Polls at least once, also when the deadline has passed.)
    const absl::Duration left =
        std::max(deadline - absl::Now(), absl::ZeroDuration());
    pollfd p{fd, POLLIN, 0};
    const int r = ::poll(&p, 1,
                         static_cast<int>(absl::ToInt64Milliseconds(
                             absl::Ceil(left, absl::Milliseconds(1)))));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return false;
    if (r == 0) {
      if (absl::Now() >= deadline) return false;
      continue;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      return errno == ECONNRESET;
    }
    out->append(buf, static_cast<size_t>(n));
  }
}

// The status code of a raw HTTP answer ("HTTP/1.1 200 OK..."); -1 if none.
int StatusOf(const std::string& raw) {
  int code = -1;
  if (raw.size() < 12 || raw.compare(0, 5, "HTTP/") != 0) return -1;
  if (!absl::SimpleAtoi(raw.substr(9, 3), &code)) return -1;
  return code;
}

std::string BodyOf(const std::string& raw) {
  const size_t end = raw.find("\r\n\r\n");
  return end == std::string::npos ? "" : raw.substr(end + 4);
}

struct Reply {
  int status = -1;      // -1: no answer in time
  std::string raw;      // status line, headers and body
  absl::Duration took;  // connect() to the close after the answer
};

// One request on a fresh connection that asks to be closed after the
// answer (as kubelet's probes do), with `budget` for all of it.
Reply Exchange(int port, std::string_view request,
               absl::Duration budget = kProbeBudget) {
  Reply reply;
  const absl::Time start = absl::Now();
  const int fd = Connect(port);
  if (fd >= 0) {
    if (SendAll(fd, request) &&
        ReadUntilClosed(fd, start + budget, &reply.raw)) {
      reply.status = StatusOf(reply.raw);
    }
    ::close(fd);
  }
  reply.took = absl::Now() - start;
  return reply;
}

constexpr std::string_view kProbe =
    "GET /healthz HTTP/1.1\r\nHost: 10.0.0.1:9464\r\n"
    "User-Agent: kube-probe/1.29\r\nAccept: */*\r\nConnection: close\r\n\r\n";

// Sends `probes` sequential /healthz probes; each must be 200 within the
// probe budget. Returns the slowest.
absl::Duration ProbeHealth(int port, int probes) {
  absl::Duration slowest;
  for (int i = 0; i < probes; ++i) {
    const Reply r = Exchange(port, kProbe);
    EXPECT_EQ(r.status, 200)
        << "probe " << i << " after " << r.took << ": " << r.raw;
    EXPECT_LT(r.took, kProbeBudget) << "probe " << i;
    slowest = std::max(slowest, r.took);
  }
  return slowest;
}

// Connections that send a request head one byte per `interval`, from one
// thread, and never finish it (slowloris), plus silent ones.
class SlowClients {
 public:
  SlowClients(int port, int slow, int silent,
              absl::Duration interval = absl::Milliseconds(200))
      : interval_(interval) {
    for (int i = 0; i < slow + silent; ++i) {
      const int fd = Connect(port);
      EXPECT_GE(fd, 0) << "connection " << i << ": " << std::strerror(errno);
      if (fd < 0) continue;
      (i < slow ? slow_ : silent_).push_back(fd);
    }
    thread_ = std::thread([this] { Feed(); });
  }
  ~SlowClients() {
    StopFeeding();
    for (int fd : slow_) ::close(fd);
    for (int fd : silent_) ::close(fd);
  }

  void StopFeeding() {
    if (!thread_.joinable()) return;
    stop_.Notify();
    thread_.join();
  }

  std::vector<int> all() const {
    std::vector<int> fds = slow_;
    fds.insert(fds.end(), silent_.begin(), silent_.end());
    return fds;
  }

 private:
  void Feed() {
    const std::string head =
        "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + std::string(4096, 'a');
    size_t next = 0;
    while (!stop_.WaitForNotificationWithTimeout(interval_)) {
      for (int fd : slow_) {
        (void)::send(fd, &head[next % head.size()], 1, MSG_NOSIGNAL);
      }
      ++next;
    }
  }

  const absl::Duration interval_;
  std::vector<int> slow_;
  std::vector<int> silent_;
  absl::Notification stop_;
  std::thread thread_;
};

// True if the server has closed (FIN or reset) the connection `fd`, waiting
// up to `wait` for it; bytes it sent are discarded.
bool ClosedByServer(int fd, absl::Duration wait) {
  std::string ignored;
  return ReadUntilClosed(fd, absl::Now() + wait, &ignored);
}

int CountClosed(const std::vector<int>& fds) {
  int closed = 0;
  for (int fd : fds) closed += ClosedByServer(fd, absl::ZeroDuration()) ? 1 : 0;
  return closed;
}

HttpServerOptions Loopback() {
  HttpServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics = [] { return std::string("# TYPE x gauge\nx 1\n"); };
  return o;
}

// ---------------------------------------------------------------------------

TEST(HttpServerSlowClientsTest, HealthzAnswersWithin1sWhileSlowClientsAreOpen) {
  HttpServerOptions o = Loopback();
  NeverTimeOut(o);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HttpServer> server,
                       HttpServer::Create(o));
  // 48 slowloris connections (a byte per 200 ms) and 16 silent ones.
  SlowClients slow(server->port(), 48, 16);
  ASSERT_EQ(slow.all().size(), 64u);
  absl::SleepFor(absl::Milliseconds(300));  // the slow ones have started
  const absl::Duration slowest = ProbeHealth(server->port(), 20);
  std::cout << "slowest of 20 /healthz probes with 64 slow connections open: "
            << slowest << "\n";
  // And the server did not get there by dropping the slow clients.
  EXPECT_EQ(CountClosed(slow.all()), 0);
  // /metrics too.
  const Reply m = Exchange(
      server->port(), "GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(m.status, 200) << m.raw;
  EXPECT_EQ(BodyOf(m.raw), "# TYPE x gauge\nx 1\n");
}

TEST(HttpServerSlowClientsTest, MoreConnectionsThanTheTable) {
  HttpServerOptions o = Loopback();
  NeverTimeOut(o);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HttpServer> server,
                       HttpServer::Create(o));
  SlowClients silent(server->port(), 0, 300);
  ASSERT_EQ(silent.all().size(), 300u);
  ProbeHealth(server->port(), 20);
  // The table holds at most 256: the oldest waiting connections made room
  // (at least 44 of the 300), closed by the time the first probe was
  // answered (they were accepted before it); the newest stay open.
  const std::vector<int> fds = silent.all();
  int closed = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while ((closed = CountClosed(fds)) < 300 - 256 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_GE(closed, 300 - 256);
  EXPECT_EQ(CountClosed({fds.begin() + 50, fds.end()}), 0);
}

TEST(HttpServerSlowClientsTest, StopIsPromptWithSlowClientsOpen) {
  HttpServerOptions o = Loopback();
  NeverTimeOut(o);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HttpServer> server,
                       HttpServer::Create(o));
  const int port = server->port();
  SlowClients slow(port, 16, 16);
  // One keep-alive connection half-way through its second request.
  const int half = Connect(port);
  ASSERT_GE(half, 0);
  ASSERT_TRUE(SendAll(half, "GET /healthz HTTP/1.1\r\n\r\nGET /heal"));
  // Answered after all the slow ones were accepted (one queue).
  EXPECT_EQ(Exchange(port, kProbe).status, 200);
  absl::SleepFor(absl::Milliseconds(300));  // the slow ones have started

  const absl::Time start = absl::Now();
  server->Stop();
  const absl::Duration took = absl::Now() - start;
  std::cout << "Stop() with 33 slow connections open took " << took << "\n";
  EXPECT_LT(took, absl::Seconds(1));
  server->Stop();  // idempotent
  // Every connection is closed, and nothing listens any more.
  slow.StopFeeding();
  for (int fd : slow.all()) {
    EXPECT_TRUE(ClosedByServer(fd, absl::Seconds(5)));
  }
  std::string got;
  EXPECT_TRUE(ReadUntilClosed(half, absl::Now() + absl::Seconds(5), &got));
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200"));
  ::close(half);
  EXPECT_EQ(Connect(port), -1);
}

TEST(HttpServerSlowClientsTest, HeadTooLargeIs431AndClosed) {
  HttpServerOptions o = Loopback();
  o.max_request_head_bytes = 1024;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HttpServer> server,
                       HttpServer::Create(o));
  // A head over the limit, complete or not.
  for (const std::string& request :
       {"GET /healthz HTTP/1.1\r\nX-Big: " + std::string(2000, 'a') +
            "\r\n\r\n",
        "GET /healthz HTTP/1.1\r\nX-Big: " + std::string(5000, 'a')}) {
    const Reply r = Exchange(server->port(), request, absl::Seconds(5));
    EXPECT_EQ(r.status, 431) << r.raw;
    EXPECT_THAT(r.raw, HasSubstr("Connection: close\r\n"));
  }
  // Just under the limit is fine.
  std::string fits = "GET /healthz HTTP/1.1\r\nConnection: close\r\nX-Pad: ";
  fits += std::string(1024 - fits.size() - 4, 'a') + "\r\n\r\n";
  ASSERT_EQ(fits.size(), 1024u);
  EXPECT_EQ(Exchange(server->port(), fits).status, 200);
}

TEST(HttpServerSlowClientsTest, IdleAndSlowConnectionsAreClosed) {
  HttpServerOptions o = Loopback();
  o.idle_timeout = absl::Milliseconds(300);
  o.request_timeout = absl::Milliseconds(600);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HttpServer> server,
                       HttpServer::Create(o));
  // (The server cannot close a connection before it accepts it, after the
  // client's connect(): the lower bounds are exact.)
  absl::Time start = absl::Now();
  const int silent = Connect(server->port());
  ASSERT_GE(silent, 0);
  EXPECT_TRUE(ClosedByServer(silent, absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, o.idle_timeout);
  ::close(silent);

  // Kept alive after an answer, then idle.
  const int kept = Connect(server->port());
  ASSERT_GE(kept, 0);
  start = absl::Now();  // (before the server can have answered)
  ASSERT_TRUE(SendAll(kept, "GET /healthz HTTP/1.1\r\n\r\n"));
  std::string got;
  EXPECT_TRUE(ReadUntilClosed(kept, absl::Now() + absl::Seconds(10), &got));
  EXPECT_GE(absl::Now() - start, o.idle_timeout);
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(got, HasSubstr("Connection: keep-alive\r\n"));
  ::close(kept);

  // Slowloris: a byte every 50 ms keeps it busy but its head never
  // completes; closed request_timeout after the first byte.
  SlowClients slow(server->port(), 1, 0, absl::Milliseconds(50));
  start = absl::Now();
  EXPECT_TRUE(ClosedByServer(slow.all()[0], absl::Seconds(10)));
  EXPECT_GE(absl::Now() - start, o.request_timeout - absl::Milliseconds(300));
}

// Reads one answer with a Content-Length body from a kept-alive connection.
std::string ReadAnswer(int fd, bool head_only = false) {
  std::string got;
  char c;
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  size_t want = std::string::npos;
  while (got.size() != want && absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    if (::recv(fd, &c, 1, 0) != 1) break;
    got += c;
    const size_t end = got.find("\r\n\r\n");
    if (want == std::string::npos && end != std::string::npos) {
      const size_t cl = got.find("Content-Length: ");
      size_t length = 0;
      if (cl != std::string::npos) {
        length = std::stoul(got.substr(cl + 16));
      }
      want = end + 4 + (head_only ? 0 : length);
    }
  }
  return got;
}

TEST(HttpServerProtocolTest, Answers) {
  HttpServerOptions o = Loopback();
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HttpServer> server,
                       HttpServer::Create(o));
  const int port = server->port();
  // Pipelined on one keep-alive connection, HEAD among them.
  const int fd = Connect(port);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd,
                      "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                      "\r\nHEAD /metrics HTTP/1.1\n\n"
                      "GET /metrics?x=1 HTTP/1.1\r\n\r\n"));
  std::string a = ReadAnswer(fd);
  EXPECT_THAT(a, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_EQ(BodyOf(a), "ok\n");
  a = ReadAnswer(fd, /*head_only=*/true);
  EXPECT_THAT(a, StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(
      a, HasSubstr("Content-Type: text/plain; version=0.0.4; charset=utf-8"));
  EXPECT_THAT(a, HasSubstr("Content-Length: 19\r\n"));
  EXPECT_EQ(BodyOf(a), "");
  a = ReadAnswer(fd);
  EXPECT_EQ(BodyOf(a), "# TYPE x gauge\nx 1\n");
  ::close(fd);

  struct Case {
    std::string request;
    int status;
    std::string has;
  };
  for (const Case& c : std::vector<Case>{
           {"GET /healthz HTTP/1.0\r\n\r\n", 200, "Connection: close"},
           {"GET http://h:1/healthz HTTP/1.1\r\nConnection: close\r\n\r\n", 200,
            "ok"},
           {"GET /nope HTTP/1.1\r\nConnection: close\r\n\r\n", 404,
            "not found"},
           {"POST /metrics HTTP/1.1\r\nContent-Length: 1\r\n\r\nx", 405,
            "Allow: GET, HEAD"},
           {"DELETE /healthz HTTP/1.1\r\nConnection: close\r\n\r\n", 405,
            "method not allowed"},
           {"GET /healthz HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", 413,
            "Connection: close"},
           {"GET /healthz HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
            413, "Connection: close"},
           {"GET /healthz\r\n\r\n", 400, "bad request"},
           {"GET /healthz HTTP/1.1\r\nno colon\r\n\r\n", 400, "bad request"},
           {"GET /healthz HTTP/2.0\r\n\r\n", 505, "Connection: close"},
       }) {
    const Reply r = Exchange(port, c.request, absl::Seconds(5));
    EXPECT_EQ(r.status, c.status) << c.request << " → " << r.raw;
    EXPECT_THAT(r.raw, HasSubstr(c.has)) << c.request;
  }
}

TEST(HttpServerProtocolTest, Ipv6Loopback) {
  HttpServerOptions o = Loopback();
  o.listen = "[::1]:0";
  absl::StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::Create(o);
  if (!server.ok()) GTEST_SKIP() << "no IPv6 loopback: " << server.status();
  EXPECT_EQ((*server)->host(), "::1");
  const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in6 addr{};
  addr.sin6_family = AF_INET6;
  addr.sin6_port = htons(static_cast<uint16_t>((*server)->port()));
  addr.sin6_addr = in6addr_loopback;
  ASSERT_EQ(
      ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_TRUE(SendAll(fd, kProbe));
  std::string got;
  EXPECT_TRUE(ReadUntilClosed(fd, absl::Now() + absl::Seconds(5), &got));
  EXPECT_THAT(got, StartsWith("HTTP/1.1 200 OK\r\n"));
  ::close(fd);
}

TEST(HttpServerProtocolTest, BadOptions) {
  HttpServerOptions o = Loopback();
  o.max_connections = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(HttpServer::Create(o).status()));
  o = Loopback();
  o.request_timeout = absl::ZeroDuration();
  EXPECT_TRUE(absl::IsInvalidArgument(HttpServer::Create(o).status()));
}

}  // namespace
}  // namespace ckptd::daemon
