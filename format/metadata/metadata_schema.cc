// Copyright 2026 The ckptd Authors.
//
// The DCP schema over the streaming VM's values (metadata_schema.h): the
// interpreters (the old decoder's, metadata_generic_decode.cc, with the same
// checks in the same order and the same messages; folded values take a fast
// path) and the folds.
#include "format/metadata/metadata_schema.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ckptd::format::mdvm {

struct FieldSet {
  std::string_view cls;
  std::array<std::string_view, 5> names;
  size_t n;
};
constexpr FieldSet kFieldSets[kNumFieldSets] = {
    {"TensorProperties",
     {"dtype", "layout", "requires_grad", "memory_format", "pin_memory"},
     5},
    {"ChunkStorageMetadata", {"offsets", "sizes"}, 2},
    {"TensorStorageMetadata", {"properties", "size", "chunks"}, 3},
    // __init__(fqn, offset=None, index=None); the BUILD dict is ordered
    // fqn, index, offset and has no offset for bytes items.
    {"MetadataIndex", {"fqn", "offset", "index"}, 3},
    {"_StorageInfo",
     {"relative_path", "offset", "length", "transform_descriptors"},
     4},
    {"StorageMeta", {"checkpoint_id", "save_id", "load_id", "modules"}, 4},
    {"Metadata",
     {"state_dict_metadata", "planner_data", "storage_data", "storage_meta",
      "version"},
     5},
};

Schema::Schema(Vm* vm) : vm_(vm) {
  for (int s = 0; s < kNumFieldSets; ++s) {
    for (size_t i = 0; i < 5; ++i) {
      field_ids_[s][i] = i < kFieldSets[s].n
                             ? vm_->builder().Intern(kFieldSets[s].names[i])
                             : CompactMetadata::kNone;
    }
  }
}

// ---------------------------------------------------------------------------
// Kinds, errors, rendering
// ---------------------------------------------------------------------------

K Schema::KindOf(const Val& v) const {
  switch (v.tag) {
    case Tag::kNone:
      return K::kNone;
    case Tag::kBool:
      return K::kBool;
    case Tag::kInt:
      return K::kInt;
    case Tag::kBigInt:
      return K::kBigInt;
    case Tag::kFloat:
      return K::kFloat;
    case Tag::kStr:
      return K::kString;
    case Tag::kBytes:
      return K::kBytes;
    case Tag::kGlobal:
      return K::kGlobal;
    case Tag::kIntSeq:
      return K::kTuple;
    case Tag::kIntSeq1:
      return K::kTuple;
    case Tag::kNode:
      switch (vm_->node(v).kind) {
        case NodeKind::kTuple:
          return K::kTuple;
        case NodeKind::kList:
          return K::kList;
        case NodeKind::kDict:
          return K::kDict;
        case NodeKind::kSet:
          return K::kSet;
        case NodeKind::kObject:
          return K::kObject;
        case NodeKind::kPersId:
          return K::kPersId;
      }
      return K::kObject;
    default:
      return K::kObject;  // folded objects
  }
}

bool Schema::IsCallTo(const Val& v, int cls) const {
  switch (v.tag) {
    case Tag::kSize:
      return cls == kClsSize;
    case Tag::kChunk:
      return cls == kClsChunk;
    case Tag::kProps:
      return cls == kClsProperties || cls == kClsShardProperties;
    case Tag::kTensor:
      return cls == kClsTensorStorage;
    case Tag::kBytesMd:
      return cls == kClsBytesStorage;
    case Tag::kIndex:
      return cls == kClsIndex;
    case Tag::kInfo:
      return cls == kClsStorageInfo;
    case Tag::kNode: {
      const Node& n = vm_->node(v);
      return n.kind == NodeKind::kObject && n.callable.tag == Tag::kGlobal &&
             vm_->global_class(n.callable.a) == cls;
    }
    default:
      return false;
  }
}

