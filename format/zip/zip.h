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
#ifndef CKPTD_FORMAT_ZIP_ZIP_H_
#define CKPTD_FORMAT_ZIP_ZIP_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
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
  ~ZipArchiveBuilder();
  // Movable (headers and segments stay valid), not copyable.
  ZipArchiveBuilder(ZipArchiveBuilder&&) noexcept;
  ZipArchiveBuilder& operator=(ZipArchiveBuilder&&) noexcept;
  ZipArchiveBuilder(const ZipArchiveBuilder&) = delete;
  ZipArchiveBuilder& operator=(const ZipArchiveBuilder&) = delete;

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

  // Sizes and offsets >= `threshold` use zip64 fields (default 0xffffffff);
  // builders constructed afterwards use it. Tests set 0 to force zip64
  // everywhere. Not for production use.
  static void SetZip64ThresholdForTest(uint64_t threshold);

 private:
  friend class ZipStreamWriter;
  struct Record;
  // Lays out a record of `size` payload bytes (its local header is built
  // now; the payload pieces are attached by the caller).
  Record& AddRecordOfSize(std::string_view name, uint64_t size);
  // True if the zip64 end of central directory record + locator are needed.
  bool NeedsZip64End() const;
  // Appends the zip64 end of central directory record and locator (when
  // NeedsZip64End()) and the end of central directory record.
  void AppendEndRecords(std::string* cd) const;
  // Builds descriptors, the central directory and the end records from the
  // records' CRCs, and segments_.
  void Finalize();

  std::string prefix_;
  uint64_t zip64_threshold_;
  std::vector<Record> records_;
  std::deque<std::string> owned_;  // stable storage for headers/owned data
  std::vector<std::string_view> segments_;
  uint64_t next_offset_ = 0;   // end of the last record = central dir offset
  uint64_t central_size_ = 0;  // central directory bytes
  bool any_zip64_ = false;
  const std::string* trailer_ = nullptr;  // central dir + end records
  bool finished_ = false;
};

// Streams an archive into a WritableFile record by record, for archives too
// large to hold in memory (ckptctl convert). Same layout as
// ZipArchiveBuilder; each record's size must be declared up front, its bytes
// are CRC'd as they are appended. Not thread-safe.
class ZipStreamWriter {
 public:
  // `file` must outlive the writer; the archive starts at file->Size().
  explicit ZipStreamWriter(WritableFile* file, std::string prefix = "archive");

  // Writes the local header of a record of exactly `size` bytes.
  absl::Status BeginRecord(std::string_view name, uint64_t size);
  // Appends payload bytes of the open record.
  absl::Status Append(std::string_view data);
  // Closes the record (FAILED_PRECONDITION if fewer/more bytes than declared
  // were appended) and writes its data descriptor.
  absl::Status EndRecord();
  // BeginRecord + Append + EndRecord.
  absl::Status AddRecord(std::string_view name, std::string_view data);
  // Writes the central directory and end records.
  absl::Status Finish();

 private:
  WritableFile* file_;
  const uint64_t base_;
  ZipArchiveBuilder layout_;
  bool open_ = false;
  uint64_t appended_ = 0;
  uint32_t crc_ = 0;
};

struct ZipEntry {
  std::string name;      // full name, with prefix ("archive/data/0")
  uint64_t data_offset;  // of the payload, relative to the archive start
  uint64_t size;         // payload bytes (STORED: compressed == uncompressed)
  uint32_t crc32;        // from the central directory
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
  // The CRC-32 of the record's payload, as the file computes it
  // (RandomAccessFile::Crc32: read in blocks, or combined from CRCs the
  // file keeps of its parts); read errors name the archive.
  absl::StatusOr<uint32_t> EntryCrc32(const ZipEntry& entry) const;
  // EntryCrc32, compared with the directory.
  absl::Status VerifyCrc(const ZipEntry& entry) const;

  const RandomAccessFile* file() const { return file_; }
  uint64_t archive_offset() const { return offset_; }
  uint64_t archive_length() const { return length_; }
  // "file @ offset" for messages.
  std::string Describe() const;

 private:
  class Opener;  // Open()'s steps (zip_reader.cc)

  ZipArchiveReader() = default;
  // Reads n bytes at archive-relative `pos`.
  absl::Status ReadAt(uint64_t pos, size_t n, char* dst) const;
  // OUT_OF_RANGE unless the entry's data lies inside the archive.
  absl::Status CheckEntry(const ZipEntry& entry) const;

  const RandomAccessFile* file_ = nullptr;
  uint64_t offset_ = 0;
  uint64_t length_ = 0;
  std::string prefix_;
  std::vector<ZipEntry> entries_;
  absl::flat_hash_map<std::string, size_t> index_;  // name -> entries_ index
};

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_ZIP_ZIP_H_
