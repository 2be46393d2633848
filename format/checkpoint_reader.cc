// Copyright 2026 The ckptd Authors.
#include "format/checkpoint_reader.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>

#include "common/absl_fmt.h"
#include "common/crc32.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/save_plan.h"
#include "format/strided_copy.h"
#include "format/zip.h"

namespace ckptd::format {
namespace {

// Blocks in which the fused read-and-CRC path reads a record: small enough
// that the CRC reads the bytes back from cache (L2), large enough that the
// syscalls cost nothing.
constexpr uint64_t kFusedCrcBlock = uint64_t{256} << 10;
// Blocks of the stand-alone record check.
constexpr uint64_t kCrcBlock = uint64_t{1} << 20;
// Records at least this large are CRC'd on a helper thread while the
// reading thread reads on (the page-cache copy and the CRC then overlap),
// where the machine has a core for each reading thread's helper.
constexpr uint64_t kPipelineMin = uint64_t{4} << 20;

// "item 'model.w' chunk at offsets (2, 0)" / "bytes item 'step'".
std::string DescribeItem(const StorageKey& key) {
  if (!key.has_offset) return fmt::format("bytes item '{}'", key.fqn);
  return fmt::format("item '{}' chunk at offsets ({})", key.fqn,
                     fmt::join(key.offset, ", "));
}

absl::Status CrcMismatch(const ZipArchiveReader& archive, const StorageKey& key,
                         const ZipEntry& e, uint32_t got) {
  return absl::DataLossError(fmt::format(
      "{}: {}: CRC-32 mismatch in record '{}' at file offset {} ({} bytes): "
      "the data has "
      "0x{:08x}, the archive says 0x{:08x}; the payload is corrupt (ckptctl "
      "verify lists "
      "every damaged record)",
      archive.Describe(), DescribeItem(key), e.name,
      archive.archive_offset() + e.data_offset, e.size, got, e.crc32));
}

// Streams one record through CRC-32 and compares it with the archive.
absl::Status VerifyRecord(const ZipArchiveReader& archive,
                          const StorageKey& key, const ZipEntry& e,
                          ReadStats* stats) {
  std::string buf(std::min(e.size, kCrcBlock), '\0');
  uint32_t crc = 0;
  for (uint64_t done = 0; done < e.size;) {
    const size_t n = std::min(e.size - done, kCrcBlock);
    RETURN_IF_ERROR(
        Annotate(archive.ReadRange(e, done, n, buf.data()), DescribeItem(key)));
    crc = Crc32(crc, buf.data(), n);
    done += n;
    if (stats != nullptr) {
      stats->bytes_read += n;
      stats->read_calls++;
      stats->crc_bytes += n;
    }
  }
  if (crc != e.crc32) return CrcMismatch(archive, key, e, crc);
  return absl::OkStatus();
}

// A parse error of a payload's small records that is a CRC mismatch (the zip
// reader's ReadRecord checks them) becomes DATA_LOSS naming the item.
absl::Status CrcErrorAsDataLoss(const absl::Status& s, const StorageKey& key) {
  if (absl::IsInvalidArgument(s) &&
      s.message().find("CRC-32 mismatch") != std::string_view::npos) {
    return absl::DataLossError(
        fmt::format("{}: {}", DescribeItem(key), s.message()));
  }
  return s;
}

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

// CRC-32 of a record on a helper thread while the reading thread reads it
// into memory: the reader publishes how many bytes are in place, the helper
// follows (spinning, then yielding, between blocks: a futex wake per block
// would cost the reader more than the CRC). One per reading thread, reused
// for every large record that thread reads in one ReadPlanned call.
class CrcHelper {
 public:
  CrcHelper() : thread_([this] { Run(); }) {}
  ~CrcHelper() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  CrcHelper(const CrcHelper&) = delete;
  CrcHelper& operator=(const CrcHelper&) = delete;

