// Copyright 2026 The ckptd Authors.
#include "format/checkpoint_reader.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <utility>

#include "common/parallel.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/save_plan.h"
#include "format/strided_copy.h"
#include "format/zip.h"

namespace ckptd::format {
namespace {


std::vector<int64_t> EffectiveStrides(const std::vector<int64_t>& sizes,
                                      const std::vector<int64_t>& strides) {
  return strides.empty() ? ContiguousStrides(sizes) : strides;
}

// Reverses each `unit`-byte word (the element, or each half of a complex).
void ByteSwap(char* p, size_t n, size_t unit) {
  if (unit <= 1) return;
  for (size_t off = 0; off + unit <= n; off += unit) std::reverse(p + off, p + off + unit);
}

// Reads a box of elements from a file into a strided destination, reading
// only the byte ranges needed: dense boxes go straight into the destination
// when its layout matches, sparse ones are split until each piece is dense
// enough to read through a bounce buffer.
class BoxReader {
 public:
  // swap_unit: 0 for native byte order, else the word size to byte-swap.
  BoxReader(const RandomAccessFile* file, size_t es, size_t swap_unit,
            uint64_t max_block, ReadStats* stats)
      : file_(file), es_(es), swap_unit_(swap_unit), max_block_(max_block), stats_(stats) {}

  // src: file offset of element [0..0] of the box; strides in bytes.
  absl::Status Copy(size_t d, uint64_t src, const std::vector<int64_t>& sstride,
                    char* dst, const std::vector<int64_t>& dstride,
                    std::vector<int64_t>& len) {
    const size_t nd = len.size();
    uint64_t needed = es_, span = es_;
    for (size_t k = d; k < nd; ++k) {
      if (len[k] == 0) return absl::OkStatus();
      needed *= static_cast<uint64_t>(len[k]);
      span += static_cast<uint64_t>(len[k] - 1) * static_cast<uint64_t>(sstride[k]);
    }
    if (span == needed && DenseSameLayout(d, sstride, dstride, len)) {
      // Direct: the box is one contiguous range in the file and in memory.
      for (uint64_t done = 0; done < needed;) {
        const uint64_t n = std::min<uint64_t>(needed - done, uint64_t{1} << 30);
        RETURN_IF_ERROR(file_->ReadExact(src + done, n, dst + done));
        done += n;
        Count(n);
      }
      if (swap_unit_) ByteSwap(dst, needed, swap_unit_);
      if (stats_) stats_->bytes_copied += needed;
      return absl::OkStatus();
    }
    if (span <= max_block_ && (span <= 2 * needed || span <= (64 << 10) || d + 1 == nd)) {
      // Bounce: read the covering range once, scatter from memory.
      buf_.resize(span);
      RETURN_IF_ERROR(file_->ReadExact(src, span, buf_.data()));
      Count(span);
      if (swap_unit_) ByteSwap(buf_.data(), span, swap_unit_);
      std::vector<int64_t> s_el(nd - d), d_el(nd - d);
      for (size_t k = d; k < nd; ++k) {
        s_el[k - d] = sstride[k] / static_cast<int64_t>(es_);
        d_el[k - d] = dstride[k] / static_cast<int64_t>(es_);
      }
      StridedCopy(es_, absl::MakeConstSpan(len).subspan(d), buf_.data(), s_el, dst, d_el);
      if (stats_) stats_->bytes_copied += needed;
      return absl::OkStatus();
    }
    // Split: halve the outermost dimension, or descend into the next one.
    if (len[d] > 1) {
      const int64_t whole = len[d], half = whole / 2;
      len[d] = half;
      RETURN_IF_ERROR(Copy(d, src, sstride, dst, dstride, len));
      len[d] = whole - half;
      absl::Status s = Copy(d, src + half * sstride[d], sstride, dst + half * dstride[d],
                            dstride, len);
      len[d] = whole;
      return s;
    }
    return Copy(d + 1, src, sstride, dst, dstride, len);
  }

