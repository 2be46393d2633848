// Copyright 2026 The ckptd Authors.
//
// Zip records (PKWARE APPNOTE 6.3): local file header 30 bytes + name +
// extra; data descriptor PK\x07\x08 crc csize usize (4- or 8-byte sizes);
// central directory header 46 bytes + name + extra + comment; zip64 end of
// central directory record (56 bytes) + locator (20 bytes); end of central
// directory record (22 bytes + comment). All integers little-endian.
#include "format/zip/zip.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/status/status.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ckptd::format {
namespace {

constexpr uint32_t kLocalSig = 0x04034b50;
constexpr uint32_t kCentralSig = 0x02014b50;
constexpr uint32_t kDescriptorSig = 0x08074b50;
constexpr uint32_t kEocdSig = 0x06054b50;
constexpr uint32_t kEocd64Sig = 0x06064b50;
constexpr uint32_t kLocatorSig = 0x07064b50;

constexpr uint64_t kLocalHeaderSize = 30;
constexpr uint64_t kCentralHeaderSize = 46;
constexpr uint64_t kEocdSize = 22;
constexpr uint64_t kEocd64Size = 56;
constexpr uint64_t kLocatorSize = 20;
constexpr uint64_t kMaxComment = 0xffff;

constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kPadExtraId = 0x4246;  // "FB", torch's alignment padding
constexpr uint16_t kFlags = 0x0808;       // data descriptor + UTF-8 names
constexpr uint16_t kVersionZip64 = 45;
constexpr uint64_t kAlignment = 64;

constexpr uint32_t kMax32 = 0xffffffff;
constexpr uint16_t kMax16 = 0xffff;

// Sizes/offsets >= this use zip64 fields. Tests lower it.
std::atomic<uint64_t> g_zip64_threshold{kMax32};

void Put16(std::string* s, uint16_t v) {
  char b[2] = {static_cast<char>(v), static_cast<char>(v >> 8)};
  s->append(b, 2);
}
void Put32(std::string* s, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>(v >> (8 * i));
  s->append(b, 4);
}
void Put64(std::string* s, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (8 * i));
  s->append(b, 8);
}

uint16_t Get16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
uint32_t Get32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | (static_cast<uint32_t>(u[1]) << 8) |
         (static_cast<uint32_t>(u[2]) << 16) |
         (static_cast<uint32_t>(u[3]) << 24);
}
uint64_t Get64(const char* p) {
  return static_cast<uint64_t>(Get32(p)) |
         (static_cast<uint64_t>(Get32(p + 4)) << 32);
}

