// Copyright 2026 The ckptd Authors.
//
// Reads a DCP checkpoint directory written by stock dcp.save or by ckptd,
// resharding into whatever chunks the caller asks for (dcp-format.md §5.3):
// each requested box is intersected with the saved chunks and only the byte
// ranges needed are read from the payloads (a small piece of a large
// contiguous chunk costs a small read).
//
// CRC-32 rule (CheckpointReaderOptions::verify_crc, on by default): a read
// returns no value from a zip record whose CRC-32 does not match its archive.
// Every value comes from a storage record (archive/data/<key> of the saved
// chunk's torch.save archive) that this reader has checked in full:
//  * a read that copies a whole record in one piece into a destination of
//    the same C-order layout (loading with the sharding that saved) computes
//    the CRC on the bytes as they arrive, in 256 KiB blocks, while they are
//    in cache: no extra I/O. For records of 4 MiB and more, when the machine
//    has at least 2 x threads CPUs, a helper thread per reading thread runs
//    the CRC while the reading thread reads on (the two overlap);
//  * a read of parts of a record that are each one contiguous byte range of
//    the record and of the destination (row boxes: resharding along the
//    first dimension) streams the whole record once through CRC-32 and
//    copies the parts out of each block while it is in cache: the read
//    costs the record's bytes instead of the parts';
//  * any other read of a record (column boxes, strided destinations) first
//    streams the whole record through CRC-32: one extra sequential read of
//    the record's bytes;
//  * each record is checked at most once per reader (the reader remembers
//    the records it checked), so later reads of it cost nothing extra;
//  * the small records (data.pkl, byteorder, version) are always checked
//    when parsed, and bytes items (ReadBytesItem, ReadObject) have every
//    record of their archive checked (raw, non-archive bytes items carry no
//    CRC and are returned as they are).
// A mismatch is DATA_LOSS naming the file, the archive offset, the item
// (fqn and chunk offsets), the record and its byte range in the file. As
// with every failed read, destinations may already have been written: the
// caller must not use them.
#ifndef CKPTD_FORMAT_CHECKPOINT_CHECKPOINT_READER_H_
#define CKPTD_FORMAT_CHECKPOINT_CHECKPOINT_READER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/cancel.h"
#include "common/env.h"
#include "common/names.h"
#include "format/convert/safetensors.h"
#include "format/metadata/compact_metadata.h"
#include "format/metadata/metadata.h"
#include "format/pickle/py_value.h"
#include "format/tensor/payload_transform.h"
#include "format/tensor/tensor_payload.h"
#include "format/zip/zip.h"

namespace ckptd::format {

class CrcHelper;     // read_chunk.h
struct ChunkRecord;  // read_chunk.h

// A writable strided destination (strides in elements; empty = C order).
struct TensorDest {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;
  char* data = nullptr;
};

// "Fill dest with the box [offsets, offsets + dest.sizes) of tensor fqn."
struct TensorRequest {
  std::string fqn;
  std::vector<int64_t> offsets;  // global offsets of the box (empty for 0-d)
  TensorDest dest;
};

// One overlap of a requested box with a saved chunk (DCP's ReadItem).
struct ReadItem {
  size_t request = 0;                    // index into the requests
  size_t chunk = 0;                      // index into the tensor's saved chunks
  std::vector<int64_t> dest_offsets;     // inside the requested box
  std::vector<int64_t> storage_offsets;  // inside the saved chunk
  std::vector<int64_t> lengths;
};

// Whole records at least this large are read directly (direct_io); a
// caller laying out destinations for direct reads (WholeRecordOffset) need
// not ask about smaller ones.
inline constexpr uint64_t kDirectReadMinBytes = uint64_t{1} << 20;

struct CheckpointReaderOptions {
  Env* env = Env::Default();
  uint64_t max_metadata_bytes = uint64_t{4} << 30;
  // Largest bounce buffer a single read uses.
  uint64_t max_read_block = uint64_t{16} << 20;
  // Largest bytes item ReadBytesItem will return.
  uint64_t max_bytes_item = uint64_t{1} << 30;
  // Threads each ReadTensors call reads with (the caller's included); the
  // work is split by (tensor, saved chunk). Values < 1 mean 1.
  int threads = 1;
  // Check payload CRC-32s (the rule above). Off: bytes are returned
  // unchecked (for benchmarks, or salvaging a damaged checkpoint).
  bool verify_crc = true;
  // Read whole records (a box that is a saved chunk, into a dense
  // destination, from an uncompressed payload) with direct reads
  // (RandomAccessFile::ReadDirect: no page cache) where the file allows
  // them and the destination's address shares the file offset's alignment
  // (WholeRecordOffset says which offset); the unaligned head and tail of
  // the record, and every other read, go through the page cache. For a
  // reader that reads each byte once and hands it on itself (the daemon's
  // restore): processes that share a page cache should leave it off.
  bool direct_io = false;
};

struct ReadStats {
  uint64_t bytes_read = 0;    // payload bytes read from files
  uint64_t bytes_copied = 0;  // into destinations
  uint64_t read_calls = 0;
  uint64_t crc_bytes = 0;  // run through CRC-32
  // Of bytes_read, those read with direct reads (no page cache; direct_io).
  uint64_t direct_bytes = 0;
  // Bytes of payload archives read to parse them (end records, central
  // directory, local headers, data.pkl), with one or two reads per saved
  // chunk: not in bytes_read.
  uint64_t archive_bytes = 0;
};

class CheckpointReader {
 public:
  // Reads (streaming, metadata_decode.h) and validates `.metadata` (chunks
  // in bounds, non-overlapping; file names inside the directory). NOT_FOUND
  // if the directory has no `.metadata`; UNIMPLEMENTED for rank-local
  // checkpoints (__{r}.metadata only).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& dir, const CheckpointReaderOptions& options = {});