 private:
  bool DenseSameLayout(size_t d, const std::vector<int64_t>& sstride,
                       const std::vector<int64_t>& dstride,
                       const std::vector<int64_t>& len) const {
    // Both layouts C-contiguous over dims d.. (ignoring dims of length 1).
    int64_t expect = static_cast<int64_t>(es_);
    for (size_t k = len.size(); k-- > d;) {
      if (len[k] != 1 && (sstride[k] != expect || dstride[k] != expect)) return false;
      expect *= len[k];
    }
    return true;
  }
  void Count(uint64_t n) {
    if (stats_) {
      stats_->bytes_read += n;
      stats_->read_calls++;
    }
  }

  const RandomAccessFile* file_;
  const size_t es_;
  const size_t swap_unit_;
  const uint64_t max_block_;
  ReadStats* stats_;
  std::string buf_;
};

}  // namespace

bool IsSafeRelativePath(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    std::string_view part = path.substr(start, end - start);
    if (part == ".." || part.empty()) return false;
    start = end + 1;
  }
  return path.find('\0') == std::string_view::npos;
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& dir, const CheckpointReaderOptions& options) {
  Env* env = options.env;
  const std::string marker = JoinPath(dir, kMetadataName);
  if (absl::Status e = env->FileExists(marker); !e.ok()) {
    if (absl::IsNotFound(e) && env->FileExists(JoinPath(dir, "__0.metadata")).ok()) {
      return absl::UnimplementedError(fmt::format(
          "{} is a rank-local checkpoint (dcp.save(use_collectives=False)): it has "
          "__{{rank}}.metadata files but no global .metadata",
          dir));
    }
    if (absl::IsNotFound(e)) {
      return absl::NotFoundError(fmt::format(
          "{} has no .metadata: not a checkpoint, or not committed", dir));
    }
    return e;
  }
  ASSIGN_OR_RETURN(std::string bytes,
                   ReadFileToString(env, marker, options.max_metadata_bytes));
  DecodeOptions dopts;
  dopts.source_name = marker;
  ASSIGN_OR_RETURN(Metadata md, DecodeMetadata(bytes, dopts));
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&entry)) {
      RETURN_IF_ERROR(Annotate(
          ValidateChunks(fqn, t->size, t->chunks, /*require_full_coverage=*/false),
          marker));
    }
  }
  for (const auto& [key, info] : md.storage_data) {
    if (!IsSafeRelativePath(info.relative_path)) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: storage entry {} points outside the checkpoint directory: '{}'", marker,
          DescribeKey(key), info.relative_path));
    }
  }
  auto reader = std::unique_ptr<CheckpointReader>(new CheckpointReader(dir, options));
  reader->metadata_ = std::move(md);
  return reader;
}

absl::StatusOr<const StorageInfo*> CheckpointReader::Locate(const StorageKey& key) const {
  const StorageInfo* info = metadata_.FindStorage(key);
  if (info == nullptr) {
    return absl::DataLossError(fmt::format(
        "{}/.metadata: no storage_data entry for {}", dir_, DescribeKey(key)));
  }
  return info;
}

absl::StatusOr<const RandomAccessFile*> CheckpointReader::OpenFile(
    const std::string& relative_path) {
  absl::MutexLock l(&mu_);
  auto it = files_.find(relative_path);
  if (it != files_.end()) return it->second.get();
  ASSIGN_OR_RETURN(auto file, options_.env->NewRandomAccessFile(JoinPath(dir_, relative_path)));
  const RandomAccessFile* raw = file.get();
  files_.emplace(relative_path, std::move(file));
  return raw;
}

