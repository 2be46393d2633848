// Copyright 2026 The ckptd Authors.
//
// WriteCheckpoint follows the durability protocol of
// format/plan/commit_protocol.h (docs/durability.md): 1 PrepareCheckpointDir, 2
// data files written and fsynced, 3 SyncDataFileEntries, 4–6 PublishMetadata. A
// failure at any step leaves no `.metadata`; the data files this attempt wrote
// are removed (best effort).
#include "format/checkpoint/checkpoint_writer.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/plan/commit_protocol.h"
#include "format/zip/zip.h"

namespace ckptd::format {
absl::Status ValidateWriteItem(const WriteItem& item) {
  const ItemDesc& d = item.desc;
  if (d.type == ItemDesc::Type::kBytes) {
    return absl::OkStatus();
  }
  const TensorView& t = item.tensor;
  if (t.dtype != d.dtype) {
    return absl::InvalidArgumentError(
        fmt::format("{}: data is {} but the item declares {}", d.fqn,
                    DTypeName(t.dtype), DTypeName(d.dtype)));
  }
  if (t.sizes != d.chunk_sizes) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: data has shape {} but the chunk is {}", d.fqn,
        DescribeBox(std::vector<int64_t>(t.sizes.size(), 0), t.sizes),
        DescribeBox(d.chunk_offsets, d.chunk_sizes)));
  }
  if (!t.strides.empty()) {
    if (t.strides.size() != t.sizes.size()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {} strides for {} dimensions", d.fqn,
                      t.strides.size(), t.sizes.size()));
    }
    for (int64_t s : t.strides) {
      if (s < 0) {
        return absl::InvalidArgumentError(
            fmt::format("{}: negative stride", d.fqn));
      }
    }
  }
  if (t.data == nullptr && t.numel() > 0) {
    return absl::InvalidArgumentError(fmt::format("{}: no data", d.fqn));
  }
  return absl::OkStatus();
}

absl::StatusOr<StorageInfo> AppendItem(WritableFile* file,
                                       const std::string& relative_path,
                                       const WriteItem& item,
                                       std::string* scratch) {
  StorageInfo info;
  info.relative_path = relative_path;
  info.offset = file->Size();
  if (item.desc.type == ItemDesc::Type::kBytes) {
    RETURN_IF_ERROR(file->Append(item.bytes));
    info.length = item.bytes.size();
    return info;
  }
  ZipArchiveBuilder builder;
  AddTensorRecords(item.tensor, &builder, scratch);
  builder.Finish();
  RETURN_IF_ERROR(file->AppendV(builder.segments()));
  info.length = builder.size();
  return info;
}

void AppendStorageData(
    const SavePlan& plan,
    absl::FunctionRef<const ItemDesc&(const PlannedItem&)> desc,
    absl::Span<const size_t> order, absl::Span<StorageInfo> infos,
    Metadata* metadata) {
  auto& sd = metadata->storage_data;
  sd.reserve(sd.size() + order.size());
  for (size_t p : order)
    sd.emplace_back(desc(plan.items[p]).Key(), std::move(infos[p]));
}

std::vector<size_t> FileWriteOrder(const SavePlan& plan) {
  std::vector<size_t> order;
  order.reserve(plan.items.size());
  for (const PlannedFile& pf : plan.files)
    order.insert(order.end(), pf.items.begin(), pf.items.end());
  return order;
}

namespace {

// Encodes `metadata` and publishes it under `protocol` (steps 4–6).
absl::StatusOr<uint64_t> EncodeAndPublish(const CommitProtocolOptions& protocol,
                                          const std::string& dir,
                                          const Metadata& metadata,
                                          const EncodeOptions& encoding) {
  ASSIGN_OR_RETURN(std::string bytes, EncodeMetadata(metadata, encoding));
  return PublishMetadata(protocol, dir, bytes);
}

// Checks each item's data against its description and plans the save
// (pure).
absl::StatusOr<SavePlan> PlanWrite(
    absl::Span<const std::vector<WriteItem>> ranks, const PlanOptions& plan) {
  std::vector<std::vector<ItemDesc>> descs(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    descs[r].reserve(ranks[r].size());
    for (const WriteItem& it : ranks[r]) {
      RETURN_IF_ERROR(
          Annotate(ValidateWriteItem(it), fmt::format("rank {}", r)));
      descs[r].push_back(it.desc);
    }
  }
  return PlanSave(descs, plan);
}

// Step 2 of WriteCheckpoint: the plan's data files written (each item
// appended in the file's order), fsynced and closed, several at a time;
// what they hold, and which ones it created.
class DataFileWriter {
 public:
  DataFileWriter(Env* env, const std::string& dir, const SavePlan& plan,
                 absl::Span<const std::vector<WriteItem>> ranks, bool sync)
      : env_(env),
        dir_(dir),
        plan_(plan),
        ranks_(ranks),
        sync_(sync),
        infos_(plan.items.size()),
        sizes_(plan.files.size(), 0),
        created_(plan.files.size(), 0) {}

