// Copyright 2026 The ckptd Authors.
//
// CompactMetadata: the DCP `.metadata` object model (dcp-format.md §3) in a
// form sized for millions of chunks: strings (fqns, file names) interned
// once, every shape, chunk box and storage key in one flat int64 array,
// storage entries in a flat array of fixed-size records, each chunk's
// storage entry resolved by index when the model is built, an fqn → item
// index, and chunk lookup by box through a per-tensor sweep index (built on
// first use) instead of a scan. About 80 bytes per 2-d chunk with its
// storage entry (format::Metadata: ~300 bytes and four heap blocks).
//
// Made by DecodeCompactMetadata (metadata_decode.h) from a pickle, or by
// FromMetadata from the plain model; ToMetadata gives the plain model back
// (the two agree field by field: tests/format/compact_metadata_test.cc).
//
// Semantics follow the Python dicts the model comes from: a duplicate fqn in
// state_dict_metadata or a duplicate key in storage_data keeps the first
// position and the last value. A storage entry "matches" a chunk when its
// key is (fqn, offsets) of that tensor's chunk (the first chunk with those
// offsets, if several share them), a bytes item when it is (fqn, None);
// entries that match nothing (orphans) are kept and listed but no item
// refers to them.
//
// Thread-safety: const methods may be called concurrently (the box index
// and the key index are built once, under absl::call_once).
#ifndef CKPTD_FORMAT_METADATA_COMPACT_METADATA_H_
#define CKPTD_FORMAT_METADATA_COMPACT_METADATA_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "format/metadata/metadata.h"

namespace ckptd::format {

// Interned strings with stable addresses (blocks never move), so views stay
// valid for the table's lifetime, also across moves of the table.
class StringTable {
 public:
  StringTable() = default;
  StringTable(StringTable&&) = default;
  StringTable& operator=(StringTable&&) = default;

  // The id of `s`, adding it if new.
  uint32_t Intern(std::string_view s);
  // The id of `s`, or nullopt.
  std::optional<uint32_t> Find(std::string_view s) const;
  std::string_view Get(uint32_t id) const { return views_[id]; }
  size_t size() const { return views_.size(); }
  // Bytes held (blocks, views, index), for allocation accounting.
  uint64_t MemoryBytes() const;

 private:
  static constexpr size_t kBlockBytes = 64 << 10;
  std::vector<std::unique_ptr<char[]>> blocks_;
  size_t block_used_ = kBlockBytes;
  uint64_t block_bytes_ = 0;
  std::vector<std::string_view> views_;
  absl::flat_hash_map<std::string_view, uint32_t> ids_;
};

class CompactMetadata {
 public:
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();

  // One state_dict_metadata entry (in the pickle's dict order).
  struct Item {
    uint32_t fqn = kNone;  // string id
    bool tensor = false;
    TensorProperties properties;  // tensors only
    uint32_t ndim = 0;            // rank of the global shape
    uint64_t shape_pos = 0;       // global shape at ints[shape_pos, +ndim)
    uint32_t num_chunks = 0;
    uint64_t first_chunk = 0;  // global index of chunk 0 (chunk_storage)
    // Every chunk has chunk_ndim offsets and as many sizes, chunk j's at
    // ints[chunk_pos + 2 * chunk_ndim * j]; kNone when the chunks' ranks
    // differ (then chunk j is irregular[chunk_pos + j]: its offsets and
    // sizes may differ in length too).
    uint32_t chunk_ndim = 0;
    uint64_t chunk_pos = 0;
    uint32_t bytes_storage = kNone;  // bytes items: their storage entry
  };

  // One storage_data entry (pickle order, duplicates merged).
  struct Storage {
    uint32_t fqn = kNone;         // key: string id of the fqn
    uint32_t path = kNone;        // string id of relative_path
    uint32_t transforms = kNone;  // index of its transform_descriptors list
    uint32_t key_ndim = 0;
    bool has_offset = false;  // key offset None (bytes) vs a torch.Size
    uint64_t key_pos = 0;     // key offsets at ints[key_pos, +key_ndim)
    uint64_t offset = 0;
    uint64_t length = 0;
    uint32_t item = kNone;   // the item the key names, kNone: an orphan
    uint32_t chunk = kNone;  // and its chunk (tensor items)
  };