absl::StatusOr<std::vector<ReadItem>> CheckpointReader::PlanReads(
    absl::Span<const TensorRequest> requests) const {
  std::vector<ReadItem> items;
  for (size_t r = 0; r < requests.size(); ++r) {
    const TensorRequest& req = requests[r];
    const StorageMetadata* entry = metadata_.Find(req.fqn);
    if (entry == nullptr) {
      return absl::NotFoundError(fmt::format(
          "{}: missing key in checkpoint {}", req.fqn, dir_));
    }
    const auto* tmd = std::get_if<TensorStorageMetadata>(entry);
    if (tmd == nullptr) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: the checkpoint holds a bytes item, not a tensor", req.fqn));
    }
    const size_t nd = tmd->size.size();
    const auto& sizes = req.dest.sizes;
    if (req.offsets.size() != nd || sizes.size() != nd) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: requested box {} has {} dimensions, the saved tensor {}", req.fqn,
          DescribeBox(req.offsets, sizes), req.offsets.size(), nd));
    }
    uint64_t want = 1;
    for (size_t d = 0; d < nd; ++d) {
      if (req.offsets[d] < 0 || sizes[d] < 0 || req.offsets[d] > tmd->size[d] ||
          sizes[d] > tmd->size[d] - req.offsets[d]) {
        return absl::OutOfRangeError(fmt::format(
            "{}: requested box {} is outside the saved shape {}", req.fqn,
            DescribeBox(req.offsets, sizes),
            DescribeBox(std::vector<int64_t>(nd, 0), tmd->size)));
      }
      want *= static_cast<uint64_t>(sizes[d]);
    }
    uint64_t got = 0;
    for (size_t c = 0; c < tmd->chunks.size(); ++c) {
      const ChunkStorageMetadata& s = tmd->chunks[c];
      ReadItem item;
      item.request = r;
      item.chunk = c;
      bool overlap = true;
      uint64_t vol = 1;
      for (size_t d = 0; d < nd && overlap; ++d) {
        const int64_t start = std::max(req.offsets[d], s.offsets[d]);
        const int64_t end = std::min(req.offsets[d] + sizes[d], s.offsets[d] + s.sizes[d]);
        if (start >= end) {
          overlap = false;
          break;
        }
        item.lengths.push_back(end - start);
        item.storage_offsets.push_back(start - s.offsets[d]);
        item.dest_offsets.push_back(start - req.offsets[d]);
        vol *= static_cast<uint64_t>(end - start);
      }
      if (!overlap) continue;
      got += vol;
      items.push_back(std::move(item));
    }
    if (got != want) {
      return absl::DataLossError(fmt::format(
          "{}: the checkpoint's chunks cover only {} of the {} requested elements of {}",
          req.fqn, got, want, DescribeBox(req.offsets, sizes)));
    }
  }
  return items;
}

absl::Status CheckpointReader::ReadTensors(absl::Span<const TensorRequest> requests,
                                           ReadStats* stats) {
  ASSIGN_OR_RETURN(std::vector<ReadItem> items, PlanReads(requests));
  return ReadPlanned(requests, items, stats);
}

