// Copyright 2026 The ckptd Authors.
#include "shm/fd_passing.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace ckptd::shm {
namespace {

void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}
uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

bool HasMagic(std::string_view m) {
  return m.size() >= 4 && std::memcmp(m.data(), kArenaMagic, 4) == 0;
}

// Milliseconds left until `deadline` for poll(), >= 0.
int PollMs(absl::Time deadline) {
  const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

}  // namespace

void OwnedFd::Reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string EncodeArenaRequest(uint64_t size, std::string_view owner) {
  owner = owner.substr(0, kMaxArenaOwnerBytes);
  std::string out(kArenaMagic, 4);
  PutU64(&out, size);
  PutU32(&out, static_cast<uint32_t>(owner.size()));
  out.append(owner);
  return out;
}

absl::StatusOr<ArenaRequest> DecodeArenaRequest(std::string_view m) {
  if (m.size() < kArenaRequestHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena request: ", m.size(), " bytes, shorter than the ",
                     kArenaRequestHeaderBytes, "-byte header"));
  }
  if (!HasMagic(m)) {
    return absl::InvalidArgumentError(
        "arena request: bad magic (expected \"CKA1\")");
  }
  ArenaRequest req;
  req.size = GetU64(m.data() + 4);
  const uint32_t n = GetU32(m.data() + 12);
  if (n > kMaxArenaOwnerBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "arena request: owner of ", n, " bytes exceeds ", kMaxArenaOwnerBytes));
  }
  if (m.size() != kArenaRequestHeaderBytes + n) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena request: ", m.size(), " bytes, header says ",
                     kArenaRequestHeaderBytes, " + ", n));
  }
  if (req.size == 0) {
    return absl::InvalidArgumentError("arena request: size must be positive");
  }
  req.owner.assign(m.data() + kArenaRequestHeaderBytes, n);
  return req;
}

std::string EncodeArenaReply(const absl::Status& status, uint64_t arena_id) {
  std::string out(kArenaMagic, 4);
  PutU32(&out, static_cast<uint32_t>(status.code()));
  PutU64(&out, status.ok() ? arena_id : 0);
  const std::string_view msg(
      status.message().data(),
      std::min(status.message().size(), kMaxArenaReplyMessageBytes));
  PutU32(&out, static_cast<uint32_t>(msg.size()));
  out.append(msg);
  return out;
}

absl::StatusOr<uint64_t> DecodeArenaReply(std::string_view m) {
  if (m.size() < kArenaReplyHeaderBytes || !HasMagic(m)) {
    return absl::InternalError(
        absl::StrCat("malformed arena socket reply (", m.size(), " bytes)"));
  }
  const uint32_t code = GetU32(m.data() + 4);
  const uint64_t id = GetU64(m.data() + 8);
  const uint32_t n = GetU32(m.data() + 16);
  if (n > kMaxArenaReplyMessageBytes ||
      m.size() != kArenaReplyHeaderBytes + n ||
      code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InternalError("malformed arena socket reply");
  }
  if (code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(code),
                        std::string(m.substr(kArenaReplyHeaderBytes, n)));
  }
  if (id == 0) return absl::InternalError("arena socket returned arena id 0");
  return id;
}

