// Copyright 2026 The ckptd Authors.
//
// What the peer server and client share on the gRPC side (internal to
// daemon/cluster/peer_*.cc).
#ifndef CKPTD_DAEMON_CLUSTER_PEER_GRPC_H_
#define CKPTD_DAEMON_CLUSTER_PEER_GRPC_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "daemon/cluster/peer_service.h"
#include "grpcpp/security/credentials.h"

namespace ckptd::daemon {

// HTTP/2 settings of the peer channels, server and client: stream windows
// of 64 MiB and frames of up to 16 MiB (gRPC starts at 64 KiB and grows
// them only with its BDP probe, which on a fast link leaves a 4 MiB chunk
// waiting on window updates).
std::vector<std::pair<std::string, int>> PeerTransportArgs();

// The channel credentials of a peer client: TLS with `tls` when it has a
// certificate or CA, else plaintext (the token still travels).
std::shared_ptr<grpc::ChannelCredentials> ClientCreds(const PeerTls& tls);

// The call metadata carrying "Bearer <token>".
inline constexpr char kAuthHeader[] = "authorization";

// gRPC runs callback-API completions on a process-wide queue whose threads
// stop when its last user (server or channel) goes away; a channel
// destroyed right after its last callback returned can race that shutdown
// (gRPC 1.51: "assertion failed: prior > 0" in grpc_cq_internal_unref).
// One leaked channel that made a callback call keeps the queue for the
// process. Idempotent.
void KeepCallbackQueueAlive();

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_PEER_GRPC_H_