absl::Status CheckpointReader::ReadPlanned(absl::Span<const TensorRequest> requests,
                                           absl::Span<const ReadItem> items,
                                           ReadStats* stats) {
  for (const TensorRequest& req : requests) {
    if (req.dest.data == nullptr) {
      uint64_t n = 1;
      for (int64_t s : req.dest.sizes) n *= static_cast<uint64_t>(s);
      if (n > 0) return absl::InvalidArgumentError(fmt::format("{}: no destination buffer", req.fqn));
    }
  }
  // Group by (fqn, saved chunk) so each payload's header is parsed once.
  std::vector<const ReadItem*> order;
  order.reserve(items.size());
  for (const ReadItem& it : items) order.push_back(&it);
  std::stable_sort(order.begin(), order.end(), [&](const ReadItem* a, const ReadItem* b) {
    const std::string& fa = requests[a->request].fqn;
    const std::string& fb = requests[b->request].fqn;
    if (fa != fb) return fa < fb;
    return a->chunk < b->chunk;
  });
  // [begin, end) of `order`: the items of one (fqn, saved chunk).
  std::vector<std::pair<size_t, size_t>> groups;
  for (size_t i = 0; i < order.size();) {
    size_t j = i + 1;
    const std::string& fqn = requests[order[i]->request].fqn;
    while (j < order.size() && order[j]->chunk == order[i]->chunk &&
           requests[order[j]->request].fqn == fqn) {
      ++j;
    }
    groups.emplace_back(i, j);
    i = j;
  }
  auto read_group = [&](size_t g, ReadStats* group_stats) {
    const auto [begin, end] = groups[g];
    const std::string& fqn = requests[order[begin]->request].fqn;
    const auto& tmd = std::get<TensorStorageMetadata>(*metadata_.Find(fqn));
    return ReadChunkItems(
        tmd, fqn, order[begin]->chunk,
        absl::MakeConstSpan(order.data() + begin, end - begin), requests,
        group_stats);
  };

  const size_t n_threads = std::min<size_t>(
      static_cast<size_t>(std::max(options_.threads, 1)), groups.size());
  if (n_threads <= 1) {
    for (size_t g = 0; g < groups.size(); ++g) {
      RETURN_IF_ERROR(read_group(g, stats));
    }
    return absl::OkStatus();
  }
  // A worker loop over the groups; the caller's thread is one of the workers.
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first_error;  // guarded by mu
  ReadStats total;           // guarded by mu
  auto worker = [&] {
    ReadStats local;
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t g = next.fetch_add(1, std::memory_order_relaxed);
      if (g >= groups.size()) break;
      if (absl::Status s = read_group(g, stats != nullptr ? &local : nullptr);
          !s.ok()) {
        absl::MutexLock l(&mu);
        if (first_error.ok()) first_error = std::move(s);
        failed.store(true, std::memory_order_relaxed);
        break;
      }
    }
    absl::MutexLock l(&mu);
    total.bytes_read += local.bytes_read;
    total.bytes_copied += local.bytes_copied;
    total.read_calls += local.read_calls;
  };
  RunOnThreads(static_cast<int>(n_threads), worker);
  absl::MutexLock l(&mu);
  if (stats != nullptr) {
    stats->bytes_read += total.bytes_read;
    stats->bytes_copied += total.bytes_copied;
    stats->read_calls += total.read_calls;
  }
  return first_error;
}