absl::Status SendMessageWithFd(int sock, std::string_view message, int fd,
                               int flags) {
  iovec iov{const_cast<char*>(message.data()), message.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | flags);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::UnavailableError("send on the arena socket would block");
    }
    return absl::ErrnoToStatus(errno, "send on the arena socket");
  }
  if (static_cast<size_t>(n) != message.size()) {
    return absl::InternalError(absl::StrCat(
        "short send on the arena socket: ", n, " of ", message.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ReceivedMessage> ReceiveMessageWithFds(int sock,
                                                      size_t max_bytes,
                                                      int flags) {
  ReceivedMessage out;
  out.bytes.resize(max_bytes + 1);  // one more: detects a longer message
  iovec iov{out.bytes.data(), out.bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for a few fds, so that "too many" is seen and they are closed.
  alignas(cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | flags);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      return absl::UnavailableError("nothing to receive on the arena socket");
    }
    return absl::ErrnoToStatus(errno, "receive on the arena socket");
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr;
       c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out.fds.emplace_back(fd);
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    return absl::InvalidArgumentError(
        "arena socket message carried too many file descriptors");
  }
  if ((msg.msg_flags & MSG_TRUNC) || static_cast<size_t>(n) > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena socket message longer than ", max_bytes, " bytes"));
  }
  out.bytes.resize(static_cast<size_t>(n));
  return out;
}

namespace {

// One request and its reply on a fresh connection to the arena socket,
// within `timeout`.
absl::StatusOr<ReceivedMessage> Exchange(const std::string& socket_path,
                                         std::string_view message, int fd,
                                         absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  sockaddr_un addr{};
  if (socket_path.empty() || socket_path.size() >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("arena socket path '", socket_path, "' must be 1..",
                     sizeof(addr.sun_path) - 1, " bytes"));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  OwnedFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock.valid()) return absl::ErrnoToStatus(errno, "socket(AF_UNIX)");
  int rc;
  do {
    rc =
        ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    return absl::UnavailableError(
        absl::StrCat("cannot connect to the ckptd arena socket ", socket_path,
                     ": ", strerror(err)));
  }
  // A blocking send of a small message on a fresh connection: the socket
  // buffer takes it at once. The reply is awaited with poll.
  const absl::Status sent = SendMessageWithFd(sock.get(), message, fd);
  if (!sent.ok()) {
    return absl::Status(sent.code(),
                        absl::StrCat(sent.message(), " (", socket_path, ")"));
  }
  while (true) {
    pollfd p{sock.get(), POLLIN, 0};
    const int ms = PollMs(deadline);
    const int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return absl::ErrnoToStatus(errno, "poll on the arena socket");
    if (r == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("no reply from the ckptd arena socket ", socket_path,
                       " within ", absl::FormatDuration(timeout)));
    }
    break;
  }
  absl::StatusOr<ReceivedMessage> reply =
      ReceiveMessageWithFds(sock.get(), kMaxArenaReplyBytes, MSG_DONTWAIT);
  if (!reply.ok()) return reply.status();
  if (reply->bytes.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "the ckptd arena socket ", socket_path, " closed without a reply"));
  }
  return reply;
}

}  // namespace

absl::StatusOr<uint64_t> RegisterArenaFd(const std::string& socket_path,
                                         int arena_fd, uint64_t size,
                                         std::string_view owner,
                                         absl::Duration timeout) {
  absl::StatusOr<ReceivedMessage> reply =
      Exchange(socket_path, EncodeArenaRequest(size, owner), arena_fd, timeout);
  if (!reply.ok()) return reply.status();
  return DecodeArenaReply(reply->bytes);
}

std::string EncodeBufferRequest(std::string_view token) {
  std::string out(kBufferMagic, 4);
  out.append(token);
  return out;
}

bool IsBufferRequest(std::string_view m) {
  return m.size() >= 4 && std::memcmp(m.data(), kBufferMagic, 4) == 0;
}

absl::StatusOr<std::string> DecodeBufferRequest(std::string_view m) {
  if (!IsBufferRequest(m) || m.size() != 4 + kBufferTokenBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group buffer request: ", m.size(), " bytes, expected \"CKB1\" and a ",
        kBufferTokenBytes, "-digit token"));
  }
  const std::string_view token = m.substr(4);
  for (char c : token) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return absl::InvalidArgumentError(
          "group buffer request: the token is not lowercase hex");
    }
  }
  return std::string(token);
}

absl::StatusOr<FetchedFd> FetchGroupBuffer(const std::string& socket_path,
                                           std::string_view token,
                                           absl::Duration timeout) {
  absl::StatusOr<ReceivedMessage> reply =
      Exchange(socket_path, EncodeBufferRequest(token), -1, timeout);
  if (!reply.ok()) return reply.status();
  absl::StatusOr<uint64_t> size = DecodeArenaReply(reply->bytes);
  if (!size.ok()) return size.status();
  if (reply->fds.size() != 1) {
    return absl::InternalError(absl::StrCat(
        "the ckptd arena socket answered a group buffer fetch with ",
        reply->fds.size(), " descriptors, not 1"));
  }
  return FetchedFd{std::move(reply->fds[0]), *size};
}

}  // namespace ckptd::shm
