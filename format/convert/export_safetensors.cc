// Copyright 2026 The ckptd Authors.
#include "format/convert/export_safetensors.h"

#include <map>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/convert/safetensors.h"
#include "format/tensor/dtype_convert.h"
#include "format/tensor/tensor_slabs.h"
#include "nlohmann/json.hpp"

namespace ckptd::format {
namespace {

constexpr std::string_view kIndexName = "model.safetensors.index.json";

// One tensor to export.
struct Planned {
  std::string fqn;   // in the checkpoint
  std::string name;  // in the safetensors files
  DType in = DType::kFloat32, out = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;  // in `out`
};

struct Shard {
  std::string file;
  std::vector<size_t> tensors;  // indexes into the plan
  uint64_t bytes = 0;
};

bool IsModelFile(std::string_view n) {
  return n == "model.safetensors" || n == kIndexName ||
         (n.starts_with("model-") &&
          (n.ends_with(".safetensors") || n.ends_with(".safetensors.tmp")));
}

bool Kept(std::string_view fqn, const std::vector<std::string>& only) {
  if (only.empty()) return true;
  for (const std::string& p : only) {
    if (fqn.starts_with(p)) return true;
  }
  return false;
}

// The tensors to export, in checkpoint order, with their output names and
// dtypes; what is left out goes to stats->skipped.
absl::StatusOr<std::vector<Planned>> PlanTensors(
    const CompactMetadata& md, const SafetensorsExportOptions& options,
    SafetensorsExportStats* stats) {
  std::vector<Planned> plan;
  absl::flat_hash_set<std::string> names;
  for (size_t i = 0; i < md.num_items(); ++i) {
    const std::string fqn(md.fqn(i));
    if (!Kept(fqn, options.only)) continue;
    if (!md.item(i).tensor) {
      stats->skipped.push_back(fqn +
                               ": bytes item (safetensors holds tensors)");
      continue;
    }
    Planned p;
    p.fqn = fqn;
    p.name =
        fqn.starts_with(options.strip) ? fqn.substr(options.strip.size()) : fqn;
    p.in = p.out = md.item(i).properties.dtype;
    if (options.dtype.has_value() && IsConvertibleFloat(p.in)) {
      p.out = *options.dtype;
    }
    if (!SafetensorsDTypeName(p.out).has_value()) {
      stats->skipped.push_back(fqn + ": " + std::string(DTypeName(p.out)) +
                               " has no safetensors dtype");
      continue;
    }
    if (p.name.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("tensor '{}' has no name left after stripping '{}'", fqn,
                      options.strip));
    }
    if (!names.insert(p.name).second) {
      return absl::InvalidArgumentError(fmt::format(
          "two tensors would both be named '{}' (after stripping '{}')", p.name,
          options.strip));
    }
    p.shape.assign(md.shape(i).begin(), md.shape(i).end());
    p.bytes = ElementSize(p.out);
    for (int64_t s : p.shape) p.bytes *= static_cast<uint64_t>(s);
    plan.push_back(std::move(p));
  }
  if (plan.empty()) {
    return absl::InvalidArgumentError(
        "no tensor to export (check --only; bytes items are not exported)");
  }
  return plan;
}

// Greedy, in order: a shard closes when the next tensor would take it past
// `max` (HF's rule; a larger tensor gets a shard of its own).
std::vector<Shard> PlanShards(const std::vector<Planned>& plan, uint64_t max) {
  std::vector<Shard> shards;
  for (size_t i = 0; i < plan.size(); ++i) {
    if (shards.empty() || (!shards.back().tensors.empty() &&
                           shards.back().bytes + plan[i].bytes > max)) {
      shards.emplace_back();
    }
    shards.back().tensors.push_back(i);
    shards.back().bytes += plan[i].bytes;
  }
  for (size_t k = 0; k < shards.size(); ++k) {
    shards[k].file = shards.size() == 1
                         ? std::string("model.safetensors")
                         : fmt::format("model-{:05d}-of-{:05d}.safetensors",
                                       k + 1, shards.size());
  }
  return shards;
}

// Writes `contents` as `path` atomically (tmp, fsync, rename).
absl::Status PublishFile(Env* env, const std::string& path,
                         const std::function<absl::Status(WritableFile*)>& fill,
                         uint64_t* bytes) {
  const std::string tmp = path + ".tmp";
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp));
  absl::Status s = fill(file.get());
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = file->Close();
  if (s.ok()) s = env->RenameFile(tmp, path);
  if (!s.ok()) {
    (void)env->RemoveFile(tmp);
    return s;
  }
  *bytes += file->Size();
  return absl::OkStatus();
}

