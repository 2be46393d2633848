// Copyright 2026 The ckptd Authors.
//
// Client::GetRestoreIndex and Client::Restore: reading a checkpoint through
// the daemon (daemon.proto, Restore). The wants are planned into batches by
// restore_batches.h; each batch is one Restore call that the daemon fills
// in the arena, then copied out into the caller's destinations.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/batching.h"
#include "client/ckptd_client.h"
#include "client/client_rpc.h"
#include "client/restore_batches.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "proto/grpc_status.h"
#include "shm/arena.h"

namespace ckptd::client {

namespace pb = ::ckptd::v1;

namespace {

// Longest restore group name (daemon.proto RestoreRequest.group).
constexpr size_t kMaxGroupBytes = 1024;

// The daemon's refusal of a restore, for a daemon that does not serve them.
absl::Status NoRestoreService(const std::string& socket) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the daemon at ", socket,
      " does not serve restores (an older daemon): read the checkpoint "
      "directly"));
}

absl::Status CheckOptions(const RestoreOptions& o) {
  if (o.local_world_size < 1 || o.local_rank < 0 ||
      o.local_rank >= o.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local_rank ", o.local_rank, " is not in [0, local_world_size) with ",
        "local_world_size ", o.local_world_size));
  }
  if (o.group.size() > kMaxGroupBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group of ", o.group.size(), " bytes, more than ", kMaxGroupBytes));
  }
  if (o.batch_bytes < internal::kMinRestoreBatchBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_bytes ", o.batch_bytes, " is below the minimum of ",
                     internal::kMinRestoreBatchBytes));
  }
  return absl::OkStatus();
}

// The Restore call of batch `b` of `n`.
pb::RestoreRequest RequestFor(const std::string& checkpoint_id,
                              const RestoreOptions& options, uint64_t arena_id,
                              absl::Span<const RestoreTensor> tensors,
                              absl::Span<const internal::RestoreWant> wants,
                              absl::Span<const RestoreBytesItem> bytes_items,
                              const internal::RestoreBatch& batch, size_t b,
                              size_t n) {
  pb::RestoreRequest req;
  req.set_checkpoint_id(checkpoint_id);
  req.set_group(options.group);
  req.set_local_rank(options.local_rank);
  req.set_local_world_size(options.local_world_size);
  req.set_batch(static_cast<uint32_t>(b));
  req.set_last(b + 1 == n);
  req.set_arena_id(arena_id);
  req.set_skip_crc(!options.verify_crc);
  req.set_identity(options.identity);
  req.mutable_boxes()->Reserve(static_cast<int>(batch.boxes.size()));
  for (const internal::RestorePiece& p : batch.boxes) {
    const RestoreTensor& t = tensors[p.tensor];
    pb::RestoreBox* box = req.add_boxes();
    box->set_fqn(t.fqn);
    box->set_dtype(wants[p.tensor].dtype);
    for (size_t k = 0; k < p.box.sizes.size(); ++k) {
      box->add_offsets(t.offsets[k] + p.box.offsets[k]);
      box->add_sizes(p.box.sizes[k]);
    }
    box->set_arena_offset(p.arena_offset);
  }
  for (const internal::RestoreBytesSlot& s : batch.bytes_items) {
    pb::RestoreBytes* item = req.add_bytes_items();
    item->set_fqn(bytes_items[s.item].fqn);
    item->set_arena_offset(s.arena_offset);
    item->set_capacity(s.capacity);
  }
  return req;
}

// Copies the bytes items of a served batch out of the arena.
absl::Status TakeBytesItems(const internal::RestoreBatch& batch,
                            const pb::RestoreResponse& resp, const char* arena,
                            absl::Span<RestoreBytesItem> bytes_items,
                            uint64_t* delivered) {
  if (resp.bytes_lengths_size() != static_cast<int>(batch.bytes_items.size())) {
    return absl::InternalError(absl::StrCat(
        "the daemon answered ", resp.bytes_lengths_size(),
        " bytes lengths for ", batch.bytes_items.size(), " bytes items"));
  }
  for (size_t k = 0; k < batch.bytes_items.size(); ++k) {
    const internal::RestoreBytesSlot& s = batch.bytes_items[k];
    const uint64_t len = resp.bytes_lengths(static_cast<int>(k));
    RestoreBytesItem& item = bytes_items[s.item];
    if (len > s.capacity) {
      return absl::InternalError(
          absl::StrCat("the daemon reports ", len, " bytes for bytes item '",
                       item.fqn, "' in a slot of ", s.capacity));
    }
    item.value.assign(arena + s.arena_offset, len);
    *delivered += len;
  }
  return absl::OkStatus();
}

// After batch `failed` of a group restore failed: sends this rank's last
// batch, empty, so that the group's other ranks do not wait for it at each
// of their later batches (until the gather deadline). Best effort: the
// daemon counts the rank finished as the call arrives, so its answer
// (which comes when the group's batch is served) is not waited for long.
void LeaveGroup(pb::CheckpointDaemon::Stub* stub,
                const pb::RestoreRequest& failed, absl::Duration timeout) {
  pb::RestoreRequest req;
  req.set_checkpoint_id(failed.checkpoint_id());
  req.set_group(failed.group());
  req.set_local_rank(failed.local_rank());
  req.set_local_world_size(failed.local_world_size());
  req.set_batch(failed.batch() + 1);
  req.set_last(true);
  req.set_arena_id(failed.arena_id());
  req.set_identity(failed.identity());
  grpc::ClientContext ctx;
  internal::SetTimeout(&ctx, timeout);
  pb::RestoreResponse resp;
  (void)stub->Restore(&ctx, req, &resp);
}

}  // namespace