absl::Status Schema::Error(const ObjectPath& p, std::string_view msg,
                           const Val* at) const {
  if (folding_) return absl::CancelledError();  // cheap: "do not fold"
  std::string where = p.Render();
  std::string suffix;
  if (at != nullptr && at->tag == Tag::kNode) {
    suffix = fmt::format(" (pickle offset {})", vm_->node(*at).pos);
  }
  if (where.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}{}", vm_->source_name(), msg, suffix));
  }
  return absl::InvalidArgumentError(
      fmt::format("{}: {}: {}{}", vm_->source_name(), where, msg, suffix));
}

std::string Schema::Got(const Val& v) const {
  if (folding_) return {};
  return "got " + Describe(v, 3, 200);
}

// ---------------------------------------------------------------------------
// Generic access
// ---------------------------------------------------------------------------

absl::Status Schema::SeqItems(const Val& v, SeqView* out, const ObjectPath& p) {
  if (v.tag == Tag::kIntSeq) {
    auto& vals = out->owned();
    vals.clear();
    for (int64_t x : vm_->ints(v)) {
      Val i;
      i.tag = Tag::kInt;
      i.w[0] = x;
      vals.push_back(i);
    }
    out->Adopt();
    return absl::OkStatus();
  }
  if (v.tag == Tag::kIntSeq1) {
    Val inner = v;
    inner.tag = Tag::kIntSeq;
    inner.flags = 0;
    out->owned().assign(1, inner);
    out->Adopt();
    return absl::OkStatus();
  }
  if (v.tag != Tag::kNode) return Error(p, "not a sequence");
  Node& n = vm_->node(v);
  if (n.kind != NodeKind::kTuple && !CanRead(v)) return Error(p, "shared");
  if (n.typed_chunks && n.chunk_count > 0) {
    if (folding_) return Error(p, "typed");
    vm_->Untype(n, v.w[0]);
  }
  const Node& again = vm_->node(v);
  out->Point(again.items.data(), again.items.size());
  return absl::OkStatus();
}

absl::Status Schema::DictEntries(const Val& v, const std::vector<Val>** out,
                                 const ObjectPath& p) {
  if (v.tag != Tag::kNode || !CanRead(v)) return Error(p, "shared");
  Node& n = vm_->node(v);
  if (n.typed_storage) {
    if (folding_) return Error(p, "typed");
    vm_->Untype(n, v.w[0]);
  }
  *out = &vm_->node(v).entries;
  return absl::OkStatus();
}

