// Copyright 2026 The ckptd Authors.
//
// One thread runs an epoll loop over the listening socket, an eventfd that
// Stop() writes, and the connections (level-triggered, non-blocking). A
// connection is in one of three states:
//   kRequest   reading a request head (EPOLLIN). Deadline: idle_timeout
//              after it began waiting while nothing has arrived, else
//              request_timeout after the head's first byte.
//   kWriting   its answer is being sent (EPOLLOUT). Deadline: write_timeout.
//   kDraining  answered with "Connection: close": our side is shut down and
//              what the client still sends is read and dropped until it
//              closes (closing with unread input would reset the connection
//              and could destroy the answer in flight). Deadline:
//              idle_timeout, and at most kMaxDrainBytes.
// Epoll events carry a connection id, never the fd, so that an event for a
// connection closed earlier in the same batch cannot reach a new connection
// that reused its fd.

#include "daemon/metrics/http_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

absl::StatusOr<std::pair<std::string, int>> ParseListenAddress(
    const std::string& listen) {
  const size_t colon = listen.rfind(':');
  auto bad = [&] {
    return absl::InvalidArgumentError(fmt::format(
        "http_listen '{}': expected host:port (port 0-65535)", listen));
  };
  if (colon == std::string::npos) return bad();
  std::string host = listen.substr(0, colon);
  const std::string port_text = listen.substr(colon + 1);
  int port = -1;
  const char* end = port_text.data() + port_text.size();
  auto [ptr, ec] = std::from_chars(port_text.data(), end, port);
  if (port_text.empty() || ec != std::errc() || ptr != end || port < 0 ||
      port > 65535) {
    return bad();
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [::1]:9464
  } else if (host.find(':') != std::string::npos) {
    return bad();  // a v6 address needs brackets
  }
  if (host.empty()) host = "0.0.0.0";
  return std::pair{host, port};
}

namespace {

using SteadyClock = std::chrono::steady_clock;

// Epoll ids of the two fds that are not connections.
constexpr uint64_t kListenId = 0;
constexpr uint64_t kWakeId = 1;
// Connections accepted per wake-up (then the others get their turn).
constexpr int kAcceptBatch = 64;
// After "too many open files" (or no memory), accepting pauses this long.
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
// A closing connection's input dropped at most.
constexpr size_t kMaxDrainBytes = 64 << 10;

enum class ConnState { kRequest, kWriting, kDraining };

struct Conn {
  uint64_t id = 0;  // the epoll data
  int fd = -1;      // -1: closed, to be erased
  ConnState state = ConnState::kRequest;
  uint32_t events = 0;  // registered with epoll
  // When the current state began (for kRequest: waiting for a request).
  SteadyClock::time_point since;
  // The first byte of the head in `in` (kRequest, `in` not empty).
  SteadyClock::time_point head_start;
  std::string in;  // the head being read (+ pipelined bytes after it)
  std::string out;
  size_t out_done = 0;
  bool close_after = false;
  size_t drained = 0;
};

// A parsed request head.
struct Request {
  std::string method;
  std::string path;
  bool keep_alive = false;
  bool has_body = false;
};

struct Answer {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  bool allow = false;  // "Allow: GET, HEAD" (405)
};

const char* Reason(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Error";
  }
}

Answer Error(int status) {
  Answer a;
  a.status = status;
  a.body =
      fmt::format("{} {}\n", status, absl::AsciiStrToLower(Reason(status)));
  return a;
}

absl::string_view TrimOws(absl::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    if (c <= ' ' || c >= 0x7f || std::strchr("\"(),/:;<=>?@[\\]{}", c)) {
      return false;
    }
  }
  return true;
}

// The end of the head at the start of `in` (one past its empty line), or
// npos if it has not all arrived. Lines may end in CRLF or LF.
size_t HeadEnd(absl::string_view in) {
  for (size_t i = in.find('\n'); i != absl::string_view::npos;
       i = in.find('\n', i + 1)) {
    if (i + 1 < in.size() && in[i + 1] == '\n') return i + 2;
    if (i + 2 < in.size() && in[i + 1] == '\r' && in[i + 2] == '\n') {
      return i + 3;
    }
  }
  return absl::string_view::npos;
}

