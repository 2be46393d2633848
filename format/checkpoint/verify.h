// Copyright 2026 The ckptd Authors.
//
// Full verification of a checkpoint directory: the .metadata decodes, every
// tensor's chunks are in bounds, disjoint and cover it, every item has a
// storage entry inside the directory and inside its file, every payload is a
// well-formed torch.save archive whose CRC-32s match, tensor payloads agree
// with .metadata on dtype and shape, and bytes items hold a parseable pickle
// that references only allowlisted globals (no code runs when it is loaded).
#ifndef CKPTD_FORMAT_CHECKPOINT_VERIFY_H_
#define CKPTD_FORMAT_CHECKPOINT_VERIFY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/env.h"

namespace ckptd::format {

struct VerifyOptions {
  Env* env = Env::Default();
  // Read every payload byte and check CRC-32s (off: structure only).
  bool check_crc = true;
  // Stop after this many problems.
  size_t max_problems = 100;
  // Bytes items whose pickle references a global outside the allowlist
  // (IsAllowedPickleGlobal) are problems; true: notes only.
  bool allow_unsafe_globals = false;
};

// The allowlist of globals a bytes item's pickle may reference: what
// ckptd.load's restricted unpickler admits (client/python/ckptd/
// _safe_pickle.py holds the Python twin; README "Security model"). torch
// 1.13's weights_only allowlist (OrderedDict, Parameter, Tensor, Size,
// _get_layout, legacy tensor/storage classes, the _rebuild_* functions),
// torch 2.x's tensor rebuilds, torch dtype/layout/memory-format/qscheme
// constants, builtins set/frozenset/complex/slice/range/bytes/bytearray/
// list/dict/tuple/int/float/str/bool, _codecs.encode, collections
// OrderedDict/defaultdict/Counter, numpy arrays, scalars, dtypes and RNG
// state constructors. Protocol-2 spellings (__builtin__) are mapped first.
bool IsAllowedPickleGlobal(std::string_view module, std::string_view name);

struct VerifyReport {
  // Each problem names the file, offset and item: "__1_0.distcp @ 4096:
  // model.w[2:4, 0:6]: CRC-32 of archive/data/0 is 0x1234abcd, the central
  // directory says 0x0badf00d".
  std::vector<std::string> problems;
  // Informational notes (unreferenced files, etc.).
  std::vector<std::string> notes;
  size_t tensors = 0;
  size_t chunks = 0;
  size_t bytes_items = 0;
  size_t files = 0;
  uint64_t payload_bytes = 0;  // bytes of all item payloads
  uint64_t crc_bytes = 0;      // bytes run through CRC-32
  // Bytes that payloads stored with a transform (zstd) decoded to.
  uint64_t decoded_bytes = 0;
  bool ok() const { return problems.empty(); }
};

// Returns a report (problems found are in the report, not the status). The
// status is an error only when verification itself could not run (the
// directory does not exist, .metadata cannot be read from disk).
absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& dir,
                                              const VerifyOptions& options = {});

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_CHECKPOINT_VERIFY_H_
