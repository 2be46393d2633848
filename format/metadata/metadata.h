// Copyright 2026 The ckptd Authors.
//
// The DCP `.metadata` object model (dcp-format.md §3) and its pickle
// encoding: written with the constructor (REDUCE) encoding of §3.4 B, read
// from every encoding stock PyTorch produces (§3.2, §3.6).
#ifndef CKPTD_FORMAT_METADATA_METADATA_H_
#define CKPTD_FORMAT_METADATA_METADATA_H_

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "format/tensor/dtype.h"

namespace ckptd::format {

// The extents of a box (its offsets or sizes): up to 2 held inline, as
// nearly every tensor has, so that a chunk record needs no heap block (a
// save of 2 million chunks makes 4 million fewer allocations). Converts to
// and from std::vector<int64_t> and compares equal to one.
class Dims : public absl::InlinedVector<int64_t, 2> {
 public:
  using Base = absl::InlinedVector<int64_t, 2>;
  using Base::Base;
  Dims() = default;
  Dims(const std::vector<int64_t>& v)  // NOLINT: implicit, like a vector
      : Base(v.begin(), v.end()) {}
  Dims& operator=(const std::vector<int64_t>& v) {
    assign(v.begin(), v.end());
    return *this;
  }
  Dims& operator=(std::initializer_list<int64_t> l) {  // d = {rows, cols}
    assign(l.begin(), l.end());
    return *this;
  }
  operator std::vector<int64_t>() const {  // NOLINT: implicit
    return std::vector<int64_t>(begin(), end());
  }
  friend bool operator==(const Dims& a, const Dims& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
  friend bool operator==(const Dims& a, const std::vector<int64_t>& b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
  }
};

// torch.distributed.checkpoint.metadata.ChunkStorageMetadata: a saved box.
struct ChunkStorageMetadata {
  Dims offsets;  // global offsets of the box
  Dims sizes;    // extent of the box
  friend bool operator==(const ChunkStorageMetadata& a,
                         const ChunkStorageMetadata& b) {
    return a.offsets == b.offsets && a.sizes == b.sizes;
  }
};

// TensorProperties: only dtype matters to loaders; the rest is kept for
// inspection.
struct TensorProperties {
  DType dtype = DType::kFloat32;
  bool requires_grad = false;
  bool pin_memory = false;
  // 0 contiguous, 1 channels_last, 2 preserve (the _MEM_FORMAT_ENCODING value)
  int memory_format = 0;
  bool operator==(const TensorProperties&) const = default;
};

struct TensorStorageMetadata {
  TensorProperties properties;
  std::vector<int64_t> size;  // global shape
  std::vector<ChunkStorageMetadata> chunks;
  bool operator==(const TensorStorageMetadata&) const = default;
};

struct BytesStorageMetadata {
  bool operator==(const BytesStorageMetadata&) const = default;
};

using StorageMetadata =
    std::variant<TensorStorageMetadata, BytesStorageMetadata>;

// Key of storage_data: MetadataIndex equality/hash is (fqn, offset); the
// index hint is not part of the key.
struct StorageKey {
  std::string fqn;
  bool has_offset = false;      // false for bytes items (offset None)
  std::vector<int64_t> offset;  // chunk offsets (empty for 0-d tensors)
  bool operator==(const StorageKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const StorageKey& k) {
    return H::combine(std::move(h), k.fqn, k.has_offset, k.offset);
  }
};

// filesystem._StorageInfo: where an item's bytes are.
struct StorageInfo {
  std::string relative_path;  // "__0_0.distcp"
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::string> transform_descriptors;  // empty: none
  bool operator==(const StorageInfo&) const = default;
};

struct StorageMeta {
  std::optional<std::string> checkpoint_id;  // pathlib objects become strings
  std::optional<std::string> save_id;
  std::optional<std::string> load_id;
  std::vector<std::string> modules;
  bool operator==(const StorageMeta&) const = default;
};

// One element of a planner_data path: a dict key or a list index.
using PathElement = std::variant<std::string, int64_t>;

// The commit marker of a checkpoint directory: present ⇔ complete.
inline constexpr char kMetadataName[] = ".metadata";

struct Metadata {
  // state_dict_metadata in insertion order (the order the writer produced).
  std::vector<std::pair<std::string, StorageMetadata>> state_dict_metadata;
  // planner_data as {fqn: path}; nullopt when the pickle held None or a shape
  // we do not understand (custom planners: tolerated, ignored).
  std::optional<std::vector<std::pair<std::string, std::vector<PathElement>>>>
      planner_data;
  // storage_data: every chunk and bytes item's location, in file order of the
  // pickle.
  std::vector<std::pair<StorageKey, StorageInfo>> storage_data;
  std::optional<StorageMeta> storage_meta;
  std::optional<std::string> version;

