// Copyright 2026 The ckptd Authors.
//
// CheckpointReader: opening, planning, the order of reads, bytes items. The
// reads of one saved chunk are read_chunk.cc.
#include "format/checkpoint/checkpoint_reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <utility>

#include "common/absl_fmt.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "common/tsan_annotations.h"
#include "fmt/format.h"
#include "format/checkpoint/read_chunk.h"
#include "format/metadata/metadata_decode.h"
#include "format/plan/save_plan.h"
#include "format/zip/zip.h"

namespace ckptd::format {

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& dir, const CheckpointReaderOptions& options) {
  Env* env = options.env;
  const std::string marker = JoinPath(dir, kMetadataName);
  if (absl::Status e = env->FileExists(marker); !e.ok()) {
    if (absl::IsNotFound(e) &&
        env->FileExists(JoinPath(dir, "__0.metadata")).ok()) {
      return absl::UnimplementedError(
          fmt::format("{} is a rank-local checkpoint "
                      "(dcp.save(use_collectives=False)): it has "
                      "__{{rank}}.metadata files but no global .metadata",
                      dir));
    }
    if (absl::IsNotFound(e)) {
      return absl::NotFoundError(fmt::format(
          "{} has no .metadata: not a checkpoint, or not committed", dir));
    }
    return e;
  }
  ReadMetadataOptions ropts;
  ropts.max_file_bytes = options.max_metadata_bytes;
  ropts.decode.source_name = marker;
  ASSIGN_OR_RETURN(CompactMetadata md, ReadCompactMetadata(env, marker, ropts));
  for (size_t i = 0; i < md.num_items(); ++i) {
    if (md.item(i).tensor) {
      RETURN_IF_ERROR(Annotate(
          ValidateChunks(md, i, /*require_full_coverage=*/false), marker));
    }
  }
  // Each distinct file name once (names are interned).
  std::vector<uint8_t> path_checked;
  for (const CompactMetadata::Storage& s : md.storage_entries()) {
    if (s.path >= path_checked.size()) path_checked.resize(s.path + 1, 0);
    if (path_checked[s.path]) continue;
    path_checked[s.path] = 1;
    if (!IsSafeRelativePath(md.relative_path(s))) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: storage entry {} points outside the checkpoint directory: '{}'",
          marker, md.DescribeStorageKey(s), md.relative_path(s)));
    }
  }
  auto reader =
      std::unique_ptr<CheckpointReader>(new CheckpointReader(dir, options));
  reader->compact_ = std::move(md);
  return reader;
}

const Metadata& CheckpointReader::metadata() const {
  CallOnce(metadata_once_, [this] {
    metadata_ = std::make_unique<Metadata>(compact_.ToMetadata());
  });
  return *metadata_;
}

StorageKey CheckpointReader::ChunkKey(size_t item, size_t chunk) const {
  const auto off = compact_.chunk_offsets(item, chunk);
  return StorageKey{
      std::string(compact_.fqn(item)), true, {off.begin(), off.end()}};
}

absl::Status CheckpointReader::VerifyArchiveCrcs(
    const ZipArchiveReader& archive, const StorageKey& key,
    const ZipEntry* skip, ReadStats* stats) {
  for (const ZipEntry& e : archive.entries()) {
    if (&e == skip) continue;
    RETURN_IF_ERROR(VerifyRecord(archive, key, e, stats));
  }
  return absl::OkStatus();
}

bool CheckpointReader::CrcChecked(const CompactMetadata::Storage* s) {
  absl::MutexLock l(&crc_mu_);
  return crc_checked_.contains(s);
}

void CheckpointReader::MarkCrcChecked(const CompactMetadata::Storage* s) {
  absl::MutexLock l(&crc_mu_);
  crc_checked_.insert(s);
}

