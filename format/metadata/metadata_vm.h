// Copyright 2026 The ckptd Authors.
//
// Internal to the streaming `.metadata` decoder (metadata_decode.h): the
// value model of its pickle VM, and the VM.
//
// The VM is run by the pickle machine pickle::Parse runs too
// (format/pickle/pickle_machine.h: opcodes, operands, MARKs, limits,
// errors), so it has the same semantics (every difference below is a
// representation, not a behaviour), but its values are 40-byte `Val`s
// instead of a graph of 216-byte pickle::Values, and DCP objects are folded
// into compact forms as soon as nothing can change them any more:
//
//  * Tuples of ints are one Val (up to 4 inline, longer ones in an int
//    pool); so are torch.Size objects, made at REDUCE/NEWOBJ time (their
//    meaning cannot change: the decoder ignores anything added to them).
//  * A value is "consumed" when an opcode moves it from the stack into
//    another value (TUPLE*, APPEND(S), SETITEM(S), REDUCE, BUILD, ...). A
//    consumed value can only be reached again through the memo or a DUP;
//    pass 1 (ScanMemoReferences) lists every memo index the program ever
//    GETs, and a value stored in such a slot or DUPed is flagged `shared`.
//    An unshared object is therefore immutable once consumed, and the
//    decoder folds it: ChunkStorageMetadata, TensorProperties,
//    TensorStorageMetadata, BytesStorageMetadata, MetadataIndex and
//    _StorageInfo become Vals (or records) holding exactly what the schema
//    walk would read from the object, and the nodes that made them are
//    recycled. A shared object stays a generic node and the schema walk at
//    the end reads it as the old decoder would.
//  * A list receiving only folded chunks of one rank keeps their boxes in
//    one flat int64 array (a "typed" list); the first dict receiving only
//    (MetadataIndex, _StorageInfo) pairs appends them straight to the
//    CompactMetadataBuilder (the "typed storage dict"). Anything else makes
//    such a container generic again (its entries become Vals).
//  * Only memo slots that pass 1 saw referenced are stored.
// The schema walk (Schema, metadata_decode.cc) reads folded and generic
// values alike, in the old decoder's order, with its error messages.
#ifndef CKPTD_FORMAT_METADATA_METADATA_VM_H_
#define CKPTD_FORMAT_METADATA_METADATA_VM_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "format/metadata/compact_metadata.h"
#include "format/pickle/pickle.h"
#include "format/pickle/pickle_machine.h"
#include "format/pickle/pickle_source.h"

namespace ckptd::format::mdvm {

enum class Tag : uint8_t {
  kNone,
  kBool,     // a
  kInt,      // w[0]
  kBigInt,   // a = blob (little-endian two's complement, minimal)
  kFloat,    // w[0] = bits
  kStr,      // a = string id (CompactMetadataBuilder's table)
  kBytes,    // a = blob
  kGlobal,   // a = global id
  kIntSeq,   // a tuple of ints: a = count; <= 4 inline in w, else w[0] = pool
  kIntSeq1,  // a 1-tuple holding a tuple of ints (torch.Size's arguments):
             // the inner tuple as kIntSeq
  kNode,     // w[0] = node id
  // Folded objects (immutable):
  kSize,     // torch.Size: as kIntSeq
  kChunk,    // ChunkStorageMetadata: a = ndim; <= 2: w = offsets, sizes;
             // else w[0] = pool (offsets then sizes)
  kProps,    // TensorProperties: a = dtype, w[0] = memory format, flags
  kTensor,   // TensorStorageMetadata: a = tensor record
  kBytesMd,  // BytesStorageMetadata
  kIndex,    // MetadataIndex: a = fqn string id, flags kHasOffset, offsets
             // as kIntSeq in (n = count <= 2: w[0..1]; n = 0xffff: w[0] =
             // pool, w[1] = count), w[3] = index hint (-1: none)
  kInfo,     // _StorageInfo: a = path string id, w[0] = offset, w[1] =
             // length, w[2] = transforms list (-1: none)
};

enum Flag : uint8_t {
  kShared = 1,  // reachable through the memo or a DUP: may still change
  kHasOffset = 2,
  kRequiresGrad = 4,
  kPinMemory = 8,
};

struct Val {
  Tag tag = Tag::kNone;
  uint8_t flags = 0;
  uint16_t n = 0;
  uint32_t a = 0;
  int64_t w[4] = {0, 0, 0, 0};