// Parses a complete head; an error answer (400, 505) if malformed.
std::variant<Request, Answer> ParseHead(absl::string_view head) {
  std::vector<absl::string_view> lines = absl::StrSplit(head, '\n');
  for (absl::string_view& l : lines) absl::ConsumeSuffix(&l, "\r");
  // The request line: METHOD SP target SP HTTP/1.x
  const std::vector<absl::string_view> parts = absl::StrSplit(lines[0], ' ');
  if (parts.size() != 3 || !IsToken(parts[0]) || parts[1].empty() ||
      !absl::StartsWith(parts[2], "HTTP/")) {
    return Error(400);
  }
  Request r;
  r.method = std::string(parts[0]);
  int minor;
  if (parts[2] == "HTTP/1.1") {
    minor = 1;
  } else if (parts[2] == "HTTP/1.0") {
    minor = 0;
  } else {
    return Error(505);
  }
  absl::string_view target = parts[1];
  // Absolute form (http://host/path) → the path.
  for (absl::string_view scheme : {"http://", "https://"}) {
    if (absl::StartsWithIgnoreCase(target, scheme)) {
      target.remove_prefix(scheme.size());
      const size_t slash = target.find('/');
      target = slash == absl::string_view::npos ? "/" : target.substr(slash);
    }
  }
  r.path = std::string(target.substr(0, target.find_first_of("?#")));
  bool close = false;
  bool keep_alive = false;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = lines[i];
    if (line.empty()) break;  // the end of the head
    const size_t colon = line.find(':');
    // (A line folded onto the previous one starts with whitespace: not a
    // token, rejected like other malformed lines.)
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return Error(400);
    }
    const absl::string_view name = line.substr(0, colon);
    const absl::string_view value = TrimOws(line.substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "Connection")) {
      for (absl::string_view option : absl::StrSplit(value, ',')) {
        option = TrimOws(option);
        close |= absl::EqualsIgnoreCase(option, "close");
        keep_alive |= absl::EqualsIgnoreCase(option, "keep-alive");
      }
    } else if (absl::EqualsIgnoreCase(name, "Content-Length")) {
      uint64_t length = 0;
      auto [ptr, ec] =
          std::from_chars(value.data(), value.data() + value.size(), length);
      if (value.empty() || ec != std::errc() ||
          ptr != value.data() + value.size()) {
        return Error(400);
      }
      r.has_body |= length > 0;
    } else if (absl::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      r.has_body = true;
    }
  }
  r.keep_alive = minor == 1 ? !close : keep_alive && !close;
  return r;
}

// A timeout as a steady-clock duration; at most a year (an infinite one
// must not overflow a deadline).
SteadyClock::duration ToClock(absl::Duration d) {
  return std::chrono::duration_cast<SteadyClock::duration>(
      absl::ToChronoNanoseconds(std::min(d, absl::Hours(24 * 365))));
}

}  // namespace

class HttpServer::Impl {
 public:
  explicit Impl(HttpServerOptions options)
      : options_(std::move(options)),
        request_timeout_(ToClock(options_.request_timeout)),
        idle_timeout_(ToClock(options_.idle_timeout)),
        write_timeout_(ToClock(options_.write_timeout)) {}
  ~Impl() { Stop(); }

  absl::Status Start(const std::string& host, int port);
  void Stop();

  // Constant after Start().
  HttpServerOptions options_;
  std::string host_;
  int port_ = 0;

 private:
  absl::Status Listen(const std::string& host, int port);
  void Run();
  void Accept(SteadyClock::time_point now);
  void OnEvent(Conn& c, uint32_t events, SteadyClock::time_point now);
  void OnReadable(Conn& c, SteadyClock::time_point now);
  // Answers the complete heads in c.in, in order, while the answers go out
  // at once.
  void Serve(Conn& c, SteadyClock::time_point now);
  Answer Handle(const Request& r);
  void Respond(Conn& c, const Answer& a, bool head_only, bool close,
               SteadyClock::time_point now);
  // Sends what it can of c.out; once all is sent, the connection waits for
  // its next request or drains.
  void Flush(Conn& c, SteadyClock::time_point now);
  void Watch(Conn& c, uint32_t events);
  void Close(Conn& c);
  SteadyClock::time_point Deadline(const Conn& c) const;
  // Closes the connections past their deadline; the time until the next
  // deadline, for epoll_wait (-1: none).
  int Expire(SteadyClock::time_point now);
  void EraseClosed();