absl::StatusOr<const StorageInfo*> CheckpointReader::Locate(
    const StorageKey& key) const {
  const CompactMetadata::Storage* s = compact_.FindStorage(key);
  if (s == nullptr) {
    return absl::DataLossError(fmt::format(
        "{}/.metadata: no storage_data entry for {}", dir_, DescribeKey(key)));
  }
  absl::MutexLock l(&locate_mu_);
  auto& info = located_[s];
  if (info == nullptr) info = std::make_unique<StorageInfo>(compact_.Info(*s));
  return info.get();
}

absl::StatusOr<const RandomAccessFile*> CheckpointReader::OpenFile(
    const std::string& relative_path) {
  absl::MutexLock l(&mu_);
  auto it = files_.find(relative_path);
  if (it != files_.end()) return it->second.get();
  ASSIGN_OR_RETURN(auto file, options_.env->NewRandomAccessFile(
                                  JoinPath(dir_, relative_path)));
  const RandomAccessFile* raw = file.get();
  files_.emplace(relative_path, std::move(file));
  return raw;
}

absl::StatusOr<std::vector<ReadItem>> CheckpointReader::PlanReads(
    absl::Span<const TensorRequest> requests) const {
  const CompactMetadata& md = compact_;
  std::vector<ReadItem> items;
  std::vector<uint32_t> hits;
  for (size_t r = 0; r < requests.size(); ++r) {
    const TensorRequest& req = requests[r];
    const std::optional<size_t> i = md.FindItem(req.fqn);
    if (!i.has_value()) {
      return absl::NotFoundError(
          fmt::format("{}: missing key in checkpoint {}", req.fqn, dir_));
    }
    if (!md.item(*i).tensor) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: the checkpoint holds a bytes item, not a tensor", req.fqn));
    }
    const absl::Span<const int64_t> shape = md.shape(*i);
    const size_t nd = shape.size();
    const auto& sizes = req.dest.sizes;
    if (req.offsets.size() != nd || sizes.size() != nd) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: requested box {} has {} dimensions, the saved tensor {}",
          req.fqn, DescribeBox(req.offsets, sizes), req.offsets.size(), nd));
    }
    uint64_t want = 1;
    for (size_t d = 0; d < nd; ++d) {
      if (req.offsets[d] < 0 || sizes[d] < 0 || req.offsets[d] > shape[d] ||
          sizes[d] > shape[d] - req.offsets[d]) {
        return absl::OutOfRangeError(
            fmt::format("{}: requested box {} is outside the saved shape {}",
                        req.fqn, DescribeBox(req.offsets, sizes),
                        DescribeBox(std::vector<int64_t>(nd, 0), shape)));
      }
      want *= static_cast<uint64_t>(sizes[d]);
    }
    // The saved chunks that overlap the box, found by the box index.
    hits.clear();
    md.OverlappingChunks(*i, req.offsets, sizes, &hits);
    uint64_t got = 0;
    for (uint32_t c : hits) {
      const auto s_off = md.chunk_offsets(*i, c),
                 s_size = md.chunk_sizes(*i, c);
      ReadItem item;
      item.request = r;
      item.chunk = c;
      item.lengths.resize(nd);
      item.storage_offsets.resize(nd);
      item.dest_offsets.resize(nd);
      uint64_t vol = 1;
      for (size_t d = 0; d < nd; ++d) {
        const int64_t start = std::max(req.offsets[d], s_off[d]);
        const int64_t end =
            std::min(req.offsets[d] + sizes[d], s_off[d] + s_size[d]);
        item.lengths[d] = end - start;
        item.storage_offsets[d] = start - s_off[d];
        item.dest_offsets[d] = start - req.offsets[d];
        vol *= static_cast<uint64_t>(end - start);
      }
      got += vol;
      items.push_back(std::move(item));
    }
    if (got != want) {
      return absl::DataLossError(
          fmt::format("{}: the checkpoint's chunks cover only {} of the {} "
                      "requested elements of {}",
                      req.fqn, got, want, DescribeBox(req.offsets, sizes)));
    }
  }
  return items;
}

