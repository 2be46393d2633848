// Copyright 2026 The ckptd Authors.
//
// The rank writer: streams one rank's items into its data file
// __{rank}_0.distcp, in the rank's index order, as they arrive from
// staging — each tensor as a torch.save archive (format/
// tensor_record_writer.h), each bytes item as the archive the client
// made (checked like `verify` checks it before it can be committed). Items
// the plan gave to another rank (dedup) are consumed without being
// written. Step 2 of docs/durability.md: once the rank's last item is in,
// the file is fsynced and closed. With options.zstd_level each item's
// payload is compressed as it streams (one zstd frame per item).
//
// Takes: the rank's RankIndex and RankFilePlan (plan/), and StagedExtents
// in index order (staging/); hands on: RankWriteResult (commit/).
//
// Thread-compatible: one writer task at a time drives a RankWriter (the
// orchestrator's per-rank `busy` flag). `index` and `plan` must outlive it
// and stay unchanged.
#ifndef CKPTD_DAEMON_WRITE_RANK_WRITER_H_
#define CKPTD_DAEMON_WRITE_RANK_WRITER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "common/env.h"
#include "common/rate_limiter.h"
#include "daemon/tier/memory_tier.h"
#include "daemon/types/save_types.h"
#include "format/tensor/tensor_record_writer.h"

namespace ckptd::daemon {

struct RankWriterOptions {
  Env* env = nullptr;
  bool fsync = true;
  RateLimiter* limiter = nullptr;  // null: unlimited
  // Bytes appended between two checks of the abort flag and two grants of
  // the rate limiter.
  uint64_t piece_bytes = uint64_t{8} << 20;
  // SaveOptions.compression "zstd": each item's payload is one zstd frame
  // (format::ZstdWritableFile) at this level, and its storage_data names
  // the "stream.zstd/1" transform, as FileSystemWriter(_extensions=
  // [ZStandard()]) writes. 0: uncompressed.
  int zstd_level = 0;
  // The memory tier's capture of the checkpoint (not owned; null: none):
  // the data file's bytes are also kept there as they are written.
  TierCapture* capture = nullptr;
};

class RankWriter {
 public:
  // The rank's file is `io_dir`/plan->relative_path (io_dir: the
  // checkpoint directory's fd-anchored path, commit/checkpoint_dir.h).
  RankWriter(RankWriterOptions options, int rank, const RankIndex* index,
             const RankFilePlan* plan, const std::string& io_dir);
  RankWriter(const RankWriter&) = delete;
  RankWriter& operator=(const RankWriter&) = delete;

  // Appends the extent, which must be the rank's next bytes in index order
  // (INTERNAL otherwise). Stops with CANCELLED between pieces once
  // `aborted` is true; `progress` counts payload bytes as they go out.
  absl::Status Consume(const StagedExtent& extent,
                       const std::atomic<bool>& aborted,
                       std::atomic<uint64_t>& progress);
  // Writes the items at the cursor that need no bytes (empty tensors) and,
  // once every item is done, fsyncs (if options.fsync) and closes the file.
  // Call after the rank's last extent was consumed.
  absl::Status Advance();

  bool finished() const { return finished_; }
  // Bytes in the data file so far (0: none created).
  uint64_t file_size() const { return file_ ? file_->Size() : 0; }
  // Where the written items landed. REQUIRES: finished().
  RankWriteResult TakeResult();
  // After a failure or cancel: closes the file without a status and returns
  // its path if this writer created it (the caller removes it).
  std::optional<std::string> Abandon();

 private:
  absl::Status OpenFile();
  absl::Status BeginItem(const format::ItemDesc& item, uint64_t nbytes);
  absl::Status AppendPiece(const format::ItemDesc& item, uint64_t nbytes,
                           std::string_view bytes);
  absl::Status EndItem(int64_t plan_item, const format::ItemDesc& item,
                       uint64_t nbytes);

  const RankWriterOptions options_;
  const int rank_;
  const RankIndex* const index_;
  const RankFilePlan* const plan_;
  const std::string path_;
  std::unique_ptr<WritableFile> file_;
  bool created_ = false;
  // Cursor: the item and offset the next extent must start at.
  uint32_t cur_item_ = 0;
  uint64_t cur_offset_ = 0;
  std::unique_ptr<format::TorchSaveStream> zip_;  // the tensor being written
  // zstd_level: the item's compressed stream into file_ (null otherwise);
  // out() is what the item's bytes go to.
  std::unique_ptr<WritableFile> zstd_;
  WritableFile* out() const { return zstd_ ? zstd_.get() : file_.get(); }
  uint64_t item_start_ = 0;
  std::string bytes_item_;  // the bytes item at the cursor, for its check
  bool finished_ = false;
  RankWriteResult result_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_WRITE_RANK_WRITER_H_
