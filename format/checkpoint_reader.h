// Copyright 2026 The ckptd Authors.
//
// Reads a DCP checkpoint directory written by stock dcp.save or by ckptd,
// resharding into whatever chunks the caller asks for (dcp-format.md §5.3):
// each requested box is intersected with the saved chunks and only the byte
// ranges needed are read from the payloads (a small piece of a large
// contiguous chunk costs a small read).
#ifndef CKPTD_FORMAT_CHECKPOINT_READER_H_
#define CKPTD_FORMAT_CHECKPOINT_READER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/env.h"
#include "format/metadata.h"
#include "format/py_value.h"
#include "format/tensor_payload.h"

namespace ckptd::format {

// A writable strided destination (strides in elements; empty = C order).
struct TensorDest {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  char* data = nullptr;
};

// "Fill dest with the box [offsets, offsets + dest.sizes) of tensor fqn."
struct TensorRequest {
  std::string fqn;
  std::vector<int64_t> offsets;  // global offsets of the box (empty for 0-d)
  TensorDest dest;
};

// One overlap of a requested box with a saved chunk (DCP's ReadItem).
struct ReadItem {
  size_t request = 0;      // index into the requests
  size_t chunk = 0;        // index into the tensor's saved chunks
  std::vector<int64_t> dest_offsets;     // inside the requested box
  std::vector<int64_t> storage_offsets;  // inside the saved chunk
  std::vector<int64_t> lengths;
};

struct CheckpointReaderOptions {
  Env* env = Env::Default();
  uint64_t max_metadata_bytes = uint64_t{4} << 30;
  // Largest bounce buffer a single read uses.
  uint64_t max_read_block = uint64_t{16} << 20;
  // Largest bytes item ReadBytesItem will return.
  uint64_t max_bytes_item = uint64_t{1} << 30;
  // Threads each ReadTensors call reads with (the caller's included); the
  // work is split by (tensor, saved chunk). Values < 1 mean 1.
  int threads = 1;
};

struct ReadStats {
  uint64_t bytes_read = 0;     // from files
  uint64_t bytes_copied = 0;   // into destinations
  uint64_t read_calls = 0;
};

class CheckpointReader {
 public:
  // Reads and validates `.metadata` (chunks in bounds, non-overlapping).
  // NOT_FOUND if the directory has no `.metadata`; UNIMPLEMENTED for
  // rank-local checkpoints (__{r}.metadata only).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& dir, const CheckpointReaderOptions& options = {});

  const Metadata& metadata() const { return metadata_; }
  const std::string& dir() const { return dir_; }

  // The read plan for `requests` (§5.3). Errors: unknown fqn, bytes item
  // asked as a tensor, box outside the tensor, rank mismatch, or a region of
  // a request that no saved chunk covers.
  absl::StatusOr<std::vector<ReadItem>> PlanReads(
      absl::Span<const TensorRequest> requests) const;

  // Plans and fills every request. Destination dtype must equal the saved
  // payload dtype. Reads with options.threads threads; on failure the first
  // error is returned (the other threads stop at their next chunk) and some
  // destinations may have been partly written. Thread-safe: several calls
  // may run on one reader at once (requests must not share destinations).
  absl::Status ReadTensors(absl::Span<const TensorRequest> requests,
                           ReadStats* stats = nullptr);
  // ReadTensors with the plan already made: `items` must be what
  // PlanReads(requests) returned (for callers that inspect the plan's
  // errors themselves without planning twice).
  absl::Status ReadPlanned(absl::Span<const TensorRequest> requests,
                           absl::Span<const ReadItem> items, ReadStats* stats = nullptr);

  // The raw payload of a bytes item (a torch.save archive).
  absl::StatusOr<std::string> ReadBytesItem(std::string_view fqn);
  // The value of a bytes item holding plain Python values.
  absl::StatusOr<PyValue> ReadObject(std::string_view fqn);

  // The storage location of a saved chunk / bytes item.
  absl::StatusOr<const StorageInfo*> Locate(const StorageKey& key) const;
  // Opens the file of a storage entry (cached; thread-safe).
  absl::StatusOr<const RandomAccessFile*> OpenFile(const std::string& relative_path);

 private:
  CheckpointReader(std::string dir, CheckpointReaderOptions options)
      : dir_(std::move(dir)), options_(options) {}
  absl::Status ReadChunkItems(const TensorStorageMetadata& tmd,
                              const std::string& fqn, size_t chunk,
                              absl::Span<const ReadItem* const> items,
                              absl::Span<const TensorRequest> requests,
                              ReadStats* stats);

  const std::string dir_;
  const CheckpointReaderOptions options_;
  Metadata metadata_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<RandomAccessFile>> files_
      ABSL_GUARDED_BY(mu_);
};

// True for paths that must not be followed (absolute, "..", empty): a
// relative_path in storage_data must stay inside the checkpoint directory.
bool IsSafeRelativePath(std::string_view path);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_CHECKPOINT_READER_H_
