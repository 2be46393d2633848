// Copyright 2026 The ckptd Authors.
//
// torch.save-compatible zip archives (dcp-format.md §2.1): a writer that lays
// out STORED records without copying the caller's payload bytes, and a bounded
// reader over a byte range of a file (a DCP item inside a .distcp file).
//
// Writer layout, per record: local header (flags 0x0808: data descriptor +
// UTF-8, method 0, time/date 0, CRC/sizes 0, extra field "FB" padding so the
// data starts at a multiple of 64 from the archive start; a zip64 extra field
// when a size or offset needs it), the data, a data descriptor
// (PK\x07\x08, crc, sizes; 8-byte sizes in zip64 form). Then the central
// directory with real CRCs/sizes, a zip64 EOCD record + locator when any
// offset/size/count needs zip64, and the classic EOCD.
#ifndef CKPTD_FORMAT_ZIP_H_
#define CKPTD_FORMAT_ZIP_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/env.h"

namespace ckptd::format {

// Builds one archive. Not thread-safe.
class ZipArchiveBuilder {
 public:
  // `prefix` is the archive's top folder: records are named prefix + "/" +
  // name ("archive/data.pkl"). torch.save always uses "archive".
  explicit ZipArchiveBuilder(std::string prefix = "archive");

  // Adds a record whose payload is the concatenation of `pieces`. The pieces
  // are not copied: they must stay valid and unchanged until the archive has
  // been written (segments()) or copied (FinishInto).
  // REQUIRES: Finish()/FinishInto() not called yet.
  void AddRecord(std::string_view name,
                 absl::Span<const std::string_view> pieces);
  // Adds a record whose payload the builder owns (small records: data.pkl,
  // byteorder, version).
  void AddOwnedRecord(std::string_view name, std::string data);

  // Total archive size in bytes. Valid as soon as the last record was added.
  uint64_t size() const;

  // Computes the CRC-32 of every record (one read pass over the payloads)
  // and finalises headers and the central directory. After this,
  // segments() describes the whole archive.
  void Finish();
  // Like Finish(), but also copies the whole archive into dst (size() bytes),
  // computing each CRC while copying (payload bytes are read once).
  void FinishInto(char* dst);

  // The archive as an ordered list of byte ranges: builder-owned header
  // bytes interleaved with the caller's payload pieces. Their concatenation
  // is the archive. REQUIRES: Finish() or FinishInto() called.
  const std::vector<std::string_view>& segments() const;

 private:
  struct Record;
  void Layout();  // assigns offsets/padding; idempotent
  void Finalize();
  std::string prefix_;
  std::vector<Record> records_;
  std::deque<std::string> owned_;  // stable storage for headers/owned data
  std::vector<std::string_view> segments_;
  uint64_t size_ = 0;
  bool laid_out_ = false;
  bool finished_ = false;
};

struct ZipEntry {
  std::string name;       // full name, with prefix ("archive/data/0")
  uint64_t data_offset;   // of the payload, relative to the archive start
  uint64_t size;          // payload bytes (STORED: compressed == uncompressed)
  uint32_t crc32;         // from the central directory
};

struct ZipReaderOptions {
  uint64_t max_entries = 1 << 20;
  uint64_t max_central_directory_bytes = uint64_t{256} << 20;
};

// Reads an archive stored at [offset, offset + length) of `file`. Only STORED
// entries are accepted. Every offset and size is checked against the range;
// errors name the file, the archive offset and the entry.
class ZipArchiveReader {
 public:
  // `file` must outlive the reader.
  static absl::StatusOr<std::unique_ptr<ZipArchiveReader>> Open(
      const RandomAccessFile* file, uint64_t offset, uint64_t length,
      const ZipReaderOptions& options = {});

  // Prefix taken from the first central-directory entry (up to its first '/').
  const std::string& prefix() const { return prefix_; }
  const std::vector<ZipEntry>& entries() const { return entries_; }
  // Finds prefix + "/" + name; nullptr if absent.
  const ZipEntry* Find(std::string_view name) const;

  // Reads a whole record, checking its CRC-32; RESOURCE_EXHAUSTED if it is
  // larger than max_bytes.
  absl::StatusOr<std::string> ReadRecord(const ZipEntry& entry,
                                         uint64_t max_bytes) const;
  // Reads n bytes at `offset_in_entry` of the record's payload (no CRC check).
  absl::Status ReadRange(const ZipEntry& entry, uint64_t offset_in_entry,
                         size_t n, char* dst) const;
  // Streams the record through CRC-32 and compares with the directory.
  absl::Status VerifyCrc(const ZipEntry& entry) const;

  const RandomAccessFile* file() const { return file_; }
  uint64_t archive_offset() const { return offset_; }
  uint64_t archive_length() const { return length_; }
  // "file @ offset" for messages.
  std::string Describe() const;

 private:
  ZipArchiveReader() = default;
  const RandomAccessFile* file_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t length_ = 0;
  std::string prefix_;
  std::vector<ZipEntry> entries_;
};

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_ZIP_H_
