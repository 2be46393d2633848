// Copyright 2026 The ckptd Authors.
//
// The gRPC face of multi-node checkpoints (proto/ckptd/v1/peer.proto):
//   PeerServer        ckptd.v1.PeerDaemon on TCP; every call must carry the
//                     shared token; forwards to this daemon's Coordinator
//   MakeLinkFactory   CoordinatorLinks to remote coordinators (callback
//                     client API, per-call deadlines, the token attached)
// TLS (server and client) when certificate files are configured. gRPC and
// protobuf types stay inside peer_server.cc, peer_client.cc and the message
// codec (peer_codec.h).
#ifndef CKPTD_DAEMON_CLUSTER_PEER_SERVICE_H_
#define CKPTD_DAEMON_CLUSTER_PEER_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/shares.h"

namespace ckptd::daemon {

struct PeerTls {
  std::string cert_pem;  // this daemon's certificate chain
  std::string key_pem;
  std::string ca_pem;  // verifies the other side
  bool enabled() const { return !cert_pem.empty(); }
};

// Learns each finished peer call: its method ("Plan", "Prepare",
// "Heartbeat", "Abort") and status code (OK, UNAUTHENTICATED for a missing
// or wrong token, UNAVAILABLE / DEADLINE_EXCEEDED for an unreachable or
// silent coordinator, ...). Called on gRPC threads: must not block.
using PeerCallObserver =
    std::function<void(std::string_view method, absl::StatusCode code)>;

// A call's token is checked on its initial metadata, before any of its
// request is read: a refused call costs the server no more than what HTTP/2
// flow control lets the caller send ahead (a few MiB), however big its
// request. An authenticated request is received whole, then its size is
// checked against its method's limit (RESOURCE_EXHAUSTED naming both) before
// it is parsed: gRPC 1.51 cannot refuse a message on its declared length.
struct PeerServerOptions {
  std::string listen;  // "0.0.0.0:7070"; port 0 picks a free port
  std::string token;   // required, non-empty
  PeerTls tls;
  // Plan and Prepare requests: node indexes of big jobs are large.
  int max_message_bytes = 1 << 30;
  // Heartbeat and Abort requests: ids and a reason (at most ~14 KiB).
  int max_small_message_bytes = 64 << 10;
  PeerCallObserver on_request;  // calls this server answered; optional
};

class PeerServer {
 public:
  // Binds and starts serving; calls get UNAVAILABLE until SetCoordinator.
  static absl::StatusOr<std::unique_ptr<PeerServer>> Start(
      const PeerServerOptions& options);
  // Shuts down; pending long-polls are answered CANCELLED.
  ~PeerServer();
  int port() const;
  // `coordinator` must outlive the server (or be reset to null first).
  void SetCoordinator(CoordinatorLink* coordinator);
  // PushShare, ListShares and FetchShare go to `shares` (UNAVAILABLE
  // while null); the same rule.
  void SetShares(Shares* shares);

 private:
  struct Impl;
  explicit PeerServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct PeerClientOptions {
  std::string token;
  PeerTls tls;
  absl::Duration plan_deadline =
      absl::Seconds(150);  // stage_timeout + peer_timeout
  absl::Duration prepare_deadline =
      absl::Seconds(330);  // commit_timeout + peer_timeout
  absl::Duration call_deadline = absl::Seconds(15);  // heartbeat, abort
  // Longest wait between reconnection attempts to a coordinator that went
  // away (gRPC's backoff, +-20 % jitter): well within peer_timeout, so that
  // a restarted coordinator hears from this node before it gives up on it.
  absl::Duration max_reconnect_backoff = absl::Seconds(2);
  int max_message_bytes = 1 << 30;
  PeerCallObserver on_call;  // calls made to coordinators; optional
};

// Links to remote coordinators, one channel per address (cached).
LinkFactory MakeLinkFactory(const PeerClientOptions& options);
// Links to other daemons for replicas (shares.h), one channel per address
// (cached): PushShare and ListShares as blocking calls, FetchShare a few
// pieces at a time.
ShareLinkFactory MakeShareLinkFactory(const PeerClientOptions& options);

// Reads a token file: trailing whitespace stripped; refuses an empty token
// and a file readable by group or others.
absl::StatusOr<std::string> ReadTokenFile(const std::string& path);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_PEER_SERVICE_H_
