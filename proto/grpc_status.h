// Copyright 2026 The ckptd Authors.
//
// absl::Status ↔ grpc::Status, the one conversion at every gRPC boundary
// (the daemon's service, the peer server and client, the client library).
// The codes are the same numbers in both; the message goes across as is.
#ifndef CKPTD_PROTO_GRPC_STATUS_H_
#define CKPTD_PROTO_GRPC_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ckptd {

inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

}  // namespace ckptd

#endif  // CKPTD_PROTO_GRPC_STATUS_H_
