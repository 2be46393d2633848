// Copyright 2026 The ckptd Authors.

#include "daemon/commit/external_metadata.h"

#include <string>
#include <utility>
#include <variant>

#include "absl/container/flat_hash_map.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/plan/save_plan.h"
#include "format/tensor/dtype.h"

namespace ckptd::daemon {
namespace {

std::string DescribeInfo(const format::StorageInfo& i) {
  std::string out =
      fmt::format("{} at {} length {}", i.relative_path, i.offset, i.length);
  if (!i.transform_descriptors.empty()) {
    out += fmt::format(" transforms [{}]",
                       fmt::join(i.transform_descriptors, ", "));
  }
  return out;
}

absl::Status Mismatch(std::string what) {
  return absl::FailedPreconditionError(
      "the .metadata handed to CommitMetadata does not describe what was "
      "written: " +
      std::move(what));
}

}  // namespace

std::vector<LayoutEntry> LayoutOf(const WritePlan& plan,
                                  absl::Span<const RankIndex* const> indexes,
                                  absl::Span<const format::StorageInfo> infos) {
  std::vector<LayoutEntry> out;
  out.reserve(plan.plan.items.size());
  for (size_t p = 0; p < plan.plan.items.size(); ++p) {
    const format::PlannedItem& pi = plan.plan.items[p];
    out.push_back({indexes[pi.rank]->items[pi.item_index].Key(),
                   p < infos.size() ? infos[p] : format::StorageInfo{}});
  }
  return out;
}

namespace {

using WrittenIndex = absl::flat_hash_map<format::StorageKey, size_t>;

// storage_data: a bijection onto the layout, location for location.
absl::Status CheckStorageData(const format::Metadata& metadata,
                              absl::Span<const LayoutEntry> layout,
                              const WrittenIndex& written) {
  absl::flat_hash_map<format::StorageKey, bool> seen;
  seen.reserve(metadata.storage_data.size());
  for (const auto& [key, info] : metadata.storage_data) {
    auto it = written.find(key);
    if (it == written.end()) {
      return Mismatch(fmt::format(
          "storage_data names {}, which this checkpoint did not write",
          format::DescribeKey(key)));
    }
    if (!seen.emplace(key, true).second) {
      return Mismatch(
          fmt::format("storage_data names {} twice", format::DescribeKey(key)));
    }
    const format::StorageInfo& want = layout[it->second].info;
    if (!(info == want)) {
      return Mismatch(fmt::format(
          "storage_data puts {} in {}; it was written to {}",
          format::DescribeKey(key), DescribeInfo(info), DescribeInfo(want)));
    }
  }
  for (const LayoutEntry& e : layout) {
    if (!seen.contains(e.key)) {
      return Mismatch(fmt::format("storage_data lacks {}, which was written",
                                  format::DescribeKey(e.key)));
    }
  }
  return absl::OkStatus();
}

// state_dict_metadata: the same items, with the dtypes and shapes written.
absl::Status CheckStateDict(const format::Metadata& metadata,
                            absl::Span<const format::ItemDesc* const> items,
                            const WrittenIndex& written) {
  size_t described = 0;
  for (const auto& [fqn, sm] : metadata.state_dict_metadata) {
    if (std::holds_alternative<format::BytesStorageMetadata>(sm)) {
      ++described;
      if (!written.contains(format::StorageKey{fqn, false, {}})) {
        return Mismatch(
            fmt::format("bytes item '{}' was not written as bytes", fqn));
      }
      continue;
    }
    const auto& t = std::get<format::TensorStorageMetadata>(sm);
    for (const format::ChunkStorageMetadata& ch : t.chunks) {
      ++described;
      auto it = written.find(format::StorageKey{fqn, true, ch.offsets});
      if (it == written.end()) {
        return Mismatch(fmt::format("chunk {} of tensor '{}' was not written",
                                    format::DescribeBox(ch.offsets, ch.sizes),
                                    fqn));
      }
      const format::ItemDesc& item = *items[it->second];
      if (item.type != format::ItemDesc::Type::kTensor ||
          item.dtype != t.properties.dtype || item.global_shape != t.size ||
          item.chunk_sizes != ch.sizes) {
        return Mismatch(fmt::format(
            "'{}' chunk {} is described as {} of shape [{}]; written: {} "
            "chunk {} of shape [{}]",
            fqn, format::DescribeBox(ch.offsets, ch.sizes),
            format::DTypeName(t.properties.dtype), fmt::join(t.size, ", "),
            format::DTypeName(item.dtype),
            format::DescribeBox(item.chunk_offsets, item.chunk_sizes),
            fmt::join(item.global_shape, ", ")));
      }
    }
  }
  if (described != written.size()) {
    return Mismatch(fmt::format(
        "state_dict_metadata describes {} chunks and bytes items; {} were "
        "written",
        described, written.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckExternalMetadata(
    const format::Metadata& metadata,
    absl::Span<const format::ItemDesc* const> items,
    absl::Span<const LayoutEntry> layout) {
  if (items.size() != layout.size()) {
    return absl::InternalError(
        fmt::format("CheckExternalMetadata: {} items for {} layout entries",
                    items.size(), layout.size()));
  }
  WrittenIndex written;
  written.reserve(layout.size());
  for (size_t p = 0; p < layout.size(); ++p) written.emplace(layout[p].key, p);
  RETURN_IF_ERROR(CheckStorageData(metadata, layout, written));
  return CheckStateDict(metadata, items, written);
}

absl::Status CheckExternalMetadata(const format::Metadata& metadata,
                                   const WritePlan& plan,
                                   absl::Span<const RankIndex* const> indexes,
                                   absl::Span<const LayoutEntry> layout) {
  std::vector<const format::ItemDesc*> items;
  items.reserve(plan.plan.items.size());
  for (const format::PlannedItem& pi : plan.plan.items)
    items.push_back(&indexes[pi.rank]->items[pi.item_index]);
  return CheckExternalMetadata(metadata, items, layout);
}

absl::StatusOr<format::Metadata> DecodeExternalMetadata(
    std::string_view bytes) {
  absl::StatusOr<format::Metadata> metadata = format::DecodeMetadata(bytes);
  if (!metadata.ok()) {
    return absl::InvalidArgumentError(
        fmt::format("the .metadata handed to CommitMetadata cannot be "
                    "decoded: {}",
                    metadata.status().message()));
  }
  return metadata;
}

CommitResult CommitExternal(const CommitterOptions& options,
                            const std::string& io_dir, const WritePlan& plan,
                            absl::Span<const RankIndex* const> indexes,
                            absl::Span<const format::StorageInfo> infos,
                            std::string_view bytes,
                            const format::StepCheck& before_publish) {
  const format::CommitProtocolOptions protocol{options.env, options.fsync};
  CommitResult out;
  absl::StatusOr<format::Metadata> metadata = DecodeExternalMetadata(bytes);
  if (!metadata.ok()) {
    out.status = metadata.status();
    return out;
  }
  out.status = CheckExternalMetadata(*metadata, plan, indexes,
                                     LayoutOf(plan, indexes, infos));
  // 3. The data files' directory entries.
  if (out.status.ok()) {
    out.status = format::SyncDataFileEntries(protocol, io_dir);
  }
  if (out.status.ok() && before_publish) out.status = before_publish();
  if (!out.status.ok()) return out;
  // 4–6.
  absl::StatusOr<uint64_t> published = format::PublishMetadata(
      protocol, io_dir, bytes, nullptr, &out.marker_may_remain);
  out.status = published.status();
  if (published.ok()) out.metadata_bytes = *published;
  return out;
}

}  // namespace ckptd::daemon
