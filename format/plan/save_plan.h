// Copyright 2026 The ckptd Authors.
//
// The save planner: pure (no I/O) global planning of a DCP save, as stock
// DefaultSavePlanner + FileSystemWriter do it (dcp-format.md §1, §4.2–4.4):
//   1. dedup of replicated items across ranks by DCP's load-balanced rule,
//   2. validation of the global plan (in bounds, non-overlapping, covering)
//      in O(n log n),
//   3. assignment of each rank's surviving items to __{rank}_{k}.distcp files,
//   4. the Metadata skeleton (state_dict_metadata with index-hint order,
//      planner_data) that the commit completes with storage_data.
#ifndef CKPTD_FORMAT_PLAN_SAVE_PLAN_H_
#define CKPTD_FORMAT_PLAN_SAVE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "format/tensor/dtype.h"
#include "format/metadata/metadata.h"

namespace ckptd::format {

class CompactMetadata;

// One item a rank contributes, described without its bytes (the planner does
// not need them). Mirrors DCP's WriteItem.
struct ItemDesc {
  enum class Type : uint8_t { kTensor, kBytes };
  std::string fqn;
  Type type = Type::kTensor;
  // Tensor items: dtype, global shape and this chunk's box, as Dims (up to
  // 2 dimensions inline), so that a decoded item needs no heap block: a
  // plan round of 2 million items makes 6 million fewer allocations.
  DType dtype = DType::kFloat32;
  Dims global_shape;
  Dims chunk_offsets;
  Dims chunk_sizes;
  // planner_data path (dict keys / list indices); empty means {fqn}.
  std::vector<PathElement> path;

  // Bytes the dedup rule charges: numel * element size, or 1 for bytes items.
  uint64_t DedupWeight() const;
  StorageKey Key() const;
};

struct PlanOptions {
  // DefaultSavePlanner(dedup_save_to_lowest_rank=True): replicated items go
  // to the lowest rank holding them instead of the least-loaded one.
  bool dedup_save_to_lowest_rank = false;
  // FileSystemWriter(thread_count=T): files per rank, items bucketed as
  // stock does (bytes round-robin, tensors largest-first to the lightest).
  int files_per_rank = 1;
  // Require the chunks of every tensor to cover it exactly (stock checks
  // this whenever more than one rank plans).
  bool require_full_coverage = true;
  // Limits that turn absurd requests into errors, not allocations.
  uint64_t max_items = uint64_t{1} << 26;
  int max_ndim = 64;
};

// Where one surviving item goes.
struct PlannedItem {
  int rank = 0;           // the rank whose data is written
  size_t item_index = 0;  // index into that rank's ItemDesc list
  int file_index = 0;     // k of __{rank}_{k}.distcp
};

struct PlannedFile {
  std::string relative_path;  // "__3_0.distcp"
  int rank = 0;
  std::vector<size_t> items;  // indices into SavePlan::items, in write
                              // order: bytes items first, then tensors
};

struct SavePlan {
  std::vector<PlannedItem>
      items;  // surviving items, rank order then item order
  std::vector<PlannedFile> files;  // rank order, then k
  // state_dict_metadata (chunks in index-hint order) and planner_data;
  // storage_data is empty until the files are written.
  Metadata metadata;
  // For each surviving item, the index of its chunk in its tensor's chunk
  // list (its MetadataIndex.index hint); -1 for bytes items.
  std::vector<int64_t> chunk_index;
};

// Plans a save of `ranks` (ranks[r] = rank r's items, in its order).
// Errors (INVALID_ARGUMENT) name the fqn and chunk: "model.w: chunk
// [0:4, 0:6] of rank 1 overlaps chunk [2:6, 0:6] of rank 0". A plan of
// 2^18 chunks or more validates its tensors on up to 4 threads (the
// caller's included); the plan and the error are those of one thread.
absl::StatusOr<SavePlan> PlanSave(absl::Span<const std::vector<ItemDesc>> ranks,
                                  const PlanOptions& options = {});

// Validates one tensor's chunks against its global shape: every chunk has
// the tensor's rank, lies in bounds, no two overlap, and (if
// require_full_coverage) their volumes add up to the tensor's. O(n log n)
// for the usual one-dimensional shardings.
absl::Status ValidateChunks(std::string_view fqn,
                            absl::Span<const int64_t> global_shape,
                            absl::Span<const ChunkStorageMetadata> chunks,
                            bool require_full_coverage);

// The same for tensor item `item` of a CompactMetadata.
absl::Status ValidateChunks(const CompactMetadata& md, size_t item,
                            bool require_full_coverage);

// "[0:2, 0:6]" rendering of a box.
std::string DescribeBox(absl::Span<const int64_t> offsets,
                        absl::Span<const int64_t> sizes);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_PLAN_SAVE_PLAN_H_
