// Copyright 2026 The ckptd Authors.
//
// Shared by the tests of the .metadata codec (format/metadata/metadata.h):
// the checked decode every one of them goes through (both decoders, which
// must agree), dcp-format.md §3.3's small example, and hand-built pickles:
// the example in CPython's NEWOBJ/BUILD shape (§3.2, §3.4 A) and a builder
// of constructor-form pickles whose parts a test replaces with odd shapes.
#ifndef CKPTD_TESTS_TESTING_METADATA_PICKLES_H_
#define CKPTD_TESTS_TESTING_METADATA_PICKLES_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/metadata/metadata.h"
#include "format/pickle/pickle.h"

namespace ckptd::testing {

// The modules of DCP's classes, as a pickle names them: the metadata
// dataclasses, the old sharded-tensor TensorProperties, _StorageInfo.
inline constexpr std::string_view kM = "torch.distributed.checkpoint.metadata";
inline constexpr std::string_view kShard =
    "torch.distributed._shard.sharded_tensor.metadata";
inline constexpr std::string_view kFs =
    "torch.distributed.checkpoint.filesystem";

// The message of `s`.
std::string Msg(const absl::Status& s);

// Expects `got` to equal `want` field by field (entries in order).
void ExpectSameMetadata(const format::Metadata& got,
                        const format::Metadata& want);

// Every decode of the codec's tests runs both decoders, the streaming one
// (DecodeMetadata: what callers get, returned) and the generic reference
// (DecodeMetadataGeneric), and checks that they agree: both succeed with the
// same Metadata, or both fail with the same code (unless one of them ran
// out of its allocation budget: they account memory differently); a
// pickle-level error names the same byte offset and opcode in both. Inputs
// over 64 MiB go through the streaming decoder only.
absl::StatusOr<format::Metadata> DecodeChecked(
    std::string_view data, const format::DecodeOptions& options = {});

// dcp-format.md §3.3: {"model": {"w": T[4,6] sharded on dim 0}, "step": 7},
// its storage entries in rank order (not chunk order).
format::Metadata SmallExample();

// The ways a CPython pickle of the §3.3 example may differ
// (PythonStyleExample).
struct PyVariant {
  int enum_form = 0;           // 0 by value, 1 builtins getattr, 2 __builtin__
  bool shard_props = false;    // _shard TensorProperties + MEM_FORMAT_ENCODING
  bool layout_global = false;  // GLOBAL torch strided instead of _get_layout
  bool pathlib_local = false;  // pathlib._local PosixPath
  bool modules = true;         // StorageMeta has 'modules' (2.7+)
  int transforms = 0;          // 0 absent, 1 None, 2 ['stream.zstd/1']
  bool bytes_build = false;    // BytesStorageMetadata + EMPTY_DICT BUILD
  bool version = true;
};

// Emits `module.name` the way CPython does for a dataclass instance:
// GLOBAL, EMPTY_TUPLE, NEWOBJ (the caller adds the state and BUILD).
void NewObj(pickle::Writer& w, std::string_view module, std::string_view name);

// Emits torch.Size(v).
void PySize(pickle::Writer& w, std::vector<int64_t> v);

// The §3.3 example as Python 2.4+ pickles it (protocol 2 opcodes).
std::string PythonStyleExample(const PyVariant& pv);

// A builder for small hand-made Metadata pickles in constructor form,
// Metadata(state_dict_metadata, planner_data, storage_data[, storage_meta]),
// whose parts tests replace with odd shapes. A null part is the standard
// one: "model.w" float16 [4] in two chunks, planner_data None, its two
// storage entries in file "f"; storage_meta is omitted.
struct Parts {
  std::function<void(pickle::Writer&)> sdm;
  std::function<void(pickle::Writer&)> planner;
  std::function<void(pickle::Writer&)> storage;
  std::function<void(pickle::Writer&)> storage_meta;  // null: omitted
};

// The pickle of `parts` through DecodeChecked, as "/x/.metadata".
absl::StatusOr<format::Metadata> DecodeParts(const Parts& parts);

// Expects DecodeParts(parts) to fail with INVALID_ARGUMENT, its message
// starting with the source name and containing `needle`.
void ExpectError(const Parts& parts, std::string_view needle);

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_METADATA_PICKLES_H_
