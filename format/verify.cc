// Copyright 2026 The ckptd Authors.
#include "format/verify.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint_reader.h"
#include "format/metadata.h"
#include "format/pickle.h"
#include "format/save_plan.h"
#include "format/tensor_payload.h"
#include "format/zip.h"

namespace ckptd::format {
namespace {

class Verifier {
 public:
  Verifier(const std::string& dir, const VerifyOptions& options)
      : dir_(dir), options_(options) {}

  absl::StatusOr<VerifyReport> Run() {
    Env* env = options_.env;
    const std::string marker = JoinPath(dir_, kMetadataName);
    if (absl::Status e = env->FileExists(marker); !e.ok()) {
      if (absl::IsNotFound(e)) {
        Problem(fmt::format("{}: no .metadata (not a checkpoint, or not committed)", dir_));
        return report_;
      }
      return e;
    }
    ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(env, marker, uint64_t{8} << 30));
    DecodeOptions dopts;
    dopts.source_name = marker;
    auto decoded = DecodeMetadata(bytes, dopts);
    if (!decoded.ok()) {
      Problem(std::string(decoded.status().message()));
      return report_;
    }
    md_ = *std::move(decoded);
    CheckPlan();
    CheckStorage();
    return report_;
  }

 private:
  void Problem(std::string p) {
    if (report_.problems.size() < options_.max_problems) report_.problems.push_back(std::move(p));
  }
  bool Full() const { return report_.problems.size() >= options_.max_problems; }

  // Chunks in bounds, disjoint and covering; one storage entry per item.
  void CheckPlan() {
    for (const auto& [fqn, entry] : md_.state_dict_metadata) {
      if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
        report_.tensors++;
        report_.chunks += t->chunks.size();
        if (absl::Status s = ValidateChunks(fqn, t->size, t->chunks, true); !s.ok()) {
          Problem(fmt::format(".metadata: {}", s.message()));
        }
        for (const auto& c : t->chunks) {
          if (md_.FindStorage(StorageKey{fqn, true, c.offsets}) == nullptr) {
            Problem(fmt::format(".metadata: {}: no storage_data entry",
                                DescribeKey(StorageKey{fqn, true, c.offsets})));
          }
        }
      } else {
        report_.bytes_items++;
        if (md_.FindStorage(StorageKey{fqn, false, {}}) == nullptr) {
          Problem(fmt::format(".metadata: {} (bytes item): no storage_data entry", fqn));
        }
      }
    }
    for (const auto& [key, info] : md_.storage_data) {
      const StorageMetadata* e = md_.Find(key.fqn);
      if (e == nullptr) {
        Problem(fmt::format(".metadata: storage_data entry {} names no state_dict item",
                            DescribeKey(key)));
      } else if (std::holds_alternative<TensorStorageMetadata>(*e) != key.has_offset) {
        Problem(fmt::format(".metadata: storage_data entry {} disagrees with the item's kind",
                            DescribeKey(key)));
      }
    }
  }

  const ChunkStorageMetadata* FindChunk(const TensorStorageMetadata& t,
                                        const std::vector<int64_t>& offsets) {
    for (const auto& c : t.chunks) {
      if (c.offsets == offsets) return &c;
    }
    return nullptr;
  }

