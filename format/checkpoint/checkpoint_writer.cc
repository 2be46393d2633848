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

absl::StatusOr<uint64_t> CommitMetadata(Env* env, const std::string& dir,
                                        Metadata* metadata,
                                        const EncodeOptions& encoding) {
  ASSIGN_OR_RETURN(std::string bytes, EncodeMetadata(*metadata, encoding));
  return PublishMetadata({env, /*sync=*/true}, dir, bytes);  // steps 4–6
}

absl::StatusOr<WriteResult> WriteCheckpoint(
    const std::string& dir, absl::Span<const std::vector<WriteItem>> ranks,
    const CheckpointWriterOptions& options) {
  Env* env = options.env;
  // Plan (pure).
  std::vector<std::vector<ItemDesc>> descs(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    descs[r].reserve(ranks[r].size());
    for (const WriteItem& it : ranks[r]) {
      RETURN_IF_ERROR(
          Annotate(ValidateWriteItem(it), fmt::format("rank {}", r)));
      descs[r].push_back(it.desc);
    }
  }
  ASSIGN_OR_RETURN(SavePlan plan, PlanSave(descs, options.plan));

  // 1. The directory, durably, and no stale commit marker.
  const CommitProtocolOptions protocol{env, options.sync};
  RETURN_IF_ERROR(CreateDirsDurably(env, dir));
  RETURN_IF_ERROR(PrepareCheckpointDir(protocol, dir, options.overwrite));

  // 2. Data files, io_threads at a time.
  std::vector<StorageInfo> infos(plan.items.size());
  std::vector<uint64_t> file_sizes(plan.files.size(), 0);
  // One byte per file (not vector<bool>: the workers set entries of
  // different files at once, and bits of one word would race).
  std::vector<uint8_t> created(plan.files.size(), 0);
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
      if (f >= plan.files.size()) return;
      const PlannedFile& pf = plan.files[f];
      const std::string path = JoinPath(dir, pf.relative_path);
      absl::Status s = [&]() -> absl::Status {
        ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path));
        created[f] = 1;
        for (size_t p : pf.items) {
          const PlannedItem& pi = plan.items[p];
          ASSIGN_OR_RETURN(infos[p],
                           AppendItem(file.get(), pf.relative_path,
                                      ranks[pi.rank][pi.item_index], &scratch));
        }
        if (options.sync) RETURN_IF_ERROR(file->Sync());
        file_sizes[f] = file->Size();
        return file->Close();
      }();
      if (!s.ok()) {
        absl::MutexLock l(&mu);
        if (first_error.ok()) first_error = s;
        return;
      }
    }
  };
  const int n_threads =
      std::max(1, std::min<int>(options.io_threads, plan.files.size()));
  std::vector<std::thread> threads;
  for (int t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();

  auto cleanup = [&] {
    for (size_t f = 0; f < plan.files.size(); ++f) {
      if (created[f])
        (void)env->RemoveFile(JoinPath(dir, plan.files[f].relative_path));
    }
  };
  if (!first_error.ok()) {
    cleanup();
    return first_error;
  }
  // 3. The data files' directory entries.
  if (absl::Status s = SyncDataFileEntries(protocol, dir); !s.ok()) {
    cleanup();
    return s;
  }

  // storage_data in rank order, each rank's items in write order (§4.5).
  WriteResult result;
  result.metadata = std::move(plan.metadata);
  AppendStorageData(
      plan,
      [&](const PlannedItem& pi) -> const ItemDesc& {
        return ranks[pi.rank][pi.item_index].desc;
      },
      FileWriteOrder(plan), absl::MakeSpan(infos), &result.metadata);
  if (options.metadata_encoding.write_storage_meta) {
    StorageMeta sm;
    sm.checkpoint_id = dir;
    if (!options.save_id.empty()) sm.save_id = options.save_id;
    result.metadata.storage_meta = sm;
  }
  // 4–6. Commit (PublishMetadata un-publishes itself on failure).
  absl::StatusOr<uint64_t> committed = [&]() -> absl::StatusOr<uint64_t> {
    ASSIGN_OR_RETURN(
        std::string bytes,
        EncodeMetadata(result.metadata, options.metadata_encoding));
    return PublishMetadata(protocol, dir, bytes);
  }();
  if (!committed.ok()) {
    cleanup();
    (void)SyncDataFileEntries(protocol, dir);
    return committed.status();
  }
  result.metadata_bytes = *committed;
  for (uint64_t s : file_sizes) result.data_bytes += s;
  result.files = plan.files.size();
  result.metadata.BuildIndex();
  return result;
}

}  // namespace ckptd::format
