// Copyright 2026 The ckptd Authors.
//
// The DCP `.metadata` codec (dcp-format.md §3).
//
// Encoder: protocol 2, constructor encoding (§3.4 B). Globals and strings
// (FQNs, file names) are memoized with BINPUT/BINGET, dicts and lists are
// written in batches of 1000 like CPython's pickler (keeps the reader's
// stack small). Opcodes go through Emitter, a cursor-based twin of
// pickle::Writer (same bytes; 2x faster at 2M chunks).
//
// Decoder: interprets the generic pickle::Parse graph schema-first: each
// class has a fixed decoder and no decoder recurses on the pickle's own
// structure, so the call depth is bounded by the schema (~8) whatever the
// pickle holds (cycles, deep nesting). Every error names the source and a
// path into the object graph.
#include "format/metadata.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string_view>
#include <utility>

#include "absl/base/attributes.h"
#include "absl/base/optimization.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/pickle.h"

namespace ckptd::format {
namespace {

using pickle::Value;
using Kind = pickle::Value::Kind;

constexpr std::string_view kMetadataModule =
    "torch.distributed.checkpoint.metadata";
constexpr std::string_view kShardModule =
    "torch.distributed._shard.sharded_tensor.metadata";
constexpr std::string_view kFilesystemModule =
    "torch.distributed.checkpoint.filesystem";

// CPython's pickler batch size for SETITEMS / APPENDS.
constexpr size_t kBatch = 1000;

// True if Python's unpickler accepts `s` as BINUNICODE payload (UTF-8 with
// 'surrogatepass', i.e. encoded surrogates allowed).
bool IsPickleUtf8(std::string_view s) {
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp;
    if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
      return false;  // overlong or out of range
    }
    i += len;
  }
  return true;
}

// ---------------------------------------------------------------------------
// Encoder
// ---------------------------------------------------------------------------

// The protocol-2 opcodes the encoder uses, byte for byte those of
// pickle::Writer, written through a cursor into a pre-sized string. (Writer
// appends byte by byte; at 2M chunks that alone costs more than the rest of
// the encoder.) Memo slots are the caller's (Put/Get).
class Emitter {
 public:
  // Appends to `out`; call Finish() to trim it to what was written.
  Emitter(std::string* out, size_t size_hint) : out_(out), pos_(out->size()) {
    out_->resize(pos_ + size_hint);
  }
  void Finish() { out_->resize(pos_); }

  void Proto(int version) { Op2('\x80', static_cast<uint8_t>(version)); }
  void Stop() { Op('.'); }
  void None() { Op('N'); }
  void Bool(bool v) { Op(v ? '\x88' : '\x89'); }
  void Mark() { Op('('); }
  void Tuple() { Op('t'); }
  void EmptyTuple() { Op(')'); }
  void Tuple1() { Op('\x85'); }
  void Tuple2() { Op('\x86'); }
  void Tuple3() { Op('\x87'); }
  void EmptyList() { Op(']'); }
  void Append() { Op('a'); }
  void Appends() { Op('e'); }
  void EmptyDict() { Op('}'); }
  void SetItem() { Op('s'); }
  void SetItems() { Op('u'); }
  void Reduce() { Op('R'); }
  void Build() { Op('b'); }

  // BININT1 / BININT2 / BININT / LONG1 (minimal two's complement).
  void Int(int64_t v) {
    if (v >= 0 && v <= 0xff) {
      Op2('K', static_cast<uint8_t>(v));
    } else if (v >= 0 && v <= 0xffff) {
      char* p = Room(3);
      p[0] = 'M';
      PutLE(p + 1, static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      char* p = Room(5);
      p[0] = 'J';
      PutLE(p + 1, static_cast<uint32_t>(static_cast<int32_t>(v)), 4);
    } else {
      const uint64_t u = static_cast<uint64_t>(v);
      int n = 8;
      while (n > 1) {
        const uint8_t top = (u >> (8 * (n - 1))) & 0xff;
        const uint8_t next_sign = (u >> (8 * (n - 2) + 7)) & 1;
        if ((top == 0x00 && next_sign == 0) ||
            (top == 0xff && next_sign == 1)) {
          --n;
        } else {
          break;
        }
      }
      char* p = Room(2 + n);
      p[0] = '\x8a';
      p[1] = static_cast<char>(n);
      PutLE(p + 2, u, n);
    }
  }

  // Non-negative ints up to 2^64-1 (LONG1 with a ninth, sign byte above
  // INT64_MAX).
  void UInt(uint64_t v) {
    if (v <= static_cast<uint64_t>(INT64_MAX)) {
      Int(static_cast<int64_t>(v));
      return;
    }
    char* p = Room(11);
    p[0] = '\x8a';
    p[1] = 9;
    PutLE(p + 2, v, 8);
    p[10] = 0;
  }

  // BINUNICODE. REQUIRES: utf8.size() < 2^32.
  void String(std::string_view utf8) {
    char* p = Room(5 + utf8.size());
    p[0] = 'X';
    PutLE(p + 1, utf8.size(), 4);
    std::memcpy(p + 5, utf8.data(), utf8.size());
  }

  void Global(std::string_view module, std::string_view name) {
    char* p = Room(3 + module.size() + name.size());
    *p++ = 'c';
    std::memcpy(p, module.data(), module.size());
    p += module.size();
    *p++ = '\n';
    std::memcpy(p, name.data(), name.size());
    p[name.size()] = '\n';
  }

  void Put(uint32_t index) {
    if (index <= 0xff) {
      Op2('q', static_cast<uint8_t>(index));
    } else {
      char* p = Room(5);
      p[0] = 'r';
      PutLE(p + 1, index, 4);
    }
  }
  void Get(uint32_t index) {
    if (index <= 0xff) {
      Op2('h', static_cast<uint8_t>(index));
    } else {
      char* p = Room(5);
      p[0] = 'j';
      PutLE(p + 1, index, 4);
    }
  }

  // EMPTY_TUPLE, TUPLE1..3, or MARK ... TUPLE.
  void IntTuple(absl::Span<const int64_t> values) {
    if (values.size() > 3) Mark();
    for (int64_t v : values) Int(v);
    switch (values.size()) {
      case 0:
        EmptyTuple();
        break;
      case 1:
        Tuple1();
        break;
      case 2:
        Tuple2();
        break;
      case 3:
        Tuple3();
        break;
      default:
        Tuple();
    }
  }

 private:
  static void PutLE(char* p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) p[i] = static_cast<char>(v >> (8 * i));
  }
  // Reserves n bytes at the cursor and advances past them.
  ABSL_ATTRIBUTE_ALWAYS_INLINE char* Room(size_t n) {
    if (ABSL_PREDICT_FALSE(pos_ + n > out_->size())) Grow(n);
    char* p = out_->data() + pos_;
    pos_ += n;
    return p;
  }
  ABSL_ATTRIBUTE_NOINLINE void Grow(size_t n) {
    out_->resize(std::max(out_->size() * 2, pos_ + n + 4096));
  }
  void Op(char op) { *Room(1) = op; }
  void Op2(char op, uint8_t arg) {
    char* p = Room(2);
    p[0] = op;
    p[1] = static_cast<char>(arg);
  }