// Appends bytes as a quoted, escaped, bounded name for messages.
std::string Quote(std::string_view name) {
  std::string out = "'";
  size_t n = 0;
  for (unsigned char c : name) {
    if (++n > 200) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  out += "'";
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------

struct ZipArchiveBuilder::Record {
  std::string name;  // with prefix
  std::vector<std::string_view> pieces;
  uint64_t size = 0;
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  bool zip64_size = false;    // sizes live in the zip64 extra field
  bool zip64_offset = false;  // header offset lives in the zip64 extra field
  uint32_t crc = 0;
  const std::string* header = nullptr;  // local header, in owned_
  std::string* descriptor = nullptr;    // data descriptor, in owned_

  bool zip64() const { return zip64_size || zip64_offset; }
  uint64_t descriptor_size() const { return zip64() ? 24 : 16; }
  // Zip64 extra field in the central directory: the fields whose header
  // value is 0xffffffff, in the order usize, csize, offset.
  uint64_t zip64_extra_size() const {
    return zip64() ? 4 + (zip64_size ? 16 : 0) + (zip64_offset ? 8 : 0) : 0;
  }
  // In the local header it always holds both sizes (APPNOTE 4.5.3), and the
  // offset too when that needs zip64 (like miniz).
  uint64_t local_zip64_extra_size() const {
    return zip64() ? 4 + 16 + (zip64_offset ? 8 : 0) : 0;
  }
  uint64_t central_size() const {
    return kCentralHeaderSize + name.size() + zip64_extra_size();
  }
};

void ZipArchiveBuilder::SetZip64ThresholdForTest(uint64_t threshold) {
  g_zip64_threshold.store(threshold, std::memory_order_relaxed);
}

ZipArchiveBuilder::ZipArchiveBuilder(std::string prefix)
    : prefix_(std::move(prefix)),
      zip64_threshold_(g_zip64_threshold.load(std::memory_order_relaxed)) {}

ZipArchiveBuilder::~ZipArchiveBuilder() = default;
// std::deque's move keeps its elements in place, so the Record::header /
// descriptor pointers and segments_ stay valid.
ZipArchiveBuilder::ZipArchiveBuilder(ZipArchiveBuilder&&) noexcept = default;
ZipArchiveBuilder& ZipArchiveBuilder::operator=(ZipArchiveBuilder&&) noexcept =
    default;

void ZipArchiveBuilder::AddRecord(std::string_view name,
                                  absl::Span<const std::string_view> pieces) {
  uint64_t size = 0;
  for (std::string_view p : pieces) size += p.size();
  Record& r = AddRecordOfSize(name, size);
  for (std::string_view p : pieces) {
    if (!p.empty()) r.pieces.push_back(p);
  }
}

ZipArchiveBuilder::Record& ZipArchiveBuilder::AddRecordOfSize(
    std::string_view name, uint64_t size) {
  ABSL_RAW_CHECK(!finished_, "ZipArchiveBuilder::AddRecord after Finish");
  Record r;
  r.name = prefix_ + "/" + std::string(name);
  ABSL_RAW_CHECK(r.name.size() <= kMax16, "zip record name too long");
  r.size = size;
  r.header_offset = next_offset_;
  r.zip64_size = r.size >= zip64_threshold_;
  r.zip64_offset = r.header_offset >= zip64_threshold_;

  // Local header: the zip64 extra field (if any) first, then "FB" padding so
  // that the data starts at a multiple of kAlignment.
  const uint64_t unpadded = r.header_offset + kLocalHeaderSize + r.name.size() +
                            r.local_zip64_extra_size() + 4;
  const uint64_t pad = (kAlignment - unpadded % kAlignment) % kAlignment;
  const uint64_t extra_len = r.local_zip64_extra_size() + 4 + pad;
  std::string h;
  h.reserve(kLocalHeaderSize + r.name.size() + extra_len);
  Put32(&h, kLocalSig);
  Put16(&h, r.zip64() ? kVersionZip64 : 0);  // version needed
  Put16(&h, kFlags);
  Put16(&h, 0);  // method: STORED
  Put16(&h, 0);  // time
  Put16(&h, 0);  // date
  Put32(&h, 0);  // crc: in the descriptor
  Put32(&h, 0);  // compressed size: in the descriptor
  Put32(&h, 0);  // uncompressed size: in the descriptor
  Put16(&h, static_cast<uint16_t>(r.name.size()));
  Put16(&h, static_cast<uint16_t>(extra_len));
  h += r.name;
  if (r.zip64()) {
    Put16(&h, kZip64ExtraId);
    Put16(&h, static_cast<uint16_t>(r.local_zip64_extra_size() - 4));
    Put64(&h, r.size);
    Put64(&h, r.size);
    if (r.zip64_offset) Put64(&h, r.header_offset);
  }
  Put16(&h, kPadExtraId);
  Put16(&h, static_cast<uint16_t>(pad));
  h.append(pad, 'Z');
  r.data_offset = r.header_offset + h.size();
  owned_.push_back(std::move(h));
  r.header = &owned_.back();

  next_offset_ = r.data_offset + r.size + r.descriptor_size();
  central_size_ += r.central_size();
  any_zip64_ = any_zip64_ || r.zip64();
  records_.push_back(std::move(r));
  return records_.back();
}

void ZipArchiveBuilder::AddOwnedRecord(std::string_view name,
                                       std::string data) {
  owned_.push_back(std::move(data));
  const std::string_view piece = owned_.back();
  AddRecord(name, absl::MakeConstSpan(&piece, 1));
}

bool ZipArchiveBuilder::NeedsZip64End() const {
  const uint64_t count = records_.size();
  return any_zip64_ || count >= std::min<uint64_t>(kMax16, zip64_threshold_) ||
         central_size_ >= zip64_threshold_ || next_offset_ >= zip64_threshold_;
}

uint64_t ZipArchiveBuilder::size() const {
  return next_offset_ + central_size_ +
         (NeedsZip64End() ? kEocd64Size + kLocatorSize : 0) + kEocdSize;
}

void ZipArchiveBuilder::Finish() {
  if (finished_) return;
  for (Record& r : records_) {
    uint32_t crc = 0;
    for (std::string_view p : r.pieces) crc = Crc32(crc, p.data(), p.size());
    r.crc = crc;
  }
  Finalize();
}

void ZipArchiveBuilder::FinishInto(char* dst) {
  if (finished_) {
    for (std::string_view s : segments_) {
      std::memcpy(dst, s.data(), s.size());
      dst += s.size();
    }
    return;
  }
  for (Record& r : records_) {
    std::memcpy(dst + r.header_offset, r.header->data(), r.header->size());
    char* p = dst + r.data_offset;
    uint32_t crc = 0;
    for (std::string_view piece : r.pieces) {
      crc = CopyWithCrc32(crc, p, piece.data(), piece.size());
      p += piece.size();
    }
    r.crc = crc;
  }
  Finalize();
  for (const Record& r : records_) {
    std::memcpy(dst + r.data_offset + r.size, r.descriptor->data(),
                r.descriptor->size());
  }
  std::memcpy(dst + next_offset_, trailer_->data(), trailer_->size());
}

namespace {

// The data descriptor after a record's payload.
std::string Descriptor(uint32_t crc, uint64_t size, bool zip64) {
  std::string desc;
  desc.reserve(zip64 ? 24 : 16);
  Put32(&desc, kDescriptorSig);
  Put32(&desc, crc);
  if (zip64) {
    Put64(&desc, size);
    Put64(&desc, size);
  } else {
    Put32(&desc, static_cast<uint32_t>(size));
    Put32(&desc, static_cast<uint32_t>(size));
  }
  return desc;
}

}  // namespace

void ZipArchiveBuilder::Finalize() {
  const uint64_t t = zip64_threshold_;
  std::string cd;
  cd.reserve(central_size_ + kEocd64Size + kLocatorSize + kEocdSize);
  for (Record& r : records_) {
    owned_.push_back(Descriptor(r.crc, r.size, r.zip64()));
    r.descriptor = &owned_.back();

    const uint32_t size32 =
        r.zip64_size ? kMax32 : static_cast<uint32_t>(r.size);
    Put32(&cd, kCentralSig);
    Put16(&cd, r.zip64() ? kVersionZip64 : 0);  // version made by
    Put16(&cd, r.zip64() ? kVersionZip64 : 0);  // version needed
    Put16(&cd, kFlags);
    Put16(&cd, 0);  // method
    Put16(&cd, 0);  // time
    Put16(&cd, 0);  // date
    Put32(&cd, r.crc);
    Put32(&cd, size32);
    Put32(&cd, size32);
    Put16(&cd, static_cast<uint16_t>(r.name.size()));
    Put16(&cd, static_cast<uint16_t>(r.zip64_extra_size()));
    Put16(&cd, 0);  // comment length
    Put16(&cd, 0);  // disk number start
    Put16(&cd, 0);  // internal attributes
    Put32(&cd, 0);  // external attributes
    Put32(&cd,
          r.zip64_offset ? kMax32 : static_cast<uint32_t>(r.header_offset));
    cd += r.name;
    if (r.zip64()) {
      Put16(&cd, kZip64ExtraId);
      Put16(&cd, static_cast<uint16_t>(r.zip64_extra_size() - 4));
      if (r.zip64_size) {
        Put64(&cd, r.size);
        Put64(&cd, r.size);
      }
      if (r.zip64_offset) Put64(&cd, r.header_offset);
    }
  }
  ABSL_RAW_CHECK(cd.size() == central_size_, "central directory size");

  const uint64_t count = records_.size();
  const uint64_t cd_offset = next_offset_;
  if (NeedsZip64End()) {
    const uint64_t eocd64_offset = cd_offset + central_size_;
    Put32(&cd, kEocd64Sig);
    Put64(&cd, kEocd64Size - 12);  // size of the rest of the record
    Put16(&cd, kVersionZip64);     // version made by
    Put16(&cd, kVersionZip64);     // version needed
    Put32(&cd, 0);                 // this disk
    Put32(&cd, 0);                 // disk with the central directory
    Put64(&cd, count);
    Put64(&cd, count);
    Put64(&cd, central_size_);
    Put64(&cd, cd_offset);
    Put32(&cd, kLocatorSig);
    Put32(&cd, 0);  // disk with the zip64 EOCD
    Put64(&cd, eocd64_offset);
    Put32(&cd, 1);  // total disks
  }
  const uint16_t count16 = count >= std::min<uint64_t>(kMax16, t)
                               ? kMax16
                               : static_cast<uint16_t>(count);
  Put32(&cd, kEocdSig);
  Put16(&cd, 0);  // this disk
  Put16(&cd, 0);  // disk with the central directory
  Put16(&cd, count16);
  Put16(&cd, count16);
  Put32(&cd,
        central_size_ >= t ? kMax32 : static_cast<uint32_t>(central_size_));
  Put32(&cd, cd_offset >= t ? kMax32 : static_cast<uint32_t>(cd_offset));
  Put16(&cd, 0);  // comment length
  owned_.push_back(std::move(cd));
  trailer_ = &owned_.back();
  ABSL_RAW_CHECK(next_offset_ + trailer_->size() == size(), "archive size");

  segments_.clear();
  segments_.reserve(records_.size() * 4 + 1);
  for (const Record& r : records_) {
    segments_.push_back(*r.header);
    segments_.insert(segments_.end(), r.pieces.begin(), r.pieces.end());
    segments_.push_back(*r.descriptor);
  }
  segments_.push_back(*trailer_);
  finished_ = true;
}

const std::vector<std::string_view>& ZipArchiveBuilder::segments() const {
  ABSL_RAW_CHECK(finished_, "ZipArchiveBuilder::segments before Finish");
  return segments_;
}

// ---------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------

std::string ZipArchiveReader::Describe() const {
  return fmt::format("{} @ {}", file_ != nullptr ? file_->path() : "<null>",
                     offset_);
}

absl::Status ZipArchiveReader::ReadAt(uint64_t pos, size_t n, char* dst) const {
  if (n == 0) return absl::OkStatus();
  absl::Status s = file_->ReadExact(offset_ + pos, n, dst);
  if (!s.ok()) return Annotate(s, Describe());
  return s;
}

absl::StatusOr<std::unique_ptr<ZipArchiveReader>> ZipArchiveReader::Open(
    const RandomAccessFile* file, uint64_t offset, uint64_t length,
    const ZipReaderOptions& options) {
  if (file == nullptr) {
    return absl::InvalidArgumentError("ZipArchiveReader::Open: null file");
  }
  std::unique_ptr<ZipArchiveReader> r(new ZipArchiveReader());
  r->file_ = file;
  r->offset_ = offset;
  r->length_ = length;
  const std::string desc = r->Describe();
  const uint64_t file_size = file->Size();
  if (offset > file_size || length > file_size - offset) {
    return absl::OutOfRangeError(fmt::format(
        "{}: archive [{}, +{}) extends past the end of the file ({})", desc,
        offset, length, file_size));
  }
  if (length < kEocdSize) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: {} bytes is too short for a zip archive", desc, length));
  }

  // 1. End of central directory record: search backwards over the comment.
  const uint64_t tail_len = std::min(length, kEocdSize + kMaxComment);
  const uint64_t tail_start = length - tail_len;
  std::string tail(tail_len, '\0');
  RETURN_IF_ERROR(r->ReadAt(tail_start, tail_len, tail.data()));
  uint64_t eocd = UINT64_MAX;      // relative to the tail
  uint64_t fallback = UINT64_MAX;  // a signature with trailing bytes
  for (uint64_t p = tail_len - kEocdSize + 1; p-- > 0;) {
    if (Get32(tail.data() + p) != kEocdSig) continue;
    const uint64_t end = p + kEocdSize + Get16(tail.data() + p + 20);
    if (end == tail_len) {
      eocd = p;
      break;
    }
    if (end < tail_len && fallback == UINT64_MAX) fallback = p;
  }
  if (eocd == UINT64_MAX) eocd = fallback;
  if (eocd == UINT64_MAX) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: no end of central directory record in the last {} bytes of the "
        "archive ({} bytes): not a zip archive or truncated",
        desc, tail_len, length));
  }
  const char* e = tail.data() + eocd;
  const uint64_t eocd_pos = tail_start + eocd;  // relative to the archive
  uint64_t disk = Get16(e + 4);
  uint64_t cd_disk = Get16(e + 6);
  uint64_t count_disk = Get16(e + 8);
  uint64_t count = Get16(e + 10);
  uint64_t cd_size = Get32(e + 12);
  uint64_t cd_offset = Get32(e + 16);
  uint64_t cd_limit = eocd_pos;  // the central directory ends before this

  // 2. Zip64 locator and end of central directory record.
  if (eocd_pos >= kLocatorSize) {
    char loc[kLocatorSize];
    RETURN_IF_ERROR(r->ReadAt(eocd_pos - kLocatorSize, kLocatorSize, loc));
    if (Get32(loc) == kLocatorSig) {
      const uint64_t loc_pos = eocd_pos - kLocatorSize;
      const uint32_t loc_disk = Get32(loc + 4);
      const uint64_t eocd64_pos = Get64(loc + 8);
      const uint32_t disks = Get32(loc + 16);
      if (loc_disk != 0 || disks > 1) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: zip64 locator names disk {} of {}: multi-disk archives are "
            "not supported",
            desc, loc_disk, disks));
      }
      if (loc_pos < kEocd64Size || eocd64_pos > loc_pos - kEocd64Size) {
        return absl::OutOfRangeError(fmt::format(
            "{}: zip64 end of central directory record at {} does not fit "
            "before its locator at {}",
            desc, eocd64_pos, loc_pos));
      }
      char z[kEocd64Size];
      RETURN_IF_ERROR(r->ReadAt(eocd64_pos, kEocd64Size, z));
      if (Get32(z) != kEocd64Sig) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: bad zip64 end of central directory signature 0x{:08x} at {}",
            desc, Get32(z), eocd64_pos));
      }
      if (Get64(z + 4) < kEocd64Size - 12) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: zip64 end of central directory record at {} has size {}", desc,
            eocd64_pos, Get64(z + 4)));
      }
      disk = Get32(z + 16);
      cd_disk = Get32(z + 20);
      count_disk = Get64(z + 24);
      count = Get64(z + 32);
      cd_size = Get64(z + 40);
      cd_offset = Get64(z + 48);
      cd_limit = eocd64_pos;
    }
  }
  if (disk != 0 || cd_disk != 0 || count_disk != count) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: end of central directory names disk {} / directory disk {} with "
        "{} of {} entries: multi-disk archives are not supported",
        desc, disk, cd_disk, count_disk, count));
  }
  if (cd_offset > cd_limit || cd_size > cd_limit - cd_offset) {
    return absl::OutOfRangeError(fmt::format(
        "{}: central directory [{}, +{}) extends past its end record at {}",
        desc, cd_offset, cd_size, cd_limit));
  }
  if (count > cd_size / kCentralHeaderSize) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: {} entries do not fit in a central directory of {} bytes", desc,
        count, cd_size));
  }
  if (count > options.max_entries) {
    return absl::ResourceExhaustedError(
        fmt::format("{}: {} entries exceeds the limit of {}", desc, count,
                    options.max_entries));
  }
  if (cd_size > options.max_central_directory_bytes) {
    return absl::ResourceExhaustedError(
        fmt::format("{}: central directory of {} bytes exceeds the limit of {}",
                    desc, cd_size, options.max_central_directory_bytes));
  }

  // 3. Central directory entries, each checked against its local header.
  std::string cd(cd_size, '\0');
  RETURN_IF_ERROR(r->ReadAt(cd_offset, cd_size, cd.data()));
  r->entries_.reserve(count);
  r->index_.reserve(count);
  std::string local;
  uint64_t p = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (cd_size - p < kCentralHeaderSize) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: central directory entry #{} at {} extends past the central "
          "directory end ({})",
          desc, i, cd_offset + p, cd_offset + cd_size));
    }
    const char* h = cd.data() + p;
    if (Get32(h) != kCentralSig) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: bad central directory signature 0x{:08x} for entry #{} at {}",
          desc, Get32(h), i, cd_offset + p));
    }
    const uint16_t flags = Get16(h + 8);
    const uint16_t method = Get16(h + 10);
    const uint32_t crc = Get32(h + 16);
    uint64_t csize = Get32(h + 20);
    uint64_t usize = Get32(h + 24);
    const uint64_t name_len = Get16(h + 28);
    const uint64_t extra_len = Get16(h + 30);
    const uint64_t comment_len = Get16(h + 32);
    uint64_t local_offset = Get32(h + 42);
    const uint64_t entry_len =
        kCentralHeaderSize + name_len + extra_len + comment_len;
    if (cd_size - p < entry_len) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: central directory entry #{} at {} ({} bytes) extends past the "
          "central directory end ({})",
          desc, i, cd_offset + p, entry_len, cd_offset + cd_size));
    }
    ZipEntry entry;
    entry.name.assign(h + kCentralHeaderSize, name_len);
    const std::string qname = Quote(entry.name);

    // Zip64 extended information: present fields replace the 0xffffffff
    // placeholders, in the order usize, csize, offset.
    const char* x = h + kCentralHeaderSize + name_len;
    uint64_t xleft = extra_len;
    while (xleft >= 4) {
      const uint16_t id = Get16(x);
      const uint64_t len = Get16(x + 2);
      if (len > xleft - 4) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: entry {}: extra field 0x{:04x} of {} bytes overruns the "
            "extra data ({} bytes)",
            desc, qname, id, len, xleft - 4));
      }
      if (id == kZip64ExtraId) {
        const char* f = x + 4;
        uint64_t fleft = len;
        for (uint64_t* v : {&usize, &csize, &local_offset}) {
          if (*v != kMax32) continue;
          if (fleft < 8) {
            return absl::InvalidArgumentError(fmt::format(
                "{}: entry {}: zip64 extra field is too short ({} bytes)", desc,
                qname, len));
          }
          *v = Get64(f);
          f += 8;
          fleft -= 8;
        }
      }
      x += 4 + len;
      xleft -= 4 + len;
    }

    // Bits 0 (encrypted), 6 (strong encryption), 13 (masked local header).
    if (flags & 0x2041) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: entry {}: encrypted entries are not supported", desc, qname));
    }
    if (method != 0) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: entry {}: compression method {} is not supported (only "
          "STORED)",
          desc, qname, method));
    }
    if (csize != usize) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: entry {}: STORED entry has compressed size {} != size {}", desc,
          qname, csize, usize));
    }
    if (local_offset > length ||
        kLocalHeaderSize + name_len > length - local_offset) {
      return absl::OutOfRangeError(fmt::format(
          "{}: entry {}: local header at {} extends past the archive end ({})",
          desc, qname, local_offset, length));
    }
    local.resize(kLocalHeaderSize + name_len);
    RETURN_IF_ERROR(r->ReadAt(local_offset, local.size(), local.data()));
    if (Get32(local.data()) != kLocalSig) {
      return absl::InvalidArgumentError(
          fmt::format("{}: entry {}: bad local header signature 0x{:08x} at {}",
                      desc, qname, Get32(local.data()), local_offset));
    }
    const uint64_t local_name_len = Get16(local.data() + 26);
    const uint64_t local_extra_len = Get16(local.data() + 28);
    if (local_name_len != name_len ||
        std::string_view(local.data() + kLocalHeaderSize, name_len) !=
            entry.name) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: entry {}: local header at {} names a different entry", desc,
          qname, local_offset));
    }
    // local_offset + 30 + 2 * 0xffff <= length + 2^17: no overflow.
    entry.data_offset =
        local_offset + kLocalHeaderSize + local_name_len + local_extra_len;
    entry.size = usize;
    entry.crc32 = crc;
    if (entry.data_offset > length || entry.size > length - entry.data_offset) {
      return absl::OutOfRangeError(fmt::format(
          "{}: entry {}: data [{}, +{}) extends past the archive end ({})",
          desc, qname, entry.data_offset, entry.size, length));
    }
    if (!r->index_.emplace(entry.name, r->entries_.size()).second) {
      return absl::InvalidArgumentError(
          fmt::format("{}: duplicate entry {}", desc, qname));
    }
    r->entries_.push_back(std::move(entry));
    p += entry_len;
  }

  if (!r->entries_.empty()) {
    const std::string& first = r->entries_.front().name;
    const size_t slash = first.find('/');
    if (slash == std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("{}: first entry {} is not inside a folder (expected "
                      "'<prefix>/...')",
                      desc, Quote(first)));
    }
    r->prefix_ = first.substr(0, slash);
  }
  return r;
}

