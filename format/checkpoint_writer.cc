// Copyright 2026 The ckptd Authors.
//
// Durability protocol of a checkpoint directory (`.metadata` present ⇔
// checkpoint complete):
//   0. If `.metadata` exists: refuse, or with `overwrite` remove it and fsync
//      the directory, so no crash can pair the old marker with new data.
//   1. Write every __{r}_{k}.distcp file and fsync it.
//   2. fsync the directory: the data files' entries are durable.
//   3. Write `.metadata.tmp` and fsync it.
//   4. Rename `.metadata.tmp` → `.metadata` (the commit point).
//   5. fsync the directory: the commit is durable.
// A failure at any step leaves no `.metadata` (a marker renamed in before a
// failing step 5 is removed again); the data files written by this attempt
// are removed (best effort).
#include "format/checkpoint_writer.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/zip.h"

namespace ckptd::format {
absl::Status ValidateWriteItem(const WriteItem& item) {
  const ItemDesc& d = item.desc;
  if (d.type == ItemDesc::Type::kBytes) {
    return absl::OkStatus();
  }
  const TensorView& t = item.tensor;
  if (t.dtype != d.dtype) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: data is {} but the item declares {}", d.fqn, DTypeName(t.dtype),
        DTypeName(d.dtype)));
  }
  if (t.sizes != d.chunk_sizes) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: data has shape {} but the chunk is {}", d.fqn,
        DescribeBox(std::vector<int64_t>(t.sizes.size(), 0), t.sizes),
        DescribeBox(d.chunk_offsets, d.chunk_sizes)));
  }
  if (!t.strides.empty()) {
    if (t.strides.size() != t.sizes.size()) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: {} strides for {} dimensions", d.fqn, t.strides.size(), t.sizes.size()));
    }
    for (int64_t s : t.strides) {
      if (s < 0) {
        return absl::InvalidArgumentError(fmt::format("{}: negative stride", d.fqn));
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

absl::StatusOr<uint64_t> CommitMetadata(Env* env, const std::string& dir,
                                        Metadata* metadata,
                                        const EncodeOptions& encoding) {
  ASSIGN_OR_RETURN(std::string bytes, EncodeMetadata(*metadata, encoding));
  // Steps 3–5.
  RETURN_IF_ERROR(WriteFileAtomic(env, JoinPath(dir, kMetadataName), bytes));
  return bytes.size();
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
      RETURN_IF_ERROR(Annotate(ValidateWriteItem(it), fmt::format("rank {}", r)));
      descs[r].push_back(it.desc);
    }
  }
  ASSIGN_OR_RETURN(SavePlan plan, PlanSave(descs, options.plan));

  // 0. The directory and the old commit marker.
  RETURN_IF_ERROR(CreateDirsDurably(env, dir));
  const std::string marker = JoinPath(dir, kMetadataName);
  if (absl::Status e = env->FileExists(marker); e.ok()) {
    if (!options.overwrite) {
      return absl::FailedPreconditionError(fmt::format(
          "{} already holds a committed checkpoint (pass overwrite to replace it)", dir));
    }
    RETURN_IF_ERROR(env->RemoveFile(marker));
    RETURN_IF_ERROR(env->SyncDir(dir));
  } else if (!absl::IsNotFound(e)) {
    return e;
  }

  // 1. Data files, io_threads at a time.
  std::vector<StorageInfo> infos(plan.items.size());
  std::vector<uint64_t> file_sizes(plan.files.size(), 0);
  std::vector<bool> created(plan.files.size(), false);
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
        created[f] = true;
        for (size_t p : pf.items) {
          const PlannedItem& pi = plan.items[p];
          ASSIGN_OR_RETURN(infos[p], AppendItem(file.get(), pf.relative_path,
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
  const int n_threads = std::max(1, std::min<int>(options.io_threads, plan.files.size()));
  std::vector<std::thread> threads;
  for (int t = 1; t < n_threads; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();

  auto cleanup = [&] {
    for (size_t f = 0; f < plan.files.size(); ++f) {
      if (created[f]) (void)env->RemoveFile(JoinPath(dir, plan.files[f].relative_path));
    }
  };
  if (!first_error.ok()) {
    cleanup();
    return first_error;
  }
  // 2. The data files' directory entries.
  if (options.sync) {
    if (absl::Status s = env->SyncDir(dir); !s.ok()) {
      cleanup();
      return s;
    }
  }

  // storage_data in rank order, each rank's items in write order (§4.5).
  WriteResult result;
  result.metadata = std::move(plan.metadata);
  auto& sd = result.metadata.storage_data;
  sd.reserve(plan.items.size());
  for (const PlannedFile& pf : plan.files) {
    for (size_t p : pf.items) {
      const PlannedItem& pi = plan.items[p];
      sd.emplace_back(ranks[pi.rank][pi.item_index].desc.Key(), std::move(infos[p]));
    }
  }
  if (options.metadata_encoding.write_storage_meta) {
    StorageMeta sm;
    sm.checkpoint_id = dir;
    if (!options.save_id.empty()) sm.save_id = options.save_id;
    result.metadata.storage_meta = sm;
  }
  // 3–5. Commit.
  auto committed = options.sync
                       ? CommitMetadata(env, dir, &result.metadata, options.metadata_encoding)
                       : [&]() -> absl::StatusOr<uint64_t> {
                           ASSIGN_OR_RETURN(std::string bytes,
                                            EncodeMetadata(result.metadata,
                                                           options.metadata_encoding));
                           ASSIGN_OR_RETURN(auto f, env->NewWritableFile(marker));
                           RETURN_IF_ERROR(f->Append(bytes));
                           RETURN_IF_ERROR(f->Close());
                           return bytes.size();
                         }();
  if (!committed.ok()) {
    // The rename may have happened before a later step failed: un-publish
    // first (the marker can only be ours, see step 0), then the data, so a
    // failed save never leaves a visible .metadata behind.
    (void)env->RemoveFile(marker);
    cleanup();
    (void)env->SyncDir(dir);
    return committed.status();
  }
  result.metadata_bytes = *committed;
  for (uint64_t s : file_sizes) result.data_bytes += s;
  result.files = plan.files.size();
  result.metadata.BuildIndex();
  return result;
}

}  // namespace ckptd::format