absl::Status Schema::Fields(const Val& obj, FieldSetId set, Val* out, bool* has,
                            const ObjectPath& p,
                            std::optional<Val>* tuple_state) {
  const std::string_view cls = kFieldSets[set].cls;
  const size_t n_names = kFieldSets[set].n;
  const uint32_t* ids = field_ids_[set];
  std::fill(has, has + n_names, false);
  const Node& n = vm_->node(obj);
  // Positional REDUCE arguments (NEWOBJ's go to object.__new__, ignored).
  if (!n.newobj) {
    SeqView args;
    RETURN_IF_ERROR(SeqItems(n.args, &args, p));
    for (size_t i = 0; i < args.size() && i < n_names; ++i) {
      out[i] = args[i];
      has[i] = true;
    }
  }
  const Node& again = vm_->node(obj);
  if (!again.has_state || again.state.tag == Tag::kNone) {
    return absl::OkStatus();
  }
  if (!CanRead(obj)) return Error(p, "shared");
  const Val state = again.state;
  Val dicts[2] = {state, Val{}};
  const K sk = KindOf(state);
  if (sk == K::kTuple) {
    if (tuple_state != nullptr) {
      *tuple_state = state;
      return absl::OkStatus();
    }
    SeqView items;
    RETURN_IF_ERROR(SeqItems(state, &items, p));
    if (items.size() != 2) {
      return Error(
          p, fmt::format("{}: unsupported BUILD state, {}", cls, Got(state)));
    }
    dicts[0] = items[0];
    dicts[1] = items[1];
  }
  for (const Val& d : dicts) {
    if (d.tag == Tag::kNone) continue;
    if (KindOf(d) != K::kDict) {
      return Error(
          p, fmt::format("{}: BUILD state is not a dict, {}", cls, Got(d)),
          &obj);
    }
    const std::vector<Val>* entries = nullptr;
    RETURN_IF_ERROR(DictEntries(d, &entries, p));
    for (size_t k = 0; k + 1 < entries->size(); k += 2) {
      const Val& key = (*entries)[k];
      if (key.tag != Tag::kStr) continue;
      for (size_t i = 0; i < n_names; ++i) {
        if (key.a == ids[i]) {
          out[i] = (*entries)[k + 1];
          has[i] = true;
          break;
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Schema::Required(bool has, std::string_view cls,
                              std::string_view field,
                              const ObjectPath& p) const {
  if (has) return absl::OkStatus();
  return Error(p, fmt::format("{} has no '{}'", cls, field));
}

absl::StatusOr<uint32_t> Schema::String(const Val& v,
                                        const ObjectPath& p) const {
  if (v.tag != Tag::kStr) return Error(p, "expected str, " + Got(v), &v);
  return v.a;
}

absl::StatusOr<uint64_t> Schema::UInt(const Val& v, const ObjectPath& p) const {
  if (v.tag == Tag::kInt) {
    if (v.w[0] < 0) return Error(p, fmt::format("negative value {}", v.w[0]));
    return static_cast<uint64_t>(v.w[0]);
  }
  if (v.tag == Tag::kBigInt) {
    absl::StatusOr<uint64_t> u = BigIntToUInt64(vm_->blob(v));
    if (!u.ok()) return Error(p, std::string(u.status().message()));
    return u;
  }
  return Error(p, "expected int, " + Got(v), &v);
}

absl::StatusOr<bool> Schema::Bool(const Val& v, const ObjectPath& p) const {
  if (v.tag == Tag::kBool) return v.a != 0;
  if (v.tag == Tag::kInt) return v.w[0] != 0;
  if (v.tag == Tag::kNone) return false;
  return Error(p, "expected bool, " + Got(v), &v);
}

absl::Status Schema::Size(const Val& v, const ObjectPath& p, Ints* out) {
  if (v.tag == Tag::kSize || v.tag == Tag::kIntSeq) {
    const auto ints = vm_->ints(v);
    out->assign(ints.begin(), ints.end());
    return absl::OkStatus();
  }
  Val ints = v;
  if (IsCallTo(v, kClsSize)) {
    const Val args = vm_->node(v).args;
    SeqView items;
    const bool tuple = KindOf(args) == K::kTuple;
    if (tuple) RETURN_IF_ERROR(SeqItems(args, &items, p));
    if (!tuple || items.size() > 1) {
      return Error(p, "torch.Size: expected one argument, " + Got(args), &v);
    }
    if (items.empty()) {
      out->clear();
      return absl::OkStatus();
    }
    ints = items[0];
  }
  const K k = KindOf(ints);
  if (k != K::kTuple && k != K::kList) {
    return Error(p, "expected torch.Size, " + Got(v), &v);
  }
  SeqView items;
  RETURN_IF_ERROR(SeqItems(ints, &items, p));
  out->clear();
  out->reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].tag != Tag::kInt) {
      return Error(p,
                   fmt::format("torch.Size element {}: expected int, {}", i,
                               Got(items[i])),
                   &v);
    }
    out->push_back(items[i].w[0]);
  }
  return absl::OkStatus();
}

absl::StatusOr<DType> Schema::DTypeOf(const Val& v, const ObjectPath& p) const {
  if (v.tag == Tag::kGlobal) {
    const auto [module, name] = vm_->global(v.a);
    if (module == "torch") {
      absl::StatusOr<DType> d = DTypeFromName(name);
      if (!d.ok()) return Error(p, std::string(d.status().message()));
      return d;
    }
  }
  return Error(p, "expected a torch dtype (GLOBAL torch <name>), " + Got(v),
               &v);
}

namespace {

bool IsEnumClass(const Vm& vm, const Val& g) {
  if (g.tag != Tag::kGlobal) return false;
  const auto [module, name] = vm.global(g.a);
  return IsMemoryFormatEnum(module, name);
}

}  // namespace

absl::StatusOr<int> Schema::MemoryFormat(const Val& v,
                                         const ObjectPath& p) const {
  if (v.tag == Tag::kGlobal) {
    const auto [module, name] = vm_->global(v.a);
    if (module == "torch") {
      if (std::optional<int> f = MemoryFormatOfTorchGlobal(name)) return *f;
    }
  }
  // Only the callable and the arguments are read: they never change, so a
  // shared enum object (stock pickles memoize it once) is fine to fold.
  if (v.tag == Tag::kNode && vm_->node(v).kind == NodeKind::kObject &&
      !vm_->node(v).newobj && KindOf(vm_->node(v).args) == K::kTuple) {
    const Node& n = vm_->node(v);
    const Val c = n.callable;
    SeqView args;
    if (!const_cast<Schema*>(this)->SeqItems(n.args, &args, p).ok()) {
      return Error(p,
                   "expected a memory format (_MEM_FORMAT_ENCODING "
                   "member), " +
                       Got(v),
                   &v);
    }
    if (IsEnumClass(*vm_, c) && args.size() == 1 && args[0].tag == Tag::kInt &&
        args[0].w[0] >= 0 && args[0].w[0] <= 2) {
      return static_cast<int>(args[0].w[0]);
    }
    if (c.tag == Tag::kGlobal) {
      const auto [module, name] = vm_->global(c.a);
      if ((module == "builtins" || module == "__builtin__") &&
          name == "getattr" && args.size() == 2 && IsEnumClass(*vm_, args[0]) &&
          args[1].tag == Tag::kStr) {
        if (std::optional<int> f =
                MemoryFormatOfEnumMember(vm_->str(args[1]))) {
          return *f;
        }
      }
    }
  }
  return Error(
      p, "expected a memory format (_MEM_FORMAT_ENCODING member), " + Got(v),
      &v);
}

absl::StatusOr<TensorProperties> Schema::Properties(const Val& v,
                                                    const ObjectPath& p) {
  if (v.tag == Tag::kProps) {
    TensorProperties out;
    out.dtype = static_cast<DType>(v.a);
    out.memory_format = static_cast<int>(v.w[0]);
    out.requires_grad = v.flags & kRequiresGrad;
    out.pin_memory = v.flags & kPinMemory;
    return out;
  }
  if (!IsCallTo(v, kClsProperties) && !IsCallTo(v, kClsShardProperties)) {
    return Error(p, "expected TensorProperties, " + Got(v), &v);
  }
  Val f[5];
  bool has[5];
  std::optional<Val> tuple_state;
  RETURN_IF_ERROR(Fields(v, kFsProperties, f, has, p, &tuple_state));
  if (tuple_state.has_value()) {
    // __setstate__((dtype, layout, requires_grad, mem_format_enc, pin))
    SeqView items;
    RETURN_IF_ERROR(SeqItems(*tuple_state, &items, p));
    if (items.size() != 5) {
      return Error(p,
                   "TensorProperties state: expected (dtype, layout, "
                   "requires_grad, memory_format, pin_memory), " +
                       Got(*tuple_state),
                   &v);
    }
    for (size_t i = 0; i < 5; ++i) {
      f[i] = items[i];
      has[i] = true;
    }
  }
  TensorProperties out;  // dtype default: torch.get_default_dtype()
  if (has[0]) {
    ASSIGN_OR_RETURN(out.dtype, DTypeOf(f[0], p.Field("dtype")));
  }
  // f[1] (layout) is deprecated and ignored by every loader.
  if (has[2]) {
    ASSIGN_OR_RETURN(out.requires_grad, Bool(f[2], p.Field("requires_grad")));
  }
  if (has[3]) {
    ASSIGN_OR_RETURN(out.memory_format,
                     MemoryFormat(f[3], p.Field("memory_format")));
  }
  if (has[4]) {
    ASSIGN_OR_RETURN(out.pin_memory, Bool(f[4], p.Field("pin_memory")));
  }
  return out;
}

absl::Status Schema::Chunk(const Val& v, const ObjectPath& p, Ints* offsets,
                           Ints* sizes) {
  if (v.tag == Tag::kChunk) {
    const auto c = vm_->chunk_ints(v);
    offsets->assign(c.begin(), c.begin() + v.a);
    sizes->assign(c.begin() + v.a, c.end());
    return absl::OkStatus();
  }
  if (v.tag != Tag::kNode || !IsCallTo(v, kClsChunk)) {
    return Error(p, "expected ChunkStorageMetadata, " + Got(v), &v);
  }
  Val f[2];
  bool has[2];
  RETURN_IF_ERROR(Fields(v, kFsChunk, f, has, p));
  RETURN_IF_ERROR(Required(has[0], "ChunkStorageMetadata", "offsets", p));
  RETURN_IF_ERROR(Required(has[1], "ChunkStorageMetadata", "sizes", p));
  RETURN_IF_ERROR(Size(f[0], p.Field("offsets"), offsets));
  return Size(f[1], p.Field("sizes"), sizes);
}

absl::StatusOr<TensorRec> Schema::Tensor(const Val& v, const ObjectPath& p) {
  Val f[3];
  bool has[3];
  RETURN_IF_ERROR(Fields(v, kFsTensor, f, has, p));
  for (size_t i = 0; i < 3; ++i) {
    RETURN_IF_ERROR(Required(has[i], "TensorStorageMetadata",
                             kFieldSets[kFsTensor].names[i], p));
  }
  TensorRec t;
  ASSIGN_OR_RETURN(t.properties, Properties(f[0], p.Field("properties")));
  Ints shape;
  RETURN_IF_ERROR(Size(f[1], p.Field("size"), &shape));
  t.shape.assign(shape.begin(), shape.end());
  const ObjectPath cp = p.Field("chunks");
  const Val& chunks = f[2];
  const K ck = KindOf(chunks);
  if (ck != K::kList && ck != K::kTuple) {
    return Error(cp, "expected list, " + Got(chunks), &chunks);
  }
  if (chunks.tag == Tag::kNode) {
    Node& n = vm_->node(chunks);
    if (n.typed_chunks && n.items.empty()) {
      if (!CanRead(chunks)) return Error(cp, "shared");
      t.chunk_ndim = n.chunk_ndim;
      t.count = n.chunk_count;
      if (folding_) {
        t.ints = std::move(n.chunk_ints);  // the node is freed by the fold
        n.chunk_ints.clear();
        n.chunk_count = 0;
      } else {
        t.ints = n.chunk_ints;
      }
      return t;
    }
  }
  SeqView items;
  RETURN_IF_ERROR(SeqItems(chunks, &items, cp));
  Ints off, sz;
  bool regular = true;
  std::vector<ChunkStorageMetadata> all;
  all.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    RETURN_IF_ERROR(Chunk(items[i], cp.Index(i), &off, &sz));
    regular = regular && off.size() == sz.size() &&
              off.size() == (all.empty() ? off.size() : all[0].offsets.size());
    all.push_back({{off.begin(), off.end()}, {sz.begin(), sz.end()}});
  }
  t.count = static_cast<uint32_t>(all.size());
  if (regular) {
    t.chunk_ndim =
        all.empty() ? 0 : static_cast<uint32_t>(all[0].offsets.size());
    t.ints.reserve(2 * t.chunk_ndim * all.size());
    for (const auto& c : all) {
      t.ints.insert(t.ints.end(), c.offsets.begin(), c.offsets.end());
      t.ints.insert(t.ints.end(), c.sizes.begin(), c.sizes.end());
    }
  } else {
    t.chunk_ndim = CompactMetadata::kNone;
    t.irregular = std::move(all);
  }
  return t;
}

absl::Status Schema::Key(const Val& v, const ObjectPath& p, KeyData* out) {
  if (v.tag == Tag::kIndex) {
    out->fqn = v.a;
    out->has_offset = v.flags & kHasOffset;
    const auto off = vm_->index_offsets(v);
    out->offset.assign(off.begin(), off.end());
    out->hint = v.w[3];
    return absl::OkStatus();
  }
  if (v.tag != Tag::kNode || !IsCallTo(v, kClsIndex)) {
    return Error(p, "expected MetadataIndex, " + Got(v), &v);
  }
  Val f[3];
  bool has[3];
  RETURN_IF_ERROR(Fields(v, kFsIndex, f, has, p));
  RETURN_IF_ERROR(Required(has[0], "MetadataIndex", "fqn", p));
  ASSIGN_OR_RETURN(out->fqn, String(f[0], p.Field("fqn")));
  out->has_offset = has[1] && f[1].tag != Tag::kNone;
  out->offset.clear();
  if (out->has_offset) {
    RETURN_IF_ERROR(Size(f[1], p.Field("offset"), &out->offset));
  }
  // f[2] (index) is a lookup hint only.
  out->hint = has[2] && f[2].tag == Tag::kInt ? f[2].w[0] : -1;
  return absl::OkStatus();
}

absl::Status Schema::Info(const Val& v, const ObjectPath& p, InfoData* out) {
  if (v.tag == Tag::kInfo) {
    out->path = v.a;
    out->offset = static_cast<uint64_t>(v.w[0]);
    out->length = static_cast<uint64_t>(v.w[1]);
    out->transforms.clear();
    if (v.w[2] >= 0) out->transforms = vm_->transforms(v.w[2]);
    return absl::OkStatus();
  }
  if (v.tag != Tag::kNode || !IsCallTo(v, kClsStorageInfo)) {
    return Error(p, "expected filesystem._StorageInfo, " + Got(v), &v);
  }
  Val f[4];
  bool has[4];
  RETURN_IF_ERROR(Fields(v, kFsInfo, f, has, p));
  for (size_t i = 0; i < 3; ++i) {
    RETURN_IF_ERROR(
        Required(has[i], "_StorageInfo", kFieldSets[kFsInfo].names[i], p));
  }
  ASSIGN_OR_RETURN(out->path, String(f[0], p.Field("relative_path")));
  ASSIGN_OR_RETURN(out->offset, UInt(f[1], p.Field("offset")));
  ASSIGN_OR_RETURN(out->length, UInt(f[2], p.Field("length")));
  out->transforms.clear();
  if (has[3] && f[3].tag != Tag::kNone) {
    const ObjectPath tp = p.Field("transform_descriptors");
    const K k = KindOf(f[3]);
    if (k != K::kList && k != K::kTuple) {
      return Error(tp, "expected list of str or None, " + Got(f[3]), &f[3]);
    }
    SeqView items;
    RETURN_IF_ERROR(SeqItems(f[3], &items, tp));
    for (size_t i = 0; i < items.size(); ++i) {
      ASSIGN_OR_RETURN(uint32_t s, String(items[i], tp.Index(i)));
      out->transforms.push_back(s);
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Folding
// ---------------------------------------------------------------------------

bool Schema::QuickFields(const Val& obj, FieldSetId set, Val* out,
                         bool* has) const {
  const Node& n = vm_->node(obj);
  if (!n.items.empty() || !n.entries.empty() || n.has_kwargs) return false;
  const size_t count = kFieldSets[set].n;
  const uint32_t* ids = field_ids_[set];
  std::fill(has, has + count, false);
  if (n.newobj) {
    // cls.__new__(cls) + BUILD {field: value}: what pickle writes for a
    // dataclass.
    if (!n.has_state || n.state.tag == Tag::kNone) return true;
    const Val& st = n.state;
    if (st.tag != Tag::kNode || st.shared()) return false;
    const Node& d = vm_->node(st);
    if (d.kind != NodeKind::kDict || d.typed_storage) return false;
    for (size_t k = 0; k + 1 < d.entries.size(); k += 2) {
      const Val& key = d.entries[k];
      if (key.tag != Tag::kStr) continue;
      for (size_t i = 0; i < count; ++i) {
        if (key.a == ids[i]) {
          out[i] = d.entries[k + 1];
          has[i] = true;
          break;
        }
      }
    }
    return true;
  }
  // cls(*args) without BUILD: ckptd's constructor encoding.
  if (n.has_state && n.state.tag != Tag::kNone) return false;
  if (n.args.tag == Tag::kNode) {
    const Node& t = vm_->node(n.args);
    for (size_t i = 0; i < t.items.size() && i < count; ++i) {
      out[i] = t.items[i];
      has[i] = true;
    }
    return true;
  }
  return false;  // tuples of ints: the general path
}

size_t Schema::FieldCount(FieldSetId set) { return kFieldSets[set].n; }

bool Schema::QuickFold(const Val& v, int cls, Val* out) {
  FieldSetId set;
  switch (cls) {
    case kClsChunk:
      set = kFsChunk;
      break;
    case kClsIndex:
      set = kFsIndex;
      break;
    case kClsStorageInfo:
      set = kFsInfo;
      break;
    default:
      return false;
  }
  Val f[4];
  bool has[4];
  return QuickFields(v, set, f, has) && FoldFields(cls, f, has, out);
}

bool Schema::FoldFields(int cls, const Val* f, const bool* has, Val* out) {
  auto ints_ok = [](const Val& x, uint32_t max) {
    return (x.tag == Tag::kSize || x.tag == Tag::kIntSeq) && x.a <= max;
  };
  switch (cls) {
    case kClsChunk: {
      if (!has[0] || !has[1] || !ints_ok(f[0], 2) || !ints_ok(f[1], 2) ||
          f[0].a != f[1].a) {
        return false;
      }
      const uint32_t nd = f[0].a;
      Val& c = *out;
      c = Val{};
      c.tag = Tag::kChunk;
      c.a = nd;
      for (uint32_t d = 0; d < nd; ++d) {
        c.w[d] = f[0].w[d];
        c.w[nd + d] = f[1].w[d];
      }
      return true;
    }
    case kClsIndex: {
      if (!has[0] || f[0].tag != Tag::kStr) return false;
      const bool has_offset = has[1] && f[1].tag != Tag::kNone;
      if (has_offset && !ints_ok(f[1], 2)) return false;
      Val& x = *out;
      x = Val{};
      x.tag = Tag::kIndex;
      x.a = f[0].a;
      x.flags = has_offset ? kHasOffset : 0;
      if (has_offset) {
        x.n = static_cast<uint16_t>(f[1].a);
        x.w[0] = f[1].w[0];
        x.w[1] = f[1].w[1];
      }
      x.w[3] = has[2] && f[2].tag == Tag::kInt ? f[2].w[0] : -1;
      return true;
    }
    case kClsStorageInfo: {
      if (!has[0] || !has[1] || !has[2] || f[0].tag != Tag::kStr ||
          f[1].tag != Tag::kInt || f[2].tag != Tag::kInt || f[1].w[0] < 0 ||
          f[2].w[0] < 0 || (has[3] && f[3].tag != Tag::kNone)) {
        return false;
      }
      Val& x = *out;
      x = Val{};
      x.tag = Tag::kInfo;
      x.a = f[0].a;
      x.w[0] = f[1].w[0];
      x.w[1] = f[2].w[0];
      x.w[2] = -1;
      return true;
    }
    default:
      return false;
  }
}

bool Schema::FoldObject(const Val& v, int cls, Val* out) {
  const ObjectPath p;
  switch (cls) {
    case kClsChunk: {
      Ints off, sz;
      if (!Chunk(v, p, &off, &sz).ok() || off.size() != sz.size()) {
        return false;
      }
      *out = vm_->MakeChunk(off, sz);
      return true;
    }
    case kClsProperties:
    case kClsShardProperties: {
      absl::StatusOr<TensorProperties> props = Properties(v, p);
      if (!props.ok()) return false;
      Val f;
      f.tag = Tag::kProps;
      f.a = static_cast<uint32_t>(props->dtype);
      f.w[0] = props->memory_format;
      f.flags = (props->requires_grad ? kRequiresGrad : 0) |
                (props->pin_memory ? kPinMemory : 0);
      *out = f;
      return true;
    }
    case kClsTensorStorage: {
      absl::StatusOr<TensorRec> t = Tensor(v, p);
      if (!t.ok()) return false;
      Val f;
      f.tag = Tag::kTensor;
      f.a = vm_->NewTensor(*std::move(t));
      *out = f;
      return true;
    }
    case kClsBytesStorage:
      out->tag = Tag::kBytesMd;
      return true;
    case kClsIndex: {
      KeyData key;
      if (!Key(v, p, &key).ok()) return false;
      *out = vm_->MakeIndex(key.fqn, key.has_offset, key.offset, key.hint);
      return true;
    }
    case kClsStorageInfo: {
      InfoData info;
      if (!Info(v, p, &info).ok()) return false;
      Val f;
      f.tag = Tag::kInfo;
      f.a = info.path;
      f.w[0] = static_cast<int64_t>(info.offset);
      f.w[1] = static_cast<int64_t>(info.length);
      f.w[2] = info.transforms.empty()
                   ? -1
                   : vm_->NewTransforms(std::move(info.transforms));
      *out = f;
      return true;
    }
    default:
      return false;
  }
}

void Schema::FreeConsumed(const Val& v, int depth) {
  if (v.tag != Tag::kNode || v.shared() || depth > 3) return;
  const uint64_t id = static_cast<uint64_t>(v.w[0]);
  // Children first (unshared nodes are reachable from this one alone);
  // freeing them never touches this node's vectors.
  {
    const Node& n = vm_->node(v);
    for (const Val& c : n.items) {
      if (c.tag == Tag::kNode) FreeConsumed(c, depth + 1);
    }
    for (const Val& c : n.entries) {
      if (c.tag == Tag::kNode) FreeConsumed(c, depth + 1);
    }
    if (n.kind == NodeKind::kObject) {
      FreeConsumed(n.callable, depth + 1);
      FreeConsumed(n.args, depth + 1);
      if (n.has_kwargs) FreeConsumed(n.kwargs, depth + 1);
      if (n.has_state) FreeConsumed(n.state, depth + 1);
    } else if (n.kind == NodeKind::kPersId) {
      FreeConsumed(n.args, depth + 1);
    }
  }
  vm_->FreeNode(id);
}

void Schema::Fold(Val* v) {
  if (v->tag != Tag::kNode || v->shared()) return;
  const Node& n = vm_->node(*v);
  if (n.kind != NodeKind::kObject || n.callable.tag != Tag::kGlobal) return;
  const int cls = vm_->global_class(n.callable.a);
  if (cls == kOther || cls == kClsMetadata || cls == kClsStorageMeta ||
      cls == kClsSize) {
    return;
  }
  folding_ = true;
  Val out;
  const bool ok = QuickFold(*v, cls, &out) || FoldObject(*v, cls, &out);
  folding_ = false;
  if (!ok) return;
  FreeConsumed(*v, 0);
  *v = out;
}

}  // namespace ckptd::format::mdvm