  void CheckStorage() {
    // Group entries by file, in offset order.
    std::map<std::string, std::vector<std::pair<const StorageKey*, const StorageInfo*>>> by_file;
    for (const auto& [key, info] : md_.storage_data) {
      if (!IsSafeRelativePath(info.relative_path)) {
        Problem(fmt::format(".metadata: {}: relative_path '{}' leaves the checkpoint directory",
                            DescribeKey(key), info.relative_path));
        continue;
      }
      by_file[info.relative_path].push_back({&key, &info});
    }
    report_.files = by_file.size();
    for (auto& [rel, items] : by_file) {
      if (Full()) return;
      auto file = options_.env->NewRandomAccessFile(JoinPath(dir_, rel));
      if (!file.ok()) {
        Problem(fmt::format("{}: {} (referenced by {} items)", rel, file.status().message(),
                            items.size()));
        continue;
      }
      std::sort(items.begin(), items.end(),
                [](const auto& a, const auto& b) { return a.second->offset < b.second->offset; });
      uint64_t prev_end = 0;
      const StorageKey* prev = nullptr;
      for (const auto& [key, info] : items) {
        if (Full()) return;
        const std::string where = fmt::format("{} @ {}: {}", rel, info->offset, DescribeKey(*key));
        if (info->offset > (*file)->Size() || info->length > (*file)->Size() - info->offset) {
          Problem(fmt::format("{}: payload [{}, +{}) extends past the end of the file ({} bytes)",
                              where, info->offset, info->length, (*file)->Size()));
          continue;
        }
        if (prev != nullptr && info->offset < prev_end) {
          Problem(fmt::format("{}: payload overlaps the payload of {}", where, DescribeKey(*prev)));
        }
        prev_end = info->offset + info->length;
        prev = key;
        report_.payload_bytes += info->length;
        CheckPayload(file->get(), *key, *info, where);
      }
      uint64_t size = (*file)->Size();
      if (prev_end < size) {
        report_.notes.push_back(fmt::format("{}: {} trailing bytes after the last payload", rel,
                                            size - prev_end));
      }
    }
    // Data files that nothing references (e.g. from an earlier, larger save).
    auto names = options_.env->ListDir(dir_);
    if (names.ok()) {
      for (const auto& n : *names) {
        if (n.size() > 7 && n.substr(n.size() - 7) == ".distcp" && !by_file.count(n)) {
          report_.notes.push_back(fmt::format("{}: not referenced by .metadata", n));
        }
      }
    }
  }

  void CheckPayload(const RandomAccessFile* file, const StorageKey& key,
                    const StorageInfo& info, const std::string& where) {
    if (!info.transform_descriptors.empty()) {
      report_.notes.push_back(fmt::format("{}: transformed payload ({}) not verified", where,
                                          fmt::join(info.transform_descriptors, ", ")));
      return;
    }
    auto archive = ZipArchiveReader::Open(file, info.offset, info.length);
    if (!archive.ok()) {
      Problem(fmt::format("{}: {}", where, archive.status().message()));
      return;
    }
    if (options_.check_crc) {
      for (const ZipEntry& e : (*archive)->entries()) {
        if (absl::Status s = (*archive)->VerifyCrc(e); !s.ok()) {
          Problem(fmt::format("{}: {}", where, s.message()));
          return;
        }
        report_.crc_bytes += e.size;
      }
    }
    const StorageMetadata* entry = md_.Find(key.fqn);
    if (entry == nullptr) return;
    if (const auto* t = std::get_if<TensorStorageMetadata>(entry)) {
      auto rec = ParseTensorPayload(**archive);
      if (!rec.ok()) {
        Problem(fmt::format("{}: {}", where, rec.status().message()));
        return;
      }
      if (rec->dtype != t->properties.dtype) {
        Problem(fmt::format("{}: payload dtype {} but .metadata says {}", where,
                            DTypeName(rec->dtype), DTypeName(t->properties.dtype)));
      }
      const ChunkStorageMetadata* chunk = FindChunk(*t, key.offset);
      if (chunk != nullptr && rec->sizes != chunk->sizes) {
        Problem(fmt::format("{}: payload shape {} but the chunk is {}", where,
                            DescribeBox(std::vector<int64_t>(rec->sizes.size(), 0), rec->sizes),
                            DescribeBox(chunk->offsets, chunk->sizes)));
      }
      return;
    }
    // Bytes item: data.pkl must parse.
    if (auto doc = ParseArchivePickle(**archive, uint64_t{1} << 30, key.fqn); !doc.ok()) {
      Problem(fmt::format("{}: {}", where, doc.status().message()));
    }
  }

  const std::string dir_;
  const VerifyOptions options_;
  Metadata md_;
  VerifyReport report_;
};

}  // namespace

absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& dir,
                                              const VerifyOptions& options) {
  if (absl::Status s = options.env->FileExists(dir); !s.ok()) return s;
  return Verifier(dir, options).Run();
}

}  // namespace ckptd::format
