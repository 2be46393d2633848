// Copyright 2026 The ckptd Authors.
//
// The generic `.metadata` decoder (DecodeMetadataGeneric): interprets the
// pickle::Parse graph schema-first: each class has a fixed decoder and no
// decoder recurses on the pickle's own structure, so the call depth is
// bounded by the schema (~8) whatever the pickle holds (cycles, deep
// nesting). Every error names the source and a path into the object graph.
// DecodeMetadata uses the streaming decoder (metadata_decode.h) instead;
// this one is kept as its reference: tests and the fuzzer check that both
// agree.
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
#include "format/metadata/schema_common.h"
#include "format/pickle/pickle.h"

namespace ckptd::format {
namespace {

using pickle::Value;
using Kind = pickle::Value::Kind;

// ---------------------------------------------------------------------------
// Decoder
// ---------------------------------------------------------------------------

std::string Got(const Value& v) {
  return "got " + pickle::DebugString(v, 3, 200);
}

bool IsEnumClass(const Value& g) {
  return g.kind == Kind::kGlobal && IsMemoryFormatEnum(g.module, g.name);
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
  absl::Status Error(const ObjectPath& p, std::string_view msg) const {
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
                      absl::Span<const Value*> out, const ObjectPath& p,
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
                        std::string_view field, const ObjectPath& p) const {
    if (v != nullptr) return absl::OkStatus();
    return Error(p, fmt::format("{} has no '{}'", cls, field));
  }

  absl::StatusOr<std::string> String(const Value& v,
                                     const ObjectPath& p) const {
    if (v.kind != Kind::kString) return Error(p, "expected str, " + Got(v));
    return v.str;
  }

  absl::StatusOr<int64_t> Int(const Value& v, const ObjectPath& p) const {
    if (v.kind == Kind::kInt) return v.i;
    if (v.kind == Kind::kBigInt) return Error(p, "int out of int64 range");
    return Error(p, "expected int, " + Got(v));
  }

  absl::StatusOr<uint64_t> UInt(const Value& v, const ObjectPath& p) const {
    if (v.kind == Kind::kInt) {
      if (v.i < 0) return Error(p, fmt::format("negative value {}", v.i));
      return static_cast<uint64_t>(v.i);
    }
    if (v.kind == Kind::kBigInt) {
      absl::StatusOr<uint64_t> u = BigIntToUInt64(v.str);
      if (!u.ok()) return Error(p, std::string(u.status().message()));
      return u;
    }
    return Error(p, "expected int, " + Got(v));
  }

  absl::StatusOr<bool> Bool(const Value& v, const ObjectPath& p) const {
    if (v.kind == Kind::kBool) return v.b;
    if (v.kind == Kind::kInt) return v.i != 0;
    if (v.kind == Kind::kNone) return false;
    return Error(p, "expected bool, " + Got(v));
  }

  // torch.Size(ints) via REDUCE, or a bare tuple/list of ints.
  absl::StatusOr<std::vector<int64_t>> Size(const Value& v,
                                            const ObjectPath& p) const {
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

  absl::StatusOr<DType> DTypeOf(const Value& v, const ObjectPath& p) const {
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
  absl::StatusOr<int> MemoryFormat(const Value& v, const ObjectPath& p) const {
    if (v.kind == Kind::kGlobal && v.module == "torch") {
      if (std::optional<int> f = MemoryFormatOfTorchGlobal(v.name)) return *f;
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
        if (std::optional<int> f = MemoryFormatOfEnumMember(args[1]->str)) {
          return *f;
        }
      }
    }
    return Error(
        p, "expected a memory format (_MEM_FORMAT_ENCODING member), " + Got(v));
  }

  absl::StatusOr<TensorProperties> Properties(const Value& v,
                                              const ObjectPath& p) const {
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
                                             const ObjectPath& p) const {
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

  absl::StatusOr<StorageMetadata> Item(const Value& v,
                                       const ObjectPath& p) const {
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
    const ObjectPath chunks_path = p.Field("chunks");
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

  absl::StatusOr<StorageKey> Key(const Value& v, const ObjectPath& p) const {
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

  absl::StatusOr<StorageInfo> Info(const Value& v, const ObjectPath& p) const {
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
      const ObjectPath tp = p.Field("transform_descriptors");
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
        v.callable->kind != Kind::kGlobal ||
        !IsPathlibClass(v.callable->module, v.callable->name) ||
        v.args == nullptr || v.args->kind != Kind::kTuple) {
      return std::nullopt;
    }
    PurePathJoiner path(v.callable->name);
    for (const Value* part : v.args->items) {
      if (part->kind != Kind::kString) return std::nullopt;
      path.Add(part->str);
    }
    return std::move(path).Finish();
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
    if (!Fields(v, "StorageMeta", kNames, absl::MakeSpan(f), ObjectPath{})
             .ok()) {
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
  const ObjectPath rp;
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
    const ObjectPath p = rp.Field("state_dict_metadata");
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
    const ObjectPath p = rp.Field("storage_data");
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

absl::StatusOr<Metadata> DecodeMetadataGeneric(std::string_view data,
                                               const DecodeOptions& options) {
  return MetadataDecoder::Decode(data, options);
}

}  // namespace ckptd::format