  const SteadyClock::duration request_timeout_;
  const SteadyClock::duration idle_timeout_;
  const SteadyClock::duration write_timeout_;

  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;

  // Owned by the server thread (Stop() only after joining it).
  std::unordered_map<uint64_t, Conn> conns_;
  uint64_t next_id_ = kWakeId + 1;
  bool accepting_ = true;
  SteadyClock::time_point accept_resume_;
  bool accept_error_logged_ = false;

  absl::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

absl::Status HttpServer::Impl::Listen(const std::string& host, int port) {
  auto cannot = [&](const char* why) {
    return absl::UnavailableError(
        fmt::format("http_listen {}:{}: cannot listen ({})", host, port, why));
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc =
          ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return cannot(::gai_strerror(rc));
  }
  int error = 0;
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                 ai->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    // SO_REUSEADDR (restarts while old connections linger in TIME_WAIT), not
    // SO_REUSEPORT: a second daemon must not bind the same port silently.
    const int yes = 1;
    const int no = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (ai->ai_family == AF_INET6) {  // "[::]:p" takes IPv4 too
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
    }
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        ::listen(fd, SOMAXCONN) != 0) {
      error = errno;
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
    break;
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) return cannot(std::strerror(error));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) !=
      0) {
    return cannot(std::strerror(errno));
  }
  port_ = ntohs(bound.ss_family == AF_INET6
                    ? reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port
                    : reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  return absl::OkStatus();
}

absl::Status HttpServer::Impl::Start(const std::string& host, int port) {
  host_ = host;
  if (absl::Status s = Listen(host, port); !s.ok()) return s;
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) {
    return absl::InternalError(
        fmt::format("http server: epoll/eventfd: {}", std::strerror(errno)));
  }
  for (const auto& [fd, id] :
       {std::pair{listen_fd_, kListenId}, std::pair{wake_fd_, kWakeId}}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return absl::InternalError(
          fmt::format("http server: epoll_ctl: {}", std::strerror(errno)));
    }
  }
  // std::thread reports failure (resources) only by throwing.
  try {
    thread_ = std::thread([this] { Run(); });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        fmt::format("http server: cannot start its thread: {}", e.what()));
  }
  return absl::OkStatus();
}

void HttpServer::Impl::Stop() {
  absl::MutexLock l(&stop_mu_);
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    const uint64_t one = 1;
    while (::write(wake_fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (auto& [id, c] : conns_) Close(c);
  conns_.clear();
  for (int* fd : {&listen_fd_, &epoll_fd_, &wake_fd_}) {
    if (*fd >= 0) ::close(*fd);
    *fd = -1;
  }
}

void HttpServer::Impl::Run() {
  std::vector<epoll_event> events(64);
  int timeout_ms = -1;
  while (true) {
    const int n = ::epoll_wait(epoll_fd_, events.data(),
                               static_cast<int>(events.size()), timeout_ms);
    if (n < 0 && errno != EINTR) {
      spdlog::error("http server: epoll_wait: {}; the endpoint stops",
                    std::strerror(errno));
      return;
    }
    const SteadyClock::time_point now = SteadyClock::now();
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kWakeId) return;  // Stop() closes the connections
      if (id == kListenId) {
        Accept(now);
        continue;
      }
      auto it = conns_.find(id);
      if (it == conns_.end() || it->second.fd < 0) continue;  // closed
      OnEvent(it->second, events[i].events, now);
    }
    EraseClosed();
    timeout_ms = Expire(SteadyClock::now());
  }
}

void HttpServer::Impl::Accept(SteadyClock::time_point now) {
  for (int i = 0; i < kAcceptBatch; ++i) {
    const int fd =
        ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        // The listener stays readable: stop watching it for a while rather
        // than spin.
        if (!accept_error_logged_) {
          spdlog::warn("http server: accept: {}; pausing",
                       std::strerror(errno));
          accept_error_logged_ = true;
        }
        epoll_event ev{};
        ev.data.u64 = kListenId;
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
        accepting_ = false;
        accept_resume_ = now + kAcceptPause;
      }
      return;  // EAGAIN: all taken
    }
    accept_error_logged_ = false;
    EraseClosed();
    if (conns_.size() >= static_cast<size_t>(options_.max_connections)) {
      // Make room: a closing connection, else the one that has waited
      // longest for a request (slow, silent or idle; the first accepted of
      // those that began waiting at the same time), else the oldest writing
      // one.
      auto order = [](const Conn& c) {
        const int rank = c.state == ConnState::kDraining  ? 0
                         : c.state == ConnState::kRequest ? 1
                                                          : 2;
        return std::tuple(rank, c.since, c.id);
      };
      auto victim = std::min_element(conns_.begin(), conns_.end(),
                                     [&](const auto& a, const auto& b) {
                                       return order(a.second) < order(b.second);
                                     });
      Close(victim->second);
      conns_.erase(victim);
    }
    const uint64_t id = next_id_++;
    Conn& c = conns_[id];
    c.id = id;
    c.fd = fd;
    c.since = now;
    c.events = EPOLLIN;
    epoll_event ev{};
    ev.events = c.events;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      Close(c);
      conns_.erase(id);
    }
  }
}