  CompactMetadata();
  CompactMetadata(CompactMetadata&&) noexcept;
  CompactMetadata& operator=(CompactMetadata&&) noexcept;
  ~CompactMetadata();

  // The plain model and back.
  static CompactMetadata FromMetadata(const Metadata& md);
  Metadata ToMetadata() const;

  // --- items ---
  size_t num_items() const { return items_.size(); }
  const Item& item(size_t i) const { return items_[i]; }
  std::string_view fqn(size_t i) const { return strings_.Get(items_[i].fqn); }
  // Index of the item named `fqn`, or nullopt.
  std::optional<size_t> FindItem(std::string_view fqn) const;
  absl::Span<const int64_t> shape(size_t i) const {
    return {ints_.data() + items_[i].shape_pos, items_[i].ndim};
  }
  size_t num_tensors() const { return num_tensors_; }
  uint64_t num_chunks() const { return chunk_storage_.size(); }

  // --- chunks of tensor item i ---
  absl::Span<const int64_t> chunk_offsets(size_t i, size_t j) const;
  absl::Span<const int64_t> chunk_sizes(size_t i, size_t j) const;
  ChunkStorageMetadata chunk(size_t i, size_t j) const;  // a copy
  // The storage entry of chunk j, or nullptr (no entry in storage_data).
  const Storage* chunk_storage(size_t i, size_t j) const {
    const uint32_t s = chunk_storage_[items_[i].first_chunk + j];
    return s == kNone ? nullptr : &storage_[s];
  }
  const Storage* bytes_storage(size_t i) const {
    const uint32_t s = items_[i].bytes_storage;
    return s == kNone ? nullptr : &storage_[s];
  }
  // Appends to `out` the chunks of tensor item i whose box overlaps
  // [offsets, offsets + sizes) (same rank as the tensor; a 0-d tensor's
  // chunks always overlap), in ascending chunk order. O(log n + hits) for
  // shardings whose chunks are intervals along one dimension; grids cost
  // O(log n + chunks in the overlapping band).
  void OverlappingChunks(size_t i, absl::Span<const int64_t> offsets,
                         absl::Span<const int64_t> sizes,
                         std::vector<uint32_t>* out) const;

  // --- storage entries ---
  size_t num_storage() const { return storage_.size(); }
  const Storage& storage(size_t k) const { return storage_[k]; }
  absl::Span<const Storage> storage_entries() const { return storage_; }
  absl::Span<const int64_t> key_offsets(const Storage& s) const {
    return {ints_.data() + s.key_pos, s.key_ndim};
  }
  std::string_view relative_path(const Storage& s) const {
    return strings_.Get(s.path);
  }
  std::vector<std::string> transform_descriptors(const Storage& s) const;
  // "model.w@(0, 6)" / "step", as DescribeKey.
  std::string DescribeStorageKey(const Storage& s) const;
  StorageKey Key(const Storage& s) const;
  StorageInfo Info(const Storage& s) const;
  // The entry stored under `key` (Python dict lookup), or nullptr.
  const Storage* FindStorage(const StorageKey& key) const;

  // --- the rest ---
  const std::optional<
      std::vector<std::pair<std::string, std::vector<PathElement>>>>&
  planner_data() const {
    return planner_data_;
  }
  const std::optional<StorageMeta>& storage_meta() const {
    return storage_meta_;
  }
  const std::optional<std::string>& version() const { return version_; }
  std::string_view str(uint32_t id) const { return strings_.Get(id); }
  // Bytes held by the model (arrays and strings; indexes built later add
  // about 16 bytes per chunk of the tensors they cover).
  uint64_t MemoryBytes() const;

 private:
  friend class CompactMetadataBuilder;
  struct BoxIndex;

  // Chunk j of item i: where its offsets (then its sizes) are in ints_.
  struct ChunkLoc {
    uint64_t pos;
    uint32_t off_n;
    uint32_t size_n;
  };
  ChunkLoc ChunkAt(size_t i, size_t j) const {
    const Item& it = items_[i];
    if (it.chunk_ndim != kNone) {
      return {it.chunk_pos + uint64_t{2} * it.chunk_ndim * j, it.chunk_ndim,
              it.chunk_ndim};
    }
    return irregular_[it.chunk_pos + j];
  }
  const BoxIndex& IndexOf(size_t i) const;