  // Lookup helpers with Python dict semantics (the last duplicate wins).
  // Without indexes they scan linearly; BuildIndex() builds hash indexes,
  // which DecodeMetadata already did. Call BuildIndex() again after modifying
  // the vectors.
  void BuildIndex();
  const StorageMetadata* Find(std::string_view fqn) const;
  const StorageInfo* FindStorage(const StorageKey& key) const;

 private:
  friend class MetadataDecoder;  // DecodeMetadata fills the indexes
  absl::flat_hash_map<std::string, size_t> sdm_index_;
  absl::flat_hash_map<StorageKey, size_t> storage_index_;
};

struct EncodeOptions {
  // Emit StorageMeta (str checkpoint_id, modules list) instead of None.
  bool write_storage_meta = false;
};

// Pickles `md` as protocol 2 using the constructor encoding (§3.4 B):
// Metadata(sdm, planner_data, storage_data[, storage_meta]),
// TensorProperties(dtype) (all five positional args, with torch.strided and
// torch.<memory_format> globals, only when requires_grad / pin_memory /
// memory_format are not the defaults), torch.Size via REDUCE,
// MetadataIndex(fqn, offset, index) with the index hint = the chunk's
// position (index None when no chunk matches), MetadataIndex(fqn) for bytes,
// _StorageInfo(path, offset, length[, transform_descriptors list]).
// planner_data nullopt is written as {fqn: (fqn,)}. With write_storage_meta:
// StorageMeta(checkpoint_id, save_id, load_id) + BUILD {'modules': [...]}
// (a 4th positional arg would break 2.4–2.6). A version is set by BUILD on
// the Metadata (not a positional parameter before 2.8).
//
// Faithful, not validating: inconsistent input (a key without a chunk,
// mismatched ranks) is written as given. Errors (INVALID_ARGUMENT): strings
// that are not UTF-8, a dtype or memory_format value out of range. Globals
// and strings are memoized: ~77 B per 2-d chunk (chunk + storage entry).
absl::StatusOr<std::string> EncodeMetadata(const Metadata& md,
                                           const EncodeOptions& options = {});

struct DecodeOptions {
  std::string source_name = ".metadata";  // for error messages
  uint64_t max_alloc_bytes = uint64_t{8} << 30;
};

// Unpickles a .metadata written by stock PyTorch 2.x (protocols 2–5,
// NEWOBJ+BUILD or REDUCE encodings, both the `checkpoint` and `_shard`
// TensorProperties, the memory-format enum by value or via getattr, pathlib
// in `pathlib` or `pathlib._local`) or by EncodeMetadata. Unknown globals in
// planner_data / storage_meta are tolerated (-> nullopt). storage_data must be
// FileSystemWriter's {MetadataIndex: _StorageInfo}; other StorageWriters are
// not supported. Duplicate dict keys (crafted pickles) keep the first
// position and the last value, like a Python dict. The result is indexed
// (BuildIndex() not needed). Errors are INVALID_ARGUMENT naming the source and
// a path into the object graph ("/c/.metadata: state_dict_metadata['w']
// .chunks[3].offsets: expected torch.Size, got ... (pickle offset 1234)",
// "storage_data entry 3 (key): ..."), or the pickle VM's INVALID_ARGUMENT /
// RESOURCE_EXHAUSTED naming the byte offset and opcode.
//
// This is the streaming decoder (metadata_decode.h: DecodeCompactMetadata,
// ~100 bytes per chunk while decoding) followed by
// CompactMetadata::ToMetadata; code that can use CompactMetadata should.
absl::StatusOr<Metadata> DecodeMetadata(std::string_view data,
                                        const DecodeOptions& options = {});

// The same over the generic pickle::Parse graph (pickle.h): ~5 KB per chunk
// while decoding (2M chunks need ~12 GB and a raised max_alloc_bytes). Kept
// as the reference the streaming decoder is checked against (tests, fuzzer).
absl::StatusOr<Metadata> DecodeMetadataGeneric(
    std::string_view data, const DecodeOptions& options = {});

// A key rendered for messages: "model.w@(0, 6)" for a chunk (its offsets;
// the key has no sizes), "model.w@()" for a 0-d tensor, "step" for bytes.
std::string DescribeKey(const StorageKey& key);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_METADATA_METADATA_H_
