// Copyright 2026 The ckptd Authors.
//
// The peer protocol's messages (proto/ckptd/v1/peer.proto) ↔ the plain
// structs of cluster.h, for the peer server and client. Decoding is
// bounded (sizes, counts, string lengths) and precise: a malformed message
// is INVALID_ARGUMENT naming what is wrong. Item fields go through the one
// item codec (service/item_codec.h) the trainers' Save uses too.
//
// Internal to daemon/cluster/ (peer_server.cc, peer_client.cc); protobuf
// but no gRPC. Pure functions; thread-safe.
#ifndef CKPTD_DAEMON_CLUSTER_PEER_CODEC_H_
#define CKPTD_DAEMON_CLUSTER_PEER_CODEC_H_

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "ckptd/v1/peer.pb.h"
#include "daemon/cluster/cluster.h"
#include "daemon/types/checkpoint_state.h"

namespace ckptd::daemon {

// At most `max` bytes of `s`, cut on a UTF-8 boundary (proto3 strings must
// be valid UTF-8).
std::string_view TruncateUtf8(std::string_view s, size_t max);

void ToProto(const PeerCallId& id, v1::PeerCall* out);
absl::StatusOr<PeerCallId> FromProto(const v1::PeerCall& in);

// A node's index, columnar: one kind per distinct (fqn, type, dtype,
// shape, path), each item a kind and its box.
void EncodeIndex(const NodeIndex& index, v1::NodeIndex* out);
absl::StatusOr<std::shared_ptr<NodeIndex>> DecodeIndex(const v1::NodeIndex& in);

// Plan round. The request's index is encoded when the call carries one
// (else its digest only); `item_counts` (per rank) come back for decoding
// the answer's keep bitmaps.
std::vector<size_t> EncodePlanRequest(const PlanCall& call,
                                      v1::PlanRequest* out);
absl::StatusOr<PlanCall> DecodePlanRequest(const v1::PlanRequest& in);
void ToProto(const NodePlan& plan, v1::PlanResponse* out);
NodePlan FromProto(const v1::PlanResponse& in,
                   const std::vector<size_t>& item_counts);

// Commit round.
void EncodePrepareRequest(const PrepareCall& call, v1::PrepareRequest* out);
absl::StatusOr<PrepareCall> DecodePrepareRequest(const v1::PrepareRequest& in);
// The commit's answer: state COMMITTED, the global figures, the nodes.
void ToProto(const GlobalStatus& g, v1::PrepareResponse* out);
GlobalStatus FromProto(const v1::PrepareResponse& in);

// Heartbeats.
void ToProto(const GlobalStatus& g, v1::HeartbeatResponse* out);
GlobalStatus FromProto(const v1::HeartbeatResponse& in);
void ToProto(const NodeProgress& p, v1::NodeProgress* out);
NodeProgress FromProto(const v1::NodeProgress& in);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_PEER_CODEC_H_
