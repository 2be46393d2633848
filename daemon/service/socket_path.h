// Copyright 2026 The ckptd Authors.
//
// The Unix socket paths the daemon listens on (the gRPC socket and the arena
// socket): made free for a new listener without taking one from a live
// daemon. Used by service.cc and arena_listener.cc at start-up; no state.
#ifndef CKPTD_DAEMON_SERVICE_SOCKET_PATH_H_
#define CKPTD_DAEMON_SERVICE_SOCKET_PATH_H_

#include <string>

#include "absl/status/status.h"

namespace ckptd::daemon {

// Makes `path` free for a new Unix socket of `type`: creates its directory;
// removes a socket nobody answers on (a dead daemon's). FAILED_PRECONDITION
// when `path` is not a socket, or another daemon serves on it.
absl::Status ClaimSocketPath(const std::string& path, int type);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_SERVICE_SOCKET_PATH_H_
