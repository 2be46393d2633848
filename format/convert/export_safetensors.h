// Copyright 2026 The ckptd Authors.
//
// A checkpoint's tensors as a Hugging Face safetensors model directory, the
// layout transformers' save_pretrained writes and from_pretrained /
// safetensors.safe_open read:
//
//   model.safetensors                          (everything fits one shard)
//   model-00001-of-0000N.safetensors ...       (more than one shard)
//   model.safetensors.index.json               {"metadata": {"total_size"},
//                                               "weight_map": {name: file}}
//
// Off the training job: tensors are read resharded into whole tensors by
// CheckpointReader (every read path's CRC rule applies) and streamed into
// the shards slab by slab, so memory is bounded by `block_bytes` (twice,
// when converting dtype), not by the checkpoint or a tensor. Each file is
// written to NAME.tmp, fsynced and renamed; the index comes last, then the
// directory is fsynced.
#ifndef CKPTD_FORMAT_CONVERT_EXPORT_SAFETENSORS_H_
#define CKPTD_FORMAT_CONVERT_EXPORT_SAFETENSORS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"
#include "format/tensor/dtype.h"

namespace ckptd::format {

struct SafetensorsExportOptions {
  Env* env = Env::Default();
  // Replace an earlier export in the output directory (its model*.safetensors
  // files and index are removed first); otherwise ALREADY_EXISTS.
  bool overwrite = false;
  // Largest shard (tensor bytes; a larger tensor gets a shard of its own).
  // transformers' default max_shard_size is "5GB".
  uint64_t max_shard_bytes = uint64_t{5'000'000'000};
  // Floating tensors (float64/32/16, bfloat16) are written in this dtype
  // (IsConvertibleFloat); other tensors keep theirs.
  std::optional<DType> dtype;
  // Only tensors whose fqn starts with one of these (empty: all) ...
  std::vector<std::string> only;
  // ... named without this prefix where they have it ("model.").
  std::string strip;
  // Tensor bytes are read in slabs of at most this many bytes.
  uint64_t block_bytes = uint64_t{64} << 20;
  // Check payload CRC-32s (CheckpointReader's rule).
  bool verify_crc = true;
};

struct SafetensorsExportStats {
  size_t tensors = 0;
  uint64_t tensor_bytes = 0;         // the index's total_size
  uint64_t bytes_written = 0;        // every file, headers and index included
  std::vector<std::string> files;    // shards, then the index (if any)
  std::vector<std::string> skipped;  // "fqn: why" (bytes items, complex)
};

// Exports checkpoint `dir` into directory `out` (created if missing).
// Errors: the reader's; INVALID_ARGUMENT for a --dtype that is not a
// floating dtype, names that collide or become empty after `strip`, or
// nothing left to export; ALREADY_EXISTS (see overwrite).
absl::StatusOr<SafetensorsExportStats> ExportSafetensors(
    const std::string& dir, const std::string& out,
    const SafetensorsExportOptions& options = {});

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_CONVERT_EXPORT_SAFETENSORS_H_