  std::string* out_;
  size_t pos_;
};

// Globals the encoder emits; dtypes follow at kNumFixedGlobals + dtype.
enum GlobalId : int {
  kGMetadata,
  kGTensorStorageMetadata,
  kGChunkStorageMetadata,
  kGBytesStorageMetadata,
  kGTensorProperties,
  kGMetadataIndex,
  kGStorageInfo,
  kGStorageMeta,
  kGSize,
  kGStrided,
  kGContiguousFormat,  // + memory_format (0, 1, 2)
  kGChannelsLast,
  kGPreserveFormat,
  kNumFixedGlobals,
};
constexpr int kNumGlobals = kNumFixedGlobals + kNumDTypes;

constexpr std::array<std::pair<std::string_view, std::string_view>,
                     kNumFixedGlobals>
    kFixedGlobals = {{
        {kMetadataModule, "Metadata"},
        {kMetadataModule, "TensorStorageMetadata"},
        {kMetadataModule, "ChunkStorageMetadata"},
        {kMetadataModule, "BytesStorageMetadata"},
        {kMetadataModule, "TensorProperties"},
        {kMetadataModule, "MetadataIndex"},
        {kFilesystemModule, "_StorageInfo"},
        {kMetadataModule, "StorageMeta"},
        {"torch", "Size"},
        {"torch", "strided"},
        {"torch", "contiguous_format"},
        {"torch", "channels_last"},
        {"torch", "preserve_format"},
    }};

constexpr uint32_t kNoSlot = UINT32_MAX;

// Per-FQN state of the storage_data pass: the memo slot of the FQN string and
// the index hints (the chunk's position in its tensor's chunk list).
//
// Stock order is rank-major, i.e. it visits a tensor's chunks in order, so a
// per-tensor cursor answers almost every query. The cursor is checked
// against a 64-bit fingerprint of each chunk's offsets, kept in one array
// with each tensor's chunks adjacent: a rank-major pass then touches one
// cache line per tensor every 8 ranks instead of every chunk's heap data
// (3x faster at 2M chunks). A fingerprint collision could only yield a wrong
// hint, which loaders verify anyway (utils.find_state_dict_object). Misses
// fall back to an exact map built on first use.
class IndexHints {
 public:
  struct Entry {
    std::string_view fqn;
    const TensorStorageMetadata* tsm = nullptr;  // null for bytes items
    const uint64_t* fingerprints = nullptr;      // one per chunk
    Entry* successor = nullptr;  // the entry that followed this one last time
    uint32_t fqn_slot = kNoSlot;
    size_t next = 0;
    std::unique_ptr<absl::flat_hash_map<std::vector<int64_t>, size_t>>
        by_offset;
  };

  explicit IndexHints(const Metadata& md) {
    entries_.reserve(md.state_dict_metadata.size());
    size_t chunks = 0;
    for (const auto& [fqn, sm] : md.state_dict_metadata) {
      // Later duplicates win, as in the Python dict the loader builds.
      Entry& e = entries_[fqn];
      e.fqn = fqn;
      e.tsm = std::get_if<TensorStorageMetadata>(&sm);
      if (e.tsm != nullptr) chunks += e.tsm->chunks.size();
    }
    fingerprints_.resize(chunks);
    uint64_t* next = fingerprints_.data();
    for (const auto& [fqn, sm] : md.state_dict_metadata) {
      Entry& e = entries_[fqn];
      if (e.tsm == nullptr ||
          e.tsm != std::get_if<TensorStorageMetadata>(&sm)) {
        continue;  // bytes, or an overridden duplicate
      }
      e.fingerprints = next;
      for (const auto& c : e.tsm->chunks) *next++ = Fingerprint(c.offsets);
    }
  }

  static uint64_t Fingerprint(const std::vector<int64_t>& offsets) {
    return absl::Hash<std::vector<int64_t>>{}(offsets);
  }

  // The entry of a state_dict_metadata FQN, or nullptr. Stock storage_data
  // repeats the same FQN sequence for every rank, so the successor of the
  // previous entry is tried before hashing.
  Entry* Lookup(std::string_view fqn) {
    Entry* e = nullptr;
    if (prev_ != nullptr && prev_->successor != nullptr &&
        prev_->successor->fqn == fqn) {
      e = prev_->successor;
    } else {
      auto it = entries_.find(fqn);
      e = it == entries_.end() ? nullptr : &it->second;
      if (prev_ != nullptr) prev_->successor = e;
    }
    prev_ = e;
    return e;
  }

  // The hint for a chunk key of `e`, or -1 if no chunk has these offsets.
  static int64_t Find(Entry& e, const std::vector<int64_t>& offset) {
    if (e.tsm == nullptr) return -1;
    const auto& chunks = e.tsm->chunks;
    if (e.next < chunks.size() &&
        e.fingerprints[e.next] == Fingerprint(offset)) {
      return static_cast<int64_t>(e.next++);
    }
    if (e.by_offset == nullptr) {
      e.by_offset =
          std::make_unique<absl::flat_hash_map<std::vector<int64_t>, size_t>>();
      e.by_offset->reserve(chunks.size());
      for (size_t i = 0; i < chunks.size(); ++i) {
        e.by_offset->try_emplace(chunks[i].offsets, i);  // first one wins
      }
    }
    auto it = e.by_offset->find(offset);
    if (it == e.by_offset->end()) return -1;
    e.next = it->second + 1;
    return static_cast<int64_t>(it->second);
  }

 private:
  // Entries are never added after construction, so pointers stay valid.
  absl::flat_hash_map<std::string_view, Entry> entries_;
  std::vector<uint64_t> fingerprints_;
  Entry* prev_ = nullptr;
};

class Encoder {
 public:
  Encoder(std::string* out, size_t size_hint) : w_(out, size_hint) {
    slots_.fill(kNoSlot);
  }

  absl::Status Encode(const Metadata& md, const EncodeOptions& options);

