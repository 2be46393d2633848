// Copyright 2026 The ckptd Authors.
//
// The `.metadata` encoder (dcp-format.md §3.4 B): protocol 2, constructor
// encoding. Globals and strings (FQNs, file names) are memoized with
// BINPUT/BINGET, dicts and lists are written in batches of 1000 like
// CPython's pickler (keeps the reader's stack small). Opcodes go through
// Emitter, a cursor-based twin of pickle::Writer (same bytes; 2x faster at
// 2M chunks).
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
#include "format/metadata/dcp_modules.h"
#include "format/metadata/metadata.h"
#include "format/pickle/pickle.h"

namespace ckptd::format {
namespace {

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
  // Appends to `out`; call Finish() to trim it to what was written. The
  // string's capacity is reserved up front, but its size (which zero-fills)
  // grows in steps just ahead of the cursor: each step's bytes are written
  // while the zeroing left them in cache, and fresh pages are touched once.
  Emitter(std::string* out, size_t size_hint) : out_(out), pos_(out->size()) {
    out_->reserve(pos_ + size_hint);
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
    constexpr size_t kStep = size_t{256} << 10;
    size_t want = std::max(out_->size() + kStep, pos_ + n);
    if (want > out_->capacity()) {
      want = std::max(out_->capacity() * 2, pos_ + n + kStep);
    }
    out_->resize(want);
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

  static uint64_t Fingerprint(absl::Span<const int64_t> offsets) {
    uint64_t h = 0x2545f4914f6cdd1dull ^ offsets.size();
    for (int64_t v : offsets) {
      h = (h ^ static_cast<uint64_t>(v)) * 0x9e3779b97f4a7c15ull;
      h ^= h >> 29;
    }
    return h;
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
        e.by_offset->try_emplace(std::vector<int64_t>(chunks[i].offsets.begin(),
                                                      chunks[i].offsets.end()),
                                 i);  // first one wins
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

}  // namespace

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

}  // namespace ckptd::format