  // The checkpoint's metadata (~100 bytes per chunk).
  const CompactMetadata& compact() const { return compact_; }
  // The same as the plain model, made on the first call (about 300 bytes
  // and four heap blocks per chunk: for callers that need format::Metadata;
  // thread-safe).
  const Metadata& metadata() const;
  const std::string& dir() const { return dir_; }
  const CheckpointReaderOptions& options() const { return options_; }

  // The read plan for `requests` (§5.3). Errors: unknown fqn, bytes item
  // asked as a tensor, box outside the tensor, rank mismatch, or a region of
  // a request that no saved chunk covers.
  absl::StatusOr<std::vector<ReadItem>> PlanReads(
      absl::Span<const TensorRequest> requests) const;

  // Plans and fills every request. Destination dtype must equal the saved
  // payload dtype. Reads with options.threads threads; on failure the first
  // error is returned (the other threads stop at their next chunk) and some
  // destinations may have been partly written. Thread-safe: several calls
  // may run on one reader at once (requests must not share destinations).
  // `verify_crc` false skips the CRC rule for this call (it applies only
  // if options.verify_crc is on too). `cancel` (may be null): once raised,
  // every thread stops before its next saved chunk, or its next block (at
  // most 8 MiB) of a whole record it is reading, and the call returns
  // cancel->status().
  absl::Status ReadTensors(absl::Span<const TensorRequest> requests,
                           ReadStats* stats = nullptr, bool verify_crc = true,
                           const Cancellation* cancel = nullptr);
  // ReadTensors with the plan already made: `items` must be what
  // PlanReads(requests) returned (for callers that inspect the plan's
  // errors themselves without planning twice).
  absl::Status ReadPlanned(absl::Span<const TensorRequest> requests,
                           absl::Span<const ReadItem> items,
                           ReadStats* stats = nullptr, bool verify_crc = true,
                           const Cancellation* cancel = nullptr);

  // Where in its data file the bytes of `request` start when reading it
  // reads one whole stored record in one piece (the box is a saved chunk of
  // an uncompressed torch.save payload, the destination dense), which is
  // what direct_io reads directly; nullopt for any other box. Costs the
  // parse of the chunk's archive (two small reads). For laying out a
  // destination so that its address and this offset share their alignment.
  absl::StatusOr<std::optional<uint64_t>> WholeRecordOffset(
      const TensorRequest& request);
  // Where the bytes of `request` lie, for a caller that takes them where
  // they are (the daemon lending a memory-held file to a rank): when they
  // are one contiguous range of one stored record in the box's own dense C
  // order (a whole record as above, or a part of one cut along its first
  // dimension of length above 1, as the client cuts boxes larger than a
  // batch): the file as OpenFile opened it, the range in it, and whether
  // its elements are big-endian (to be swapped by whoever copies them);
  // nullopt for any other box. With `verify_crc` (and options.verify_crc),
  // the whole record's CRC-32 is checked first unless this reader checked
  // it already (DATA_LOSS as for a read).
  struct RecordSpan {
    const RandomAccessFile* file = nullptr;
    uint64_t offset = 0;
    uint64_t size = 0;
    bool big_endian = false;
    bool whole = false;  // the range is all of the record
  };
  absl::StatusOr<std::optional<RecordSpan>> RecordRange(
      const TensorRequest& request, bool verify_crc);

  // The raw payload of a bytes item (a torch.save archive).
  absl::StatusOr<std::string> ReadBytesItem(std::string_view fqn,
                                            bool verify_crc = true);
  // The value of a bytes item holding plain Python values.
  absl::StatusOr<PyValue> ReadObject(std::string_view fqn);