 private:
  // A memoized GLOBAL.
  void Global(int id) {
    if (slots_[id] != kNoSlot) {
      w_.Get(slots_[id]);
      return;
    }
    if (id < kNumFixedGlobals) {
      w_.Global(kFixedGlobals[id].first, kFixedGlobals[id].second);
    } else {
      w_.Global("torch", DTypeName(static_cast<DType>(id - kNumFixedGlobals)));
    }
    slots_[id] = next_slot_;
    w_.Put(next_slot_++);
  }

  // A memoized string; returns its memo slot. `s` must outlive the encoder
  // (it points into the Metadata). `what` names it in the UTF-8 error.
  uint32_t Str(std::string_view s, std::string_view what) {
    auto [it, inserted] = strings_.try_emplace(s, next_slot_);
    if (!inserted) {
      w_.Get(it->second);
      return it->second;
    }
    CheckUtf8(s, what);
    w_.String(s);
    w_.Put(next_slot_);
    return next_slot_++;
  }

  // An unmemoized string (one-off values).
  void PlainStr(std::string_view s, std::string_view what) {
    CheckUtf8(s, what);
    w_.String(s);
  }

  void CheckUtf8(std::string_view s, std::string_view what) {
    if (status_.ok() && s.size() > UINT32_MAX) {
      status_ = absl::InvalidArgumentError(
          fmt::format("{} is longer than 4 GiB", what));
    }
    if (status_.ok() && !IsPickleUtf8(s)) {
      status_ = absl::InvalidArgumentError(
          fmt::format("{} is not valid UTF-8: {:?}", what, s.substr(0, 200)));
    }
  }

  void OptStr(const std::optional<std::string>& s, std::string_view what) {
    if (s.has_value()) {
      PlainStr(*s, what);
    } else {
      w_.None();
    }
  }

  void Size(absl::Span<const int64_t> v) {
    Global(kGSize);
    w_.IntTuple(v);
    w_.Tuple1();
    w_.Reduce();
  }

  // Emits `n` items into the dict/list on the stack top in CPython's batches.
  template <typename Fn>
  void Batched(size_t n, bool dict, Fn&& item) {
    for (size_t start = 0; start < n; start += kBatch) {
      const size_t k = std::min(kBatch, n - start);
      if (k > 1) w_.Mark();
      for (size_t i = start; i < start + k; ++i) item(i);
      if (k > 1) {
        dict ? w_.SetItems() : w_.Appends();
      } else {
        dict ? w_.SetItem() : w_.Append();
      }
    }
  }

  void StringList(const std::vector<std::string>& v, std::string_view what) {
    w_.EmptyList();
    Batched(v.size(), false, [&](size_t i) { PlainStr(v[i], what); });
  }

  void Properties(const TensorProperties& p);
  void Tensor(const TensorStorageMetadata& t);
  void PlannerData(const Metadata& md);
  void StorageData(const Metadata& md);
  void WriteStorageMeta(const StorageMeta& sm);

  Emitter w_;
  absl::Status status_;  // first input error (sticky)
  uint32_t next_slot_ = 0;
  std::array<uint32_t, kNumGlobals> slots_;
  absl::flat_hash_map<std::string_view, uint32_t> strings_;
};

void Encoder::Properties(const TensorProperties& p) {
  const int dtype = static_cast<int>(p.dtype);
  if (dtype < 0 || dtype >= kNumDTypes) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(
          fmt::format("TensorProperties: invalid dtype value {}", dtype));
    }
    return;
  }
  if (p.memory_format < 0 || p.memory_format > 2) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(fmt::format(
          "TensorProperties: memory_format {} is not 0 (contiguous), 1 "
          "(channels_last) or 2 (preserve)",
          p.memory_format));
    }
    return;
  }
  Global(kGTensorProperties);
  if (!p.requires_grad && !p.pin_memory && p.memory_format == 0) {
    // TensorProperties(dtype): the deprecated fields take their defaults.
    Global(kNumFixedGlobals + dtype);
    w_.Tuple1();
  } else {
    // TensorProperties(dtype, torch.strided, requires_grad,
    //                  torch.<memory_format>, pin_memory)
    w_.Mark();
    Global(kNumFixedGlobals + dtype);
    Global(kGStrided);
    w_.Bool(p.requires_grad);
    Global(kGContiguousFormat + p.memory_format);
    w_.Bool(p.pin_memory);
    w_.Tuple();
  }
  w_.Reduce();
}

void Encoder::Tensor(const TensorStorageMetadata& t) {
  // TensorStorageMetadata(properties, size, chunks)
  Global(kGTensorStorageMetadata);
  Properties(t.properties);
  Size(t.size);
  w_.EmptyList();
  Batched(t.chunks.size(), false, [&](size_t i) {
    // ChunkStorageMetadata(offsets, sizes)
    Global(kGChunkStorageMetadata);
    Size(t.chunks[i].offsets);
    Size(t.chunks[i].sizes);
    w_.Tuple2();
    w_.Reduce();
  });
  w_.Tuple3();
  w_.Reduce();
}

void Encoder::PlannerData(const Metadata& md) {
  w_.EmptyDict();
  if (!md.planner_data.has_value()) {
    // {fqn: (fqn,)}: what DefaultSavePlanner records for top-level keys.
    Batched(md.state_dict_metadata.size(), true, [&](size_t i) {
      const std::string& fqn = md.state_dict_metadata[i].first;
      Str(fqn, "state_dict_metadata key");
      Str(fqn, "state_dict_metadata key");
      w_.Tuple1();
    });
    return;
  }
  const auto& pd = *md.planner_data;
  Batched(pd.size(), true, [&](size_t i) {
    Str(pd[i].first, "planner_data key");
    const auto& path = pd[i].second;
    if (path.size() > 3) w_.Mark();
    for (const PathElement& e : path) {
      if (const auto* s = std::get_if<std::string>(&e)) {
        Str(*s, "planner_data path element");
      } else {
        w_.Int(std::get<int64_t>(e));
      }
    }
    switch (path.size()) {
      case 0:
        w_.EmptyTuple();
        break;
      case 1:
        w_.Tuple1();
        break;
      case 2:
        w_.Tuple2();
        break;
      case 3:
        w_.Tuple3();
        break;
      default:
        w_.Tuple();
    }
  });
}