// One shard: header, then each tensor streamed slab by slab (converted).
absl::Status WriteShard(Env* env, CheckpointReader& reader,
                        const std::string& path, const Shard& shard,
                        const std::vector<Planned>& plan, uint64_t block_bytes,
                        uint64_t* written) {
  std::vector<std::pair<std::string, SafetensorsTensor>> entries;
  uint64_t at = 0;
  for (size_t i : shard.tensors) {
    entries.push_back(
        {plan[i].name, {plan[i].out, plan[i].shape, at, at + plan[i].bytes}});
    at += plan[i].bytes;
  }
  ASSIGN_OR_RETURN(std::string header,
                   EncodeSafetensorsHeader(entries, {{"format", "pt"}}));
  return PublishFile(
      env, path,
      [&](WritableFile* f) -> absl::Status {
        RETURN_IF_ERROR(f->Append(header));
        std::string converted;
        for (size_t i : shard.tensors) {
          const Planned& p = plan[i];
          uint64_t done = 0;
          RETURN_IF_ERROR(StreamTensorSlabs(
              reader, p.fqn, block_bytes,
              [&](std::string_view slab) -> absl::Status {
                if (p.in == p.out) {
                  done += slab.size();
                  return f->Append(slab);
                }
                const size_t n = slab.size() / ElementSize(p.in);
                converted.resize(n * ElementSize(p.out));
                ConvertElements(p.in, p.out, slab.data(), n, converted.data());
                done += converted.size();
                return f->Append(converted);
              }));
          if (done != p.bytes) {
            return absl::InternalError(fmt::format(
                "{}: streamed {} bytes, expected {}", p.fqn, done, p.bytes));
          }
        }
        return absl::OkStatus();
      },
      written);
}

// Model files of an earlier export in `out`: refused, or removed with
// overwrite.
absl::Status ClearEarlierExport(Env* env, const std::string& out,
                                bool overwrite) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(out));
  for (const std::string& n : names) {
    if (!IsModelFile(n)) continue;
    if (!overwrite) {
      return absl::AlreadyExistsError(fmt::format(
          "{} already holds {} (pass overwrite to replace the export)", out,
          n));
    }
    RETURN_IF_ERROR(env->RemoveFile(JoinPath(out, n)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsExportStats> ExportSafetensors(
    const std::string& dir, const std::string& out,
    const SafetensorsExportOptions& options) {
  if (options.dtype.has_value() && !IsConvertibleFloat(*options.dtype)) {
    return absl::InvalidArgumentError(fmt::format(
        "export dtype {} is not a floating dtype (float32, float16, "
        "bfloat16, float64)",
        DTypeName(*options.dtype)));
  }
  CheckpointReaderOptions ropts;
  ropts.env = options.env;
  ropts.verify_crc = options.verify_crc;
  ropts.max_read_block = std::min(ropts.max_read_block, options.block_bytes);
  ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, ropts));
  SafetensorsExportStats stats;
  ASSIGN_OR_RETURN(std::vector<Planned> plan,
                   PlanTensors(reader->compact(), options, &stats));
  const std::vector<Shard> shards = PlanShards(plan, options.max_shard_bytes);
  Env* env = options.env;
  RETURN_IF_ERROR(env->CreateDirs(out));
  RETURN_IF_ERROR(ClearEarlierExport(env, out, options.overwrite));
  std::map<std::string, std::string> weight_map;  // sorted, as HF writes it
  for (const Shard& shard : shards) {
    RETURN_IF_ERROR(WriteShard(env, *reader, JoinPath(out, shard.file), shard,
                               plan, options.block_bytes,
                               &stats.bytes_written));
    stats.files.push_back(shard.file);
    for (size_t i : shard.tensors) {
      weight_map[plan[i].name] = shard.file;
      stats.tensors++;
      stats.tensor_bytes += plan[i].bytes;
    }
  }
  if (shards.size() > 1) {
    nlohmann::ordered_json index = {
        {"metadata", {{"total_size", stats.tensor_bytes}}},
        {"weight_map", weight_map}};
    const std::string text =
        index.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
        "\n";
    RETURN_IF_ERROR(PublishFile(
        env, JoinPath(out, std::string(kIndexName)),
        [&](WritableFile* f) { return f->Append(text); },
        &stats.bytes_written));
    stats.files.push_back(std::string(kIndexName));
  }
  RETURN_IF_ERROR(env->SyncDir(out));
  return stats;
}

}  // namespace ckptd::format
