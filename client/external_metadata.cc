// Copyright 2026 The ckptd Authors.
//
// Client::GetLayout and Client::CommitMetadata: the daemon side of DCP's
// StorageWriter (ckptd.StorageWriter; daemon.proto GetLayout,
// CommitMetadata). Saves with SaveOptions::external_metadata write their
// data files; the coordinator's StorageWriter.finish asks where the items
// landed and hands over the `.metadata` DCP built.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/batching.h"
#include "client/ckptd_client.h"
#include "client/client_rpc.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "proto/grpc_status.h"

namespace ckptd::client {

namespace pb = ::ckptd::v1;

absl::StatusOr<uint64_t> Client::CallerArena(const std::string& checkpoint_id) {
  if (checkpoint_id.empty()) {
    return absl::InvalidArgumentError("checkpoint_id is empty");
  }
  RETURN_IF_ERROR(
      ValidateName("checkpoint_id", checkpoint_id, kMaxCheckpointIdBytes));
  // The arena tells the daemon who asks (its uid, from the kernel).
  absl::MutexLock lock(&save_mu_);
  if (arena_ == nullptr) {
    RETURN_IF_ERROR(PrepareArena(internal::kArenaGranule, /*need_idle=*/false));
  }
  return arena_id_;
}

absl::StatusOr<std::vector<LayoutEntry>> Client::GetLayout(
    const std::string& checkpoint_id) {
  ASSIGN_OR_RETURN(const uint64_t arena, CallerArena(checkpoint_id));
  pb::LayoutRequest req;
  req.set_checkpoint_id(checkpoint_id);
  req.set_arena_id(arena);
  grpc::ClientContext ctx;
  internal::SetTimeout(&ctx, options_.rpc_timeout);
  pb::LayoutResponse resp;
  RETURN_IF_ERROR(FromGrpc(rpc_->stub->GetLayout(&ctx, req, &resp)));
  std::vector<LayoutEntry> out;
  out.reserve(resp.entries_size());
  for (pb::LayoutEntry& e : *resp.mutable_entries()) {
    LayoutEntry le;
    le.fqn = std::move(*e.mutable_fqn());
    le.is_bytes = e.is_bytes();
    le.offsets.assign(e.offsets().begin(), e.offsets().end());
    le.relative_path = std::move(*e.mutable_relative_path());
    le.offset = e.offset();
    le.length = e.length();
    le.transform_descriptors.assign(e.transform_descriptors().begin(),
                                    e.transform_descriptors().end());
    out.push_back(std::move(le));
  }
  return out;
}

absl::Status Client::CommitMetadata(const std::string& checkpoint_id,
                                    std::string_view metadata) {
  if (metadata.empty()) {
    return absl::InvalidArgumentError("the .metadata to commit is empty");
  }
  ASSIGN_OR_RETURN(const uint64_t arena, CallerArena(checkpoint_id));
  pb::CommitMetadataRequest req;
  req.set_checkpoint_id(checkpoint_id);
  req.set_arena_id(arena);
  req.set_metadata(std::string(metadata));
  grpc::ClientContext ctx;
  internal::SetTimeout(&ctx, options_.rpc_timeout);
  pb::CommitMetadataResponse resp;
  return FromGrpc(rpc_->stub->CommitMetadata(&ctx, req, &resp));
}

}  // namespace ckptd::client
