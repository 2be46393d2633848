// Copyright 2026 The ckptd Authors.
//
// ZipArchiveReader (zip.h): an archive's end records, central directory and
// local headers (zip_records.h), every offset and size checked against the
// archive's range.
#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "common/crc32.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/zip/zip.h"
#include "format/zip/zip_records.h"

namespace ckptd::format {

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
