// Copyright 2026 The ckptd Authors.
//
// torch_save_to_dcp: a torch.save file (a state dict) as a DCP checkpoint
// that stock dcp.load reads, flattened the way DCP's default planner
// flattens a state dict (torch.distributed.checkpoint._traverse):
//
//   * dicts (and OrderedDicts) are descended, their keys become str path
//     elements ("optim", "state", "0");
//   * a list is descended (int path elements) when it holds a tensor, a
//     dict, or a list that is itself descended; otherwise it is one value;
//   * tensors (and nn.Parameters) become one-chunk tensor items;
//   * every other value becomes a bytes item: the value re-encoded as a
//     torch.save archive of plain Python values (what ckptd.load and stock
//     DCP both read). Values ckptd cannot re-encode (instances of arbitrary
//     classes) are INVALID_ARGUMENT naming their fqn: nothing in the input
//     is ever executed.
//
// The fqn is the path joined with "." and planner_data holds the path, as
// dcp.save writes them. Tensor bytes are not loaded: the file is mapped and
// the writer streams each tensor from the page cache into the checkpoint,
// which is committed with the durability protocol (.metadata last).
#ifndef CKPTD_FORMAT_CONVERT_IMPORT_TORCH_SAVE_H_
#define CKPTD_FORMAT_CONVERT_IMPORT_TORCH_SAVE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/env.h"

namespace ckptd::format {

struct ImportOptions {
  Env* env = Env::Default();
  // Replace a committed checkpoint in `dir`; otherwise FAILED_PRECONDITION.
  bool overwrite = false;
  // Check the CRC-32 of every record read from the input.
  bool verify_crc = true;
  // fsync (off only in tests).
  bool sync = true;
  // data.pkl larger than this is refused.
  uint64_t max_pickle_bytes = uint64_t{1} << 30;
};

struct ImportStats {
  size_t tensors = 0;
  size_t objects = 0;
  uint64_t tensor_bytes = 0;
  uint64_t bytes_written = 0;  // data files and .metadata
};

// Errors: NOT_FOUND (no file), INVALID_ARGUMENT (not a torch.save archive,
// not a dict at the top, a value that cannot be re-encoded, a big-endian
// file), DATA_LOSS (a CRC mismatch), FAILED_PRECONDITION (see overwrite),
// and the writer's.
absl::StatusOr<ImportStats> ImportTorchSave(const std::string& file,
                                            const std::string& dir,
                                            const ImportOptions& options = {});

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_CONVERT_IMPORT_TORCH_SAVE_H_
