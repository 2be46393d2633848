// Copyright 2026 The ckptd Authors.
//
// dcp_to_torch_save: one torch.save file holding the whole state dict of a
// checkpoint, nested as planner_data says (dcp-format.md §6). Tensors come
// out full-size with their saved dtype; bytes items are re-emitted as the
// objects they pickle (including ones ckptd cannot interpret, whose pickle
// program is carried over verbatim in structure). The output is streamed:
// memory use is bounded by the read block, not by the checkpoint size.
#ifndef CKPTD_FORMAT_CONVERT_CONVERT_H_
#define CKPTD_FORMAT_CONVERT_CONVERT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/env.h"

namespace ckptd::format {

struct ConvertOptions {
  Env* env = Env::Default();
  // Replace `out` if it exists.
  bool overwrite = false;
  // Tensor data is read and written in slabs of at most this many bytes.
  uint64_t block_bytes = uint64_t{64} << 20;
  // Check the CRC-32 of every record values are taken from (tensors: the
  // CheckpointReader rule; bytes items: every record of their archive).
  // A mismatch is DATA_LOSS naming file, item and offset, and no output is
  // left behind. Off: ckptctl convert --no-verify-crc.
  bool verify_crc = true;
  // A bytes item whose pickle references a global outside the allowlist of
  // README "Security model" (one a full unpickler could run) is refused
  // (INVALID_ARGUMENT naming item and global): the output would carry it to
  // whoever torch.loads it. True: convert it as it is
  // (ckptctl convert --allow-unsafe-globals).
  bool allow_unsafe_globals = false;
};

struct ConvertStats {
  size_t tensors = 0;
  size_t objects = 0;
  uint64_t bytes_written = 0;
};

// Writes `out` atomically (out.tmp → fsync → rename).
absl::StatusOr<ConvertStats> ConvertToTorchSave(
    const std::string& dir, const std::string& out,
    const ConvertOptions& options = {});

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_CONVERT_CONVERT_H_
