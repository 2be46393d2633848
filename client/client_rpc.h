// Copyright 2026 The ckptd Authors.
//
// Internal to libckptd_client (not installed): the gRPC side of a Client,
// shared by the translation units that implement its calls (client.cc:
// connect, save, status; restore.cc: restore). Only these see gRPC and the
// generated protocol code.
#ifndef CKPTD_CLIENT_CLIENT_RPC_H_
#define CKPTD_CLIENT_CLIENT_RPC_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/ckptd_client.h"

namespace ckptd::client {

struct Client::Rpc {
  std::string target;  // "unix:/run/ckptd/ckptd.sock"
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<::ckptd::v1::CheckpointDaemon::Stub> stub;
};

namespace internal {

// Sets the call's deadline `timeout` from now (none for an infinite one).
inline void SetTimeout(grpc::ClientContext* ctx, absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return;
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

}  // namespace internal
}  // namespace ckptd::client

#endif  // CKPTD_CLIENT_CLIENT_RPC_H_