  bool shared() const { return flags & kShared; }
};
static_assert(sizeof(Val) == 40);

enum class NodeKind : uint8_t { kTuple, kList, kDict, kSet, kObject, kPersId };

struct Node {
  NodeKind kind = NodeKind::kList;
  bool newobj = false;  // objects: NEWOBJ/NEWOBJ_EX vs REDUCE/OBJ/INST
  bool has_state = false;
  bool has_kwargs = false;
  bool typed_chunks = false;   // list: boxes in chunk_ints, items empty
  bool typed_storage = false;  // dict: the typed storage dict
  uint64_t pos = 0;            // byte offset of the opcode that made it
  std::vector<Val> items;      // tuple/list/set items; object APPENDs
  std::vector<Val> entries;    // dict / object SETITEMs: k0, v0, k1, v1...
  Val callable, args, kwargs, state;  // objects; persid: args = the pid
  std::vector<int64_t> chunk_ints;    // typed list: [offsets, sizes] each
  uint32_t chunk_ndim = 0;
  uint32_t chunk_count = 0;
};

// A folded TensorStorageMetadata.
struct TensorRec {
  TensorProperties properties;
  std::vector<int64_t> shape;
  uint32_t chunk_ndim = 0;  // CompactMetadata::kNone: irregular
  uint32_t count = 0;
  std::vector<int64_t> ints;                    // regular chunks
  std::vector<ChunkStorageMetadata> irregular;  // or these
  bool moved = false;                           // handed to the builder
};

// The VM's stack: a vector of Vals without std::vector's per-push checks
// and out-of-line growth (pushes are half of all the work).
class ValStack {
 public:
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Val& operator[](size_t i) { return data_[i]; }
  const Val& operator[](size_t i) const { return data_[i]; }
  Val& back() { return data_[size_ - 1]; }
  Val* begin() { return data_.get(); }
  Val* end() { return data_.get() + size_; }
  void pop_back() { --size_; }
  // A new zeroed value on top.
  ABSL_ATTRIBUTE_ALWAYS_INLINE Val& emplace_back() {
    if (ABSL_PREDICT_FALSE(size_ == cap_)) Grow();
    Val& v = data_[size_++];
    v = Val{};
    return v;
  }
  ABSL_ATTRIBUTE_ALWAYS_INLINE void push_back(const Val& v) {
    if (ABSL_PREDICT_FALSE(size_ == cap_)) Grow();
    data_[size_++] = v;
  }
  // Shrinks (or grows with zeroed values) to n.
  void resize(size_t n) {
    while (cap_ < n) Grow();
    for (size_t i = size_; i < n; ++i) data_[i] = Val{};
    size_ = n;
  }
  // Inserts v at position pos (shifting the rest up).
  void insert(size_t pos, const Val& v) {
    push_back(v);
    for (size_t i = size_ - 1; i > pos; --i) data_[i] = data_[i - 1];
    data_[pos] = v;
  }

 private:
  void Grow() {
    const size_t cap = cap_ == 0 ? 1024 : 2 * cap_;
    std::unique_ptr<Val[]> d(new Val[cap]);
    std::copy(data_.get(), data_.get() + size_, d.get());
    data_ = std::move(d);
    cap_ = cap;
  }
  std::unique_ptr<Val[]> data_;
  size_t size_ = 0, cap_ = 0;
};

// The limits: pickle::ReaderOptions' with its defaults, but 8 GiB to
// allocate (DecodeOptions' default; the decoder sets it). The Vm is given
// its source name apart (source_name here is not read).
struct Limits : pickle::ReaderOptions {
  Limits() { max_alloc_bytes = uint64_t{8} << 30; }
};

// The input (pickle_source.h): all of it in memory, or a file read in
// blocks.
using Source = pickle::internal::Source;

// The memo indices a program reads back (GET, BINGET, LONG_BINGET), each
// with a dense slot number: a bitmap with rank counts for indices below a
// bound (the input's size: a program has fewer memo entries than bytes,
// though sparse indices are possible), a map above it.
// Bits set in x (SWAR: the baseline x86-64 target has no POPCNT).
inline uint32_t PopCount(uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ull);
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return static_cast<uint32_t>((x * 0x0101010101010101ull) >> 56);
}

