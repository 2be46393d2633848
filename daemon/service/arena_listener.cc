// Copyright 2026 The ckptd Authors.
#include "daemon/service/arena_listener.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "common/absl_fmt.h"
#include "common/env.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/service/socket_path.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

// Connections accepted per poll round (the rest wait in the backlog).
constexpr int kAcceptsPerRound = 64;

struct Connection {
  shm::OwnedFd sock;
  PeerCredentials peer;
  absl::Time deadline;
};

std::string Who(const PeerCredentials& p) {
  return fmt::format("pid {} uid {} gid {}", p.pid, p.uid, p.gid);
}

// Best effort: the reply is small and the connection fresh, so a
// non-blocking send fits its socket buffer; a client that made it not fit
// (it never reads) just loses its reply.
void SendReply(int sock, const absl::Status& status, uint64_t arena_id) {
  (void)shm::SendMessageWithFd(sock, shm::EncodeArenaReply(status, arena_id),
                               -1, MSG_DONTWAIT);
}

}  // namespace

struct ArenaListener::Impl {
  ArenaListenerOptions options;
  shm::OwnedFd listen_fd;
  shm::OwnedFd wake_fd;  // eventfd: the destructor's stop signal
  std::thread thread;
  std::atomic<int> open{0};
  // Only the listener thread touches these.
  std::vector<Connection> conns;
  absl::flat_hash_map<uint32_t, int> per_uid;

  void Run();
  void AcceptSome();
  // True when the connection is done (answered or gone).
  bool Serve(Connection& c);
  // A "CKB1" request: the group buffer of its token, or the error.
  void ServeBuffer(Connection& c, shm::ReceivedMessage msg);
  void Close(size_t i);
};

void ArenaListener::Impl::Close(size_t i) {
  Connection& c = conns[i];
  if (--per_uid[c.peer.uid] == 0) per_uid.erase(c.peer.uid);
  conns[i] = std::move(conns.back());
  conns.pop_back();
  open.store(static_cast<int>(conns.size()), std::memory_order_relaxed);
}

void ArenaListener::Impl::AcceptSome() {
  for (int n = 0; n < kAcceptsPerRound; ++n) {
    shm::OwnedFd sock(::accept4(listen_fd.get(), nullptr, nullptr,
                                SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!sock.valid()) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        spdlog::warn("arena socket: accept: {}", std::strerror(errno));
      }
      return;
    }
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      spdlog::warn("arena socket: SO_PEERCRED: {}", std::strerror(errno));
      continue;
    }
    Connection c;
    c.peer = {cred.pid, cred.uid, cred.gid};
    if (static_cast<int>(conns.size()) >= options.max_connections) {
      SendReply(sock.get(),
                absl::ResourceExhaustedError(fmt::format(
                    "the arena socket has {} connections open already; retry",
                    conns.size())),
                0);
      continue;
    }
    if (per_uid[c.peer.uid] >= options.max_connections_per_uid) {
      SendReply(sock.get(),
                absl::ResourceExhaustedError(fmt::format(
                    "uid {} has {} arena socket connections open already; "
                    "retry",
                    c.peer.uid, per_uid[c.peer.uid])),
                0);
      continue;
    }
    ++per_uid[c.peer.uid];
    c.sock = std::move(sock);
    c.deadline = absl::Now() + options.request_timeout;
    conns.push_back(std::move(c));
    open.store(static_cast<int>(conns.size()), std::memory_order_relaxed);
  }
}

void ArenaListener::Impl::ServeBuffer(Connection& c, shm::ReceivedMessage msg) {
  absl::StatusOr<std::string> token = shm::DecodeBufferRequest(msg.bytes);
  absl::StatusOr<shm::FetchedFd> buffer =
      !token.ok() ? absl::StatusOr<shm::FetchedFd>(token.status())
      : !msg.fds.empty()
          ? absl::StatusOr<shm::FetchedFd>(absl::InvalidArgumentError(
                "a group buffer request carries no file descriptor"))
      : !options.fetch_buffer
          ? absl::StatusOr<shm::FetchedFd>(absl::UnimplementedError(
                "this daemon hands out no group buffers"))
          : options.fetch_buffer(*token, c.peer);
  if (!buffer.ok()) {
    spdlog::warn("arena socket: group buffer request from {} refused: {}",
                 Who(c.peer), EscapeForLog(buffer.status().ToString()));
    SendReply(c.sock.get(), buffer.status(), 0);
    return;
  }
  (void)shm::SendMessageWithFd(
      c.sock.get(), shm::EncodeArenaReply(absl::OkStatus(), buffer->size),
      buffer->fd.get(), MSG_DONTWAIT);
}