  // Writes every file, io_threads at a time; the first error (the threads
  // then start no further file).
  absl::Status WriteAll(int io_threads) {
    std::atomic<size_t> next_file{0};
    absl::Mutex mu;
    absl::Status first_error;
    auto worker = [&] {
      std::string scratch;
      for (;;) {
        {
          absl::MutexLock l(&mu);
          if (!first_error.ok()) return;
        }
        const size_t f = next_file.fetch_add(1);
        if (f >= plan_.files.size()) return;
        if (absl::Status s = WriteFile(f, &scratch); !s.ok()) {
          absl::MutexLock l(&mu);
          if (first_error.ok()) first_error = s;
          return;
        }
      }
    };
    const int n_threads =
        std::max(1, std::min<int>(io_threads, plan_.files.size()));
    std::vector<std::thread> threads;
    for (int t = 1; t < n_threads; ++t) threads.emplace_back(worker);
    worker();
    for (auto& t : threads) t.join();
    return first_error;
  }

  // Removes the files this writer created (best effort).
  void RemoveCreated() const {
    for (size_t f = 0; f < plan_.files.size(); ++f) {
      if (created_[f])
        (void)env_->RemoveFile(JoinPath(dir_, plan_.files[f].relative_path));
    }
  }

  // The location of each plan item (storage_data moves them out).
  absl::Span<StorageInfo> infos() { return absl::MakeSpan(infos_); }
  // The bytes of all the files.
  uint64_t data_bytes() const {
    uint64_t n = 0;
    for (uint64_t s : sizes_) n += s;
    return n;
  }

 private:
  // Writes plan file f.
  absl::Status WriteFile(size_t f, std::string* scratch) {
    const PlannedFile& pf = plan_.files[f];
    ASSIGN_OR_RETURN(auto file,
                     env_->NewWritableFile(JoinPath(dir_, pf.relative_path)));
    created_[f] = 1;
    for (size_t p : pf.items) {
      const PlannedItem& pi = plan_.items[p];
      ASSIGN_OR_RETURN(infos_[p],
                       AppendItem(file.get(), pf.relative_path,
                                  ranks_[pi.rank][pi.item_index], scratch));
    }
    if (sync_) RETURN_IF_ERROR(file->Sync());
    sizes_[f] = file->Size();
    return file->Close();
  }

  Env* const env_;
  const std::string& dir_;
  const SavePlan& plan_;
  const absl::Span<const std::vector<WriteItem>> ranks_;
  const bool sync_;
  // Per plan item / per file, each entry written by the one thread writing
  // its file.
  std::vector<StorageInfo> infos_;
  std::vector<uint64_t> sizes_;
  // One byte per file (not vector<bool>: the workers set entries of
  // different files at once, and bits of one word would race).
  std::vector<uint8_t> created_;
};

// The metadata to commit: the plan's skeleton (moved out of `plan`) with
// storage_data in rank order, each rank's items in write order (§4.5), and
// a StorageMeta where the encoding writes one.
Metadata CompleteMetadata(SavePlan& plan,
                          absl::Span<const std::vector<WriteItem>> ranks,
                          absl::Span<StorageInfo> infos, const std::string& dir,
                          const CheckpointWriterOptions& options) {
  Metadata metadata = std::move(plan.metadata);
  AppendStorageData(
      plan,
      [&](const PlannedItem& pi) -> const ItemDesc& {
        return ranks[pi.rank][pi.item_index].desc;
      },
      FileWriteOrder(plan), infos, &metadata);
  if (options.metadata_encoding.write_storage_meta) {
    StorageMeta sm;
    sm.checkpoint_id = dir;
    if (!options.save_id.empty()) sm.save_id = options.save_id;
    metadata.storage_meta = sm;
  }
  return metadata;
}

}  // namespace

absl::StatusOr<uint64_t> CommitMetadata(Env* env, const std::string& dir,
                                        Metadata* metadata,
                                        const EncodeOptions& encoding) {
  return EncodeAndPublish({env, /*sync=*/true}, dir, *metadata,
                          encoding);  // steps 4–6
}

absl::StatusOr<WriteResult> WriteCheckpoint(
    const std::string& dir, absl::Span<const std::vector<WriteItem>> ranks,
    const CheckpointWriterOptions& options) {
  Env* env = options.env;
  ASSIGN_OR_RETURN(SavePlan plan, PlanWrite(ranks, options.plan));

  // 1. The directory, durably, and no stale commit marker.
  const CommitProtocolOptions protocol{env, options.sync};
  RETURN_IF_ERROR(CreateDirsDurably(env, dir));
  RETURN_IF_ERROR(PrepareCheckpointDir(protocol, dir, options.overwrite));

  // 2. Data files, io_threads at a time.
  DataFileWriter files(env, dir, plan, ranks, options.sync);
  if (absl::Status s = files.WriteAll(options.io_threads); !s.ok()) {
    files.RemoveCreated();
    return s;
  }
  // 3. The data files' directory entries.
  if (absl::Status s = SyncDataFileEntries(protocol, dir); !s.ok()) {
    files.RemoveCreated();
    return s;
  }

  WriteResult result;
  result.metadata = CompleteMetadata(plan, ranks, files.infos(), dir, options);
  // 4–6. Commit (PublishMetadata un-publishes itself on failure).
  absl::StatusOr<uint64_t> committed = EncodeAndPublish(
      protocol, dir, result.metadata, options.metadata_encoding);
  if (!committed.ok()) {
    files.RemoveCreated();
    (void)SyncDataFileEntries(protocol, dir);
    return committed.status();
  }
  result.metadata_bytes = *committed;
  result.data_bytes = files.data_bytes();
  result.files = plan.files.size();
  result.metadata.BuildIndex();
  return result;
}

}  // namespace ckptd::format