  // Checks the CRC-32 of every record of `archive` (the payload of `key`),
  // except the record `skip` (may be nullptr). DATA_LOSS on a mismatch.
  static absl::Status VerifyArchiveCrcs(const ZipArchiveReader& archive,
                                        const StorageKey& key,
                                        const ZipEntry* skip = nullptr,
                                        ReadStats* stats = nullptr);

  // The storage location of a saved chunk / bytes item (DATA_LOSS if
  // storage_data has no entry for the key). The StorageInfo lives as long
  // as the reader.
  absl::StatusOr<const StorageInfo*> Locate(const StorageKey& key) const;
  // Opens the file of a storage entry (cached; thread-safe).
  absl::StatusOr<const RandomAccessFile*> OpenFile(
      const std::string& relative_path);
  // The payload of `info` (the entry of `key`) after its storage transforms
  // (payload_transform.h): its range of the data file, or its zstd stream
  // decoded into memory (at most `max_decoded` bytes).
  absl::StatusOr<DecodedPayload> OpenPayload(const StorageInfo& info,
                                             const StorageKey& key,
                                             uint64_t max_decoded);

 private:
  CheckpointReader(std::string dir, CheckpointReaderOptions options)
      : dir_(std::move(dir)), options_(options) {}
  // Reads the parts `items` of chunk `chunk` of tensor item `item`
  // (read_chunk.cc).
  absl::Status ReadChunkItems(size_t item, size_t chunk,
                              absl::Span<const ReadItem* const> items,
                              absl::Span<const TensorRequest> requests,
                              ReadStats* stats,
                              std::unique_ptr<CrcHelper>* helper,
                              bool verify_crc, const Cancellation* cancel);
  // The StorageKey of a chunk (for messages).
  StorageKey ChunkKey(size_t item, size_t chunk) const;
  // Opens and parses the payload of chunk `chunk` of tensor item `item`
  // (read_chunk.cc); DATA_LOSS for a payload that is not the chunk's.
  absl::StatusOr<ChunkRecord> OpenChunk(size_t item, size_t chunk,
                                        ReadStats* stats);
  // The parts `items` of a chunk stored in a SAFETENSORS-format data file:
  // tensor `fqn` of the safetensors blob at `blob_offset` of `file`.
  absl::Status ReadSafetensorsChunk(size_t item, size_t chunk,
                                    const RandomAccessFile* file,
                                    uint64_t blob_offset,
                                    absl::Span<const ReadItem* const> items,
                                    absl::Span<const TensorRequest> requests,
                                    ReadStats* stats);
  // The header of the safetensors blob at `offset` of `file`, parsed once
  // per reader (a file's chunks all share it).
  absl::StatusOr<std::shared_ptr<const SafetensorsHeader>> SafetensorsHeaderAt(
      const RandomAccessFile* file, uint64_t offset, ReadStats* stats);
  // OpenPayload for a compact storage entry read from `stored`; counts the
  // stored bytes a decode read in `stats`.
  absl::StatusOr<DecodedPayload> DecodeStorage(
      const RandomAccessFile* stored, const CompactMetadata::Storage& s,
      const StorageKey& key, uint64_t max_decoded, ReadStats* stats);

  // The CRC rule: true if the storage record of `s` was checked already.
  bool CrcChecked(const CompactMetadata::Storage* s);
  void MarkCrcChecked(const CompactMetadata::Storage* s);

  const std::string dir_;
  const CheckpointReaderOptions options_;
  CompactMetadata compact_;
  absl::Mutex crc_mu_;
  absl::flat_hash_set<const CompactMetadata::Storage*> crc_checked_
      ABSL_GUARDED_BY(crc_mu_);
  mutable absl::once_flag metadata_once_;
  mutable std::unique_ptr<Metadata> metadata_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<RandomAccessFile>> files_
      ABSL_GUARDED_BY(mu_);
  absl::Mutex safetensors_mu_;
  absl::flat_hash_map<std::pair<const RandomAccessFile*, uint64_t>,
                      std::shared_ptr<const SafetensorsHeader>>
      safetensors_ ABSL_GUARDED_BY(safetensors_mu_);
  mutable absl::Mutex locate_mu_;
  mutable absl::flat_hash_map<const CompactMetadata::Storage*,
                              std::unique_ptr<StorageInfo>>
      located_ ABSL_GUARDED_BY(locate_mu_);
};

// A relative_path in storage_data must stay inside the checkpoint
// directory (common/names.h).
using ::ckptd::IsSafeRelativePath;

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_CHECKPOINT_CHECKPOINT_READER_H_
