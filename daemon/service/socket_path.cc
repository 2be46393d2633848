// Copyright 2026 The ckptd Authors.
#include "daemon/service/socket_path.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include "common/env.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ckptd::daemon {
namespace {

// True if something accepts connections of `type` (SOCK_STREAM,
// SOCK_SEQPACKET) on the Unix socket `path`.
bool SocketAnswers(const std::string& path, int type) {
  const int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  const bool ok =
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

absl::Status ClaimSocketPath(const std::string& path, int type) {
  RETURN_IF_ERROR(Env::Default()->CreateDirs(DirName(path)));
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(fmt::format(
        "{} exists and is not a socket; refusing to replace it", path));
  }
  if (SocketAnswers(path, type)) {
    return absl::FailedPreconditionError(
        fmt::format("another daemon is serving on {}", path));
  }
  ::unlink(path.c_str());  // stale socket of a dead daemon
  return absl::OkStatus();
}

}  // namespace ckptd::daemon
