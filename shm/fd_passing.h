// Copyright 2026 The ckptd Authors.
//
// The arena socket: how a client hands the daemon its arena as a file
// descriptor instead of a name. The client creates a sealed memfd
// (shm::Arena::CreateMemfd), connects to the daemon's arena socket (a Unix
// SOCK_SEQPACKET socket, `<socket>.arena` by default, GetInfo.arena_socket)
// and sends ONE request message carrying the fd (SCM_RIGHTS); the daemon
// answers with ONE reply message and closes the connection. The daemon takes
// the caller's identity from the connection (SO_PEERCRED: pid, uid, gid, set
// by the kernel at connect()), never from the message, and can only ever map
// memory the caller itself holds an fd of: no name lookup, so no confused
// deputy.
//
// Wire format (integers little-endian; one message = one sendmsg/recvmsg):
//
//   request  [0,4)   magic "CKA1"
//            [4,12)  uint64 size: bytes the client mapped (> 0); the fd's
//                    file must be at least this long
//            [12,16) uint32 n: owner length, <= kMaxArenaOwnerBytes
//            [16,16+n) owner: free text for logs ("job/rank3 pid 1234")
//            ancillary: SCM_RIGHTS with exactly one fd
//   reply    [0,4)   magic "CKA1"
//            [4,8)   uint32 code: absl::StatusCode (0 = OK)
//            [8,16)  uint64 arena_id (non-zero when OK)
//            [16,20) uint32 m: message length, <= kMaxArenaReplyMessageBytes
//            [20,20+m) message: the error text (empty when OK)
//
// A request that is not exactly this (wrong magic, length mismatch, longer
// than kMaxArenaRequestBytes, no fd or more than one) is answered
// INVALID_ARGUMENT; every fd that came with it is closed.
//
// The same socket hands out group buffers (restores through the daemon,
// daemon/restore/group_buffers.h):
//
//   request  [0,4)   magic "CKB1"
//            [4,36)  token: 32 lowercase hex digits (RestoreResponse.
//                    group_buffer_token); no fd
//   reply    the reply above, its uint64 the buffer's size, with the
//            buffer's read-only descriptor (SCM_RIGHTS) when OK
#ifndef CKPTD_SHM_FD_PASSING_H_
#define CKPTD_SHM_FD_PASSING_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ckptd::shm {

inline constexpr char kArenaMagic[4] = {'C', 'K', 'A', '1'};
inline constexpr char kBufferMagic[4] = {'C', 'K', 'B', '1'};
inline constexpr size_t kBufferTokenBytes = 32;
inline constexpr size_t kArenaRequestHeaderBytes = 16;
inline constexpr size_t kMaxArenaOwnerBytes = 256;
inline constexpr size_t kMaxArenaRequestBytes =
    kArenaRequestHeaderBytes + kMaxArenaOwnerBytes;
inline constexpr size_t kArenaReplyHeaderBytes = 20;
inline constexpr size_t kMaxArenaReplyMessageBytes = 1024;
inline constexpr size_t kMaxArenaReplyBytes =
    kArenaReplyHeaderBytes + kMaxArenaReplyMessageBytes;

// A file descriptor that is closed on destruction. Move-only.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  ~OwnedFd() { Reset(); }
  OwnedFd(OwnedFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership.
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1);

 private:
  int fd_ = -1;
};

// An arena socket connection's peer, as the kernel recorded it at connect()
// (SO_PEERCRED; pid in the daemon's pid namespace, 0 when the client is
// outside it). Unforgeable by the client.
struct PeerCredentials {
  int64_t pid = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// A decoded request.
struct ArenaRequest {
  uint64_t size = 0;
  std::string owner;
};

// Encoding and decoding (no I/O). Decode errors are INVALID_ARGUMENT with the
// reason ("arena request: 40 bytes, header says 16 + 30").
std::string EncodeArenaRequest(uint64_t size, std::string_view owner);
absl::StatusOr<ArenaRequest> DecodeArenaRequest(std::string_view message);
// `status` OK: `arena_id` is the registered arena. The message is cut to
// kMaxArenaReplyMessageBytes.
std::string EncodeArenaReply(const absl::Status& status, uint64_t arena_id);
// The arena id, or the daemon's error with its code and message.
absl::StatusOr<uint64_t> DecodeArenaReply(std::string_view message);

// Group buffer requests: the token, checked (32 lowercase hex digits).
std::string EncodeBufferRequest(std::string_view token);
bool IsBufferRequest(std::string_view message);
absl::StatusOr<std::string> DecodeBufferRequest(std::string_view message);

// sendmsg of one message with `fd` attached (SCM_RIGHTS; fd < 0: none).
// MSG_NOSIGNAL; EINTR retried; `flags` is ORed in (MSG_DONTWAIT).
absl::Status SendMessageWithFd(int sock, std::string_view message, int fd,
                               int flags = 0);

// recvmsg of one message into at most `max_bytes` (MSG_CMSG_CLOEXEC).
// Received fds are returned owned; a message longer than max_bytes is
// INVALID_ARGUMENT (its fds closed); a truncated control message (more fds
// than fit) too. EAGAIN is UNAVAILABLE; a closed connection (0 bytes, no fds)
// is returned as an empty message.
struct ReceivedMessage {
  std::string bytes;
  std::vector<OwnedFd> fds;
};
absl::StatusOr<ReceivedMessage> ReceiveMessageWithFds(int sock,
                                                      size_t max_bytes,
                                                      int flags = 0);

// The client side of one registration: connects to the arena socket at
// `socket_path`, sends `arena_fd` with the request and waits for the reply,
// all within `timeout`. Returns the arena id, or the daemon's error
// unchanged; UNAVAILABLE (naming the path) if nothing listens there;
// DEADLINE_EXCEEDED if no reply came in time.
absl::StatusOr<uint64_t> RegisterArenaFd(const std::string& socket_path,
                                         int arena_fd, uint64_t size,
                                         std::string_view owner,
                                         absl::Duration timeout);

// The client side of one group buffer fetch: the read-only descriptor and
// the buffer's size, or the daemon's error (NOT_FOUND: unknown or expired
// token; PERMISSION_DENIED: another user's); UNAVAILABLE / DEADLINE_EXCEEDED
// as RegisterArenaFd.
struct FetchedFd {
  OwnedFd fd;
  uint64_t size = 0;
};
absl::StatusOr<FetchedFd> FetchGroupBuffer(const std::string& socket_path,
                                           std::string_view token,
                                           absl::Duration timeout);

}  // namespace ckptd::shm

#endif  // CKPTD_SHM_FD_PASSING_H_
