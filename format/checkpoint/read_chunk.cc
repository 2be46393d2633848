// Copyright 2026 The ckptd Authors.
//
// CheckpointReader::ReadChunkItems (checkpoint_reader.h: the CRC rule) and
// its helpers (read_chunk.h).
#include "format/checkpoint/read_chunk.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "common/absl_fmt.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/convert/safetensors.h"
#include "format/plan/save_plan.h"
#include "format/tensor/strided_copy.h"
#include "format/tensor/tensor_payload.h"

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
// Direct reads (direct_io, records of kDirectReadMinBytes and more) go in
// blocks of kDirectBlock: large enough that one read keeps the device busy.
constexpr uint64_t kDirectBlock = uint64_t{8} << 20;
// The windows of an item's archive read before parsing it (the end records
// and central directory of a torch.save archive, and its first records,
// fit in far less).
constexpr uint64_t kArchiveWindow = uint64_t{64} << 10;

std::vector<int64_t> EffectiveStrides(const std::vector<int64_t>& sizes,
                                      const std::vector<int64_t>& strides) {
  return strides.empty() ? ContiguousStrides(sizes) : strides;
}

// Reverses each `unit`-byte word (the element, or each half of a complex).
void ByteSwap(char* p, size_t n, size_t unit) {
  if (unit <= 1) return;
  for (size_t off = 0; off + unit <= n; off += unit)
    std::reverse(p + off, p + off + unit);
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
      : file_(file),
        es_(es),
        swap_unit_(swap_unit),
        max_block_(max_block),
        stats_(stats) {}

  // src: file offset of element [0..0] of the box; strides in bytes.
  absl::Status Copy(size_t d, uint64_t src, const std::vector<int64_t>& sstride,
                    char* dst, const std::vector<int64_t>& dstride,
                    std::vector<int64_t>& len) {
    const size_t nd = len.size();
    uint64_t needed = es_, span = es_;
    for (size_t k = d; k < nd; ++k) {
      if (len[k] == 0) return absl::OkStatus();
      needed *= static_cast<uint64_t>(len[k]);
      span +=
          static_cast<uint64_t>(len[k] - 1) * static_cast<uint64_t>(sstride[k]);
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
    if (span <= max_block_ &&
        (span <= 2 * needed || span <= (64 << 10) || d + 1 == nd)) {
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
      StridedCopy(es_, absl::MakeConstSpan(len).subspan(d), buf_.data(), s_el,
                  dst, d_el);
      if (stats_) stats_->bytes_copied += needed;
      return absl::OkStatus();
    }
    // Split: halve the outermost dimension, or descend into the next one.
    if (len[d] > 1) {
      const int64_t whole = len[d], half = whole / 2;
      len[d] = half;
      RETURN_IF_ERROR(Copy(d, src, sstride, dst, dstride, len));
      len[d] = whole - half;
      absl::Status s = Copy(d, src + half * sstride[d], sstride,
                            dst + half * dstride[d], dstride, len);
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
      if (len[k] != 1 && (sstride[k] != expect || dstride[k] != expect))
        return false;
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

// Where the part of the record `e` of `rec` that `it` reads lies, when its
// bytes are one contiguous range of the record in the part's own dense C
// order, and its destination (in `request`) is laid out the same way: a
// whole record, or a part cut along its first dimension of length above 1
// (as the client cuts boxes larger than a batch). nullopt otherwise.
struct ContiguousPart {
  uint64_t offset = 0;      // from the record's first element, in bytes
  uint64_t size = 0;        // bytes
  int64_t dest_offset = 0;  // of the part in request.dest, in bytes
};
std::optional<ContiguousPart> ContiguousRange(const TensorRecord& rec,
                                              const ZipEntry& e,
                                              const ReadItem& it,
                                              const TensorRequest& request) {
  const size_t es = ElementSize(rec.dtype);
  const size_t nd = rec.sizes.size();
  uint64_t view_bytes = es;
  for (int64_t s : rec.sizes) view_bytes *= static_cast<uint64_t>(s);
  if (rec.storage_offset != 0 || view_bytes != e.size ||
      request.dest.dtype != rec.dtype || it.lengths.size() != nd ||
      it.storage_offsets.size() != nd || it.dest_offsets.size() != nd) {
    return std::nullopt;
  }
  const std::vector<int64_t> dst_el =
      EffectiveStrides(request.dest.sizes, request.dest.strides);
  if (dst_el.size() != nd) return std::nullopt;
  int64_t record_expect = static_cast<int64_t>(es);  // C order of the record
  int64_t part_expect = static_cast<int64_t>(es);    // C order of the part
  bool cut = false;  // a dimension after this one is cut
  ContiguousPart part;
  for (size_t k = nd; k-- > 0;) {
    const int64_t sstride = rec.strides[k] * static_cast<int64_t>(es);
    const int64_t dstride = dst_el[k] * static_cast<int64_t>(es);
    if (it.lengths[k] != 1) {
      if (cut || sstride != record_expect || dstride != part_expect) {
        return std::nullopt;
      }
      cut = it.lengths[k] != rec.sizes[k];
    }
    part.offset += static_cast<uint64_t>(it.storage_offsets[k] * sstride);
    part.dest_offset += it.dest_offsets[k] * dstride;
    record_expect *= rec.sizes[k];
    part_expect *= it.lengths[k];
  }
  part.size = static_cast<uint64_t>(part_expect);
  return part;
}

// Where the record `e` of `rec` goes when `items` (of one chunk) read it
// whole, in one piece, into a destination region of the same C-order
// layout; nullopt when they read anything else.
std::optional<char*> WholeRecordDest(const TensorRecord& rec, const ZipEntry& e,
                                     absl::Span<const ReadItem* const> items,
                                     absl::Span<const TensorRequest> requests) {
  if (items.size() != 1 || items[0]->lengths != rec.sizes) return std::nullopt;
  const TensorRequest& req = requests[items[0]->request];
  const std::optional<ContiguousPart> part =
      ContiguousRange(rec, e, *items[0], req);
  if (!part.has_value()) return std::nullopt;
  return req.dest.data + part->dest_offset;
}

// Reads [base, base + size) of `file` into `dst`: where `direct` and `dst`
// shares base's alignment (RandomAccessFile::DirectAlignment), the aligned
// middle with direct reads of kDirectBlock, the rest through the page
// cache in kFusedCrcBlock preads. With `crc`, its CRC-32 into *crc, on
// `pipeline` when there is one (else inline, block by block). Stops before
// a block once `cancel` (may be null) is raised.
absl::Status ReadWholeRecord(const RandomAccessFile* file, uint64_t base,
                             uint64_t size, char* dst, bool crc, bool direct,
                             CrcHelper* pipeline, const Cancellation* cancel,
                             ReadStats* stats, uint32_t* out) {
  // [0, head) and [head + middle, size) buffered, the middle direct.
  uint64_t head = size, middle = 0;
  if (direct && size >= kDirectReadMinBytes) {
    const uint64_t a = file->DirectAlignment();
    if (a != 0 && reinterpret_cast<uintptr_t>(dst) % a == base % a) {
      head = (a - base % a) % a;
      middle = (size - head) / a * a;
    }
  }
  if (crc && pipeline != nullptr) pipeline->Begin(dst, size);
  uint32_t sum = 0;
  for (uint64_t done = 0; done < size;) {
    const bool in_middle = done >= head && done < head + middle;
    const uint64_t end = in_middle ? head + middle : done < head ? head : size;
    const size_t n =
        std::min(end - done, in_middle ? kDirectBlock : kFusedCrcBlock);
    const absl::Status rs =
        cancel != nullptr && cancel->cancelled() ? cancel->status()
        : in_middle ? file->ReadDirect(base + done, n, dst + done)
                    : file->ReadExact(base + done, n, dst + done);
    if (!rs.ok()) {
      if (crc && pipeline != nullptr) pipeline->Cancel();
      return rs;
    }
    if (crc && pipeline != nullptr) {
      pipeline->Publish(done + n);
    } else if (crc) {
      sum = Crc32(sum, dst + done, n);
    }
    done += n;
    if (stats != nullptr) stats->read_calls++;
  }
  if (crc && pipeline != nullptr) sum = pipeline->Finish();
  if (stats != nullptr) {
    stats->bytes_read += size;
    stats->bytes_copied += size;
    if (crc) stats->crc_bytes += size;
    if (middle > 0) stats->direct_bytes += middle;
  }
  *out = sum;
  return absl::OkStatus();
}

// Copies each item's box from the chunk's stored elements (element [0..0]
// at file offset `base`, byte strides `sstride`) into its destination.
absl::Status CopyBoxes(const RandomAccessFile* file, DType dtype,
                       size_t swap_unit, uint64_t base,
                       const std::vector<int64_t>& sstride,
                       absl::Span<const ReadItem* const> items,
                       absl::Span<const TensorRequest> requests,
                       uint64_t max_block, ReadStats* stats,
                       std::string_view fqn) {
  const size_t es = ElementSize(dtype);
  const size_t nd = sstride.size();
  BoxReader box(file, es, swap_unit, max_block, stats);
  for (const ReadItem* it : items) {
    const TensorRequest& req = requests[it->request];
    if (req.dest.dtype != dtype) {
      return absl::InvalidArgumentError(
          fmt::format("{}: the checkpoint holds {} but the destination is {}",
                      fqn, DTypeName(dtype), DTypeName(req.dest.dtype)));
    }
    const std::vector<int64_t> dst_el =
        EffectiveStrides(req.dest.sizes, req.dest.strides);
    std::vector<int64_t> dstride(nd);
    uint64_t src = base;
    char* dst = req.dest.data;
    for (size_t d = 0; d < nd; ++d) {
      dstride[d] = dst_el[d] * static_cast<int64_t>(es);
      src += static_cast<uint64_t>(it->storage_offsets[d]) *
             static_cast<uint64_t>(sstride[d]);
      dst += it->dest_offsets[d] * dstride[d];
    }
    std::vector<int64_t> len = it->lengths;
    RETURN_IF_ERROR(
        Annotate(box.Copy(0, src, sstride, dst, dstride, len), fqn));
  }
  return absl::OkStatus();
}

// The byte strides of a record's stored elements.
std::vector<int64_t> ByteStrides(const TensorRecord& rec) {
  const size_t es = ElementSize(rec.dtype);
  const size_t nd = rec.sizes.size();
  std::vector<int64_t> sstride(nd);
  for (size_t d = 0; d < nd; ++d)
    sstride[d] = rec.strides[d] * static_cast<int64_t>(es);
  return sstride;
}

// The word size in which a record's elements are byte-swapped (the
// element, or each half of a complex): 0 for a little-endian record.
size_t SwapUnit(const TensorRecord& rec) {
  if (!rec.big_endian) return 0;
  return rec.dtype == DType::kComplex128  ? 8
         : rec.dtype == DType::kComplex64 ? 4
                                          : ElementSize(rec.dtype);
}

// The helper to run the CRC of a record of `size` bytes on (made on first
// use in *helper), or null: only for large records, and only where it has a
// core of its own (every one of `threads` reading threads and its helper
// fit the machine). `helper` may be null (no helper).
CrcHelper* CrcPipeline(uint64_t size, int threads,
                       std::unique_ptr<CrcHelper>* helper) {
  if (size < kPipelineMin || helper == nullptr ||
      2 * static_cast<unsigned>(std::max(threads, 1)) >
          std::thread::hardware_concurrency()) {
    return nullptr;
  }
  if (*helper == nullptr) *helper = std::make_unique<CrcHelper>();
  return helper->get();
}

// What the steps of CheckpointReader::ReadChunkItems share: a saved
// chunk's record, opened (OpenChunk), its layout, and the parts of it that
// the items read.
struct RecordRead {
  const ChunkRecord& c;
  const ZipEntry& e;             // the data record
  uint64_t record_start;         // file offset of its first byte
  const StorageKey& key;         // for messages
  std::string_view fqn;          // for messages
  std::vector<int64_t> sstride;  // of the stored elements, in bytes
  size_t swap_unit;              // 0: native byte order (SwapUnit)
  absl::Span<const ReadItem* const> items;
  absl::Span<const TensorRequest> requests;
  ReadStats* stats;
};

// Reads the whole record in one piece into `dst` (ReadWholeRecord), with
// `check` comparing its CRC-32 with the archive's, and byte-swaps it.
absl::Status ReadWholeInto(const RecordRead& r, char* dst, bool check,
                           bool direct, CrcHelper* pipeline,
                           const Cancellation* cancel) {
  uint32_t crc = 0;
  RETURN_IF_ERROR(Annotate(
      ReadWholeRecord(r.c.payload.file, r.c.storage_base, r.e.size, dst, check,
                      direct, pipeline, cancel, r.stats, &crc),
      r.fqn));
  if (check && crc != r.e.crc32) {
    return CrcMismatch(*r.c.archive, r.key, r.e, crc);
  }
  if (r.swap_unit) ByteSwap(dst, r.e.size, r.swap_unit);
  return absl::OkStatus();
}

// A part of a record that is one contiguous byte range of it and of its
// destination.
struct Piece {
  uint64_t begin, size;  // within the record
  char* dst;
};

// The parts the items read, when every item is one contiguous byte range
// of the record and of its destination (row boxes of a C-order chunk, as
// resharding along the first dimension reads); nullopt otherwise.
std::optional<std::vector<Piece>> ContiguousPieces(const RecordRead& r) {
  const size_t es = ElementSize(r.c.rec.dtype);
  const size_t nd = r.c.rec.sizes.size();
  std::vector<Piece> pieces;
  bool one_pass = true;
  for (const ReadItem* it : r.items) {
    const TensorRequest& req = r.requests[it->request];
    if (req.dest.dtype != r.c.rec.dtype) return std::nullopt;
    const std::vector<int64_t> dst_el =
        EffectiveStrides(req.dest.sizes, req.dest.strides);
    uint64_t begin = r.c.storage_base - r.record_start;
    char* dst = req.dest.data;
    int64_t expect = static_cast<int64_t>(es);
    for (size_t k = nd; k-- > 0;) {
      const int64_t dstride = dst_el[k] * static_cast<int64_t>(es);
      if (it->lengths[k] != 1 && (r.sstride[k] != expect || dstride != expect))
        one_pass = false;
      expect *= it->lengths[k];
      begin += static_cast<uint64_t>(it->storage_offsets[k]) *
               static_cast<uint64_t>(r.sstride[k]);
      dst += it->dest_offsets[k] * dstride;
    }
    const uint64_t size = static_cast<uint64_t>(expect);
    if (!one_pass || begin > r.e.size || size > r.e.size - begin) {
      return std::nullopt;
    }
    pieces.push_back({begin, size, dst});
  }
  return pieces;
}

// Streams the record once through CRC-32 and copies each piece's bytes out
// of each block while it is in cache; DATA_LOSS on a CRC mismatch.
absl::Status ReadPiecesWithCrc(const RecordRead& r,
                               absl::Span<const Piece> pieces) {
  const RandomAccessFile* file = r.c.payload.file;
  const uint64_t size = r.e.size;
  std::string buf(std::min(size, kFusedCrcBlock), '\0');
  uint32_t crc = 0;
  for (uint64_t done = 0; done < size;) {
    const size_t n = std::min(size - done, kFusedCrcBlock);
    RETURN_IF_ERROR(
        Annotate(file->ReadExact(r.record_start + done, n, buf.data()), r.fqn));
    crc = Crc32(crc, buf.data(), n);
    for (const Piece& p : pieces) {
      const uint64_t lo = std::max(p.begin, done);
      const uint64_t hi = std::min(p.begin + p.size, done + n);
      if (lo < hi)
        std::memcpy(p.dst + (lo - p.begin), buf.data() + (lo - done), hi - lo);
    }
    done += n;
    if (r.stats != nullptr) r.stats->read_calls++;
  }
  if (r.stats != nullptr) {
    r.stats->bytes_read += size;
    r.stats->crc_bytes += size;
    for (const Piece& p : pieces) r.stats->bytes_copied += p.size;
  }
  if (crc != r.e.crc32) return CrcMismatch(*r.c.archive, r.key, r.e, crc);
  if (r.swap_unit) {
    for (const Piece& p : pieces) ByteSwap(p.dst, p.size, r.swap_unit);
  }
  return absl::OkStatus();
}

}  // namespace

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

// Runs one record through CRC-32 (ZipArchiveReader::EntryCrc32: 1 MiB
// reads, or the piece CRCs of a memory-held file) and compares it with the
// archive.
absl::Status VerifyRecord(const ZipArchiveReader& archive,
                          const StorageKey& key, const ZipEntry& e,
                          ReadStats* stats) {
  const absl::StatusOr<uint32_t> crc = archive.EntryCrc32(e);
  if (!crc.ok()) return Annotate(crc.status(), DescribeItem(key));
  if (stats != nullptr) {
    stats->bytes_read += e.size;
    stats->read_calls += (e.size + kCrcBlock - 1) / kCrcBlock;
    stats->crc_bytes += e.size;
  }
  if (*crc != e.crc32) return CrcMismatch(archive, key, e, *crc);
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

absl::StatusOr<std::unique_ptr<WindowedFile>> WindowedFile::Open(
    const RandomAccessFile* file, uint64_t offset, uint64_t length,
    uint64_t window, ReadStats* stats) {
  auto w = std::unique_ptr<WindowedFile>(new WindowedFile(file));
  auto count = [&](uint64_t n) {
    if (stats != nullptr) stats->archive_bytes += n;
  };
  if (length <= 2 * window) {
    w->head_start_ = w->tail_start_ = offset;
    w->head_.resize(length);
    RETURN_IF_ERROR(file->ReadExact(offset, length, w->head_.data()));
    count(length);
    return w;
  }
  // The tail first (end records, central directory), then the head (local
  // headers, data.pkl): the data record that follows the head is read next,
  // so only one backward seek per item.
  w->tail_start_ = offset + length - window;
  w->tail_.resize(window);
  RETURN_IF_ERROR(file->ReadExact(w->tail_start_, window, w->tail_.data()));
  w->head_start_ = offset;
  w->head_.resize(window);
  RETURN_IF_ERROR(file->ReadExact(offset, window, w->head_.data()));
  count(2 * window);
  return w;
}

const char* WindowedFile::InWindow(uint64_t offset, uint64_t n) const {
  for (const auto* win : {&head_, &tail_}) {
    const uint64_t start = win == &head_ ? head_start_ : tail_start_;
    if (offset >= start && n <= win->size() &&
        offset - start <= win->size() - n) {
      return win->data() + (offset - start);
    }
  }
  return nullptr;
}

absl::Status WindowedFile::ReadExact(uint64_t offset, size_t n,
                                     char* scratch) const {
  if (const char* in = InWindow(offset, n)) {
    if (n > 0) std::memcpy(scratch, in, n);
    return absl::OkStatus();
  }
  return file_->ReadExact(offset, n, scratch);
}

absl::StatusOr<uint32_t> WindowedFile::Crc32(uint64_t offset,
                                             uint64_t n) const {
  if (const char* in = InWindow(offset, n)) return ckptd::Crc32(0, in, n);
  return file_->Crc32(offset, n);
}

CrcHelper::CrcHelper() : thread_([this] { Run(); }) {}

CrcHelper::~CrcHelper() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void CrcHelper::Begin(const char* base, uint64_t size) {
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

uint32_t CrcHelper::Finish() {
  Wait();
  return crc_;
}

void CrcHelper::Cancel() {
  cancel_.store(true, std::memory_order_release);
  Wait();
}

void CrcHelper::Wait() {
  for (int spins = 0; !done_.load(std::memory_order_acquire); ++spins) {
    if (spins > 64) std::this_thread::yield();
  }
}

void CrcHelper::Run() {
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

absl::StatusOr<ChunkRecord> CheckpointReader::OpenChunk(size_t item,
                                                        size_t chunk,
                                                        ReadStats* stats) {
  const CompactMetadata& md = compact_;
  const absl::Span<const int64_t> saved_offsets = md.chunk_offsets(item, chunk);
  const absl::Span<const int64_t> saved_sizes = md.chunk_sizes(item, chunk);
  const CompactMetadata::Storage* info = md.chunk_storage(item, chunk);
  const StorageKey key = ChunkKey(item, chunk);  // for messages
  if (info == nullptr) {
    return absl::DataLossError(fmt::format(
        "{}/.metadata: no storage_data entry for {}", dir_, DescribeKey(key)));
  }
  // A transformed (zstd) payload is decoded into memory first; `file` is
  // then that memory and [payload.offset, +payload.length) its bytes.
  ASSIGN_OR_RETURN(const RandomAccessFile* stored,
                   OpenFile(std::string(md.relative_path(*info))));
  ChunkRecord c;
  ASSIGN_OR_RETURN(
      c.payload,
      DecodeStorage(stored, *info, key, MaxDecodedPayload(md, *info), stats));
  const DecodedPayload& payload = c.payload;
  const RandomAccessFile* file = payload.file;
  // The archive's small reads (end records, central directory, data.pkl)
  // come from two windows read up front.
  ASSIGN_OR_RETURN(c.view,
                   WindowedFile::Open(file, payload.offset, payload.length,
                                      kArchiveWindow, stats));
  char magic[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const uint64_t rest = file->Size() - std::min(file->Size(), payload.offset);
  if (rest >= 8) RETURN_IF_ERROR(c.view->ReadExact(payload.offset, 8, magic));
  if (rest < 8 || std::memcmp(magic, "PK\x03\x04", 4) != 0) {
    if (payload.owned == nullptr && LooksLikeSafetensors(magic, rest)) {
      return c;  // SAFETENSORS-format data file: no archive
    }
    return absl::DataLossError(
        fmt::format("{} @ {}: payload of {} is neither a torch.save archive "
                    "nor a safetensors blob",
                    file->path(), payload.offset, DescribeKey(key)));
  }
  ASSIGN_OR_RETURN(
      c.archive,
      ZipArchiveReader::Open(c.view.get(), payload.offset, payload.length));
  absl::StatusOr<TensorRecord> parsed = ParseTensorPayload(*c.archive);
  if (!parsed.ok()) return CrcErrorAsDataLoss(parsed.status(), key);
  c.rec = *std::move(parsed);
  const TensorRecord& rec = c.rec;
  if (!std::equal(rec.sizes.begin(), rec.sizes.end(), saved_sizes.begin(),
                  saved_sizes.end())) {
    return absl::DataLossError(fmt::format(
        "{}: payload has shape {} but .metadata says the chunk is {}",
        c.archive->Describe(),
        DescribeBox(std::vector<int64_t>(rec.sizes.size(), 0), rec.sizes),
        DescribeBox(saved_offsets, saved_sizes)));
  }
  const size_t es = ElementSize(rec.dtype);
  c.storage_base = payload.offset + rec.entry->data_offset +
                   static_cast<uint64_t>(rec.storage_offset) * es;
  return c;
}

absl::StatusOr<std::optional<uint64_t>> CheckpointReader::WholeRecordOffset(
    const TensorRequest& request) {
  ASSIGN_OR_RETURN(std::optional<RecordSpan> r,
                   RecordRange(request, /*verify_crc=*/false));
  if (!r.has_value() || !r->whole) return std::nullopt;
  return r->offset;
}

absl::StatusOr<std::optional<CheckpointReader::RecordSpan>>
CheckpointReader::RecordRange(const TensorRequest& request, bool verify_crc) {
  ASSIGN_OR_RETURN(std::vector<ReadItem> items,
                   PlanReads(absl::MakeConstSpan(&request, 1)));
  const std::optional<size_t> item = compact_.FindItem(request.fqn);
  if (items.size() != 1 || !item.has_value()) return std::nullopt;
  const size_t chunk = items[0].chunk;
  ASSIGN_OR_RETURN(ChunkRecord c, OpenChunk(*item, chunk, nullptr));
  if (c.archive == nullptr || c.payload.owned != nullptr) return std::nullopt;
  const ZipEntry& e = *c.rec.entry;
  // The box is all of the request: it starts at the destination's start.
  const std::optional<ContiguousPart> range =
      ContiguousRange(c.rec, e, items[0], request);
  if (!range.has_value() || range->dest_offset != 0) return std::nullopt;
  const CompactMetadata::Storage* info = compact_.chunk_storage(*item, chunk);
  if (verify_crc && options_.verify_crc && !CrcChecked(info)) {
    // A memory-held file combines the CRCs it took of its 64 KiB pieces.
    RETURN_IF_ERROR(
        VerifyRecord(*c.archive, ChunkKey(*item, chunk), e, nullptr));
    MarkCrcChecked(info);
  }
  return RecordSpan{c.payload.file, c.storage_base + range->offset, range->size,
                    c.rec.big_endian, range->size == e.size};
}

absl::Status CheckpointReader::ReadChunkItems(
    size_t item, size_t chunk, absl::Span<const ReadItem* const> items,
    absl::Span<const TensorRequest> requests, ReadStats* stats,
    std::unique_ptr<CrcHelper>* helper, bool verify_crc,
    const Cancellation* cancel) {
  const std::string_view fqn = compact_.fqn(item);
  const CompactMetadata::Storage* info = compact_.chunk_storage(item, chunk);
  const StorageKey key = ChunkKey(item, chunk);  // for messages
  ASSIGN_OR_RETURN(ChunkRecord c, OpenChunk(item, chunk, stats));
  if (c.archive == nullptr) {
    // SAFETENSORS-format data file: the blob of the file's tensors.
    return ReadSafetensorsChunk(item, chunk, c.payload.file, c.payload.offset,
                                items, requests, stats);
  }
  const ZipEntry& e = *c.rec.entry;
  const RecordRead r{c,
                     e,
                     c.payload.offset + e.data_offset,
                     key,
                     fqn,
                     ByteStrides(c.rec),
                     SwapUnit(c.rec),
                     items,
                     requests,
                     stats};
  const bool check = verify_crc && !CrcChecked(info);
  const bool direct = options_.direct_io && c.payload.owned == nullptr;
  if (check || direct) {
    // The whole record, in one piece, into a destination region of the
    // same C-order layout: CRC'd as it arrives, read directly where it
    // may be.
    if (const std::optional<char*> whole =
            WholeRecordDest(c.rec, e, items, requests)) {
      CrcHelper* pipeline =
          check ? CrcPipeline(e.size, options_.threads, helper) : nullptr;
      RETURN_IF_ERROR(
          ReadWholeInto(r, *whole, check, direct, pipeline, cancel));
      if (check) MarkCrcChecked(info);
      return absl::OkStatus();
    }
  }
  if (check) {
    // One pass where every part is a contiguous range; else the record is
    // checked first and the parts are read as any others.
    if (const std::optional<std::vector<Piece>> pieces = ContiguousPieces(r)) {
      RETURN_IF_ERROR(ReadPiecesWithCrc(r, *pieces));
      MarkCrcChecked(info);
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(VerifyRecord(*c.archive, key, e, stats));
    MarkCrcChecked(info);
  }
  return CopyBoxes(c.payload.file, c.rec.dtype, r.swap_unit, c.storage_base,
                   r.sstride, items, requests, options_.max_read_block, stats,
                   fqn);
}

absl::Status CheckpointReader::ReadSafetensorsChunk(
    size_t item, size_t chunk, const RandomAccessFile* file,
    uint64_t blob_offset, absl::Span<const ReadItem* const> items,
    absl::Span<const TensorRequest> requests, ReadStats* stats) {
  const CompactMetadata& md = compact_;
  const std::string_view fqn = md.fqn(item);
  ASSIGN_OR_RETURN(std::shared_ptr<const SafetensorsHeader> header,
                   SafetensorsHeaderAt(file, blob_offset, stats));
  auto t = header->tensors.find(std::string(fqn));
  if (t == header->tensors.end()) {
    return absl::DataLossError(fmt::format(
        "{} @ {}: the safetensors blob has no tensor '{}' (its chunk at {})",
        file->path(), blob_offset, fqn,
        DescribeBox(md.chunk_offsets(item, chunk),
                    md.chunk_sizes(item, chunk))));
  }
  const SafetensorsTensor& st = t->second;
  const absl::Span<const int64_t> saved_sizes = md.chunk_sizes(item, chunk);
  const DType dtype = md.item(item).properties.dtype;
  if (st.dtype != dtype ||
      !std::equal(st.shape.begin(), st.shape.end(), saved_sizes.begin(),
                  saved_sizes.end())) {
    return absl::DataLossError(fmt::format(
        "{} @ {}: safetensors tensor '{}' is {}{} but .metadata says the "
        "chunk is {} {}",
        file->path(), blob_offset, fqn, DTypeName(st.dtype),
        DescribeBox(std::vector<int64_t>(st.shape.size(), 0), st.shape),
        DTypeName(dtype),
        DescribeBox(md.chunk_offsets(item, chunk), saved_sizes)));
  }
  // Row-major, little-endian: no checksum to check (safetensors has none).
  const size_t nd = st.shape.size();
  std::vector<int64_t> sstride(nd);
  int64_t stride = static_cast<int64_t>(ElementSize(dtype));
  for (size_t d = nd; d-- > 0;) {
    sstride[d] = stride;
    stride *= st.shape[d];
  }
  return CopyBoxes(file, dtype, /*swap_unit=*/0, st.begin, sstride, items,
                   requests, options_.max_read_block, stats, fqn);
}

absl::StatusOr<std::shared_ptr<const SafetensorsHeader>>
CheckpointReader::SafetensorsHeaderAt(const RandomAccessFile* file,
                                      uint64_t offset, ReadStats* stats) {
  const std::pair<const RandomAccessFile*, uint64_t> key{file, offset};
  {
    absl::MutexLock l(&safetensors_mu_);
    if (auto it = safetensors_.find(key); it != safetensors_.end())
      return it->second;
  }
  // Parsed outside the lock (it reads); a racing thread's copy is dropped.
  ASSIGN_OR_RETURN(SafetensorsHeader h, ReadSafetensorsHeader(file, offset));
  if (stats != nullptr) stats->archive_bytes += h.data_start - offset;
  auto shared = std::make_shared<const SafetensorsHeader>(std::move(h));
  absl::MutexLock l(&safetensors_mu_);
  return safetensors_.try_emplace(key, std::move(shared)).first->second;
}

}  // namespace ckptd::format