absl::Status CheckpointReader::ReadTensors(
    absl::Span<const TensorRequest> requests, ReadStats* stats, bool verify_crc,
    const Cancellation* cancel) {
  ASSIGN_OR_RETURN(std::vector<ReadItem> items, PlanReads(requests));
  return ReadPlanned(requests, items, stats, verify_crc, cancel);
}

namespace {

// One saved chunk's reads: order[begin, end) read chunk `chunk` of tensor
// item `item`, whose payload lies at `offset` of file `path`.
struct ChunkGroup {
  uint32_t item, chunk;
  uint32_t path = CompactMetadata::kNone;
  uint64_t offset = 0;
  size_t begin = 0, end = 0;  // range of `order`
};

// The read items of a ReadPlanned call grouped by saved chunk.
struct ChunkGroups {
  std::vector<const ReadItem*> order;  // the items, by (item, chunk)
  std::vector<ChunkGroup> groups;      // in (file, offset) order
};

// The tensor item of each request (item_of[r] for requests[r]), after
// checking that each request has a destination and names a tensor and that
// each read item refers to a request and a saved chunk of it.
absl::StatusOr<std::vector<uint32_t>> RequestItems(
    const CompactMetadata& md, const std::string& dir,
    absl::Span<const TensorRequest> requests,
    absl::Span<const ReadItem> items) {
  std::vector<uint32_t> item_of(requests.size());
  for (size_t r = 0; r < requests.size(); ++r) {
    const TensorRequest& req = requests[r];
    if (req.dest.data == nullptr) {
      uint64_t n = 1;
      for (int64_t s : req.dest.sizes) n *= static_cast<uint64_t>(s);
      if (n > 0)
        return absl::InvalidArgumentError(
            fmt::format("{}: no destination buffer", req.fqn));
    }
    const std::optional<size_t> i = md.FindItem(req.fqn);
    if (!i.has_value() || !md.item(*i).tensor) {
      return absl::InvalidArgumentError(
          fmt::format("{}: not a tensor of checkpoint {}", req.fqn, dir));
    }
    item_of[r] = static_cast<uint32_t>(*i);
  }
  for (const ReadItem& it : items) {
    if (it.request >= requests.size() ||
        it.chunk >= md.item(item_of[it.request]).num_chunks) {
      return absl::InvalidArgumentError(
          "ReadPlanned: a read item that PlanReads did not make");
    }
  }
  return item_of;
}

// One group per saved chunk (each payload's header is parsed once),
// visited in (file, offset) order: the reads of one file go forward.
ChunkGroups GroupByChunk(const CompactMetadata& md,
                         absl::Span<const ReadItem> items,
                         const std::vector<uint32_t>& item_of) {
  ChunkGroups out;
  std::vector<const ReadItem*>& order = out.order;
  order.reserve(items.size());
  for (const ReadItem& it : items) order.push_back(&it);
  auto key_of = [&](const ReadItem* it) {
    return std::pair<uint32_t, uint64_t>(item_of[it->request], it->chunk);
  };
  std::stable_sort(order.begin(), order.end(),
                   [&](const ReadItem* a, const ReadItem* b) {
                     return key_of(a) < key_of(b);
                   });
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    while (j < order.size() && key_of(order[j]) == key_of(order[i])) ++j;
    ChunkGroup g;
    g.item = item_of[order[i]->request];
    g.chunk = static_cast<uint32_t>(order[i]->chunk);
    if (const auto* s = md.chunk_storage(g.item, g.chunk)) {
      g.path = s->path;
      g.offset = s->offset;
    }
    g.begin = i;
    g.end = j;
    out.groups.push_back(g);
    i = j;
  }
  std::stable_sort(out.groups.begin(), out.groups.end(),
                   [](const ChunkGroup& a, const ChunkGroup& b) {
                     return std::tie(a.path, a.offset) <
                            std::tie(b.path, b.offset);
                   });
  return out;
}

