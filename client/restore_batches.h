// Copyright 2026 The ckptd Authors.
//
// Internal to libckptd_client (not installed): the pure parts of
// Client::Restore — local validation of the destinations, the split of a
// rank's wants into Restore batches (boxes C-order contiguous in the arena,
// bytes items beside them) and the copy of a batch out of the arena into
// the caller's (possibly strided) destinations. No gRPC here, so tests can
// exercise all of it without a daemon.
//
// The plan depends only on the wants and the batch limit — never on the
// arena's current size — so the local ranks of one restore group that want
// the same boxes send identical batches, which the daemon serves with one
// read of each byte range (daemon.proto, Restore).
#ifndef CKPTD_CLIENT_RESTORE_BATCHES_H_
#define CKPTD_CLIENT_RESTORE_BATCHES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/ckptd_client.h"

namespace ckptd::client::internal {

// Box and bytes-item starts in the arena are multiples of this.
inline constexpr uint64_t kRestoreAlignment = 64;
// The smallest batch limit (every element type fits; a box of larger
// elements than this does not exist).
inline constexpr uint64_t kMinRestoreBatchBytes = 64;
// Largest serialized size of the box and bytes-item descriptions of one
// batch (estimated; the gRPC message limit is 64 MiB).
inline constexpr uint64_t kMaxRestoreRequestBytes = uint64_t{16} << 20;

// A destination after local validation.
struct RestoreWant {
  std::string dtype;           // canonical torch name ("float32")
  size_t elem_size = 1;        // bytes per element
  uint64_t nbytes = 0;         // numel(sizes) * elem_size
  std::vector<int64_t> sizes;  // the destination box
  // Element strides of the destination (C order when the caller gave none).
  std::vector<int64_t> strides;
  uint64_t request_bytes = 0;  // estimate of one box's size in a request
};

// Validates what is cheap to check locally: fqn (non-empty, <= 4096
// bytes), dtype known, offsets/sizes/strides of equal length (<= 64),
// values non-negative, byte counts without overflow, data non-null when
// there are elements. INVALID_ARGUMENT naming the index and fqn otherwise.
// Whether the box lies inside the saved tensor is the daemon's check.
absl::StatusOr<std::vector<RestoreWant>> ValidateRestoreTensors(
    absl::Span<const RestoreTensor> tensors);

// Validates the bytes items (fqn non-empty, <= 4096 bytes).
absl::Status ValidateRestoreBytes(absl::Span<const RestoreBytesItem> items);

// A sub-box [offsets, offsets + sizes) of a destination box (offsets
// relative to the destination's first element).
struct SubBox {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;

  friend bool operator==(const SubBox&, const SubBox&) = default;
};

// Splits a box of `sizes` (elements of `elem_size` bytes) into sub-boxes of
// at most `limit` bytes, in C order: a box that fits is returned whole;
// otherwise it is cut along its first dimension of size > 1 into runs of as
// many rows as fit, and a row that alone exceeds `limit` is cut the same
// way along its later dimensions. Empty and 0-d boxes are one sub-box.
// REQUIRES: limit >= elem_size.
std::vector<SubBox> SplitBox(absl::Span<const int64_t> sizes, size_t elem_size,
                             uint64_t limit);

// One box of a Restore call: sub-box `box` of destination `tensor`, C-order
// contiguous at [arena_offset, arena_offset + nbytes) of the arena.
struct RestorePiece {
  uint32_t tensor = 0;
  SubBox box;
  uint64_t nbytes = 0;
  uint64_t arena_offset = 0;

  friend bool operator==(const RestorePiece&, const RestorePiece&) = default;
};

// A bytes item of a Restore call, at [arena_offset, arena_offset +
// capacity).
struct RestoreBytesSlot {
  uint32_t item = 0;
  uint64_t capacity = 0;
  uint64_t arena_offset = 0;

  friend bool operator==(const RestoreBytesSlot&,
                         const RestoreBytesSlot&) = default;
};

// What one Restore call asks for.
struct RestoreBatch {
  std::vector<RestorePiece> boxes;
  std::vector<RestoreBytesSlot> bytes_items;
  uint64_t bytes = 0;      // sum of box nbytes and bytes capacities
  uint64_t arena_end = 0;  // max(arena_offset + length): arena bytes used

  friend bool operator==(const RestoreBatch&, const RestoreBatch&) = default;
};

// Packs the destinations (split with SplitBox where larger than
// `batch_bytes`), then the bytes items of `bytes_capacity` bytes, in order,
// into batches of at most `batch_bytes` arena bytes, each start aligned to
// `alignment`; a batch also closes before its descriptions exceed
// `max_request_bytes` (RestoreWant::request_bytes; a bytes item counts its
// fqn plus 32). Boxes without elements are sent too (the daemon checks
// them) and take no space. A bytes item larger than `batch_bytes` is a
// batch of its own. Always returns at least one batch (an empty one when
// there is nothing to restore).
// INVALID_ARGUMENT: batch_bytes below kMinRestoreBatchBytes, alignment not
// a power of two, more than 2^32-1 destinations or bytes items.
absl::StatusOr<std::vector<RestoreBatch>> PlanRestoreBatches(
    absl::Span<const RestoreWant> wants,
    absl::Span<const uint64_t> bytes_capacity,
    absl::Span<const std::string> bytes_fqns, uint64_t batch_bytes,
    uint64_t alignment = kRestoreAlignment,
    uint64_t max_request_bytes = kMaxRestoreRequestBytes);

// Moves the odd batches into a second region of the arena, after the
// largest batch (rounded up to kRestoreAlignment), so that batch b+1 can be
// filled while batch b is copied out.
void AlternateArenaHalves(std::vector<RestoreBatch>& batches);

// Arena bytes the batches need (the largest arena_end), rounded up to
// kArenaGranule (batching.h), at least kArenaGranule.
uint64_t RestoreArenaBytes(absl::Span<const RestoreBatch> batches);

// Copies every box of `batch` from `arena` into its destination (strided
// scatter) with `threads` threads (the caller's included).
void CopyBatchOut(absl::Span<const RestoreTensor> tensors,
                  absl::Span<const RestoreWant> wants,
                  const RestoreBatch& batch, const char* arena, int threads);

}  // namespace ckptd::client::internal

#endif  // CKPTD_CLIENT_RESTORE_BATCHES_H_