class MemoRefs {
 public:
  explicit MemoRefs(uint64_t limit);
  ~MemoRefs();
  MemoRefs(MemoRefs&& o) noexcept;
  MemoRefs& operator=(MemoRefs&&) = delete;

  ABSL_ATTRIBUTE_ALWAYS_INLINE void Add(uint64_t index) {
    if (index < limit_) {
      bits_[index / 64] |= uint64_t{1} << (index % 64);
      if (index >= end_) end_ = index + 1;
    } else {
      big_.try_emplace(index, 0);
    }
  }
  // After the last Add: numbers the indices.
  void Finish();
  // The dense slot of `index`, or -1 when no GET refers to it.
  ABSL_ATTRIBUTE_ALWAYS_INLINE int64_t Slot(uint64_t index) const {
    if (index < end_) {
      const uint64_t word = bits_[index / 64];
      const uint64_t bit = uint64_t{1} << (index % 64);
      if (!(word & bit)) return -1;
      return rank_[index / 64] + PopCount(word & (bit - 1));
    }
    if (index < limit_ || big_.empty()) return -1;
    auto it = big_.find(index);
    return it == big_.end() ? -1 : static_cast<int64_t>(it->second);
  }
  // Whether some GET refers to an index in [begin, end).
  bool AnyIn(uint64_t begin, uint64_t end) const {
    if (end > limit_ && !big_.empty()) return true;  // rare: be safe
    end = std::min(end, end_);
    for (uint64_t i = begin; i < end;) {
      const uint64_t word = bits_[i / 64] >> (i % 64);
      const uint64_t n = std::min<uint64_t>(64 - i % 64, end - i);
      if (n < 64 ? (word & ((uint64_t{1} << n) - 1)) != 0 : word != 0) {
        return true;
      }
      i += n;
    }
    return false;
  }
  // The same for GETs (random indices): a small open-addressing table of
  // the referenced indices stays in cache where the bitmap and its ranks
  // (megabytes for a large program) would not.
  ABSL_ATTRIBUTE_ALWAYS_INLINE int64_t SlotForGet(uint64_t index) const {
    for (size_t h = Hash(index);; h = (h + 1) & mask_) {
      const Entry& e = table_[h];
      if (e.index == index) return e.slot;
      if (e.index == kEmpty) return -1;
    }
  }
  size_t size() const { return size_; }
  // Bytes held: the bitmap's pages up to the largest index, the ranks,
  // the map and the table.
  uint64_t MemoryBytes() const {
    return end_ / 8 + 4 * rank_.size() + 24 * big_.size() + 16 * table_.size();
  }

 private:
  // The bitmap: limit_ bits of address space, zero pages until written
  // (GET targets are few and mostly low; most of it is never touched).
  uint64_t* bits_ = nullptr;
  size_t map_bytes_ = 0;
  uint64_t limit_ = 0;
  uint64_t end_ = 0;  // 1 + the largest index in the bitmap
  std::vector<uint32_t> rank_;
  absl::flat_hash_map<uint64_t, uint32_t> big_;
  size_t size_ = 0;
  struct Entry {
    uint64_t index;
    int64_t slot;
  };
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  size_t Hash(uint64_t i) const {
    return static_cast<size_t>((i * 0x9e3779b97f4a7c15ull) >> 32) & mask_;
  }
  std::vector<Entry> table_;
  size_t mask_ = 0;
};

// Pass 1: every memo index a GET/BINGET/LONG_BINGET of the program (up to
// STOP or the first malformed opcode, which pass 2 reports) refers to.
MemoRefs ScanMemoReferences(Source& src);

class Schema;

// Pass 2.
class Vm {
 public:
  Vm(Source& src, const Limits& limits, std::string source_name,
     CompactMetadataBuilder* builder, MemoRefs referenced);
  ~Vm();

  // Runs to STOP; then root() is the pickled value.
  absl::Status Run();
  const Val& root() const { return root_; }
  uint64_t allocated() const { return allocated_; }
  uint64_t memo_count() const { return machine_.memo_count; }
  uint64_t fast_objects() const { return fast_objects_; }
  uint64_t fast_sizes() const { return fast_sizes_; }