// Adds every counter of `from` to `to`.
void AddStats(const ReadStats& from, ReadStats* to) {
  to->bytes_read += from.bytes_read;
  to->bytes_copied += from.bytes_copied;
  to->read_calls += from.read_calls;
  to->crc_bytes += from.crc_bytes;
  to->direct_bytes += from.direct_bytes;
  to->archive_bytes += from.archive_bytes;
}

// Runs read_group(g, stats, helper) for each group g < n_groups on
// n_threads threads (the caller's one of them), in order of g; returns the
// first error, after which the threads start no further group. `stats` (may
// be null) gets the sum of every thread's counters.
template <typename ReadGroup>
absl::Status ReadGroupsOnThreads(size_t n_threads, size_t n_groups,
                                 ReadStats* stats,
                                 const ReadGroup& read_group) {
  if (n_threads <= 1) {
    std::unique_ptr<CrcHelper> helper;
    for (size_t g = 0; g < n_groups; ++g) {
      RETURN_IF_ERROR(read_group(g, stats, &helper));
    }
    return absl::OkStatus();
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first_error;  // guarded by mu
  ReadStats total;           // guarded by mu
  auto worker = [&] {
    ReadStats local;
    std::unique_ptr<CrcHelper> helper;
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t g = next.fetch_add(1, std::memory_order_relaxed);
      if (g >= n_groups) break;
      if (absl::Status s =
              read_group(g, stats != nullptr ? &local : nullptr, &helper);
          !s.ok()) {
        absl::MutexLock l(&mu);
        if (first_error.ok()) first_error = std::move(s);
        failed.store(true, std::memory_order_relaxed);
        break;
      }
    }
    absl::MutexLock l(&mu);
    AddStats(local, &total);
  };
  RunOnThreads(static_cast<int>(n_threads), worker);
  absl::MutexLock l(&mu);
  if (stats != nullptr) AddStats(total, stats);
  return first_error;
}

}  // namespace

absl::Status CheckpointReader::ReadPlanned(
    absl::Span<const TensorRequest> requests, absl::Span<const ReadItem> items,
    ReadStats* stats, bool verify_crc, const Cancellation* cancel) {
  const bool crc = verify_crc && options_.verify_crc;
  ASSIGN_OR_RETURN(const std::vector<uint32_t> item_of,
                   RequestItems(compact_, dir_, requests, items));
  const ChunkGroups chunks = GroupByChunk(compact_, items, item_of);
  auto read_group = [&](size_t g, ReadStats* group_stats,
                        std::unique_ptr<CrcHelper>* helper) {
    if (cancel != nullptr && cancel->cancelled()) return cancel->status();
    const ChunkGroup& gr = chunks.groups[g];
    return ReadChunkItems(
        gr.item, gr.chunk,
        absl::MakeConstSpan(chunks.order.data() + gr.begin, gr.end - gr.begin),
        requests, group_stats, helper, crc, cancel);
  };
  // Workers take the groups in (file, offset) order.
  const size_t n_threads = std::min<size_t>(
      static_cast<size_t>(std::max(options_.threads, 1)), chunks.groups.size());
  return ReadGroupsOnThreads(n_threads, chunks.groups.size(), stats,
                             read_group);
}

