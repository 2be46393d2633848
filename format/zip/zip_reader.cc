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

namespace {

// The end of central directory record in `tail` (the archive's last bytes),
// searched backwards over the comment: the last signature whose comment
// ends the archive, else the last one followed by trailing bytes;
// UINT64_MAX if none.
uint64_t FindEndRecord(std::string_view tail) {
  uint64_t fallback = UINT64_MAX;  // a signature with trailing bytes
  for (uint64_t p = tail.size() - kEocdSize + 1; p-- > 0;) {
    if (Get32(tail.data() + p) != kEocdSig) continue;
    const uint64_t end = p + kEocdSize + Get16(tail.data() + p + 20);
    if (end == tail.size()) return p;
    if (end < tail.size() && fallback == UINT64_MAX) fallback = p;
  }
  return fallback;
}

}  // namespace

// Open()'s steps over one archive, filling in the reader; every error
// starts with the reader's Describe().
class ZipArchiveReader::Opener {
 public:
  Opener(ZipArchiveReader* r, const ZipReaderOptions& options)
      : r_(*r), options_(options), desc_(r->Describe()) {}

  absl::Status Run() {
    const uint64_t file_size = r_.file_->Size();
    const uint64_t offset = r_.offset_, length = r_.length_;
    if (offset > file_size || length > file_size - offset) {
      return absl::OutOfRangeError(fmt::format(
          "{}: archive [{}, +{}) extends past the end of the file ({})", desc_,
          offset, length, file_size));
    }
    if (length < kEocdSize) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: {} bytes is too short for a zip archive", desc_, length));
    }
    // 1. End of central directory record; 2. zip64 locator and end record.
    RETURN_IF_ERROR(ReadEndRecord());
    RETURN_IF_ERROR(ReadZip64EndRecord());
    RETURN_IF_ERROR(CheckDirectory());
    // 3. Central directory entries, each checked against its local header.
    RETURN_IF_ERROR(ReadEntries());
    return TakePrefix();
  }

 private:
  // Where the central directory is, from the end records.
  struct EndRecord {
    uint64_t pos = 0;         // of the (classic) end record in the archive
    uint64_t disk = 0;        // this disk
    uint64_t cd_disk = 0;     // the disk with the central directory
    uint64_t count_disk = 0;  // entries on this disk
    uint64_t count = 0;       // entries in all
    uint64_t cd_size = 0;
    uint64_t cd_offset = 0;
    uint64_t cd_limit = 0;  // the central directory ends before this
  };

  // One central directory header's fields (zip64 values applied).
  struct CentralHeader {
    uint16_t flags = 0;
    uint16_t method = 0;
    uint32_t crc = 0;
    uint64_t csize = 0;
    uint64_t usize = 0;
    uint64_t name_len = 0;
    uint64_t extra_len = 0;
    uint64_t comment_len = 0;
    uint64_t local_offset = 0;

    uint64_t size() const {
      return kCentralHeaderSize + name_len + extra_len + comment_len;
    }
  };

  // 1. The end of central directory record, searched for in the tail.
  absl::Status ReadEndRecord() {
    const uint64_t length = r_.length_;
    const uint64_t tail_len = std::min(length, kEocdSize + kMaxComment);
    const uint64_t tail_start = length - tail_len;
    std::string tail(tail_len, '\0');
    RETURN_IF_ERROR(r_.ReadAt(tail_start, tail_len, tail.data()));
    const uint64_t eocd = FindEndRecord(tail);  // relative to the tail
    if (eocd == UINT64_MAX) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: no end of central directory record in the last {} bytes of "
          "the archive ({} bytes): not a zip archive or truncated",
          desc_, tail_len, length));
    }
    const char* e = tail.data() + eocd;
    end_.pos = tail_start + eocd;
    end_.disk = Get16(e + 4);
    end_.cd_disk = Get16(e + 6);
    end_.count_disk = Get16(e + 8);
    end_.count = Get16(e + 10);
    end_.cd_size = Get32(e + 12);
    end_.cd_offset = Get32(e + 16);
    end_.cd_limit = end_.pos;
    return absl::OkStatus();
  }

  // 2. The zip64 locator before the end record and the zip64 end record it
  // points at, where there are ones: their values replace the end
  // record's.
  absl::Status ReadZip64EndRecord() {
    if (end_.pos < kLocatorSize) return absl::OkStatus();
    char loc[kLocatorSize];
    RETURN_IF_ERROR(r_.ReadAt(end_.pos - kLocatorSize, kLocatorSize, loc));
    if (Get32(loc) != kLocatorSig) return absl::OkStatus();
    const uint64_t loc_pos = end_.pos - kLocatorSize;
    const uint32_t loc_disk = Get32(loc + 4);
    const uint64_t eocd64_pos = Get64(loc + 8);
    const uint32_t disks = Get32(loc + 16);
    if (loc_disk != 0 || disks > 1) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: zip64 locator names disk {} of {}: multi-disk archives are "
          "not supported",
          desc_, loc_disk, disks));
    }
    if (loc_pos < kEocd64Size || eocd64_pos > loc_pos - kEocd64Size) {
      return absl::OutOfRangeError(fmt::format(
          "{}: zip64 end of central directory record at {} does not fit "
          "before its locator at {}",
          desc_, eocd64_pos, loc_pos));
    }
    char z[kEocd64Size];
    RETURN_IF_ERROR(r_.ReadAt(eocd64_pos, kEocd64Size, z));
    if (Get32(z) != kEocd64Sig) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: bad zip64 end of central directory signature 0x{:08x} at {}",
          desc_, Get32(z), eocd64_pos));
    }
    if (Get64(z + 4) < kEocd64Size - 12) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: zip64 end of central directory record at {} has size {}", desc_,
          eocd64_pos, Get64(z + 4)));
    }
    end_.disk = Get32(z + 16);
    end_.cd_disk = Get32(z + 20);
    end_.count_disk = Get64(z + 24);
    end_.count = Get64(z + 32);
    end_.cd_size = Get64(z + 40);
    end_.cd_offset = Get64(z + 48);
    end_.cd_limit = eocd64_pos;
    return absl::OkStatus();
  }

  // The central directory the end records describe: one disk, inside the
  // archive before its end record, within the options' limits.
  absl::Status CheckDirectory() const {
    const EndRecord& e = end_;
    if (e.disk != 0 || e.cd_disk != 0 || e.count_disk != e.count) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: end of central directory names disk {} / directory disk {} "
          "with {} of {} entries: multi-disk archives are not supported",
          desc_, e.disk, e.cd_disk, e.count_disk, e.count));
    }
    if (e.cd_offset > e.cd_limit || e.cd_size > e.cd_limit - e.cd_offset) {
      return absl::OutOfRangeError(fmt::format(
          "{}: central directory [{}, +{}) extends past its end record at {}",
          desc_, e.cd_offset, e.cd_size, e.cd_limit));
    }
    if (e.count > e.cd_size / kCentralHeaderSize) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: {} entries do not fit in a central directory of {} bytes", desc_,
          e.count, e.cd_size));
    }
    if (e.count > options_.max_entries) {
      return absl::ResourceExhaustedError(
          fmt::format("{}: {} entries exceeds the limit of {}", desc_, e.count,
                      options_.max_entries));
    }
    if (e.cd_size > options_.max_central_directory_bytes) {
      return absl::ResourceExhaustedError(fmt::format(
          "{}: central directory of {} bytes exceeds the limit of {}", desc_,
          e.cd_size, options_.max_central_directory_bytes));
    }
    return absl::OkStatus();
  }

  // 3. Every central directory entry into the reader's entries and index.
  absl::Status ReadEntries() {
    std::string cd(end_.cd_size, '\0');
    RETURN_IF_ERROR(r_.ReadAt(end_.cd_offset, end_.cd_size, cd.data()));
    r_.entries_.reserve(end_.count);
    r_.index_.reserve(end_.count);
    std::string local;
    uint64_t p = 0;
    for (uint64_t i = 0; i < end_.count; ++i) {
      ASSIGN_OR_RETURN(const CentralHeader c, ReadEntry(cd, p, i, &local));
      p += c.size();
    }
    return absl::OkStatus();
  }

  // Entry #i, whose header is at cd[p, ...): its header, its zip64 sizes,
  // STORED, its local header (read into `local`) and its data checked; the
  // entry added to the reader.
  absl::StatusOr<CentralHeader> ReadEntry(std::string_view cd, uint64_t p,
                                          uint64_t i, std::string* local) {
    ASSIGN_OR_RETURN(CentralHeader c, ParseCentralHeader(cd, p, i));
    const char* name = cd.data() + p + kCentralHeaderSize;
    ZipEntry entry;
    entry.name.assign(name, c.name_len);
    const std::string qname = Quote(entry.name);
    RETURN_IF_ERROR(ApplyZip64Extra(
        qname, std::string_view(name + c.name_len, c.extra_len), &c));
    RETURN_IF_ERROR(CheckStored(qname, c));
    RETURN_IF_ERROR(ReadLocalHeader(qname, c, local, &entry));
    if (!r_.index_.emplace(entry.name, r_.entries_.size()).second) {
      return absl::InvalidArgumentError(
          fmt::format("{}: duplicate entry {}", desc_, qname));
    }
    r_.entries_.push_back(std::move(entry));
    return c;
  }

  // The central directory header of entry #i at cd[p, ...), checked to lie
  // inside the directory.
  absl::StatusOr<CentralHeader> ParseCentralHeader(std::string_view cd,
                                                   uint64_t p,
                                                   uint64_t i) const {
    const uint64_t cd_offset = end_.cd_offset, cd_size = cd.size();
    if (cd_size - p < kCentralHeaderSize) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: central directory entry #{} at {} extends past the central "
          "directory end ({})",
          desc_, i, cd_offset + p, cd_offset + cd_size));
    }
    const char* h = cd.data() + p;
    if (Get32(h) != kCentralSig) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: bad central directory signature 0x{:08x} for entry #{} at {}",
          desc_, Get32(h), i, cd_offset + p));
    }
    CentralHeader c;
    c.flags = Get16(h + 8);
    c.method = Get16(h + 10);
    c.crc = Get32(h + 16);
    c.csize = Get32(h + 20);
    c.usize = Get32(h + 24);
    c.name_len = Get16(h + 28);
    c.extra_len = Get16(h + 30);
    c.comment_len = Get16(h + 32);
    c.local_offset = Get32(h + 42);
    if (cd_size - p < c.size()) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: central directory entry #{} at {} ({} bytes) extends past the "
          "central directory end ({})",
          desc_, i, cd_offset + p, c.size(), cd_offset + cd_size));
    }
    return c;
  }

  // Zip64 extended information in the extra fields of entry `qname`:
  // present fields replace the 0xffffffff placeholders, in the order usize,
  // csize, offset.
  absl::Status ApplyZip64Extra(std::string_view qname, std::string_view extra,
                               CentralHeader* c) const {
    const char* x = extra.data();
    uint64_t xleft = extra.size();
    while (xleft >= 4) {
      const uint16_t id = Get16(x);
      const uint64_t len = Get16(x + 2);
      if (len > xleft - 4) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: entry {}: extra field 0x{:04x} of {} bytes overruns the "
            "extra data ({} bytes)",
            desc_, qname, id, len, xleft - 4));
      }
      if (id == kZip64ExtraId) {
        const char* f = x + 4;
        uint64_t fleft = len;
        for (uint64_t* v : {&c->usize, &c->csize, &c->local_offset}) {
          if (*v != kMax32) continue;
          if (fleft < 8) {
            return absl::InvalidArgumentError(fmt::format(
                "{}: entry {}: zip64 extra field is too short ({} bytes)",
                desc_, qname, len));
          }
          *v = Get64(f);
          f += 8;
          fleft -= 8;
        }
      }
      x += 4 + len;
      xleft -= 4 + len;
    }
    return absl::OkStatus();
  }

  // INVALID_ARGUMENT unless entry `qname` is a plain STORED one.
  absl::Status CheckStored(std::string_view qname,
                           const CentralHeader& c) const {
    // Bits 0 (encrypted), 6 (strong encryption), 13 (masked local header).
    if (c.flags & 0x2041) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: entry {}: encrypted entries are not supported", desc_, qname));
    }
    if (c.method != 0) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: entry {}: compression method {} is not supported (only "
          "STORED)",
          desc_, qname, c.method));
    }
    if (c.csize != c.usize) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: entry {}: STORED entry has compressed size {} != size {}", desc_,
          qname, c.csize, c.usize));
    }
    return absl::OkStatus();
  }

  // The local header of entry `qname` (read into `local`): it must name the
  // same entry; entry's data offset, size and CRC from it and the central
  // header, the data checked to lie inside the archive.
  absl::Status ReadLocalHeader(std::string_view qname, const CentralHeader& c,
                               std::string* local, ZipEntry* entry) const {
    const uint64_t length = r_.length_;
    const uint64_t local_offset = c.local_offset;
    if (local_offset > length ||
        kLocalHeaderSize + c.name_len > length - local_offset) {
      return absl::OutOfRangeError(fmt::format(
          "{}: entry {}: local header at {} extends past the archive end ({})",
          desc_, qname, local_offset, length));
    }
    local->resize(kLocalHeaderSize + c.name_len);
    RETURN_IF_ERROR(r_.ReadAt(local_offset, local->size(), local->data()));
    if (Get32(local->data()) != kLocalSig) {
      return absl::InvalidArgumentError(
          fmt::format("{}: entry {}: bad local header signature 0x{:08x} at {}",
                      desc_, qname, Get32(local->data()), local_offset));
    }
    const uint64_t local_name_len = Get16(local->data() + 26);
    const uint64_t local_extra_len = Get16(local->data() + 28);
    if (local_name_len != c.name_len ||
        std::string_view(local->data() + kLocalHeaderSize, c.name_len) !=
            entry->name) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: entry {}: local header at {} names a different entry", desc_,
          qname, local_offset));
    }
    // local_offset + 30 + 2 * 0xffff <= length + 2^17: no overflow.
    entry->data_offset =
        local_offset + kLocalHeaderSize + local_name_len + local_extra_len;
    entry->size = c.usize;
    entry->crc32 = c.crc;
    if (entry->data_offset > length ||
        entry->size > length - entry->data_offset) {
      return absl::OutOfRangeError(fmt::format(
          "{}: entry {}: data [{}, +{}) extends past the archive end ({})",
          desc_, qname, entry->data_offset, entry->size, length));
    }
    return absl::OkStatus();
  }

  // The reader's prefix: the first entry's name up to its first '/'.
  absl::Status TakePrefix() {
    if (r_.entries_.empty()) return absl::OkStatus();
    const std::string& first = r_.entries_.front().name;
    const size_t slash = first.find('/');
    if (slash == std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("{}: first entry {} is not inside a folder (expected "
                      "'<prefix>/...')",
                      desc_, Quote(first)));
    }
    r_.prefix_ = first.substr(0, slash);
    return absl::OkStatus();
  }

  ZipArchiveReader& r_;
  const ZipReaderOptions& options_;
  const std::string desc_;  // r_.Describe()
  EndRecord end_;
};

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
  RETURN_IF_ERROR(Opener(r.get(), options).Run());
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