absl::Status CheckpointReader::ReadChunkItems(const TensorStorageMetadata& tmd,
                                              const std::string& fqn, size_t chunk,
                                              absl::Span<const ReadItem* const> items,
                                              absl::Span<const TensorRequest> requests,
                                              ReadStats* stats) {
  const ChunkStorageMetadata& saved = tmd.chunks[chunk];
  StorageKey key{fqn, true, saved.offsets};
  ASSIGN_OR_RETURN(const StorageInfo* info, Locate(key));
  if (!info->transform_descriptors.empty()) {
    return absl::UnimplementedError(fmt::format(
        "{}: payload uses storage transforms [{}], which ckptd does not read yet",
        DescribeKey(key), fmt::join(info->transform_descriptors, ", ")));
  }
  ASSIGN_OR_RETURN(const RandomAccessFile* file, OpenFile(info->relative_path));
  char magic[4] = {0, 0, 0, 0};
  if (info->length >= 4) RETURN_IF_ERROR(file->ReadExact(info->offset, 4, magic));
  if (info->length < 4 || std::memcmp(magic, "PK\x03\x04", 4) != 0) {
    return absl::UnimplementedError(fmt::format(
        "{} @ {}: payload of {} is not a torch.save archive (a SAFETENSORS-format "
        "checkpoint?)",
        file->path(), info->offset, DescribeKey(key)));
  }
  ASSIGN_OR_RETURN(auto archive, ZipArchiveReader::Open(file, info->offset, info->length));
  ASSIGN_OR_RETURN(TensorRecord rec, ParseTensorPayload(*archive));
  if (rec.sizes != saved.sizes) {
    return absl::DataLossError(fmt::format(
        "{}: payload has shape {} but .metadata says the chunk is {}",
        archive->Describe(), DescribeBox(std::vector<int64_t>(rec.sizes.size(), 0), rec.sizes),
        DescribeBox(saved.offsets, saved.sizes)));
  }
  const size_t es = ElementSize(rec.dtype);
  const size_t nd = rec.sizes.size();
  std::vector<int64_t> sstride(nd);
  for (size_t d = 0; d < nd; ++d) sstride[d] = rec.strides[d] * static_cast<int64_t>(es);
  const uint64_t storage_base =
      info->offset + rec.entry->data_offset + static_cast<uint64_t>(rec.storage_offset) * es;
  size_t swap_unit = 0;
  if (rec.big_endian) {
    swap_unit = rec.dtype == DType::kComplex128 ? 8 : rec.dtype == DType::kComplex64 ? 4 : es;
  }
  BoxReader box(file, es, swap_unit, options_.max_read_block, stats);
  for (const ReadItem* it : items) {
    const TensorRequest& req = requests[it->request];
    if (req.dest.dtype != rec.dtype) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: the checkpoint holds {} but the destination is {}", fqn,
          DTypeName(rec.dtype), DTypeName(req.dest.dtype)));
    }
    const std::vector<int64_t> dst_el = EffectiveStrides(req.dest.sizes, req.dest.strides);
    std::vector<int64_t> dstride(nd);
    uint64_t src = storage_base;
    char* dst = req.dest.data;
    for (size_t d = 0; d < nd; ++d) {
      dstride[d] = dst_el[d] * static_cast<int64_t>(es);
      src += static_cast<uint64_t>(it->storage_offsets[d]) * static_cast<uint64_t>(sstride[d]);
      dst += it->dest_offsets[d] * dstride[d];
    }
    std::vector<int64_t> len = it->lengths;
    RETURN_IF_ERROR(Annotate(box.Copy(0, src, sstride, dst, dstride, len), fqn));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointReader::ReadBytesItem(std::string_view fqn) {
  const StorageMetadata* entry = metadata_.Find(fqn);
  if (entry == nullptr) {
    return absl::NotFoundError(fmt::format("{}: missing key in checkpoint {}", fqn, dir_));
  }
  if (!std::holds_alternative<BytesStorageMetadata>(*entry)) {
    return absl::InvalidArgumentError(fmt::format("{}: is a tensor, not a bytes item", fqn));
  }
  ASSIGN_OR_RETURN(const StorageInfo* info, Locate(StorageKey{std::string(fqn), false, {}}));
  if (info->length > options_.max_bytes_item) {
    return absl::ResourceExhaustedError(fmt::format(
        "{}: bytes item of {} bytes exceeds the limit of {}", fqn, info->length,
        options_.max_bytes_item));
  }
  ASSIGN_OR_RETURN(const RandomAccessFile* file, OpenFile(info->relative_path));
  std::string out(info->length, '\0');
  RETURN_IF_ERROR(file->ReadExact(info->offset, out.size(), out.data()));
  return out;
}

absl::StatusOr<PyValue> CheckpointReader::ReadObject(std::string_view fqn) {
  ASSIGN_OR_RETURN(const StorageInfo* info, Locate(StorageKey{std::string(fqn), false, {}}));
  if (!info->transform_descriptors.empty()) {
    return absl::UnimplementedError(fmt::format(
        "{}: payload uses storage transforms, which ckptd does not read yet", fqn));
  }
  ASSIGN_OR_RETURN(const RandomAccessFile* file, OpenFile(info->relative_path));
  ASSIGN_OR_RETURN(auto archive, ZipArchiveReader::Open(file, info->offset, info->length));
  ASSIGN_OR_RETURN(auto doc, ParseArchivePickle(*archive, options_.max_bytes_item, fqn));
  auto value = PyValueFromPickle(doc->root());
  if (!value.ok()) return Annotate(value.status(), fqn);
  return value;
}

}  // namespace ckptd::format
