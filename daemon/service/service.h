// Copyright 2026 The ckptd Authors.
//
// The gRPC face of the daemon: ckptd.v1.CheckpointDaemon on a Unix socket,
// served with the callback API. Each handler decodes and checks its request,
// hands it to the CheckpointManager and finishes from the manager's
// callback; nothing blocks in a reactor. absl::Status becomes grpc::Status
// here and nowhere else. gRPC types stay inside service.cc (pimpl).
#ifndef CKPTD_DAEMON_SERVICE_SERVICE_H_
#define CKPTD_DAEMON_SERVICE_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/restore/restorer.h"
#include "daemon/save/checkpoint_manager.h"

namespace ckptd::daemon {

struct ServerOptions {
  std::string socket_path;  // Unix socket to listen on
  uint32_t socket_mode =
      0660;  // chmod'ed right after binding (umask 077 until then)
  int max_message_bytes = 64 << 20;
};

// A running server. The destructor shuts it down (in-flight calls are
// cancelled) before returning.
class Server {
 public:
  // Removes a stale socket file (FAILED_PRECONDITION if a daemon answers on
  // it), creates its directory, binds and starts serving `manager`, which
  // must outlive the server.
  // `restorer` (may be null: GetRestoreIndex/Restore are then UNIMPLEMENTED)
  // must outlive the server too.
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const ServerOptions& options, CheckpointManager* manager,
      Restorer* restorer = nullptr);
  ~Server();
  // Blocks until Shutdown() is called from another thread.
  void Wait();
  // Stops serving; calls still in flight are cancelled.
  void Shutdown();
  // For a graceful stop, before Shutdown: every later call is answered
  // with `why` (UNAVAILABLE: the daemon is shutting down), while the calls
  // in flight stay open to get their answers. (gRPC's own Shutdown with a
  // deadline would also hold the stop for idle client connections.)
  void RefuseNewCalls(const absl::Status& why);
  // Waits up to `timeout` until no call is held; returns how many still are.
  int AwaitCallsAnswered(absl::Duration timeout);

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_SERVICE_SERVICE_H_