absl::StatusOr<RestoreIndex> Client::GetRestoreIndex(
    std::string_view checkpoint_id) {
  const std::string id(checkpoint_id);
  if (id.empty()) return absl::InvalidArgumentError("checkpoint_id is empty");
  RETURN_IF_ERROR(ValidateName("checkpoint_id", id, kMaxCheckpointIdBytes));
  if (!info_.restore) return NoRestoreService(options_.socket_path);
  pb::RestoreIndexRequest req;
  req.set_checkpoint_id(id);
  {
    // The arena tells the daemon who asks (its uid, from the kernel): the
    // index is served if that user may read the checkpoint.
    absl::MutexLock lock(&save_mu_);
    if (arena_ == nullptr) {
      RETURN_IF_ERROR(
          PrepareArena(internal::kArenaGranule, /*need_idle=*/false));
    }
    req.set_arena_id(arena_id_);
  }
  grpc::ClientContext ctx;
  internal::SetTimeout(&ctx, options_.rpc_timeout);
  pb::RestoreIndexResponse resp;
  RETURN_IF_ERROR(FromGrpc(rpc_->stub->GetRestoreIndex(&ctx, req, &resp)));
  RestoreIndex out;
  out.checkpoint_id = std::move(*resp.mutable_checkpoint_id());
  out.index_json = std::move(*resp.mutable_index_json());
  out.identity = std::move(*resp.mutable_identity());
  if (out.checkpoint_id.empty()) out.checkpoint_id = id;
  return out;
}

absl::StatusOr<RestoreStats> Client::Restore(
    std::string_view checkpoint_id, const RestoreOptions& options,
    absl::Span<const RestoreTensor> tensors,
    absl::Span<RestoreBytesItem> bytes_items) {
  const absl::Time start = absl::Now();
  const std::string id(checkpoint_id);
  const std::string context = absl::StrCat("restore of checkpoint ", id);
  // Local validation: nothing has been sent yet if this fails.
  if (id.empty()) return absl::InvalidArgumentError("checkpoint_id is empty");
  RETURN_IF_ERROR(ValidateName("checkpoint_id", id, kMaxCheckpointIdBytes));
  RETURN_IF_ERROR(Annotate(CheckOptions(options), context));
  if (!info_.restore) return NoRestoreService(options_.socket_path);
  auto wants = internal::ValidateRestoreTensors(tensors);
  if (!wants.ok()) return Annotate(wants.status(), context);
  RETURN_IF_ERROR(
      Annotate(internal::ValidateRestoreBytes(bytes_items), context));
  std::vector<uint64_t> capacity(bytes_items.size());
  std::vector<std::string> bytes_fqns(bytes_items.size());
  for (size_t i = 0; i < bytes_items.size(); ++i) {
    capacity[i] = bytes_items[i].nbytes;
    bytes_fqns[i] = bytes_items[i].fqn;
  }
  // The same limit for every rank of the node: the group's batches match.
  uint64_t limit = options.batch_bytes;
  if (info_.max_batch_bytes != 0) {
    limit = std::max(std::min(limit, info_.max_batch_bytes),
                     internal::kMinRestoreBatchBytes);
  }
  auto batches =
      internal::PlanRestoreBatches(*wants, capacity, bytes_fqns, limit);
  if (!batches.ok()) return Annotate(batches.status(), context);

  absl::MutexLock lock(&save_mu_);
  RETURN_IF_ERROR(Annotate(
      PrepareArena(internal::RestoreArenaBytes(*batches), /*need_idle=*/true),
      context));
  RestoreStats stats;
  const size_t n = batches->size();
  for (size_t b = 0; b < n; ++b) {
    const internal::RestoreBatch& batch = (*batches)[b];
    const pb::RestoreRequest req = RequestFor(id, options, arena_id_, tensors,
                                              *wants, bytes_items, batch, b, n);
    grpc::ClientContext ctx;
    internal::SetTimeout(&ctx, options_.rpc_timeout);
    pb::RestoreResponse resp;
    const absl::Status s = FromGrpc(rpc_->stub->Restore(&ctx, req, &resp));
    if (!s.ok()) {
      if (!req.last() && !options.group.empty() &&
          options.local_world_size > 1) {
        LeaveGroup(rpc_->stub.get(), req,
                   std::min(options_.control_timeout, absl::Seconds(2)));
      }
      return Annotate(
          s, n == 1 ? context
                    : absl::StrCat(context, " (batch ", b + 1, " of ", n, ")"));
    }
    internal::CopyBatchOut(tensors, *wants, batch, arena_->data(),
                           options_.copy_threads);
    for (const internal::RestorePiece& p : batch.boxes) stats.bytes += p.nbytes;
    RETURN_IF_ERROR(Annotate(
        TakeBytesItems(batch, resp, arena_->data(), bytes_items, &stats.bytes),
        context));
    stats.storage_bytes += resp.storage_bytes();
    stats.copied_bytes += resp.copied_bytes();
    stats.group_ranks = std::max(stats.group_ranks, resp.group_ranks());
    ++stats.batches;
  }
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

}  // namespace ckptd::client