  // --- the heap, for Schema ---
  Node& node(const Val& v) { return nodes_[v.w[0]]; }
  const Node& node(const Val& v) const { return nodes_[v.w[0]]; }
  std::string_view str(const Val& v) const;
  const std::string& blob(const Val& v) const { return blobs_[v.a]; }
  std::pair<std::string_view, std::string_view> global(uint32_t id) const;
  // Which DCP class a global names (KnownClass), or kOther.
  int global_class(uint32_t id) const { return global_class_[id]; }
  // Ints of a kIntSeq / kSize.
  absl::Span<const int64_t> ints(const Val& v) const;
  // Offsets of a kIndex.
  absl::Span<const int64_t> index_offsets(const Val& v) const;
  absl::Span<const int64_t> chunk_ints(const Val& v) const;  // kChunk
  TensorRec& tensor(const Val& v) { return tensors_[v.a]; }
  const std::vector<uint32_t>& transforms(int64_t id) const {
    return transforms_[id];
  }
  CompactMetadataBuilder& builder() { return *builder_; }
  const std::string& source_name() const { return machine_.source_name; }
  // The node that is the typed storage dict (its entries are the builder's
  // storage entries), or -1.
  int64_t typed_storage_node() const { return typed_storage_node_; }

  // Makes a typed container generic (its items/entries become Vals).
  void Untype(Node& n, uint64_t id);

  // --- allocation, for Schema's folds ---
  uint64_t NewNodeId(NodeKind kind);
  void FreeNode(uint64_t id);
  uint32_t NewTensor(TensorRec rec);
  int64_t NewTransforms(std::vector<uint32_t> ids);
  // A kIntSeq-like Val (tag given) holding `v`.
  Val MakeInts(Tag tag, absl::Span<const int64_t> v);
  void FillInts(Val* out, Tag tag, absl::Span<const int64_t> v);
  Val MakeChunk(absl::Span<const int64_t> offsets,
                absl::Span<const int64_t> sizes);
  Val MakeIndex(uint32_t fqn, bool has_offset,
                absl::Span<const int64_t> offsets, int64_t hint);
  void ReleaseInts(const Val& v);  // pool space, if at the top
  bool Charge(uint64_t bytes);     // false: over the limit (error set)

 private:
  friend class Schema;
  class Ops;

  Source& src_;
  // The pickle machine's state: MARKs, memo count, the current opcode,
  // the first error (Charge's too).
  pickle::internal::MachineState machine_;
  const uint64_t max_alloc_bytes_;
  CompactMetadataBuilder* builder_;
  std::unique_ptr<Schema> schema_;
  MemoRefs referenced_;

  std::vector<Node> nodes_;
  std::vector<uint64_t> free_nodes_;
  std::vector<int64_t> pool_;
  std::vector<std::string> blobs_;
  std::vector<std::pair<uint32_t, uint32_t>> globals_;  // (module, name)
  std::vector<int> global_class_;
  absl::flat_hash_map<std::pair<uint32_t, uint32_t>, uint32_t> global_ids_;
  std::vector<TensorRec> tensors_;
  std::vector<std::vector<uint32_t>> transforms_;
  int64_t typed_storage_node_ = -1;

  ValStack stack_;
  std::vector<Val> memo_;          // by MemoRefs slot: referenced ones only
  std::vector<uint8_t> memo_set_;  // slot holds a value
  // Slots in use (for MEMOIZE's index): dense bits + sparse set.
  // While only MEMOIZE stored into the memo, the slots in use are exactly
  // [0, machine_.memo_count) and none of the bits below are kept.
  bool only_memoize_ = true;
  std::vector<uint64_t> used_bits_;
  absl::flat_hash_set<uint64_t> used_sparse_;
  uint64_t allocated_ = 0;
  uint64_t fast_objects_ = 0, fast_sizes_ = 0;
  Val root_;
};

// DCP classes the folds recognise (Vm::global_class).
enum KnownClass : int {
  kOther = 0,
  kClsMetadata,
  kClsChunk,
  kClsTensorStorage,
  kClsBytesStorage,
  kClsProperties,       // checkpoint.metadata.TensorProperties
  kClsShardProperties,  // _shard...metadata.TensorProperties
  kClsIndex,
  kClsStorageInfo,
  kClsStorageMeta,
  kClsSize,  // torch.Size
};

}  // namespace ckptd::format::mdvm

#endif  // CKPTD_FORMAT_METADATA_METADATA_VM_H_