void Encoder::StorageData(const Metadata& md) {
  IndexHints hints(md);
  // Stock order is rank-major: runs of entries share a file.
  std::string_view last_path;
  uint32_t last_path_slot = kNoSlot;
  w_.EmptyDict();
  Batched(md.storage_data.size(), true, [&](size_t i) {
    const auto& [key, info] = md.storage_data[i];
    // MetadataIndex(fqn[, offset[, index]])
    Global(kGMetadataIndex);
    IndexHints::Entry* e = hints.Lookup(key.fqn);
    if (e != nullptr && e->fqn_slot != kNoSlot) {
      w_.Get(e->fqn_slot);
    } else {
      const uint32_t slot = Str(key.fqn, "storage_data key fqn");
      if (e != nullptr) e->fqn_slot = slot;
    }
    if (!key.has_offset) {
      w_.Tuple1();
    } else {
      Size(key.offset);
      const int64_t hint = e ? IndexHints::Find(*e, key.offset) : -1;
      if (hint >= 0) {
        w_.Int(hint);
        w_.Tuple3();
      } else {
        w_.Tuple2();  // index=None: no chunk with these offsets
      }
    }
    w_.Reduce();
    // _StorageInfo(relative_path, offset, length[, transform_descriptors])
    Global(kGStorageInfo);
    const bool transforms = !info.transform_descriptors.empty();
    if (transforms) w_.Mark();
    if (last_path_slot != kNoSlot && info.relative_path == last_path) {
      w_.Get(last_path_slot);
    } else {
      last_path_slot = Str(info.relative_path, "storage_data relative_path");
      last_path = info.relative_path;
    }
    w_.UInt(info.offset);
    w_.UInt(info.length);
    if (transforms) {
      StringList(info.transform_descriptors, "transform descriptor");
      w_.Tuple();
    } else {
      w_.Tuple3();
    }
    w_.Reduce();
  });
}

void Encoder::WriteStorageMeta(const StorageMeta& sm) {
  // StorageMeta(checkpoint_id, save_id, load_id), then BUILD {'modules': [..]}:
  // `modules` only exists from 2.7 on, and a 4th positional argument would
  // make 2.4–2.6 loaders raise TypeError; BUILD just sets the attribute.
  Global(kGStorageMeta);
  OptStr(sm.checkpoint_id, "storage_meta.checkpoint_id");
  OptStr(sm.save_id, "storage_meta.save_id");
  OptStr(sm.load_id, "storage_meta.load_id");
  w_.Tuple3();
  w_.Reduce();
  w_.EmptyDict();
  w_.String("modules");
  StringList(sm.modules, "storage_meta.modules element");
  w_.SetItem();
  w_.Build();
}

absl::Status Encoder::Encode(const Metadata& md, const EncodeOptions& options) {
  w_.Proto(2);
  // Metadata(state_dict_metadata, planner_data, storage_data[, storage_meta])
  Global(kGMetadata);
  if (options.write_storage_meta) w_.Mark();
  w_.EmptyDict();
  Batched(md.state_dict_metadata.size(), true, [&](size_t i) {
    const auto& [fqn, sm] = md.state_dict_metadata[i];
    Str(fqn, "state_dict_metadata key");
    if (const auto* t = std::get_if<TensorStorageMetadata>(&sm)) {
      Tensor(*t);
    } else {
      Global(kGBytesStorageMetadata);
      w_.EmptyTuple();
      w_.Reduce();
    }
  });
  PlannerData(md);
  StorageData(md);
  if (options.write_storage_meta) {
    WriteStorageMeta(md.storage_meta.value_or(StorageMeta{}));
    w_.Tuple();
  } else {
    w_.Tuple3();
  }
  w_.Reduce();
  if (md.version.has_value()) {
    // `version` (2.8+) is not a positional parameter of older Metadata
    // classes; BUILD sets it on every version.
    w_.EmptyDict();
    w_.String("version");
    PlainStr(*md.version, "version");
    w_.SetItem();
    w_.Build();
  }
  w_.Stop();
  w_.Finish();
  return status_;
}

// ---------------------------------------------------------------------------
// Decoder
// ---------------------------------------------------------------------------

// A position in the object graph, for error messages. Built on the stack as
// the decoder descends; rendered only when an error is reported.
struct Path {
  enum class Type : uint8_t {
    kRoot,
    kField,     // .name
    kKey,       // ['text']
    kIndex,     // [index]
    kEntryKey,  // " entry N (key)"
    kStorage,   // [DescribeKey(*key)]
  };
  const Path* parent = nullptr;
  Type type = Type::kRoot;
  std::string_view text;
  int64_t index = 0;
  const StorageKey* key = nullptr;

  Path Field(std::string_view name) const {
    return Path{this, Type::kField, name, 0, nullptr};
  }
  Path Key(std::string_view k) const {
    return Path{this, Type::kKey, k, 0, nullptr};
  }
  Path Index(int64_t i) const {
    return Path{this, Type::kIndex, {}, i, nullptr};
  }
  Path EntryKey(int64_t i) const {
    return Path{this, Type::kEntryKey, {}, i, nullptr};
  }
  Path Storage(const StorageKey* k) const {
    return Path{this, Type::kStorage, {}, 0, k};
  }

  std::string Render() const {
    std::vector<const Path*> chain;
    for (const Path* p = this; p != nullptr; p = p->parent) chain.push_back(p);
    std::string out;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const Path& p = **it;
      switch (p.type) {
        case Type::kRoot:
          break;
        case Type::kField:
          if (!out.empty()) out += '.';
          out.append(p.text);
          break;
        case Type::kKey:
          out += fmt::format("['{}']", p.text.substr(0, 200));
          break;
        case Type::kIndex:
          out += fmt::format("[{}]", p.index);
          break;
        case Type::kEntryKey:
          out += fmt::format(" entry {} (key)", p.index);
          break;
        case Type::kStorage:
          out += '[';
          out += DescribeKey(*p.key);
          out += ']';
          break;
      }
    }
    return out;
  }
};

std::string Got(const Value& v) {
  return "got " + pickle::DebugString(v, 3, 200);
}

bool IsEnumClass(const Value& g) {
  return g.kind == Kind::kGlobal &&
         (g.module == kMetadataModule || g.module == kShardModule) &&
         (g.name == "_MEM_FORMAT_ENCODING" || g.name == "MEM_FORMAT_ENCODING");
}

bool IsPathClass(const Value& g) {
  if (g.kind != Kind::kGlobal) return false;
  if (g.module != "pathlib" && g.module != "pathlib._local") return false;
  return g.name == "PosixPath" || g.name == "PurePosixPath" ||
         g.name == "WindowsPath" || g.name == "PureWindowsPath" ||
         g.name == "Path" || g.name == "PurePath";
}

