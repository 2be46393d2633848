// Copyright 2026 The ckptd Authors.
#include "daemon/write/rank_writer.h"

#include <algorithm>
#include <utility>

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/tensor/bytes_item.h"
#include "format/tensor/payload_transform.h"
#include "format/tensor/tensor_payload.h"

namespace ckptd::daemon {

using format::ItemDesc;

RankWriter::RankWriter(RankWriterOptions options, int rank,
                       const RankIndex* index, const RankFilePlan* plan,
                       const std::string& io_dir)
    : options_(options),
      rank_(rank),
      index_(index),
      plan_(plan),
      path_(plan->relative_path.empty()
                ? ""
                : JoinPath(io_dir, plan->relative_path)) {}

absl::Status RankWriter::OpenFile() {
  if (file_) return absl::OkStatus();
  if (plan_->relative_path.empty()) {
    return absl::InternalError(
        fmt::format("rank {} has surviving items but no file", rank_));
  }
  ASSIGN_OR_RETURN(file_, options_.env->NewWritableFile(path_));
  created_ = true;
  if (options_.capture != nullptr) {
    file_ = options_.capture->Tee(plan_->relative_path, std::move(file_));
  }
  return absl::OkStatus();
}

absl::Status RankWriter::BeginItem(const ItemDesc& it, uint64_t nbytes) {
  RETURN_IF_ERROR(OpenFile());
  item_start_ = file_->Size();
  if (options_.zstd_level != 0) {
    ASSIGN_OR_RETURN(zstd_, format::ZstdWritableFile::Create(
                                file_.get(), options_.zstd_level));
  }
  if (it.type != ItemDesc::Type::kTensor) return absl::OkStatus();
  zip_ = std::make_unique<format::TorchSaveStream>(out());
  RETURN_IF_ERROR(
      zip_->Begin(format::TensorDataPickle(it.dtype, it.chunk_sizes)));
  return zip_->BeginStorage("0", nbytes);
}

absl::Status RankWriter::AppendPiece(const ItemDesc& it, uint64_t nbytes,
                                     std::string_view bytes) {
  if (zip_) return zip_->Append(bytes);
  RETURN_IF_ERROR(out()->Append(bytes));
  // A bytes item is gathered for its check: whole up to kMaxBytesItemParse,
  // else its first 64 KiB (framing only).
  const uint64_t at = cur_offset_;  // of this piece's first byte, see Consume
  if (nbytes <= format::kMaxBytesItemParse) {
    bytes_item_.append(bytes);
  } else if (at < format::kBytesItemFramingPrefix) {
    bytes_item_.append(bytes.substr(
        0, std::min<uint64_t>(bytes.size(),
                              format::kBytesItemFramingPrefix - at)));
  }
  return absl::OkStatus();
}

absl::Status RankWriter::EndItem(int64_t plan_item, const ItemDesc& it,
                                 uint64_t nbytes) {
  if (it.type == ItemDesc::Type::kBytes) {
    std::string data = std::move(bytes_item_);
    bytes_item_.clear();
    RETURN_IF_ERROR(
        format::CheckBytesItemInMemory(it.fqn, std::move(data), nbytes));
  }
  if (zip_) {
    RETURN_IF_ERROR(zip_->EndStorage());
    RETURN_IF_ERROR(zip_->Finish());
    zip_.reset();
  }
  std::vector<std::string> transforms;
  if (zstd_) {
    RETURN_IF_ERROR(zstd_->Close());
    zstd_.reset();
    transforms.emplace_back(format::kZstdDescriptor);
  }
  result_.items.emplace_back(
      plan_item,
      format::StorageInfo{plan_->relative_path, item_start_,
                          file_->Size() - item_start_, std::move(transforms)});
  return absl::OkStatus();
}

absl::Status RankWriter::Advance() {
  const uint32_t n = index_->items.size();
  while (cur_item_ < n && cur_offset_ == 0 && index_->nbytes[cur_item_] == 0) {
    const int64_t p = plan_->plan_index[cur_item_];
    if (p >= 0) {
      // An empty tensor: a complete archive without payload bytes.
      const ItemDesc& it = index_->items[cur_item_];
      RETURN_IF_ERROR(BeginItem(it, 0));
      RETURN_IF_ERROR(EndItem(p, it, 0));
    }
    ++cur_item_;
  }
  if (cur_item_ == n && !finished_) {
    // Step 2: the rank's file is complete: fsync and close it.
    if (!plan_->relative_path.empty()) {
      RETURN_IF_ERROR(OpenFile());  // a rank whose items all moved elsewhere
      if (options_.fsync) RETURN_IF_ERROR(file_->Sync());
      RETURN_IF_ERROR(file_->Close());
      result_.file_bytes = file_->Size();
    }
    finished_ = true;
  }
  return absl::OkStatus();
}

absl::Status RankWriter::Consume(const StagedExtent& e,
                                 const std::atomic<bool>& aborted,
                                 std::atomic<uint64_t>& progress) {
  RETURN_IF_ERROR(Advance());
  if (cur_item_ != e.item || cur_offset_ != e.item_offset) {
    return absl::InternalError(
        fmt::format("rank {}: writer at item {} offset {}, extent at {} {}",
                    rank_, cur_item_, cur_offset_, e.item, e.item_offset));
  }
  const int64_t p = plan_->plan_index[e.item];
  const ItemDesc& it = index_->items[e.item];
  const uint64_t nb = index_->nbytes[e.item];
  if (p >= 0) {
    if (cur_offset_ == 0) RETURN_IF_ERROR(BeginItem(it, nb));
    // In pieces, so that a cancel or failure stops the writer promptly and
    // the rate limit is smooth.
    const uint64_t start = cur_offset_;
    for (uint64_t done = 0; done < e.length;) {
      if (aborted.load(std::memory_order_relaxed)) {
        return absl::CancelledError("checkpoint aborted while writing");
      }
      const uint64_t n = std::min(options_.piece_bytes, e.length - done);
      if (options_.limiter != nullptr) options_.limiter->Acquire(n, aborted);
      cur_offset_ = start + done;
      RETURN_IF_ERROR(AppendPiece(it, nb, std::string_view(e.data + done, n)));
      done += n;
      progress.fetch_add(n, std::memory_order_relaxed);
    }
    cur_offset_ = start;
  }
  cur_offset_ += e.length;
  if (cur_offset_ == nb) {
    if (p >= 0) RETURN_IF_ERROR(EndItem(p, it, nb));
    ++cur_item_;
    cur_offset_ = 0;
  }
  return absl::OkStatus();
}

RankWriteResult RankWriter::TakeResult() { return std::move(result_); }

std::optional<std::string> RankWriter::Abandon() {
  zip_.reset();
  zstd_.reset();
  file_.reset();  // closes (status dropped: the file is being removed)
  if (!created_) return std::nullopt;
  return path_;
}

}  // namespace ckptd::daemon