void HttpServer::Impl::OnEvent(Conn& c, uint32_t events,
                               SteadyClock::time_point now) {
  if (events & (EPOLLERR | EPOLLHUP)) {
    Close(c);
    return;
  }
  if (c.state == ConnState::kWriting) {
    if (events & EPOLLOUT) {
      Flush(c, now);
      if (c.fd >= 0 && c.state == ConnState::kRequest) Serve(c, now);
    }
    return;
  }
  if (events & EPOLLIN) OnReadable(c, now);
}

void HttpServer::Impl::OnReadable(Conn& c, SteadyClock::time_point now) {
  char buf[16 << 10];
  size_t want = sizeof(buf);
  if (c.state == ConnState::kRequest) {
    // A head in progress never holds more than max_request_head_bytes + 1
    // bytes: one more than allowed tells that it is too long.
    want = std::min(want, static_cast<size_t>(options_.max_request_head_bytes) +
                              1 - c.in.size());
  }
  const ssize_t n = ::recv(c.fd, buf, want, 0);
  if (n < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) Close(c);
    return;
  }
  if (n == 0) {  // the client is gone (or done)
    Close(c);
    return;
  }
  if (c.state == ConnState::kDraining) {
    c.drained += static_cast<size_t>(n);
    if (c.drained > kMaxDrainBytes) Close(c);
    return;
  }
  if (c.in.empty()) c.head_start = now;
  c.in.append(buf, static_cast<size_t>(n));
  Serve(c, now);
}

void HttpServer::Impl::Serve(Conn& c, SteadyClock::time_point now) {
  const size_t max_head = static_cast<size_t>(options_.max_request_head_bytes);
  while (c.fd >= 0 && c.state == ConnState::kRequest) {
    // Empty lines before a request line are ignored (RFC 9112 2.2).
    const size_t start = c.in.find_first_not_of("\r\n");
    c.in.erase(0, start == std::string::npos ? c.in.size() : start);
    if (c.in.empty()) return;
    const size_t end = HeadEnd(c.in);
    if (end == std::string::npos && c.in.size() <= max_head) return;  // more
    if (end == std::string::npos || end > max_head) {
      Respond(c, Error(431), /*head_only=*/false, /*close=*/true, now);
      return;
    }
    std::variant<Request, Answer> parsed =
        ParseHead(absl::string_view(c.in).substr(0, end));
    c.in.erase(0, end);
    if (Answer* bad = std::get_if<Answer>(&parsed)) {
      Respond(c, *bad, /*head_only=*/false, /*close=*/true, now);
      return;
    }
    const Request& r = std::get<Request>(parsed);
    // A body is never read: the connection cannot carry another request.
    Respond(c, Handle(r), r.method == "HEAD", !r.keep_alive || r.has_body, now);
  }
}

Answer HttpServer::Impl::Handle(const Request& r) {
  const bool known = r.path == "/metrics" || r.path == "/healthz";
  if (r.method != "GET" && r.method != "HEAD") {
    if (!known) return Error(404);
    Answer a = Error(405);
    a.allow = true;
    return a;
  }
  if (r.has_body) return Error(413);
  if (r.path == "/healthz") {
    const absl::Status s =
        options_.health ? options_.health() : absl::OkStatus();
    Answer a;
    if (s.ok()) {
      a.body = "ok\n";
    } else {
      a.status = 503;
      a.body = fmt::format("unhealthy: {}\n", std::string(s.message()));
    }
    return a;
  }
  if (r.path == "/metrics") {
    if (!options_.metrics) {
      Answer a = Error(404);
      a.body = "no metrics\n";
      return a;
    }
    Answer a;
    a.content_type = "text/plain; version=0.0.4; charset=utf-8";
    a.body = options_.metrics();
    return a;
  }
  return Error(404);
}