// The positional arguments of a REDUCE, or an empty list for NEWOBJ (whose
// arguments go to object.__new__, which dataclasses ignore).
const std::vector<const Value*>* CallArgs(const Value& obj) {
  static const std::vector<const Value*> kNone;
  if (obj.newobj || obj.args == nullptr || obj.args->kind != Kind::kTuple) {
    return &kNone;
  }
  return &obj.args->items;
}

class Decoder {
 public:
  explicit Decoder(const DecodeOptions& options) : options_(options) {}

  absl::Status Decode(const Value& root, Metadata* md);

  absl::flat_hash_map<std::string, size_t> sdm_index;
  absl::flat_hash_map<StorageKey, size_t> storage_index;

 private:
  absl::Status Error(const Path& p, std::string_view msg) const {
    const std::string where = p.Render();
    if (where.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("{}: {}", options_.source_name, msg));
    }
    return absl::InvalidArgumentError(
        fmt::format("{}: {}: {}", options_.source_name, where, msg));
  }

  // Collects the fields `names` (in positional order) of a DCP class
  // instance: positional REDUCE arguments first, then the BUILD state dict
  // (and slot-state dict) on top, as CPython would. Extra positional
  // arguments (fields of a future version) are ignored. If `tuple_state` is
  // given, a tuple BUILD state (a __setstate__ argument) is returned there
  // instead of being interpreted.
  absl::Status Fields(const Value& obj, std::string_view cls,
                      absl::Span<const std::string_view> names,
                      absl::Span<const Value*> out, const Path& p,
                      const Value** tuple_state = nullptr) const {
    std::fill(out.begin(), out.end(), nullptr);
    if (!obj.newobj && obj.args != nullptr && obj.args->kind != Kind::kTuple) {
      return Error(
          p, fmt::format("{}: constructor arguments are not a tuple, {}", cls,
                         Got(*obj.args)));
    }
    const auto& args = *CallArgs(obj);
    for (size_t i = 0; i < args.size() && i < names.size(); ++i) {
      out[i] = args[i];
    }
    const Value* state = obj.state;
    if (state == nullptr || state->is_none()) return absl::OkStatus();
    const Value* dicts[2] = {state, nullptr};
    if (state->kind == Kind::kTuple) {
      if (tuple_state != nullptr) {
        *tuple_state = state;
        return absl::OkStatus();
      }
      if (state->items.size() != 2) {
        return Error(p, fmt::format("{}: unsupported BUILD state, {}", cls,
                                    Got(*state)));
      }
      dicts[0] = state->items[0];
      dicts[1] = state->items[1];
    }
    for (const Value* d : dicts) {
      if (d == nullptr || d->is_none()) continue;
      if (d->kind != Kind::kDict) {
        return Error(
            p, fmt::format("{}: BUILD state is not a dict, {}", cls, Got(*d)));
      }
      for (const auto& [k, v] : d->entries) {
        if (k->kind != Kind::kString) continue;
        for (size_t i = 0; i < names.size(); ++i) {
          if (k->str == names[i]) {
            out[i] = v;
            break;
          }
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Required(const Value* v, std::string_view cls,
                        std::string_view field, const Path& p) const {
    if (v != nullptr) return absl::OkStatus();
    return Error(p, fmt::format("{} has no '{}'", cls, field));
  }

  absl::StatusOr<std::string> String(const Value& v, const Path& p) const {
    if (v.kind != Kind::kString) return Error(p, "expected str, " + Got(v));
    return v.str;
  }

  absl::StatusOr<int64_t> Int(const Value& v, const Path& p) const {
    if (v.kind == Kind::kInt) return v.i;
    if (v.kind == Kind::kBigInt) return Error(p, "int out of int64 range");
    return Error(p, "expected int, " + Got(v));
  }

  absl::StatusOr<uint64_t> UInt(const Value& v, const Path& p) const {
    if (v.kind == Kind::kInt) {
      if (v.i < 0) return Error(p, fmt::format("negative value {}", v.i));
      return static_cast<uint64_t>(v.i);
    }
    if (v.kind == Kind::kBigInt) {
      // Little-endian two's complement: non-negative and no set bit above
      // bit 63.
      const std::string& b = v.str;
      if (b.empty()) return uint64_t{0};
      if (static_cast<unsigned char>(b.back()) & 0x80) {
        return Error(p, "negative value");
      }
      for (size_t i = 8; i < b.size(); ++i) {
        if (b[i] != 0) return Error(p, "int out of uint64 range");
      }
      uint64_t u = 0;
      for (size_t i = 0; i < b.size() && i < 8; ++i) {
        u |= uint64_t{static_cast<unsigned char>(b[i])} << (8 * i);
      }
      return u;
    }
    return Error(p, "expected int, " + Got(v));
  }

  absl::StatusOr<bool> Bool(const Value& v, const Path& p) const {
    if (v.kind == Kind::kBool) return v.b;
    if (v.kind == Kind::kInt) return v.i != 0;
    if (v.kind == Kind::kNone) return false;
    return Error(p, "expected bool, " + Got(v));
  }

  // torch.Size(ints) via REDUCE, or a bare tuple/list of ints.
  absl::StatusOr<std::vector<int64_t>> Size(const Value& v,
                                            const Path& p) const {
    const Value* ints = &v;
    if (v.kind == Kind::kObject && v.IsCallTo("torch", "Size")) {
      const Value* args = v.args;
      if (args == nullptr || args->kind != Kind::kTuple ||
          args->items.size() > 1) {
        return Error(p, "torch.Size: expected one argument, " +
                            (args ? Got(*args) : std::string("none")));
      }
      if (args->items.empty()) return std::vector<int64_t>{};
      ints = args->items[0];
    }
    if (ints->kind != Kind::kTuple && ints->kind != Kind::kList) {
      return Error(p, "expected torch.Size, " + Got(v));
    }
    std::vector<int64_t> out;
    out.reserve(ints->items.size());
    for (size_t i = 0; i < ints->items.size(); ++i) {
      const Value& e = *ints->items[i];
      if (e.kind != Kind::kInt) {
        return Error(p, fmt::format("torch.Size element {}: expected int, {}",
                                    i, Got(e)));
      }
      out.push_back(e.i);
    }
    return out;
  }

  absl::StatusOr<DType> DTypeOf(const Value& v, const Path& p) const {
    if (v.kind != Kind::kGlobal || v.module != "torch") {
      return Error(p,
                   "expected a torch dtype (GLOBAL torch <name>), " + Got(v));
    }
    absl::StatusOr<DType> d = DTypeFromName(v.name);
    if (!d.ok()) return Error(p, std::string(d.status().message()));
    return d;
  }

  // _MEM_FORMAT_ENCODING(value), getattr(_MEM_FORMAT_ENCODING, 'NAME') (either
  // module, either enum name), or torch.<memory_format> (positional args).
  absl::StatusOr<int> MemoryFormat(const Value& v, const Path& p) const {
    if (v.kind == Kind::kGlobal && v.module == "torch") {
      if (v.name == "contiguous_format") return 0;
      if (v.name == "channels_last") return 1;
      if (v.name == "preserve_format") return 2;
    }
    if (v.kind == Kind::kObject && !v.newobj && v.callable != nullptr &&
        v.args != nullptr && v.args->kind == Kind::kTuple) {
      const Value& c = *v.callable;
      const auto& args = v.args->items;
      if (IsEnumClass(c) && args.size() == 1 && args[0]->kind == Kind::kInt &&
          args[0]->i >= 0 && args[0]->i <= 2) {
        return static_cast<int>(args[0]->i);
      }
      if (c.kind == Kind::kGlobal &&
          (c.module == "builtins" || c.module == "__builtin__") &&
          c.name == "getattr" && args.size() == 2 && IsEnumClass(*args[0]) &&
          args[1]->kind == Kind::kString) {
        const std::string& n = args[1]->str;
        if (n == "TORCH_CONTIGUOUS_FORMAT") return 0;
        if (n == "TORCH_CHANNELS_LAST") return 1;
        if (n == "TORCH_PRESERVE_FORMAT") return 2;
      }
    }
    return Error(
        p, "expected a memory format (_MEM_FORMAT_ENCODING member), " + Got(v));
  }

  absl::StatusOr<TensorProperties> Properties(const Value& v,
                                              const Path& p) const {
    if (v.kind != Kind::kObject ||
        !(v.IsCallTo(kMetadataModule, "TensorProperties") ||
          v.IsCallTo(kShardModule, "TensorProperties"))) {
      return Error(p, "expected TensorProperties, " + Got(v));
    }
    static constexpr std::array<std::string_view, 5> kNames = {
        "dtype", "layout", "requires_grad", "memory_format", "pin_memory"};
    std::array<const Value*, 5> f;
    const Value* tuple_state = nullptr;
    RETURN_IF_ERROR(Fields(v, "TensorProperties", kNames, absl::MakeSpan(f), p,
                           &tuple_state));
    if (tuple_state != nullptr) {
      // __setstate__((dtype, layout, requires_grad, mem_format_enc,
      // pin_memory))
      if (tuple_state->items.size() != 5) {
        return Error(p,
                     "TensorProperties state: expected (dtype, layout, "
                     "requires_grad, memory_format, pin_memory), " +
                         Got(*tuple_state));
      }
      for (size_t i = 0; i < 5; ++i) f[i] = tuple_state->items[i];
    }
    TensorProperties out;  // dtype default: torch.get_default_dtype()
    if (f[0] != nullptr) {
      ASSIGN_OR_RETURN(out.dtype, DTypeOf(*f[0], p.Field("dtype")));
    }
    // f[1] (layout) is deprecated and ignored by every loader.
    if (f[2] != nullptr) {
      ASSIGN_OR_RETURN(out.requires_grad,
                       Bool(*f[2], p.Field("requires_grad")));
    }
    if (f[3] != nullptr) {
      ASSIGN_OR_RETURN(out.memory_format,
                       MemoryFormat(*f[3], p.Field("memory_format")));
    }
    if (f[4] != nullptr) {
      ASSIGN_OR_RETURN(out.pin_memory, Bool(*f[4], p.Field("pin_memory")));
    }
    return out;
  }

  absl::StatusOr<ChunkStorageMetadata> Chunk(const Value& v,
                                             const Path& p) const {
    if (v.kind != Kind::kObject ||
        !v.IsCallTo(kMetadataModule, "ChunkStorageMetadata")) {
      return Error(p, "expected ChunkStorageMetadata, " + Got(v));
    }
    static constexpr std::array<std::string_view, 2> kNames = {"offsets",
                                                               "sizes"};
    std::array<const Value*, 2> f;
    RETURN_IF_ERROR(
        Fields(v, "ChunkStorageMetadata", kNames, absl::MakeSpan(f), p));
    RETURN_IF_ERROR(Required(f[0], "ChunkStorageMetadata", "offsets", p));
    RETURN_IF_ERROR(Required(f[1], "ChunkStorageMetadata", "sizes", p));
    ChunkStorageMetadata c;
    ASSIGN_OR_RETURN(c.offsets, Size(*f[0], p.Field("offsets")));
    ASSIGN_OR_RETURN(c.sizes, Size(*f[1], p.Field("sizes")));
    return c;
  }

  absl::StatusOr<StorageMetadata> Item(const Value& v, const Path& p) const {
    if (v.kind == Kind::kObject &&
        v.IsCallTo(kMetadataModule, "BytesStorageMetadata")) {
      // No fields; any BUILD state (none, {}) is irrelevant.
      return BytesStorageMetadata{};
    }
    if (v.kind != Kind::kObject ||
        !v.IsCallTo(kMetadataModule, "TensorStorageMetadata")) {
      return Error(
          p,
          "expected TensorStorageMetadata or BytesStorageMetadata, " + Got(v));
    }
    static constexpr std::array<std::string_view, 3> kNames = {
        "properties", "size", "chunks"};
    std::array<const Value*, 3> f;
    RETURN_IF_ERROR(
        Fields(v, "TensorStorageMetadata", kNames, absl::MakeSpan(f), p));
    for (size_t i = 0; i < 3; ++i) {
      RETURN_IF_ERROR(Required(f[i], "TensorStorageMetadata", kNames[i], p));
    }
    TensorStorageMetadata t;
    ASSIGN_OR_RETURN(t.properties, Properties(*f[0], p.Field("properties")));
    ASSIGN_OR_RETURN(t.size, Size(*f[1], p.Field("size")));
    const Path chunks_path = p.Field("chunks");
    const Value& chunks = *f[2];
    if (chunks.kind != Kind::kList && chunks.kind != Kind::kTuple) {
      return Error(chunks_path, "expected list, " + Got(chunks));
    }
    t.chunks.reserve(chunks.items.size());
    for (size_t i = 0; i < chunks.items.size(); ++i) {
      ASSIGN_OR_RETURN(ChunkStorageMetadata c,
                       Chunk(*chunks.items[i], chunks_path.Index(i)));
      t.chunks.push_back(std::move(c));
    }
    return StorageMetadata(std::move(t));
  }

  absl::StatusOr<StorageKey> Key(const Value& v, const Path& p) const {
    if (v.kind != Kind::kObject ||
        !v.IsCallTo(kMetadataModule, "MetadataIndex")) {
      return Error(p, "expected MetadataIndex, " + Got(v));
    }
    // __init__(fqn, offset=None, index=None); the BUILD dict is ordered
    // fqn, index, offset and has no offset for bytes items.
    static constexpr std::array<std::string_view, 3> kNames = {"fqn", "offset",
                                                               "index"};
    std::array<const Value*, 3> f;
    RETURN_IF_ERROR(Fields(v, "MetadataIndex", kNames, absl::MakeSpan(f), p));
    RETURN_IF_ERROR(Required(f[0], "MetadataIndex", "fqn", p));
    StorageKey key;
    ASSIGN_OR_RETURN(key.fqn, String(*f[0], p.Field("fqn")));
    if (f[1] != nullptr && !f[1]->is_none()) {
      key.has_offset = true;
      ASSIGN_OR_RETURN(key.offset, Size(*f[1], p.Field("offset")));
    }
    // f[2] (index) is a lookup hint only.
    return key;
  }

  absl::StatusOr<StorageInfo> Info(const Value& v, const Path& p) const {
    if (v.kind != Kind::kObject ||
        !v.IsCallTo(kFilesystemModule, "_StorageInfo")) {
      return Error(p, "expected filesystem._StorageInfo, " + Got(v));
    }
    static constexpr std::array<std::string_view, 4> kNames = {
        "relative_path", "offset", "length", "transform_descriptors"};
    std::array<const Value*, 4> f;
    RETURN_IF_ERROR(Fields(v, "_StorageInfo", kNames, absl::MakeSpan(f), p));
    for (size_t i = 0; i < 3; ++i) {
      RETURN_IF_ERROR(Required(f[i], "_StorageInfo", kNames[i], p));
    }
    StorageInfo info;
    ASSIGN_OR_RETURN(info.relative_path,
                     String(*f[0], p.Field("relative_path")));
    ASSIGN_OR_RETURN(info.offset, UInt(*f[1], p.Field("offset")));
    ASSIGN_OR_RETURN(info.length, UInt(*f[2], p.Field("length")));
    if (f[3] != nullptr && !f[3]->is_none()) {
      const Path tp = p.Field("transform_descriptors");
      if (f[3]->kind != Kind::kList && f[3]->kind != Kind::kTuple) {
        return Error(tp, "expected list of str or None, " + Got(*f[3]));
      }
      info.transform_descriptors.reserve(f[3]->items.size());
      for (size_t i = 0; i < f[3]->items.size(); ++i) {
        ASSIGN_OR_RETURN(std::string s, String(*f[3]->items[i], tp.Index(i)));
        info.transform_descriptors.push_back(std::move(s));
      }
    }
    return info;
  }

  // Tolerant: anything but a recognisable shape yields nullopt.
  static std::optional<std::string> PathLike(const Value& v) {
    if (v.kind == Kind::kString) return v.str;
    if (v.kind != Kind::kObject || v.callable == nullptr ||
        !IsPathClass(*v.callable) || v.args == nullptr ||
        v.args->kind != Kind::kTuple) {
      return std::nullopt;
    }
    // PurePath(*parts): join like os.path.join (an absolute part restarts).
    const char sep =
        v.callable->name.find("Windows") != std::string::npos ? '\\' : '/';
    std::string out;
    for (const Value* part : v.args->items) {
      if (part->kind != Kind::kString) return std::nullopt;
      const std::string& s = part->str;
      if (s.empty()) continue;
      if (s.front() == '/' || (sep == '\\' && s.size() >= 2 && s[1] == ':')) {
        out = s;
      } else if (out.empty() || out.back() == sep || out.back() == '/') {
        out += s;
      } else {
        out += sep;
        out += s;
      }
    }
    if (out.empty()) out = ".";
    return out;
  }

  static std::optional<std::string> OptString(const Value* v) {
    if (v != nullptr && v->kind == Kind::kString) return v->str;
    return std::nullopt;
  }

  std::optional<StorageMeta> StorageMetaOf(const Value& v) const {
    if (v.kind != Kind::kObject ||
        !v.IsCallTo(kMetadataModule, "StorageMeta")) {
      return std::nullopt;
    }
    static constexpr std::array<std::string_view, 4> kNames = {
        "checkpoint_id", "save_id", "load_id", "modules"};
    std::array<const Value*, 4> f;
    if (!Fields(v, "StorageMeta", kNames, absl::MakeSpan(f), Path{}).ok()) {
      return std::nullopt;
    }
    StorageMeta sm;
    if (f[0] != nullptr) sm.checkpoint_id = PathLike(*f[0]);
    sm.save_id = OptString(f[1]);
    sm.load_id = OptString(f[2]);
    // `modules` is absent in 2.4–2.6 files.
    if (f[3] != nullptr &&
        (f[3]->kind == Kind::kList || f[3]->kind == Kind::kTuple)) {
      for (const Value* m : f[3]->items) {
        if (m->kind == Kind::kString) sm.modules.push_back(m->str);
      }
    }
    return sm;
  }

  // {fqn: tuple/list of str|int}; anything else (custom planners) → nullopt.
  static std::optional<
      std::vector<std::pair<std::string, std::vector<PathElement>>>>
  PlannerData(const Value& v) {
    if (v.kind != Kind::kDict) return std::nullopt;
    std::vector<std::pair<std::string, std::vector<PathElement>>> out;
    out.reserve(v.entries.size());
    absl::flat_hash_map<std::string, size_t> seen;
    for (const auto& [k, val] : v.entries) {
      if (k->kind != Kind::kString) return std::nullopt;
      if (val->kind != Kind::kTuple && val->kind != Kind::kList) {
        return std::nullopt;
      }
      std::vector<PathElement> path;
      path.reserve(val->items.size());
      for (const Value* e : val->items) {
        if (e->kind == Kind::kString) {
          path.emplace_back(e->str);
        } else if (e->kind == Kind::kInt) {
          path.emplace_back(e->i);
        } else {
          return std::nullopt;
        }
      }
      auto [it, inserted] = seen.try_emplace(k->str, out.size());
      if (inserted) {
        out.emplace_back(k->str, std::move(path));
      } else {
        out[it->second].second = std::move(path);  // last value wins
      }
    }
    return out;
  }

  const DecodeOptions& options_;
};

absl::Status Decoder::Decode(const Value& root, Metadata* md) {
  const Path rp;
  if (root.kind != Kind::kObject ||
      !root.IsCallTo(kMetadataModule, "Metadata")) {
    return Error(rp,
                 "not a DCP .metadata: expected "
                 "torch.distributed.checkpoint.metadata.Metadata, " +
                     Got(root));
  }
  static constexpr std::array<std::string_view, 5> kNames = {
      "state_dict_metadata", "planner_data", "storage_data", "storage_meta",
      "version"};
  std::array<const Value*, 5> f;
  RETURN_IF_ERROR(Fields(root, "Metadata", kNames, absl::MakeSpan(f), rp));
  RETURN_IF_ERROR(Required(f[0], "Metadata", "state_dict_metadata", rp));

  // state_dict_metadata: {fqn: TensorStorageMetadata | BytesStorageMetadata}.
  {
    const Path p = rp.Field("state_dict_metadata");
    const Value& d = *f[0];
    if (d.kind != Kind::kDict) return Error(p, "expected dict, " + Got(d));
    md->state_dict_metadata.reserve(d.entries.size());
    sdm_index.reserve(d.entries.size());
    for (size_t i = 0; i < d.entries.size(); ++i) {
      const auto& [k, v] = d.entries[i];
      if (k->kind != Kind::kString) {
        return Error(p.EntryKey(i), "expected str, " + Got(*k));
      }
      ASSIGN_OR_RETURN(StorageMetadata item, Item(*v, p.Key(k->str)));
      auto [it, inserted] =
          sdm_index.try_emplace(k->str, md->state_dict_metadata.size());
      if (inserted) {
        md->state_dict_metadata.emplace_back(k->str, std::move(item));
      } else {
        // Duplicate key: the Python dict keeps the position, last value wins.
        md->state_dict_metadata[it->second].second = std::move(item);
      }
    }
  }

  if (f[1] != nullptr) md->planner_data = PlannerData(*f[1]);

  // storage_data: {MetadataIndex: _StorageInfo} (FileSystemWriter).
  {
    const Path p = rp.Field("storage_data");
    if (f[2] == nullptr || f[2]->kind != Kind::kDict) {
      return Error(
          p,
          "expected a dict {MetadataIndex: _StorageInfo} as "
          "FileSystemWriter writes it, " +
              (f[2] ? Got(*f[2]) : std::string("got nothing")) +
              "; checkpoints of other StorageWriters are not supported");
    }
    const Value& d = *f[2];
    md->storage_data.reserve(d.entries.size());
    storage_index.reserve(d.entries.size());
    for (size_t i = 0; i < d.entries.size(); ++i) {
      const auto& [k, v] = d.entries[i];
      ASSIGN_OR_RETURN(StorageKey key, Key(*k, p.EntryKey(i)));
      ASSIGN_OR_RETURN(StorageInfo info, Info(*v, p.Storage(&key)));
      auto [it, inserted] =
          storage_index.try_emplace(key, md->storage_data.size());
      if (inserted) {
        md->storage_data.emplace_back(std::move(key), std::move(info));
      } else {
        md->storage_data[it->second].second = std::move(info);
      }
    }
  }

  if (f[3] != nullptr) md->storage_meta = StorageMetaOf(*f[3]);

  if (f[4] != nullptr && !f[4]->is_none()) {
    ASSIGN_OR_RETURN(md->version, String(*f[4], rp.Field("version")));
  }
  return absl::OkStatus();
}

}  // namespace

// Fills Metadata's private indexes from the decoder's dedup maps.
class MetadataDecoder {
 public:
  static absl::StatusOr<Metadata> Decode(std::string_view data,
                                         const DecodeOptions& options) {
    pickle::ReaderOptions ropts;
    ropts.max_alloc_bytes = options.max_alloc_bytes;
    ropts.source_name = options.source_name;
    ASSIGN_OR_RETURN(std::unique_ptr<pickle::PickleDocument> doc,
                     pickle::Parse(data, ropts));
    Decoder decoder(options);
    Metadata md;
    RETURN_IF_ERROR(decoder.Decode(doc->root(), &md));
    md.sdm_index_ = std::move(decoder.sdm_index);
    md.storage_index_ = std::move(decoder.storage_index);
    return md;
  }
};

absl::StatusOr<std::string> EncodeMetadata(const Metadata& md,
                                           const EncodeOptions& options) {
  std::string out;
  size_t chunks = 0;
  for (const auto& [fqn, sm] : md.state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&sm)) {
      chunks += t->chunks.size();
    }
  }
  Encoder encoder(&out, 256 + 64 * md.state_dict_metadata.size() + 36 * chunks +
                            48 * md.storage_data.size());
  RETURN_IF_ERROR(encoder.Encode(md, options));
  return out;
}

