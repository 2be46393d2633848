// Copyright 2026 The ckptd Authors.
#include "daemon/service/restore_codec.h"

#include <limits>
#include <string>
#include <string_view>

#include "fmt/format.h"
#include "format/tensor/dtype.h"
#include "proto/item_codec.h"

namespace ckptd::daemon {
namespace {

namespace pb = ::ckptd::v1;

absl::StatusOr<RestoreBox> DecodeBox(const pb::RestoreBox& in, int i) {
  auto bad = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        fmt::format("box {} ('{}'): {}", i, in.fqn().substr(0, 200), what));
  };
  RestoreBox b;
  if (in.fqn().size() > kMaxFqnBytes) {
    return bad(fmt::format("fqn longer than {} bytes", kMaxFqnBytes));
  }
  b.fqn = in.fqn();
  std::string_view name = in.dtype();
  if (name.substr(0, 6) == "torch.") name.remove_prefix(6);
  absl::StatusOr<format::DType> dt = format::DTypeFromName(name);
  if (!dt.ok()) return bad(fmt::format("unknown dtype '{}'", in.dtype()));
  b.dtype = *dt;
  if (in.sizes_size() > kMaxItemDims || in.offsets_size() != in.sizes_size()) {
    return bad(fmt::format(
        "{} offsets and {} sizes (one each per dimension, at most {})",
        in.offsets_size(), in.sizes_size(), kMaxItemDims));
  }
  b.offsets.assign(in.offsets().begin(), in.offsets().end());
  b.sizes.assign(in.sizes().begin(), in.sizes().end());
  const uint64_t elem = format::ElementSize(b.dtype);
  uint64_t numel = 1;
  for (size_t d = 0; d < b.sizes.size(); ++d) {
    if (b.offsets[d] < 0 || b.sizes[d] < 0) {
      return bad("negative offset or size");
    }
    const uint64_t s = static_cast<uint64_t>(b.sizes[d]);
    if (s != 0 &&
        numel > (std::numeric_limits<uint64_t>::max() / 2) / s / elem) {
      return bad("box too large");
    }
    numel *= s;
  }
  b.nbytes = numel * elem;
  b.arena_offset = in.arena_offset();
  return b;
}

}  // namespace

absl::StatusOr<RestoreBatch> DecodeRestore(const pb::RestoreRequest& req) {
  RestoreBatch b;
  b.checkpoint_id = req.checkpoint_id();
  if (b.checkpoint_id.size() > 4096) {
    return absl::InvalidArgumentError(
        "checkpoint_id is longer than 4096 bytes");
  }
  if (req.group().size() > 1024) {
    return absl::InvalidArgumentError("group is longer than 1024 bytes");
  }
  b.group = req.group();
  if (req.local_world_size() < 1 ||
      req.local_world_size() > kMaxLocalWorldSize || req.local_rank() < 0 ||
      req.local_rank() >= req.local_world_size()) {
    return absl::InvalidArgumentError(fmt::format(
        "local_rank {} / local_world_size {}: need 0 <= local_rank < "
        "local_world_size <= {}",
        req.local_rank(), req.local_world_size(), kMaxLocalWorldSize));
  }
  b.local_rank = req.local_rank();
  b.local_world_size = req.local_world_size();
  b.batch = req.batch();
  b.last = req.last();
  b.arena_id = req.arena_id();
  b.verify_crc = !req.skip_crc();
  if (req.identity().size() > 256) {
    return absl::InvalidArgumentError("identity is longer than 256 bytes");
  }
  b.identity = req.identity();
  b.accept_group_buffer = req.accept_group_buffer();
  b.accept_held_buffers = req.accept_held_buffers();
  if (req.boxes_size() > kMaxRestoreBoxes ||
      req.bytes_items_size() > kMaxRestoreBytesItems) {
    return absl::InvalidArgumentError(fmt::format(
        "{} boxes and {} bytes items in one batch; the limits are {} and {}",
        req.boxes_size(), req.bytes_items_size(), kMaxRestoreBoxes,
        kMaxRestoreBytesItems));
  }
  b.boxes.reserve(req.boxes_size());
  for (int i = 0; i < req.boxes_size(); ++i) {
    absl::StatusOr<RestoreBox> box = DecodeBox(req.boxes(i), i);
    if (!box.ok()) return box.status();
    b.boxes.push_back(*std::move(box));
  }
  for (const pb::RestoreBytes& in : req.bytes_items()) {
    if (in.fqn().size() > kMaxFqnBytes) {
      return absl::InvalidArgumentError(
          fmt::format("bytes item fqn longer than {} bytes", kMaxFqnBytes));
    }
    b.bytes_items.push_back({in.fqn(), in.arena_offset(), in.capacity()});
  }
  return b;
}

void RestoreReplyToProto(const RestoreReply& in, pb::RestoreResponse* out) {
  for (uint64_t n : in.bytes_lengths) out->add_bytes_lengths(n);
  out->set_storage_bytes(in.storage_bytes);
  out->set_copied_bytes(in.copied_bytes);
  out->set_group_ranks(in.group_ranks);
  out->set_group_buffer_token(in.group_buffer_token);
  out->set_group_buffer_size(in.group_buffer_size);
  for (uint64_t off : in.box_buffer_offsets) out->add_box_buffer_offsets(off);
  for (const RestoreReply::Held& h : in.held_buffers) {
    pb::HeldBuffer* b = out->add_held_buffers();
    b->set_token(h.token);
    b->set_size(h.size);
  }
  for (uint32_t b : in.box_buffers) out->add_box_buffers(b);
}

void RestoreProgressToProto(const RestoreProgressInfo& in,
                            pb::RestoreProgress* out) {
  out->set_id(in.id);
  out->set_checkpoint_id(in.dir);
  out->set_group(in.group);
  out->set_uid(in.uid);
  out->set_local_world_size(in.local_world_size);
  out->set_state(in.state);
  out->set_started_unix_ms(absl::ToUnixMillis(in.started));
  out->set_last_active_unix_ms(absl::ToUnixMillis(in.last_active));
  out->set_batches(in.batches);
  out->set_copied_bytes(in.copied_bytes);
  out->set_storage_bytes(in.storage_bytes);
  out->set_peer_bytes(in.peer_bytes);
  out->set_ranks_done(in.ranks_done);
  out->set_error(in.error);
}

}  // namespace ckptd::daemon
