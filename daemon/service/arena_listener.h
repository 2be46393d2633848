// Copyright 2026 The ckptd Authors.
//
// ArenaListener: the daemon side of the arena socket (shm/fd_passing.h). A
// Unix SOCK_SEQPACKET socket where each connection registers one arena: the
// client sends a request carrying its sealed memfd, the listener reads the
// peer's kernel-verified credentials (SO_PEERCRED), hands fd + size + owner +
// credentials to the registration handler (CheckpointManager::
// RegisterArenaFd in the daemon) and replies with the arena id or the
// handler's error, then closes the connection.
//
// Bounded in every direction: one thread runs a poll() loop over
// non-blocking sockets, so a client that connects and sends nothing (or
// half a message) delays nobody; a connection gets `request_timeout` to
// deliver its request and is then answered DEADLINE_EXCEEDED and closed; at
// most `max_connections` are open at once, `max_connections_per_uid` of one
// uid (beyond: answered RESOURCE_EXHAUSTED right away); requests are at most
// shm::kMaxArenaRequestBytes and carry exactly one fd. The handler runs on
// the listener thread and must not block (mmap and a mutex are fine).
#ifndef CKPTD_DAEMON_SERVICE_ARENA_LISTENER_H_
#define CKPTD_DAEMON_SERVICE_ARENA_LISTENER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "shm/fd_passing.h"

namespace ckptd::daemon {

using shm::PeerCredentials;

// One registration as the listener received it.
struct ArenaRegistration {
  shm::OwnedFd fd;  // the client's arena, not yet verified
  uint64_t size = 0;
  std::string owner;
  PeerCredentials peer;
};

struct ArenaListenerOptions {
  // Unix socket path (1..107 bytes). Its directory is created if missing; a
  // stale socket file of a dead daemon is replaced, a live one is
  // FAILED_PRECONDITION. Created under umask 077, then chmod'ed to
  // socket_mode.
  std::string socket_path;
  uint32_t socket_mode = 0660;
  int max_connections = 128;
  int max_connections_per_uid = 16;
  absl::Duration request_timeout = absl::Seconds(5);
  // Registers the arena (owns reg.fd); its result is the reply.
  std::function<absl::StatusOr<uint64_t>(ArenaRegistration reg)> handler;
  // Hands out a group buffer ("CKB1" requests, shm/fd_passing.h) for the
  // token and the connection's peer; null: answered UNIMPLEMENTED.
  std::function<absl::StatusOr<shm::FetchedFd>(const std::string& token,
                                               const PeerCredentials& peer)>
      fetch_buffer;
};

class ArenaListener {
 public:
  // Binds, listens and starts the listener thread.
  static absl::StatusOr<std::unique_ptr<ArenaListener>> Start(
      ArenaListenerOptions options);
  // Stops the thread, closes every connection and removes the socket file.
  ~ArenaListener();

  ArenaListener(const ArenaListener&) = delete;
  ArenaListener& operator=(const ArenaListener&) = delete;

  const std::string& socket_path() const;
  // Connections open right now (tests).
  int open_connections() const;

 private:
  struct Impl;
  explicit ArenaListener(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_SERVICE_ARENA_LISTENER_H_