bool ArenaListener::Impl::Serve(Connection& c) {
  absl::StatusOr<shm::ReceivedMessage> msg = shm::ReceiveMessageWithFds(
      c.sock.get(), shm::kMaxArenaRequestBytes, MSG_DONTWAIT);
  if (!msg.ok() && absl::IsUnavailable(msg.status())) return false;  // spurious
  absl::Status error;
  absl::StatusOr<shm::ArenaRequest> req;
  if (!msg.ok()) {
    error = msg.status();
  } else if (msg->bytes.empty() && msg->fds.empty()) {
    return true;  // the client hung up
  } else if (shm::IsBufferRequest(msg->bytes)) {
    ServeBuffer(c, *std::move(msg));
    return true;
  } else if (req = shm::DecodeArenaRequest(msg->bytes); !req.ok()) {
    error = req.status();
  } else if (msg->fds.size() != 1) {
    error = absl::InvalidArgumentError(fmt::format(
        "arena request carries {} file descriptors; exactly one (the arena "
        "memfd, SCM_RIGHTS) is required",
        msg->fds.size()));
  }
  if (!error.ok()) {
    spdlog::warn("arena socket: request from {} refused: {}", Who(c.peer),
                 error);
    SendReply(c.sock.get(), error, 0);
    return true;
  }
  ArenaRegistration reg;
  reg.fd = std::move(msg->fds[0]);
  reg.size = req->size;
  reg.owner = std::move(req->owner);
  reg.peer = c.peer;
  const std::string owner = reg.owner;
  const uint64_t size = reg.size;
  absl::StatusOr<uint64_t> id = options.handler(std::move(reg));
  if (!id.ok()) {
    spdlog::warn("arena socket: {} bytes from {} ('{}') refused: {}", size,
                 Who(c.peer), EscapeForLog(owner),
                 EscapeForLog(id.status().ToString()));
  }
  SendReply(c.sock.get(), id.status(), id.value_or(0));
  return true;
}

void ArenaListener::Impl::Run() {
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({wake_fd.get(), POLLIN, 0});
    fds.push_back({listen_fd.get(), POLLIN, 0});
    absl::Time next = absl::InfiniteFuture();
    for (const Connection& c : conns) {
      fds.push_back({c.sock.get(), POLLIN, 0});
      next = std::min(next, c.deadline);
    }
    int timeout_ms = -1;
    if (next != absl::InfiniteFuture()) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(next - absl::Now()) + 1, 0, 1 << 30));
    }
    const int r = ::poll(fds.data(), fds.size(), timeout_ms);
    if (r < 0 && errno != EINTR) {
      spdlog::error("arena socket: poll: {}", std::strerror(errno));
      absl::SleepFor(absl::Milliseconds(10));
      continue;
    }
    if (r > 0 && fds[0].revents != 0) return;  // stop
    // Connections first (their pollfds are in the same order as `conns`;
    // accepting below appends, closing moves the last one into the hole, so
    // walk backwards).
    const size_t polled = fds.size() - 2;
    for (size_t i = polled; i-- > 0;) {
      if (r > 0 && fds[i + 2].revents != 0 && Serve(conns[i])) Close(i);
    }
    const absl::Time now = absl::Now();
    for (size_t i = conns.size(); i-- > 0;) {
      if (conns[i].deadline <= now) {
        spdlog::warn("arena socket: {} sent no request within {}; closed",
                     Who(conns[i].peer),
                     absl::FormatDuration(options.request_timeout));
        SendReply(conns[i].sock.get(),
                  absl::DeadlineExceededError(fmt::format(
                      "no arena request within {}",
                      absl::FormatDuration(options.request_timeout))),
                  0);
        Close(i);
      }
    }
    if (r > 0 && (fds[1].revents & POLLIN)) AcceptSome();
  }
}

absl::StatusOr<std::unique_ptr<ArenaListener>> ArenaListener::Start(
    ArenaListenerOptions options) {
  const std::string path = options.socket_path;
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        fmt::format("arena socket path '{}' must be 1..{} bytes", path,
                    sizeof(sockaddr_un::sun_path) - 1));
  }
  if (!options.handler) {
    return absl::InvalidArgumentError("arena socket: no handler");
  }
  if (options.max_connections < 1 || options.max_connections_per_uid < 1 ||
      options.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "arena socket: connection limits and the timeout must be positive");
  }
  RETURN_IF_ERROR(ClaimSocketPath(path, SOCK_SEQPACKET));
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  impl->listen_fd.Reset(
      ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!impl->listen_fd.valid()) {
    return absl::ErrnoToStatus(errno, "arena socket: socket(AF_UNIX)");
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  // The socket appears with umask 077, then gets the configured mode.
  const mode_t old_umask = ::umask(077);
  const int rc = ::bind(impl->listen_fd.get(),
                        reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  ::umask(old_umask);
  if (rc != 0) {
    return absl::ErrnoToStatus(bind_errno, fmt::format("bind {}", path));
  }
  if (::chmod(path.c_str(), impl->options.socket_mode) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return absl::ErrnoToStatus(err, fmt::format("chmod {}", path));
  }
  if (::listen(impl->listen_fd.get(), 128) != 0) {
    const int err = errno;
    ::unlink(path.c_str());
    return absl::ErrnoToStatus(err, fmt::format("listen {}", path));
  }
  impl->wake_fd.Reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!impl->wake_fd.valid()) {
    const int err = errno;
    ::unlink(path.c_str());
    return absl::ErrnoToStatus(err, "eventfd");
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  spdlog::info("arena socket listening on {} (mode {:o})", path,
               impl->options.socket_mode);
  return std::unique_ptr<ArenaListener>(new ArenaListener(std::move(impl)));
}

ArenaListener::ArenaListener(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}

ArenaListener::~ArenaListener() {
  const uint64_t one = 1;
  (void)!::write(impl_->wake_fd.get(), &one, sizeof(one));
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->conns.clear();
  ::unlink(impl_->options.socket_path.c_str());
}

const std::string& ArenaListener::socket_path() const {
  return impl_->options.socket_path;
}

int ArenaListener::open_connections() const {
  return impl_->open.load(std::memory_order_relaxed);
}

}  // namespace ckptd::daemon
