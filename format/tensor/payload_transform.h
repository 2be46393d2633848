// Copyright 2026 The ckptd Authors.
//
// Storage transforms of a payload: the `transform_descriptors` of its
// _StorageInfo in `.metadata` (torch >= 2.7). A payload stored with a
// transform is the transform's output stream of the bytes DCP would have
// written without it (a torch.save archive for a tensor chunk, the raw
// bytes of a bytes item), at [offset, offset + length) of its data file.
//
// ckptd reads, and writes on request, the one transform stock torch ships:
//
//   "stream.zstd/1"   FileSystemWriter(_extensions=[ZStandard()]): one or
//                     more concatenated zstd frames (libzstd)
//
// Any other descriptor is UNIMPLEMENTED, naming it. A transformed payload is
// decoded whole into memory (bounded by the caller's max_decoded) and then
// read like an untransformed one: its archive's CRC-32s are checked as
// usual.
#ifndef CKPTD_FORMAT_TENSOR_PAYLOAD_TRANSFORM_H_
#define CKPTD_FORMAT_TENSOR_PAYLOAD_TRANSFORM_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "format/metadata/compact_metadata.h"

namespace ckptd::format {

// The descriptor torch's ZStandard extension writes.
inline constexpr std::string_view kZstdDescriptor = "stream.zstd/1";

enum class PayloadTransform { kNone, kZstd };

// The transform `descriptors` name: none (empty list), zstd ("stream.zstd/1"
// or a 1.x minor version, as torch accepts), else UNIMPLEMENTED naming them.
absl::StatusOr<PayloadTransform> ParseTransforms(
    const std::vector<std::string>& descriptors);

// A payload's bytes after its transforms: [offset, offset + length) of
// `file`, which is the data file itself (no transform) or an in-memory file
// holding the decoded bytes (`owned`).
struct DecodedPayload {
  const RandomAccessFile* file = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
  std::unique_ptr<InMemoryFile> owned;  // set when decoded
  uint64_t stored_bytes = 0;            // bytes read from `file` to decode
};

// Decodes [offset, offset + length) of `file` stored with `descriptors`.
// Corrupt or truncated streams are DATA_LOSS naming the file, the offset and
// `what`; more than `max_decoded` bytes of output is RESOURCE_EXHAUSTED.
absl::StatusOr<DecodedPayload> DecodePayload(
    const RandomAccessFile* file, uint64_t offset, uint64_t length,
    const std::vector<std::string>& descriptors, uint64_t max_decoded,
    std::string_view what);

// The most the transformed payload of storage entry `s` may decode to: for
// a tensor chunk its torch.save archive (twice the chunk's bytes, plus
// 16 MiB for the records around them), else (bytes items) 1 GiB. A corrupt
// or hostile stream cannot make a reader allocate without bound.
uint64_t MaxDecodedPayload(const CompactMetadata& md,
                           const CompactMetadata::Storage& s);

// The zstd level a compression name "zstd:N" gives (N in 1..19), 0 for ""
// (none); nullopt for anything else. The callers add their own spellings
// (SaveOptions takes a bare "zstd") and their own error message.
std::optional<int> ZstdLevelOfName(std::string_view compression);

// One zstd frame of `in` at `level` (libzstd's levels; 3 is its default),
// with the content size and a content checksum in the frame header.
absl::StatusOr<std::string> ZstdCompress(std::string_view in, int level);

// A WritableFile that compresses what is appended into one zstd frame (with
// a content checksum) appended to `out`: the daemon's writer streams a
// payload through it (SaveOptions.compression "zstd"; the item's
// storage_data then names kZstdDescriptor). Size() counts the bytes
// appended (uncompressed: what a torch.save archive's offsets are relative
// to); Close() ends the frame and leaves `out` open; Sync() is
// FAILED_PRECONDITION (sync `out`). `out` must outlive it.
class ZstdWritableFile final : public WritableFile {
 public:
  static absl::StatusOr<std::unique_ptr<ZstdWritableFile>> Create(
      WritableFile* out, int level);
  ~ZstdWritableFile() override;
  absl::Status Append(std::string_view data) override;
  absl::Status Sync() override;
  absl::Status Close() override;
  uint64_t Size() const override { return in_bytes_; }
  const std::string& path() const override { return out_->path(); }

 private:
  ZstdWritableFile(WritableFile* out, void* ctx);
  // Compresses `data` with `end_op` (ZSTD_EndDirective), writing the output.
  absl::Status Pump(std::string_view data, int end_op);

  WritableFile* const out_;
  void* ctx_;  // ZSTD_CCtx
  std::string buf_;
  uint64_t in_bytes_ = 0;
  bool closed_ = false;
};

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_TENSOR_PAYLOAD_TRANSFORM_H_