const ZipEntry* ZipArchiveReader::Find(std::string_view name) const {
  std::string key;
  key.reserve(prefix_.size() + 1 + name.size());
  key.append(prefix_).append("/").append(name.data(), name.size());
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

absl::Status ZipArchiveReader::CheckEntry(const ZipEntry& entry) const {
  if (entry.data_offset > length_ || entry.size > length_ - entry.data_offset) {
    return absl::OutOfRangeError(fmt::format(
        "{}: entry {}: data [{}, +{}) extends past the archive end ({})",
        Describe(), Quote(entry.name), entry.data_offset, entry.size, length_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ZipArchiveReader::ReadRecord(
    const ZipEntry& entry, uint64_t max_bytes) const {
  RETURN_IF_ERROR(CheckEntry(entry));
  if (entry.size > max_bytes) {
    return absl::ResourceExhaustedError(
        fmt::format("{}: entry {}: {} bytes exceeds the limit of {}",
                    Describe(), Quote(entry.name), entry.size, max_bytes));
  }
  std::string out(entry.size, '\0');
  RETURN_IF_ERROR(ReadAt(entry.data_offset, out.size(), out.data()));
  const uint32_t crc = Crc32(0, out.data(), out.size());
  if (crc != entry.crc32) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: entry {}: CRC-32 mismatch (central directory 0x{:08x}, data "
        "0x{:08x})",
        Describe(), Quote(entry.name), entry.crc32, crc));
  }
  return out;
}

absl::Status ZipArchiveReader::ReadRange(const ZipEntry& entry,
                                         uint64_t offset_in_entry, size_t n,
                                         char* dst) const {
  RETURN_IF_ERROR(CheckEntry(entry));
  if (offset_in_entry > entry.size || n > entry.size - offset_in_entry) {
    return absl::OutOfRangeError(fmt::format(
        "{}: entry {}: read [{}, +{}) extends past the entry size ({})",
        Describe(), Quote(entry.name), offset_in_entry, n, entry.size));
  }
  return ReadAt(entry.data_offset + offset_in_entry, n, dst);
}

absl::StatusOr<uint32_t> ZipArchiveReader::EntryCrc32(
    const ZipEntry& entry) const {
  RETURN_IF_ERROR(CheckEntry(entry));
  absl::StatusOr<uint32_t> crc =
      file_->Crc32(offset_ + entry.data_offset, entry.size);
  if (!crc.ok()) return Annotate(crc.status(), Describe());
  return crc;
}

absl::Status ZipArchiveReader::VerifyCrc(const ZipEntry& entry) const {
  ASSIGN_OR_RETURN(const uint32_t crc, EntryCrc32(entry));
  if (crc != entry.crc32) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: entry {}: CRC-32 mismatch (central directory 0x{:08x}, data "
        "0x{:08x})",
        Describe(), Quote(entry.name), entry.crc32, crc));
  }
  return absl::OkStatus();
}

}  // namespace ckptd::format