  StringTable strings_;
  std::vector<Item> items_;
  std::vector<int64_t> ints_;
  std::vector<ChunkLoc> irregular_;
  std::vector<uint32_t> chunk_storage_;  // per global chunk
  std::vector<Storage> storage_;
  std::vector<std::vector<uint32_t>> transforms_;  // string ids
  std::vector<uint32_t> item_of_string_;  // string id → item (or kNone)
  size_t num_tensors_ = 0;
  std::optional<std::vector<std::pair<std::string, std::vector<PathElement>>>>
      planner_data_;
  std::optional<StorageMeta> storage_meta_;
  std::optional<std::string> version_;

  // Built on first use.
  struct Lazy;
  std::unique_ptr<Lazy> lazy_;
};

// Builds a CompactMetadata. Items and storage entries may be added in any
// order relative to each other; Finish() merges duplicates (first position,
// last value) and resolves each chunk's storage entry.
class CompactMetadataBuilder {
 public:
  CompactMetadataBuilder();

  // Reserves room for about `chunks` chunks and storage entries (address
  // space: pages are touched as the arrays fill), so the arrays do not grow
  // by copying. (Huge pages for them ran 0.87 or 1.45 s at random on the
  // build VM against a steady 0.95-1.0 s without: not used.)
  void Reserve(uint64_t chunks);

  uint32_t Intern(std::string_view s) { return md_.strings_.Intern(s); }
  const StringTable& strings() const { return md_.strings_; }

  // A tensor item: chunk boxes as [offsets..., sizes...] per chunk, each of
  // `chunk_ndim` entries (`ints` holds 2 * chunk_ndim * num_chunks values).
  void AddTensor(uint32_t fqn, const TensorProperties& properties,
                 absl::Span<const int64_t> shape, uint32_t chunk_ndim,
                 uint32_t num_chunks, absl::Span<const int64_t> ints);
  // A tensor item whose chunks' ranks differ.
  void AddIrregularTensor(uint32_t fqn, const TensorProperties& properties,
                          absl::Span<const int64_t> shape,
                          absl::Span<const ChunkStorageMetadata> chunks);
  void AddBytesItem(uint32_t fqn);
  // A storage_data entry; `hint` is MetadataIndex.index (the chunk's
  // position, used to match without hashing when right), or -1.
  void AddStorage(uint32_t fqn, bool has_offset,
                  absl::Span<const int64_t> key_offsets, uint32_t path,
                  uint64_t offset, uint64_t length,
                  const std::vector<uint32_t>* transforms, int64_t hint);

  void SetPlannerData(
      std::optional<
          std::vector<std::pair<std::string, std::vector<PathElement>>>>
          pd) {
    md_.planner_data_ = std::move(pd);
  }
  void SetStorageMeta(std::optional<StorageMeta> sm) {
    md_.storage_meta_ = std::move(sm);
  }
  void SetVersion(std::optional<std::string> v) { md_.version_ = std::move(v); }

  // The storage entries added so far (the decoder's typed storage dict).
  size_t num_storage() const { return md_.storage_.size(); }
  struct PendingStorage {
    uint32_t fqn;
    bool has_offset;
    absl::Span<const int64_t> key;
    uint32_t path;
    uint64_t offset, length;
    const std::vector<uint32_t>* transforms;  // nullptr: none
    int64_t hint;
  };
  PendingStorage pending_storage(size_t k) const;
  void ClearStorage();

  // Bytes held so far (allocation accounting of the decoder).
  uint64_t MemoryBytes() const;
  CompactMetadata Finish() &&;

 private:
  class Matcher;

  // The item of `fqn`, reset (a repeated fqn keeps its position).
  uint32_t StartItem(uint32_t fqn);
  // A tensor item with its properties and global shape (into ints_).
  CompactMetadata::Item& StartTensor(uint32_t fqn,
                                     const TensorProperties& properties,
                                     absl::Span<const int64_t> shape);
  void Match();

  CompactMetadata md_;
  std::vector<int64_t> key_ints_;  // storage key offsets until Finish()
  std::vector<int64_t> hints_;     // per storage entry
};

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_METADATA_COMPACT_METADATA_H_