void HttpServer::Impl::Respond(Conn& c, const Answer& a, bool head_only,
                               bool close, SteadyClock::time_point now) {
  c.out = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n"
      "Connection: {}\r\n{}\r\n",
      a.status, Reason(a.status), a.content_type, a.body.size(),
      close ? "close" : "keep-alive", a.allow ? "Allow: GET, HEAD\r\n" : "");
  if (!head_only) c.out += a.body;
  c.out_done = 0;
  c.close_after = close;
  c.state = ConnState::kWriting;
  c.since = now;
  Flush(c, now);
}

void HttpServer::Impl::Flush(Conn& c, SteadyClock::time_point now) {
  while (c.out_done < c.out.size()) {
    const ssize_t n = ::send(c.fd, c.out.data() + c.out_done,
                             c.out.size() - c.out_done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        Watch(c, EPOLLOUT);
        return;
      }
      Close(c);
      return;
    }
    c.out_done += static_cast<size_t>(n);
  }
  c.out.clear();
  c.out.shrink_to_fit();
  c.since = now;
  Watch(c, EPOLLIN);
  if (c.close_after) {
    ::shutdown(c.fd, SHUT_WR);
    c.state = ConnState::kDraining;
    c.in.clear();
    c.in.shrink_to_fit();
    return;
  }
  c.state = ConnState::kRequest;
  if (!c.in.empty()) c.head_start = now;  // the next pipelined head
}

void HttpServer::Impl::Watch(Conn& c, uint32_t events) {
  if (c.events == events) return;
  c.events = events;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = c.id;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev) != 0) Close(c);
}

void HttpServer::Impl::Close(Conn& c) {
  if (c.fd < 0) return;
  ::close(c.fd);  // (also leaves the epoll set)
  c.fd = -1;
}

void HttpServer::Impl::EraseClosed() {
  std::erase_if(conns_, [](const auto& kv) { return kv.second.fd < 0; });
}

SteadyClock::time_point HttpServer::Impl::Deadline(const Conn& c) const {
  switch (c.state) {
    case ConnState::kRequest:
      return c.in.empty() ? c.since + idle_timeout_
                          : c.head_start + request_timeout_;
    case ConnState::kWriting:
      return c.since + write_timeout_;
    case ConnState::kDraining:
      return c.since + idle_timeout_;
  }
  return c.since;
}

int HttpServer::Impl::Expire(SteadyClock::time_point now) {
  SteadyClock::time_point next = SteadyClock::time_point::max();
  if (!accepting_) {
    if (now >= accept_resume_) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u64 = kListenId;
      ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
      accepting_ = true;
    } else {
      next = accept_resume_;
    }
  }
  for (auto it = conns_.begin(); it != conns_.end();) {
    const SteadyClock::time_point deadline = Deadline(it->second);
    if (deadline <= now) {
      Close(it->second);
      it = conns_.erase(it);
      continue;
    }
    next = std::min(next, deadline);
    ++it;
  }
  if (next == SteadyClock::time_point::max()) return -1;
  // Rounded up: waking before the deadline would only spin.
  const auto ms =
      std::chrono::ceil<std::chrono::milliseconds>(next - now).count();
  return static_cast<int>(std::min<int64_t>(ms, 60'000));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() { Stop(); }
void HttpServer::Stop() { impl_->Stop(); }
int HttpServer::port() const { return impl_->port_; }
const std::string& HttpServer::host() const { return impl_->host_; }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(
    HttpServerOptions options) {
  absl::StatusOr<std::pair<std::string, int>> addr =
      ParseListenAddress(options.listen);
  if (!addr.ok()) return addr.status();
  if (options.max_connections < 1 || options.max_request_head_bytes < 64 ||
      options.request_timeout <= absl::ZeroDuration() ||
      options.idle_timeout <= absl::ZeroDuration() ||
      options.write_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(fmt::format(
        "http server on {}: max_connections >= 1, max_request_head_bytes >= "
        "64 and positive timeouts needed",
        options.listen));
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status s = impl->Start(addr->first, addr->second); !s.ok()) {
    return s;
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

}  // namespace ckptd::daemon
