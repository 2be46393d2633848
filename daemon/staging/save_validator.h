// Copyright 2026 The ckptd Authors.
//
// The save validator: every check a Save call must pass before the daemon
// takes any of its bytes, as pure functions (no I/O, no locks, no clock).
// The orchestrator calls them in this order:
//
//   ValidateSaveHeader   world size, rank, names
//   ValidateCluster      the node's ranks of a multi-node checkpoint
//   ValidateIndex        sequence 0: the rank's items → RankIndex
//   ValidateCudaBuffers  the batch's CUDA buffers (handles, devices)
//   ValidateExtents      the batch's extents against the rank's cursor, its
//                        arena and its CUDA buffers → ValidatedBatch
//   CheckComplete        a last batch leaves no item short
//
// Each returns INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for a limit) with a
// message naming the rank, the item and what was expected. Takes: the
// decoded SaveBatch (save_types.h) and the rank's state; hands on: RankIndex
// and ValidatedBatch. Thread-safe (pure).
#ifndef CKPTD_DAEMON_STAGING_SAVE_VALIDATOR_H_
#define CKPTD_DAEMON_STAGING_SAVE_VALIDATOR_H_

#include <cstdint>
#include <functional>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "daemon/types/save_types.h"
#include "shm/mapping.h"

namespace ckptd::daemon {

struct SaveValidatorOptions {
  int max_world_size = 1 << 16;
  uint32_t max_items = 1u << 20;  // per rank
  uint64_t max_batch = uint64_t{2} << 30;
  size_t max_cuda_buffers = 4096;  // per Save (daemon.proto)
  size_t cuda_ipc_handle_size = 64;
};

// world_size in [1, max_world_size], rank in [0, world_size), checkpoint id
// and job valid names (common/names.h).
absl::Status ValidateSaveHeader(const SaveBatch& batch,
                                const SaveValidatorOptions& options);

// The ranks this daemon saves for: all of them (single-node), or the node's
// cluster.local_ranks (distinct, ascending, in range) of a multi-node
// checkpoint; `multi` tells which.
struct LocalRanks {
  std::vector<int> ranks;
  bool multi = false;
};
absl::StatusOr<LocalRanks> ValidateCluster(const ClusterSpec& cluster,
                                           int world_size);

// Sequence 0: the rank's items. Takes them out of `batch`.
absl::StatusOr<RankIndex> ValidateIndex(SaveBatch& batch,
                                        const SaveValidatorOptions& options);

// The batch's CUDA buffers: at most max_cuda_buffers, 64-byte handles,
// non-empty, on a device `device_index` knows (the daemon's own GPUs).
absl::Status ValidateCudaBuffers(
    int rank, absl::Span<const CudaBufferDesc> buffers,
    const std::function<absl::StatusOr<int>(std::string_view)>& device_index,
    const SaveValidatorOptions& options);

// The batch's extents, in strict index order from `cursor`: each within
// its item, within the arena (`arena`: the batch's mapped arena, checked by
// shm::Mapping::Slice; null when the batch names none) or within its CUDA
// buffer's claimed size. The
// extents' `arena` fields are left for the caller to attach.
absl::StatusOr<ValidatedBatch> ValidateExtents(
    int rank, const RankIndex& index, ExtentCursor cursor,
    absl::Span<const ExtentRef> extents, const shm::Mapping* arena,
    absl::Span<const CudaBufferDesc> cuda_buffers,
    const SaveValidatorOptions& options);

// A rank's last batch: every item has all its bytes once `cursor` is
// reached.
absl::Status CheckComplete(int rank, const RankIndex& index,
                           ExtentCursor cursor);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_STAGING_SAVE_VALIDATOR_H_
