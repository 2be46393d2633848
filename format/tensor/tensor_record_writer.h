// Copyright 2026 The ckptd Authors.
//
// The one owner of the torch.save record layout (dcp-format.md §2.1). An
// archive's records, in torch's order:
//
//   data.pkl        the pickle (tensor storages as persistent ids)
//   byteorder       "little"
//   data/<key>      one record per storage, in the pickle's order
//   version         "3\n"
//
// TorchSaveStream writes an archive into a WritableFile record by record
// (the daemon's writer streams tensors from the staging pool; ckptctl
// convert streams whole state dicts); the builder functions lay one out in
// memory over the caller's bytes (tensor payloads, torch.save objects).
// Not thread-safe; one archive per object.
#ifndef CKPTD_FORMAT_TENSOR_TENSOR_RECORD_WRITER_H_
#define CKPTD_FORMAT_TENSOR_TENSOR_RECORD_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/env.h"
#include "format/zip/zip.h"

namespace ckptd::format {

class TorchSaveStream {
 public:
  // The archive starts at file->Size(); `file` must outlive this.
  explicit TorchSaveStream(WritableFile* file) : zip_(file) {}

  // data.pkl and byteorder.
  absl::Status Begin(std::string_view pickle);
  // Storage record data/<key> of exactly `size` bytes, appended in pieces.
  absl::Status BeginStorage(std::string_view key, uint64_t size);
  absl::Status Append(std::string_view data) { return zip_.Append(data); }
  absl::Status EndStorage() { return zip_.EndRecord(); }
  // version, then the central directory.
  absl::Status Finish();

 private:
  ZipStreamWriter zip_;
};

// In memory: data.pkl and byteorder; then the storages
// (AddTorchSaveStorage); then FinishTorchSaveRecords (version).
void BeginTorchSaveRecords(ZipArchiveBuilder* builder, std::string pickle);
// `pieces` must stay valid until the archive is written (ZipArchiveBuilder).
void AddTorchSaveStorage(ZipArchiveBuilder* builder, std::string_view key,
                         absl::Span<const std::string_view> pieces);
void FinishTorchSaveRecords(ZipArchiveBuilder* builder);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_TENSOR_TENSOR_RECORD_WRITER_H_
