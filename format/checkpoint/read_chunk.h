// Copyright 2026 The ckptd Authors.
//
// Internal to CheckpointReader (checkpoint_reader.h): the CRC-32 checks of
// payload records, the helper thread that runs a record's CRC beside the
// thread reading it, and a file view that serves the small reads of parsing
// an item's torch.save archive (end records, central directory, local
// headers, data.pkl) from two windows read in one pread each.
#ifndef CKPTD_FORMAT_CHECKPOINT_READ_CHUNK_H_
#define CKPTD_FORMAT_CHECKPOINT_READ_CHUNK_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "common/env.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/metadata/metadata.h"
#include "format/tensor/payload_transform.h"
#include "format/tensor/tensor_payload.h"
#include "format/zip/zip.h"

namespace ckptd::format {

// "item 'model.w' chunk at offsets (2, 0)" / "bytes item 'step'".
std::string DescribeItem(const StorageKey& key);

// DATA_LOSS naming the archive, the item, the record and its file range.
absl::Status CrcMismatch(const ZipArchiveReader& archive, const StorageKey& key,
                         const ZipEntry& e, uint32_t got);

// Streams one record through CRC-32 and compares it with the archive.
absl::Status VerifyRecord(const ZipArchiveReader& archive,
                          const StorageKey& key, const ZipEntry& e,
                          ReadStats* stats);

// A parse error of a payload's small records that is a CRC mismatch (the
// zip reader's ReadRecord checks them) becomes DATA_LOSS naming the item.
absl::Status CrcErrorAsDataLoss(const absl::Status& s, const StorageKey& key);

class WindowedFile;

// A saved chunk's payload, opened and parsed (CheckpointReader::OpenChunk).
struct ChunkRecord {
  DecodedPayload payload;              // its file and range (decoded: zstd)
  std::unique_ptr<WindowedFile> view;  // serves the archive's small reads
  std::unique_ptr<ZipArchiveReader> archive;  // null: a safetensors blob
  TensorRecord rec;                           // of the archive
  uint64_t storage_base = 0;  // file offset of the view's first element
};

// A view of `file` that holds [head_start, +head) and [tail_start, +tail)
// of it in memory (read with one pread each, or one for both when they
// touch) and serves reads inside either from there; other reads go to the
// file.
class WindowedFile : public RandomAccessFile {
 public:
  // Reads the windows of the item [offset, offset + length): its first and
  // last `window` bytes (the whole item when it is at most 2 * window).
  static absl::StatusOr<std::unique_ptr<WindowedFile>> Open(
      const RandomAccessFile* file, uint64_t offset, uint64_t length,
      uint64_t window, ReadStats* stats);

  absl::Status ReadExact(uint64_t offset, size_t n,
                         char* scratch) const override;
  // From a window when [offset, +n) lies in one, else the file's Crc32
  // (which may combine CRCs it keeps instead of reading).
  absl::StatusOr<uint32_t> Crc32(uint64_t offset, uint64_t n) const override;
  uint64_t Size() const override { return file_->Size(); }
  const std::string& path() const override { return file_->path(); }

 private:
  explicit WindowedFile(const RandomAccessFile* file) : file_(file) {}
  // Where [offset, +n) lies in a window, or null.
  const char* InWindow(uint64_t offset, uint64_t n) const;
  const RandomAccessFile* file_;
  uint64_t head_start_ = 0, tail_start_ = 0;
  std::string head_, tail_;
};

// CRC-32 of a record on a helper thread while the reading thread reads it
// into memory: the reader publishes how many bytes are in place, the helper
// follows (spinning, then yielding, between blocks: a futex wake per block
// would cost the reader more than the CRC). One per reading thread, reused
// for every large record that thread reads in one ReadPlanned call.
class CrcHelper {
 public:
  CrcHelper();
  ~CrcHelper();
  CrcHelper(const CrcHelper&) = delete;
  CrcHelper& operator=(const CrcHelper&) = delete;

  // Starts the CRC of [base, base + size); bytes become readable as they
  // are Publish()ed. Finish() or Cancel() must follow.
  void Begin(const char* base, uint64_t size);
  // Bytes [0, n) of the record are in place.
  void Publish(uint64_t n) { progress_.store(n, std::memory_order_release); }
  // Waits until the helper has run every byte through CRC-32.
  uint32_t Finish();
  // Abandons the record (a read failed); the helper stops at once.
  void Cancel();

 private:
  void Wait();
  void Run();

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

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_CHECKPOINT_READ_CHUNK_H_
