// Copyright 2026 The ckptd Authors.
//
// Internal to the `.metadata` decoders: the pieces of the DCP schema walk
// that the generic decoder (metadata_generic_decode.cc, over pickle::Value)
// and the streaming one (metadata_schema.h, over the VM's values) share, so
// that both render paths, read big ints, join pathlib paths and recognise
// memory formats the same way.
#ifndef CKPTD_FORMAT_METADATA_SCHEMA_COMMON_H_
#define CKPTD_FORMAT_METADATA_SCHEMA_COMMON_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ckptd::format {

struct StorageKey;

// A position in the object graph, for error messages. Built on the stack as
// a decoder descends (each one points at its parent, which must outlive
// it); rendered only when an error is reported.
struct ObjectPath {
  enum class Type : uint8_t {
    kRoot,
    kField,     // .name
    kKey,       // ['text']
    kIndex,     // [index]
    kEntryKey,  // " entry N (key)"
    kText,      // [text] (a storage key the caller rendered)
    kStorage,   // [DescribeKey(*key)]
  };
  const ObjectPath* parent = nullptr;
  Type type = Type::kRoot;
  std::string_view text;
  int64_t index = 0;
  const StorageKey* key = nullptr;

  ObjectPath Field(std::string_view name) const {
    return {this, Type::kField, name, 0, nullptr};
  }
  ObjectPath Key(std::string_view k) const {
    return {this, Type::kKey, k, 0, nullptr};
  }
  ObjectPath Index(int64_t i) const {
    return {this, Type::kIndex, {}, i, nullptr};
  }
  ObjectPath EntryKey(int64_t i) const {
    return {this, Type::kEntryKey, {}, i, nullptr};
  }
  ObjectPath Bracket(std::string_view t) const {
    return {this, Type::kText, t, 0, nullptr};
  }
  ObjectPath Storage(const StorageKey* k) const {
    return {this, Type::kStorage, {}, 0, k};
  }

  // "state_dict_metadata['w'].chunks[3].offsets"; empty at the root.
  std::string Render() const;
};

// A pickled int too long for int64 (LONG1/LONG4: little-endian two's
// complement bytes) as a uint64; INVALID_ARGUMENT "negative value" or "int
// out of uint64 range" where it is not one.
absl::StatusOr<uint64_t> BigIntToUInt64(std::string_view bytes);

// True for the pathlib classes a storage_meta checkpoint_id may be pickled
// as (PosixPath, PurePosixPath, WindowsPath, PureWindowsPath, Path,
// PurePath; module `pathlib` or `pathlib._local`).
bool IsPathlibClass(std::string_view module, std::string_view name);

// PurePath(*parts) of a pathlib class as a string: parts joined like
// os.path.join (an absolute part restarts the path) with the class's
// separator; "." when nothing is left.
class PurePathJoiner {
 public:
  explicit PurePathJoiner(std::string_view class_name);
  void Add(std::string_view part);
  std::string Finish() &&;

 private:
  char sep_;
  std::string out_;
};

// True for _MEM_FORMAT_ENCODING (or MEM_FORMAT_ENCODING) of the metadata
// module or the older shard module.
bool IsMemoryFormatEnum(std::string_view module, std::string_view name);
// The memory-format code (0 contiguous, 1 channels_last, 2 preserve) of the
// global torch.<name>, or nullopt.
std::optional<int> MemoryFormatOfTorchGlobal(std::string_view name);
// The code of the _MEM_FORMAT_ENCODING member named `member`
// (getattr(_MEM_FORMAT_ENCODING, 'TORCH_CHANNELS_LAST')), or nullopt.
std::optional<int> MemoryFormatOfEnumMember(std::string_view member);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_METADATA_SCHEMA_COMMON_H_