// ---------------------------------------------------------------------------
// Streaming writer
// ---------------------------------------------------------------------------

namespace ckptd::format {

ZipStreamWriter::ZipStreamWriter(WritableFile* file, std::string prefix)
    : file_(file), base_(file->Size()), layout_(std::move(prefix)) {}

absl::Status ZipStreamWriter::BeginRecord(std::string_view name,
                                          uint64_t size) {
  if (open_ || layout_.finished_) {
    return absl::FailedPreconditionError(fmt::format(
        "{}: zip record {} started while another is open or after Finish",
        file_->path(), Quote(name)));
  }
  ZipArchiveBuilder::Record& r = layout_.AddRecordOfSize(name, size);
  open_ = true;
  appended_ = 0;
  crc_ = 0;
  return file_->Append(*r.header);
}

absl::Status ZipStreamWriter::Append(std::string_view data) {
  if (!open_) {
    return absl::FailedPreconditionError(
        fmt::format("{}: zip Append with no record open", file_->path()));
  }
  const uint64_t declared = layout_.records_.back().size;
  if (data.size() > declared - appended_) {
    return absl::FailedPreconditionError(fmt::format(
        "{}: {} bytes appended past the declared size of zip record {}",
        file_->path(), data.size(), Quote(layout_.records_.back().name)));
  }
  crc_ = Crc32(crc_, data.data(), data.size());
  appended_ += data.size();
  return file_->Append(data);
}

absl::Status ZipStreamWriter::EndRecord() {
  if (!open_) {
    return absl::FailedPreconditionError(
        fmt::format("{}: zip EndRecord with no record open", file_->path()));
  }
  ZipArchiveBuilder::Record& r = layout_.records_.back();
  if (appended_ != r.size) {
    return absl::FailedPreconditionError(
        fmt::format("{}: zip record {} got {} of its {} bytes", file_->path(),
                    Quote(r.name), appended_, r.size));
  }
  open_ = false;
  r.crc = crc_;
  return file_->Append(Descriptor(r.crc, r.size, r.zip64()));
}

absl::Status ZipStreamWriter::AddRecord(std::string_view name,
                                        std::string_view data) {
  RETURN_IF_ERROR(BeginRecord(name, data.size()));
  RETURN_IF_ERROR(Append(data));
  return EndRecord();
}

absl::Status ZipStreamWriter::Finish() {
  if (open_) {
    return absl::FailedPreconditionError(
        fmt::format("{}: zip Finish with a record still open", file_->path()));
  }
  // The layout's offsets are relative to the archive start, as zip wants.
  layout_.Finalize();
  if (file_->Size() - base_ != layout_.next_offset_) {
    return absl::InternalError(fmt::format(
        "{}: zip stream wrote {} bytes but the layout expects {}",
        file_->path(), file_->Size() - base_, layout_.next_offset_));
  }
  return file_->Append(*layout_.trailer_);
}

}  // namespace ckptd::format
