// Copyright 2026 The ckptd Authors.
//
// The zip writers (zip.h): ZipArchiveBuilder lays out the records of
// zip_records.h and ZipStreamWriter streams them into a file. The reader is
// zip_reader.cc.
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
#include "format/zip/zip_records.h"

namespace ckptd::format {
namespace {

// The writer's choices (zip_records.h: what the format fixes).
constexpr uint16_t kPadExtraId = 0x4246;  // "FB", torch's alignment padding
constexpr uint16_t kFlags = 0x0808;       // data descriptor + UTF-8 names
constexpr uint16_t kVersionZip64 = 45;
constexpr uint64_t kAlignment = 64;

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
  // Appends the record's central directory header (central_size() bytes).
  void AppendCentralHeader(std::string* cd) const;
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

void ZipArchiveBuilder::Record::AppendCentralHeader(std::string* cd) const {
  const uint32_t size32 = zip64_size ? kMax32 : static_cast<uint32_t>(size);
  Put32(cd, kCentralSig);
  Put16(cd, zip64() ? kVersionZip64 : 0);  // version made by
  Put16(cd, zip64() ? kVersionZip64 : 0);  // version needed
  Put16(cd, kFlags);
  Put16(cd, 0);  // method
  Put16(cd, 0);  // time
  Put16(cd, 0);  // date
  Put32(cd, crc);
  Put32(cd, size32);
  Put32(cd, size32);
  Put16(cd, static_cast<uint16_t>(name.size()));
  Put16(cd, static_cast<uint16_t>(zip64_extra_size()));
  Put16(cd, 0);  // comment length
  Put16(cd, 0);  // disk number start
  Put16(cd, 0);  // internal attributes
  Put32(cd, 0);  // external attributes
  Put32(cd, zip64_offset ? kMax32 : static_cast<uint32_t>(header_offset));
  *cd += name;
  if (zip64()) {
    Put16(cd, kZip64ExtraId);
    Put16(cd, static_cast<uint16_t>(zip64_extra_size() - 4));
    if (zip64_size) {
      Put64(cd, size);
      Put64(cd, size);
    }
    if (zip64_offset) Put64(cd, header_offset);
  }
}

void ZipArchiveBuilder::AppendEndRecords(std::string* cd) const {
  const uint64_t t = zip64_threshold_;
  const uint64_t count = records_.size();
  const uint64_t cd_offset = next_offset_;
  if (NeedsZip64End()) {
    const uint64_t eocd64_offset = cd_offset + central_size_;
    Put32(cd, kEocd64Sig);
    Put64(cd, kEocd64Size - 12);  // size of the rest of the record
    Put16(cd, kVersionZip64);     // version made by
    Put16(cd, kVersionZip64);     // version needed
    Put32(cd, 0);                 // this disk
    Put32(cd, 0);                 // disk with the central directory
    Put64(cd, count);
    Put64(cd, count);
    Put64(cd, central_size_);
    Put64(cd, cd_offset);
    Put32(cd, kLocatorSig);
    Put32(cd, 0);  // disk with the zip64 EOCD
    Put64(cd, eocd64_offset);
    Put32(cd, 1);  // total disks
  }
  const uint16_t count16 = count >= std::min<uint64_t>(kMax16, t)
                               ? kMax16
                               : static_cast<uint16_t>(count);
  Put32(cd, kEocdSig);
  Put16(cd, 0);  // this disk
  Put16(cd, 0);  // disk with the central directory
  Put16(cd, count16);
  Put16(cd, count16);
  Put32(cd, central_size_ >= t ? kMax32 : static_cast<uint32_t>(central_size_));
  Put32(cd, cd_offset >= t ? kMax32 : static_cast<uint32_t>(cd_offset));
  Put16(cd, 0);  // comment length
}

void ZipArchiveBuilder::Finalize() {
  std::string cd;
  cd.reserve(central_size_ + kEocd64Size + kLocatorSize + kEocdSize);
  for (Record& r : records_) {
    owned_.push_back(Descriptor(r.crc, r.size, r.zip64()));
    r.descriptor = &owned_.back();
    r.AppendCentralHeader(&cd);
  }
  ABSL_RAW_CHECK(cd.size() == central_size_, "central directory size");
  AppendEndRecords(&cd);
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
// Streaming writer
// ---------------------------------------------------------------------------

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
