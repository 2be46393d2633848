// Copyright 2026 The ckptd Authors.
//
// Writes a complete DCP checkpoint directory from per-rank items held in
// memory: plan (save_plan.h) → serialize each item as a torch.save archive →
// __{rank}_{k}.distcp files → .metadata, following the durability protocol in
// checkpoint_writer.cc. Stock torch.distributed.checkpoint.load reads the
// result (dcp-format.md §9.1).
#ifndef CKPTD_FORMAT_CHECKPOINT_CHECKPOINT_WRITER_H_
#define CKPTD_FORMAT_CHECKPOINT_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/env.h"
#include "format/metadata/metadata.h"
#include "format/plan/save_plan.h"
#include "format/tensor/tensor_payload.h"

namespace ckptd::format {

// One item with its bytes. The memory must stay valid during the write.
struct WriteItem {
  ItemDesc desc;
  // kTensor: the chunk's data; sizes must equal desc.chunk_sizes and dtype
  // desc.dtype. May be strided (it is gathered to C order while written).
  TensorView tensor;
  // kBytes: the complete payload, normally a torch.save archive of the value
  // (EncodeTorchSaveObject, or Python's torch.save(obj)).
  std::string_view bytes;
};

struct CheckpointWriterOptions {
  Env* env = Env::Default();
  PlanOptions plan;
  // If `.metadata` already exists: false → FAILED_PRECONDITION; true → the
  // old commit marker is removed (durably) before any data file is written.
  bool overwrite = false;
  // fsync data files, .metadata and the directory (turn off only in tests).
  bool sync = true;
  // Files written concurrently.
  int io_threads = 2;
  EncodeOptions metadata_encoding;
  // Recorded in StorageMeta when metadata_encoding.write_storage_meta.
  std::string save_id;
};

struct WriteResult {
  Metadata metadata;        // as written to .metadata
  uint64_t data_bytes = 0;  // bytes in all .distcp files
  uint64_t metadata_bytes = 0;
  size_t files = 0;
};

// Plans, writes and commits. On error nothing is committed (no .metadata),
// the data files this call created are removed, and the error names the
// file and step ("fsync /ckpt/__1_0.distcp: Input/output error").
absl::StatusOr<WriteResult> WriteCheckpoint(
    const std::string& dir, absl::Span<const std::vector<WriteItem>> ranks,
    const CheckpointWriterOptions& options = {});

// The pieces, for callers that stage and write on their own (the daemon).

// Serializes `item` as a torch.save archive and appends it to `file`;
// returns its location. `scratch` holds gathered data of strided tensors.
absl::StatusOr<StorageInfo> AppendItem(WritableFile* file,
                                       const std::string& relative_path,
                                       const WriteItem& item,
                                       std::string* scratch);

// Checks that an item's data agrees with its description (dtype, sizes,
// strides non-negative, data present) and returns a precise error if not.
absl::Status ValidateWriteItem(const WriteItem& item);

// storage_data (dcp-format.md §4.5), the one assembly for every writer:
// for the plan items `order` (indices into plan.items, in the order the
// entries are to appear), key = desc(item).Key(), location = infos[p]
// (moved out). WriteCheckpoint passes FileWriteOrder(plan); the daemon,
// whose rank files hold items in index order, the plan order 0..n-1.
void AppendStorageData(
    const SavePlan& plan,
    absl::FunctionRef<const ItemDesc&(const PlannedItem&)> desc,
    absl::Span<const size_t> order, absl::Span<StorageInfo> infos,
    Metadata* metadata);
// plan.files' items concatenated: the order WriteCheckpoint writes them.
std::vector<size_t> FileWriteOrder(const SavePlan& plan);

// Encodes `metadata` and publishes it (commit_protocol.h steps 4–6).
absl::StatusOr<uint64_t> CommitMetadata(Env* env, const std::string& dir,
                                        Metadata* metadata,
                                        const EncodeOptions& encoding);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_CHECKPOINT_CHECKPOINT_WRITER_H_