  // Starts the CRC of [base, base + size); bytes become readable as they
  // are Publish()ed. Finish() or Cancel() must follow.
  void Begin(const char* base, uint64_t size) {
    progress_.store(0, std::memory_order_relaxed);
    cancel_.store(false, std::memory_order_relaxed);
    done_.store(false, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> l(mu_);
      base_ = base;
      size_ = size;
      job_ = true;
    }
    cv_.notify_one();
  }
  // Bytes [0, n) of the record are in place.
  void Publish(uint64_t n) { progress_.store(n, std::memory_order_release); }
  // Waits until the helper has run every byte through CRC-32.
  uint32_t Finish() {
    Wait();
    return crc_;
  }
  // Abandons the record (a read failed); the helper stops at once.
  void Cancel() {
    cancel_.store(true, std::memory_order_release);
    Wait();
  }

 private:
  void Wait() {
    for (int spins = 0; !done_.load(std::memory_order_acquire); ++spins) {
      if (spins > 64) std::this_thread::yield();
    }
  }
  void Run() {
    for (;;) {
      const char* base;
      uint64_t size;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [this] { return job_ || stop_; });
        if (!job_) return;
        job_ = false;
        base = base_;
        size = size_;
      }
      uint32_t crc = 0;
      uint64_t got = 0;
      for (int idle = 0;
           got < size && !cancel_.load(std::memory_order_acquire);) {
        const uint64_t p = progress_.load(std::memory_order_acquire);
        if (p == got) {
          if (++idle > 64) std::this_thread::yield();
          continue;
        }
        idle = 0;
        crc = Crc32(crc, base + got, p - got);
        got = p;
      }
      crc_ = crc;
      done_.store(true, std::memory_order_release);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  const char* base_ = nullptr;  // guarded by mu_
  uint64_t size_ = 0;           // guarded by mu_
  bool job_ = false;            // guarded by mu_
  bool stop_ = false;           // guarded by mu_
  std::atomic<uint64_t> progress_{0};
  std::atomic<bool> cancel_{false};
  std::atomic<bool> done_{true};
  uint32_t crc_ = 0;  // written by the helper before done_
  std::thread thread_;
};

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

absl::Status CheckpointReader::VerifyArchiveCrcs(
    const ZipArchiveReader& archive, const StorageKey& key,
    const ZipEntry* skip, ReadStats* stats) {
  for (const ZipEntry& e : archive.entries()) {
    if (&e == skip) continue;
    RETURN_IF_ERROR(VerifyRecord(archive, key, e, stats));
  }
  return absl::OkStatus();
}

bool CheckpointReader::CrcChecked(const StorageInfo* info) {
  absl::MutexLock l(&crc_mu_);
  return crc_checked_.contains(info);
}

void CheckpointReader::MarkCrcChecked(const StorageInfo* info) {
  absl::MutexLock l(&crc_mu_);
  crc_checked_.insert(info);
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
  auto read_group = [&](size_t g, ReadStats* group_stats,
                        std::unique_ptr<CrcHelper>* helper) {
    const auto [begin, end] = groups[g];
    const std::string& fqn = requests[order[begin]->request].fqn;
    const auto& tmd = std::get<TensorStorageMetadata>(*metadata_.Find(fqn));
    return ReadChunkItems(
        tmd, fqn, order[begin]->chunk,
        absl::MakeConstSpan(order.data() + begin, end - begin), requests,
        group_stats, helper);
  };

  const size_t n_threads = std::min<size_t>(
      static_cast<size_t>(std::max(options_.threads, 1)), groups.size());
  if (n_threads <= 1) {
    std::unique_ptr<CrcHelper> helper;
    for (size_t g = 0; g < groups.size(); ++g) {
      RETURN_IF_ERROR(read_group(g, stats, &helper));
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
    std::unique_ptr<CrcHelper> helper;
    while (!failed.load(std::memory_order_relaxed)) {
      const size_t g = next.fetch_add(1, std::memory_order_relaxed);
      if (g >= groups.size()) break;
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
    total.bytes_read += local.bytes_read;
    total.bytes_copied += local.bytes_copied;
    total.read_calls += local.read_calls;
    total.crc_bytes += local.crc_bytes;
  };
  RunOnThreads(static_cast<int>(n_threads), worker);
  absl::MutexLock l(&mu);
  if (stats != nullptr) {
    stats->bytes_read += total.bytes_read;
    stats->bytes_copied += total.bytes_copied;
    stats->read_calls += total.read_calls;
    stats->crc_bytes += total.crc_bytes;
  }
  return first_error;
}

absl::Status CheckpointReader::ReadChunkItems(
    const TensorStorageMetadata& tmd, const std::string& fqn, size_t chunk,
    absl::Span<const ReadItem* const> items,
    absl::Span<const TensorRequest> requests, ReadStats* stats,
    std::unique_ptr<CrcHelper>* helper) {
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
  absl::StatusOr<TensorRecord> parsed = ParseTensorPayload(*archive);
  if (!parsed.ok()) return CrcErrorAsDataLoss(parsed.status(), key);
  TensorRecord rec = *std::move(parsed);
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
  if (options_.verify_crc && !CrcChecked(info)) {
    // The CRC rule (checkpoint_reader.h).
    const ZipEntry& e = *rec.entry;
    uint64_t view_bytes = es;
    for (int64_t s : rec.sizes) view_bytes *= static_cast<uint64_t>(s);
    if (items.size() == 1 && rec.storage_offset == 0 && view_bytes == e.size &&
        requests[items[0]->request].dest.dtype == rec.dtype &&
        items[0]->lengths == rec.sizes) {
      // Fused: the whole record, in one piece, into a destination region of
      // the same C-order layout? Then CRC the bytes as they arrive.
      const ReadItem& it = *items[0];
      const TensorRequest& req = requests[it.request];
      const std::vector<int64_t> dst_el =
          EffectiveStrides(req.dest.sizes, req.dest.strides);
      bool dense = true;
      int64_t expect = static_cast<int64_t>(es);
      char* dst = req.dest.data;
      for (size_t k = nd; k-- > 0;) {
        const int64_t dstride = dst_el[k] * static_cast<int64_t>(es);
        if (it.lengths[k] != 1 && (sstride[k] != expect || dstride != expect))
          dense = false;
        expect *= it.lengths[k];
        dst += it.dest_offsets[k] * dstride;
      }
      if (dense) {
        uint32_t crc = 0;
        CrcHelper* pipeline = nullptr;
        // A helper only where it has a core of its own: every reading
        // thread and its helper fit the machine.
        if (e.size >= kPipelineMin && helper != nullptr &&
            2 * static_cast<unsigned>(std::max(options_.threads, 1)) <=
                std::thread::hardware_concurrency()) {
          if (*helper == nullptr) *helper = std::make_unique<CrcHelper>();
          pipeline = helper->get();
          pipeline->Begin(dst, e.size);
        }
        for (uint64_t done = 0; done < e.size;) {
          const size_t n = std::min(e.size - done, kFusedCrcBlock);
          if (absl::Status rs =
                  file->ReadExact(storage_base + done, n, dst + done);
              !rs.ok()) {
            if (pipeline != nullptr) pipeline->Cancel();
            return Annotate(rs, fqn);
          }
          if (pipeline != nullptr) {
            pipeline->Publish(done + n);
          } else {
            crc = Crc32(crc, dst + done, n);
          }
          done += n;
          if (stats != nullptr) stats->read_calls++;
        }
        if (pipeline != nullptr) crc = pipeline->Finish();
        if (stats != nullptr) {
          stats->bytes_read += e.size;
          stats->bytes_copied += e.size;
          stats->crc_bytes += e.size;
        }
        if (crc != e.crc32) return CrcMismatch(*archive, key, e, crc);
        if (swap_unit) ByteSwap(dst, e.size, swap_unit);
        MarkCrcChecked(info);
        return absl::OkStatus();
      }
    }
    // One pass: when every item is one contiguous byte range of the record
    // and of its destination (row boxes of a C-order chunk, as resharding
    // along the first dimension reads), the record is streamed once through
    // CRC-32 and each item's bytes are copied out of the block in cache.
    struct Piece {
      uint64_t begin, size;  // within the record
      char* dst;
    };
    std::vector<Piece> pieces;
    bool one_pass = true;
    const uint64_t rec_start = info->offset + e.data_offset;
    for (const ReadItem* it : items) {
      const TensorRequest& req = requests[it->request];
      if (req.dest.dtype != rec.dtype) {
        one_pass = false;
        break;
      }
      const std::vector<int64_t> dst_el =
          EffectiveStrides(req.dest.sizes, req.dest.strides);
      uint64_t begin = storage_base - rec_start;
      char* dst = req.dest.data;
      int64_t expect = static_cast<int64_t>(es);
      for (size_t k = nd; k-- > 0;) {
        const int64_t dstride = dst_el[k] * static_cast<int64_t>(es);
        if (it->lengths[k] != 1 && (sstride[k] != expect || dstride != expect))
          one_pass = false;
        expect *= it->lengths[k];
        begin += static_cast<uint64_t>(it->storage_offsets[k]) *
                 static_cast<uint64_t>(sstride[k]);
        dst += it->dest_offsets[k] * dstride;
      }
      const uint64_t size = static_cast<uint64_t>(expect);
      if (!one_pass || begin > e.size || size > e.size - begin) {
        one_pass = false;
        break;
      }
      pieces.push_back({begin, size, dst});
    }
    if (one_pass) {
      std::string buf(std::min(e.size, kFusedCrcBlock), '\0');
      uint32_t crc = 0;
      for (uint64_t done = 0; done < e.size;) {
        const size_t n = std::min(e.size - done, kFusedCrcBlock);
        RETURN_IF_ERROR(
            Annotate(file->ReadExact(rec_start + done, n, buf.data()), fqn));
        crc = Crc32(crc, buf.data(), n);
        for (const Piece& p : pieces) {
          const uint64_t lo = std::max(p.begin, done);
          const uint64_t hi = std::min(p.begin + p.size, done + n);
          if (lo < hi)
            std::memcpy(p.dst + (lo - p.begin), buf.data() + (lo - done),
                        hi - lo);
        }
        done += n;
        if (stats != nullptr) stats->read_calls++;
      }
      if (stats != nullptr) {
        stats->bytes_read += e.size;
        stats->crc_bytes += e.size;
        for (const Piece& p : pieces) stats->bytes_copied += p.size;
      }
      if (crc != e.crc32) return CrcMismatch(*archive, key, e, crc);
      if (swap_unit) {
        for (const Piece& p : pieces) ByteSwap(p.dst, p.size, swap_unit);
      }
      MarkCrcChecked(info);
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(VerifyRecord(*archive, key, e, stats));
    MarkCrcChecked(info);
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
  if (options_.verify_crc && out.size() >= 4 &&
      std::memcmp(out.data(), "PK\x03\x04", 4) == 0) {
    // A torch.save archive (what DCP writes): every record's CRC-32. Raw
    // bytes items carry no checksum.
    const StorageKey key{std::string(fqn), false, {}};
    auto archive = ZipArchiveReader::Open(file, info->offset, info->length);
    if (!archive.ok()) {
      return absl::DataLossError(
          fmt::format("{}: {}", DescribeItem(key), archive.status().message()));
    }
    RETURN_IF_ERROR(VerifyArchiveCrcs(**archive, key));
  }
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
  if (options_.verify_crc) {
    RETURN_IF_ERROR(
        VerifyArchiveCrcs(*archive, StorageKey{std::string(fqn), false, {}}));
  }
  ASSIGN_OR_RETURN(auto doc, ParseArchivePickle(*archive, options_.max_bytes_item, fqn));
  auto value = PyValueFromPickle(doc->root());
  if (!value.ok()) return Annotate(value.status(), fqn);
  return value;
}

}  // namespace ckptd::format