absl::StatusOr<Metadata> DecodeMetadata(std::string_view data,
                                        const DecodeOptions& options) {
  return MetadataDecoder::Decode(data, options);
}

void Metadata::BuildIndex() {
  sdm_index_.clear();
  sdm_index_.reserve(state_dict_metadata.size());
  for (size_t i = 0; i < state_dict_metadata.size(); ++i) {
    sdm_index_[state_dict_metadata[i].first] = i;  // last duplicate wins
  }
  storage_index_.clear();
  storage_index_.reserve(storage_data.size());
  for (size_t i = 0; i < storage_data.size(); ++i) {
    storage_index_[storage_data[i].first] = i;
  }
}

const StorageMetadata* Metadata::Find(std::string_view fqn) const {
  if (!sdm_index_.empty()) {
    auto it = sdm_index_.find(absl::string_view(fqn.data(), fqn.size()));
    if (it == sdm_index_.end()) return nullptr;
    if (it->second < state_dict_metadata.size() &&
        state_dict_metadata[it->second].first == fqn) {
      return &state_dict_metadata[it->second].second;
    }
    // Stale index (modified after BuildIndex): fall through to the scan.
  }
  for (auto it = state_dict_metadata.rbegin(); it != state_dict_metadata.rend();
       ++it) {
    if (it->first == fqn) return &it->second;
  }
  return nullptr;
}

const StorageInfo* Metadata::FindStorage(const StorageKey& key) const {
  if (!storage_index_.empty()) {
    auto it = storage_index_.find(key);
    if (it == storage_index_.end()) return nullptr;
    if (it->second < storage_data.size() &&
        storage_data[it->second].first == key) {
      return &storage_data[it->second].second;
    }
  }
  for (auto it = storage_data.rbegin(); it != storage_data.rend(); ++it) {
    if (it->first == key) return &it->second;
  }
  return nullptr;
}

std::string DescribeKey(const StorageKey& key) {
  if (!key.has_offset) return key.fqn;
  return fmt::format("{}@({})", key.fqn, fmt::join(key.offset, ", "));
}

}  // namespace ckptd::format