absl::StatusOr<std::string> CheckpointReader::ReadBytesItem(
    std::string_view fqn, bool verify_crc) {
  const CompactMetadata& md = compact_;
  const std::optional<size_t> i = md.FindItem(fqn);
  if (!i.has_value()) {
    return absl::NotFoundError(
        fmt::format("{}: missing key in checkpoint {}", fqn, dir_));
  }
  if (md.item(*i).tensor) {
    return absl::InvalidArgumentError(
        fmt::format("{}: is a tensor, not a bytes item", fqn));
  }
  const StorageKey key{std::string(fqn), false, {}};
  const CompactMetadata::Storage* info = md.bytes_storage(*i);
  if (info == nullptr) {
    return absl::DataLossError(fmt::format(
        "{}/.metadata: no storage_data entry for {}", dir_, DescribeKey(key)));
  }
  if (info->length > options_.max_bytes_item) {
    return absl::ResourceExhaustedError(
        fmt::format("{}: bytes item of {} bytes exceeds the limit of {}", fqn,
                    info->length, options_.max_bytes_item));
  }
  ASSIGN_OR_RETURN(const RandomAccessFile* stored,
                   OpenFile(std::string(md.relative_path(*info))));
  ASSIGN_OR_RETURN(DecodedPayload payload,
                   DecodeStorage(stored, *info, key, options_.max_bytes_item,
                                 /*stats=*/nullptr));
  std::string out;
  if (payload.owned != nullptr) {
    out = payload.owned->data();
  } else {
    out.resize(payload.length);
    RETURN_IF_ERROR(stored->ReadExact(payload.offset, out.size(), out.data()));
  }
  if (verify_crc && options_.verify_crc && out.size() >= 4 &&
      std::memcmp(out.data(), "PK\x03\x04", 4) == 0) {
    // A torch.save archive (what DCP writes): every record's CRC-32. Raw
    // bytes items carry no checksum.
    auto archive =
        ZipArchiveReader::Open(payload.file, payload.offset, payload.length);
    if (!archive.ok()) {
      return absl::DataLossError(
          fmt::format("{}: {}", DescribeItem(key), archive.status().message()));
    }
    RETURN_IF_ERROR(VerifyArchiveCrcs(**archive, key));
  }
  return out;
}

absl::StatusOr<DecodedPayload> CheckpointReader::OpenPayload(
    const StorageInfo& info, const StorageKey& key, uint64_t max_decoded) {
  ASSIGN_OR_RETURN(const RandomAccessFile* file, OpenFile(info.relative_path));
  return DecodePayload(file, info.offset, info.length,
                       info.transform_descriptors, max_decoded,
                       DescribeItem(key));
}

absl::StatusOr<DecodedPayload> CheckpointReader::DecodeStorage(
    const RandomAccessFile* stored, const CompactMetadata::Storage& s,
    const StorageKey& key, uint64_t max_decoded, ReadStats* stats) {
  if (s.transforms == CompactMetadata::kNone) {
    DecodedPayload p;
    p.file = stored;
    p.offset = s.offset;
    p.length = s.length;
    return p;
  }
  ASSIGN_OR_RETURN(DecodedPayload p,
                   DecodePayload(stored, s.offset, s.length,
                                 compact_.transform_descriptors(s), max_decoded,
                                 DescribeItem(key)));
  if (stats != nullptr) {
    stats->bytes_read += p.stored_bytes;
    stats->read_calls++;
  }
  return p;
}

absl::StatusOr<PyValue> CheckpointReader::ReadObject(std::string_view fqn) {
  const StorageKey key{std::string(fqn), false, {}};
  ASSIGN_OR_RETURN(const StorageInfo* info, Locate(key));
  ASSIGN_OR_RETURN(DecodedPayload payload,
                   OpenPayload(*info, key, options_.max_bytes_item));
  ASSIGN_OR_RETURN(
      auto archive,
      ZipArchiveReader::Open(payload.file, payload.offset, payload.length));
  if (options_.verify_crc) {
    RETURN_IF_ERROR(VerifyArchiveCrcs(*archive, key));
  }
  ASSIGN_OR_RETURN(auto doc,
                   ParseArchivePickle(*archive, options_.max_bytes_item, fqn));
  auto value = PyValueFromPickle(doc->root());
  if (!value.ok()) return Annotate(value.status(), fqn);
  return value;
}

}  // namespace ckptd::format
