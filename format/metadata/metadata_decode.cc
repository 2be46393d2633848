// Copyright 2026 The ckptd Authors.
//
// The streaming decoder's entry points (metadata_decode.h) and the parts of
// the schema walk only the final walk uses: the state_dict_metadata items,
// the tolerant planner_data / storage_meta readers, storage_data, the root,
// and the rendering of values in error messages.
#include "format/metadata/metadata_decode.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/metadata/metadata_schema.h"

namespace ckptd::format {
namespace mdvm {

namespace {

// Appends `s` as a Python str (or bytes) literal: at most 200 bytes shown
// (a str cut at a UTF-8 boundary), escaped, and the length if cut.
void Quoted(std::string_view s, bool bytes, std::string* out) {
  constexpr size_t kMaxShown = 200;
  *out += bytes ? "b'" : "'";
  size_t n = std::min(s.size(), kMaxShown);
  if (!bytes) {
    while (n > 0 && n < s.size() && (static_cast<uint8_t>(s[n]) & 0xc0) == 0x80)
      --n;
  }
  for (size_t k = 0; k < n; ++k) {
    const auto c = static_cast<uint8_t>(s[k]);
    if (c == '\\' || c == '\'') {
      *out += '\\';
      *out += static_cast<char>(c);
    } else if (c == '\n') {
      *out += "\\n";
    } else if (c < 0x20 || c == 0x7f || (bytes && c >= 0x80)) {
      *out += fmt::format("\\x{:02x}", c);
    } else {
      *out += static_cast<char>(c);
    }
  }
  if (n < s.size()) *out += fmt::format("...({} bytes)", s.size());
  *out += '\'';
}

// A bounded rendering of a VM value (depth, length, cycles) like
// pickle::DebugString, for error messages.
class Describer {
 public:
  Describer(const Vm& vm, int max_depth, size_t max_len)
      : vm_(vm), max_depth_(max_depth), max_len_(max_len) {}

  // `root` rendered, cut to max_len bytes (at a UTF-8 boundary) + "...".
  std::string Render(const Val& root) && {
    Value(root, 0);
    if (out_.size() > max_len_) {
      size_t n = max_len_;
      while (n > 0 && (static_cast<uint8_t>(out_[n]) & 0xc0) == 0x80) --n;
      out_.resize(n);
      out_ += "...";
    }
    return std::move(out_);
  }

 private:
  // Appends any value at `depth` (nothing once max_len is reached).
  void Value(const Val& v, int depth) {
    if (out_.size() >= max_len_) return;
    switch (v.tag) {
      case Tag::kNone:
      case Tag::kBool:
      case Tag::kInt:
      case Tag::kBigInt:
      case Tag::kFloat:
      case Tag::kStr:
      case Tag::kBytes:
      case Tag::kGlobal:
      case Tag::kIntSeq:
      case Tag::kIntSeq1:
      case Tag::kSize:
        return Scalar(v);
      case Tag::kChunk:
      case Tag::kProps:
      case Tag::kTensor:
      case Tag::kBytesMd:
      case Tag::kIndex:
      case Tag::kInfo:
        return Folded(v);
      case Tag::kNode:
        return NodeValue(v, depth);
    }
  }

  // Appends a scalar, a string or a tuple of ints (torch.Size included).
  void Scalar(const Val& v) {
    switch (v.tag) {
      case Tag::kNone:
        out_ += "None";
        return;
      case Tag::kBool:
        out_ += v.a ? "True" : "False";
        return;
      case Tag::kInt:
        out_ += std::to_string(v.w[0]);
        return;
      case Tag::kBigInt:
        out_ += fmt::format("<int of {} bytes>", vm_.blob(v).size());
        return;
      case Tag::kFloat: {
        double d;
        std::memcpy(&d, &v.w[0], 8);
        out_ += fmt::format("{}", d);
        return;
      }
      case Tag::kStr:
        Quoted(vm_.str(v), false, &out_);
        return;
      case Tag::kBytes:
        Quoted(vm_.blob(v), true, &out_);
        return;
      case Tag::kGlobal: {
        const auto [m, n] = vm_.global(v.a);
        out_ += fmt::format("{}.{}", m, n);
        return;
      }
      case Tag::kIntSeq:
        Ints(vm_.ints(v), true);
        return;
      case Tag::kIntSeq1:
        out_ += '(';
        Ints(vm_.ints(v), true);
        out_ += ",)";
        return;
      case Tag::kSize:
        out_ += "torch.Size(";
        Ints(vm_.ints(v), false);
        out_ += ')';
        return;
      default:
        return;  // not a scalar: Value() dispatches those elsewhere
    }
  }

  // Appends a folded DCP object as the class it stands for.
  void Folded(const Val& v) {
    switch (v.tag) {
      case Tag::kChunk: {
        const auto c = vm_.chunk_ints(v);
        out_ +=
            fmt::format("{}.ChunkStorageMetadata(offsets=", kMetadataModule);
        Ints(c.subspan(0, v.a), false);
        out_ += ", sizes=";
        Ints(c.subspan(v.a), false);
        out_ += ')';
        return;
      }
      case Tag::kProps:
        out_ += fmt::format("{}.TensorProperties(dtype={})", kMetadataModule,
                            DTypeName(static_cast<DType>(v.a)));
        return;
      case Tag::kTensor:
        out_ += fmt::format("{}.TensorStorageMetadata(...)", kMetadataModule);
        return;
      case Tag::kBytesMd:
        out_ += fmt::format("{}.BytesStorageMetadata()", kMetadataModule);
        return;
      case Tag::kIndex:
        out_ +=
            fmt::format("{}.MetadataIndex('{}', ", kMetadataModule, vm_.str(v));
        Ints(vm_.index_offsets(v), false);
        out_ += ')';
        return;
      case Tag::kInfo:
        out_ += fmt::format(
            "torch.distributed.checkpoint.filesystem._StorageInfo('{}', {}, "
            "{})",
            vm_.str(v), v.w[0], v.w[1]);
        return;
      default:
        return;  // not a folded object
    }
  }

  // Appends a node: "..." past max_depth or where it contains itself.
  void NodeValue(const Val& v, int depth) {
    const uint64_t id = v.w[0];
    if (depth >= max_depth_ ||
        std::find(path_.begin(), path_.end(), id) != path_.end()) {
      out_ += "...";
      return;
    }
    path_.push_back(id);
    const Node& n = vm_.node(v);
    switch (n.kind) {
      case NodeKind::kTuple:
        out_ += '(';
        Items(n.items, depth);
        out_ += n.items.size() == 1 ? ",)" : ")";
        break;
      case NodeKind::kList:
        out_ += '[';
        if (n.typed_chunks && n.chunk_count > 0) {
          out_ += fmt::format("<{} chunks>", n.chunk_count);
        }
        Items(n.items, depth);
        out_ += ']';
        break;
      case NodeKind::kSet:
        out_ += n.items.empty() ? "set()" : "{";
        if (!n.items.empty()) {
          Items(n.items, depth);
          out_ += '}';
        }
        break;
      case NodeKind::kDict:
        out_ += '{';
        if (n.typed_storage) out_ += "<storage entries>";
        Entries(n.entries, depth);
        out_ += '}';
        break;
      case NodeKind::kPersId:
        out_ += "persid(";
        Value(n.args, depth + 1);
        out_ += ')';
        break;
      case NodeKind::kObject:
        Object(n, depth);
        break;
    }
    path_.pop_back();
  }

  // Appends an object node: callable(args, **kwargs), then its appended
  // items, set entries and BUILD state.
  void Object(const Node& n, int depth) {
    Value(n.callable, depth + 1);
    out_ += n.newobj ? ".__new__(" : "(";
    if (n.args.tag == Tag::kIntSeq1) {
      Ints(vm_.ints(n.args), true);
    } else if (n.args.tag == Tag::kIntSeq) {
      const auto a = vm_.ints(n.args);
      for (size_t k = 0; k < a.size(); ++k) {
        if (k) out_ += ", ";
        out_ += std::to_string(a[k]);
      }
    } else if (n.args.tag == Tag::kNode) {
      Items(vm_.node(n.args).items, depth);
    }
    if (n.has_kwargs) {
      out_ += ", **";
      Value(n.kwargs, depth + 1);
    }
    out_ += ')';
    if (!n.items.empty()) {
      out_ += '[';
      Items(n.items, depth);
      out_ += ']';
    }
    if (!n.entries.empty()) {
      out_ += '{';
      Entries(n.entries, depth);
      out_ += '}';
    }
    if (n.has_state) {
      out_ += " state=";
      Value(n.state, depth + 1);
    }
  }

  // "(1, 2)"; a one-int tuple "(1,)".
  void Ints(absl::Span<const int64_t> v, bool tuple) {
    out_ += '(';
    for (size_t k = 0; k < v.size() && out_.size() < max_len_; ++k) {
      if (k) out_ += ", ";
      out_ += std::to_string(v[k]);
    }
    out_ += tuple && v.size() == 1 ? ",)" : ")";
  }

  // The items of a node at `depth`, comma-separated.
  void Items(const std::vector<Val>& xs, int depth) {
    for (size_t k = 0; k < xs.size() && out_.size() < max_len_; ++k) {
      if (k) out_ += ", ";
      Value(xs[k], depth + 1);
    }
  }

  // The entries (k0, v0, k1, v1, ...) of a node at `depth` as "k: v, ...".
  void Entries(const std::vector<Val>& xs, int depth) {
    for (size_t k = 0; k + 1 < xs.size() && out_.size() < max_len_; k += 2) {
      if (k) out_ += ", ";
      Value(xs[k], depth + 1);
      out_ += ": ";
      Value(xs[k + 1], depth + 1);
    }
  }

  const Vm& vm_;
  const int max_depth_;
  const size_t max_len_;
  std::string out_;
  std::vector<uint64_t> path_;  // nodes being printed
};

}  // namespace

std::string Schema::Describe(const Val& root, int max_depth,
                             size_t max_len) const {
  return Describer(*vm_, max_depth, max_len).Render(root);
}

absl::Status Schema::Item(uint32_t fqn, const Val& v, const ObjectPath& p) {
  CompactMetadataBuilder& b = vm_->builder();
  if (IsCallTo(v, kClsBytesStorage)) {
    // No fields; any BUILD state (none, {}) is irrelevant.
    b.AddBytesItem(fqn);
    return absl::OkStatus();
  }
  if (!IsCallTo(v, kClsTensorStorage)) {
    return Error(
        p, "expected TensorStorageMetadata or BytesStorageMetadata, " + Got(v),
        &v);
  }
  TensorRec local;
  TensorRec* t = &local;
  if (v.tag == Tag::kTensor) {
    t = &vm_->tensor(v);
    if (t->moved) return Error(p, "internal error: tensor read twice");
  } else {
    ASSIGN_OR_RETURN(local, Tensor(v, p));
  }
  if (t->chunk_ndim == CompactMetadata::kNone) {
    b.AddIrregularTensor(fqn, t->properties, t->shape, t->irregular);
  } else {
    b.AddTensor(fqn, t->properties, t->shape, t->chunk_ndim, t->count, t->ints);
  }
  if (t != &local) {
    t->moved = true;
    std::vector<int64_t>().swap(t->ints);
    std::vector<ChunkStorageMetadata>().swap(t->irregular);
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Tolerant parts (never folded)
// ---------------------------------------------------------------------------

std::optional<std::string> Schema::PathLike(const Val& v) {
  if (v.tag == Tag::kStr) return std::string(vm_->str(v));
  if (v.tag != Tag::kNode || vm_->node(v).kind != NodeKind::kObject) {
    return std::nullopt;
  }
  const Val c = vm_->node(v).callable;
  const Val args = vm_->node(v).args;
  if (c.tag != Tag::kGlobal || KindOf(args) != K::kTuple) return std::nullopt;
  const auto [module, name] = vm_->global(c.a);
  if (!IsPathlibClass(module, name)) return std::nullopt;
  SeqView parts;
  if (!SeqItems(args, &parts, ObjectPath{}).ok()) return std::nullopt;
  PurePathJoiner path(name);
  for (const Val& part : parts) {
    if (part.tag != Tag::kStr) return std::nullopt;
    path.Add(vm_->str(part));
  }
  return std::move(path).Finish();
}

std::optional<StorageMeta> Schema::StorageMetaOf(const Val& v) {
  if (v.tag != Tag::kNode || !IsCallTo(v, kClsStorageMeta)) {
    return std::nullopt;
  }
  Val f[4];
  bool has[4];
  if (!Fields(v, kFsStorageMeta, f, has, ObjectPath{}).ok()) {
    return std::nullopt;
  }
  auto opt_string = [&](int i) -> std::optional<std::string> {
    if (has[i] && f[i].tag == Tag::kStr) return std::string(vm_->str(f[i]));
    return std::nullopt;
  };
  StorageMeta sm;
  if (has[0]) sm.checkpoint_id = PathLike(f[0]);
  sm.save_id = opt_string(1);
  sm.load_id = opt_string(2);
  // `modules` is absent in 2.4–2.6 files.
  if (has[3]) {
    const K k = KindOf(f[3]);
    SeqView items;
    if ((k == K::kList || k == K::kTuple) &&
        SeqItems(f[3], &items, ObjectPath{}).ok()) {
      for (const Val& m : items) {
        if (m.tag == Tag::kStr) sm.modules.emplace_back(vm_->str(m));
      }
    }
  }
  return sm;
}

std::optional<std::vector<std::pair<std::string, std::vector<PathElement>>>>
Schema::PlannerData(const Val& v) {
  if (KindOf(v) != K::kDict) return std::nullopt;
  const std::vector<Val>* entries = nullptr;
  if (!DictEntries(v, &entries, ObjectPath{}).ok()) return std::nullopt;
  std::vector<std::pair<std::string, std::vector<PathElement>>> out;
  out.reserve(entries->size() / 2);
  absl::flat_hash_map<uint32_t, size_t> seen;
  for (size_t k = 0; k + 1 < entries->size(); k += 2) {
    SeqView items;
    const Val key = (*entries)[k];
    const Val val = (*entries)[k + 1];
    if (key.tag != Tag::kStr) return std::nullopt;
    const K vk = KindOf(val);
    if (vk != K::kTuple && vk != K::kList) return std::nullopt;
    if (!SeqItems(val, &items, ObjectPath{}).ok()) return std::nullopt;
    std::vector<PathElement> path;
    path.reserve(items.size());
    for (const Val& e : items) {
      if (e.tag == Tag::kStr) {
        path.emplace_back(std::string(vm_->str(e)));
      } else if (e.tag == Tag::kInt) {
        path.emplace_back(e.w[0]);
      } else {
        return std::nullopt;
      }
    }
    auto [it, inserted] = seen.try_emplace(key.a, out.size());
    if (inserted) {
      out.emplace_back(std::string(vm_->str(key)), std::move(path));
    } else {
      out[it->second].second = std::move(path);  // last value wins
    }
    // DictEntries' vector stays valid: nothing above allocates nodes.
    entries = &vm_->node(v).entries;
  }
  return out;
}

absl::Status Schema::StorageData(const Val& v, const ObjectPath& p) {
  CompactMetadataBuilder& b = vm_->builder();
  if (v.tag == Tag::kNode && vm_->node(v).kind == NodeKind::kDict &&
      vm_->node(v).typed_storage) {
    return absl::OkStatus();  // its entries are the builder's already
  }
  if (KindOf(v) != K::kDict) {
    return Error(p,
                 "expected a dict {MetadataIndex: _StorageInfo} as "
                 "FileSystemWriter writes it, " +
                     Got(v) +
                     "; checkpoints of other StorageWriters are not supported",
                 &v);
  }
  b.ClearStorage();
  const std::vector<Val>* entries = nullptr;
  RETURN_IF_ERROR(DictEntries(v, &entries, p));
  // Key/Info may make children generic (Untype), which never allocates
  // nodes: `entries` stays valid.
  KeyData key;
  InfoData info;
  for (size_t k = 0; k + 1 < entries->size(); k += 2) {
    const int64_t i = static_cast<int64_t>(k / 2);
    RETURN_IF_ERROR(Key((*entries)[k], p.EntryKey(i), &key));
    std::string desc;
    if (key.has_offset) {
      desc = fmt::format("{}@({})", b.strings().Get(key.fqn),
                         fmt::join(key.offset, ", "));
    } else {
      desc = std::string(b.strings().Get(key.fqn));
    }
    RETURN_IF_ERROR(Info((*entries)[k + 1], p.Bracket(desc), &info));
    b.AddStorage(key.fqn, key.has_offset, key.offset, info.path, info.offset,
                 info.length, &info.transforms, key.hint);
  }
  return absl::OkStatus();
}

absl::Status Schema::Decode(const Val& root) {
  folding_ = false;
  const ObjectPath rp;
  if (root.tag != Tag::kNode || !IsCallTo(root, kClsMetadata)) {
    return Error(rp,
                 "not a DCP .metadata: expected "
                 "torch.distributed.checkpoint.metadata.Metadata, " +
                     Got(root),
                 &root);
  }
  Val f[5];
  bool has[5];
  RETURN_IF_ERROR(Fields(root, kFsMetadata, f, has, rp));
  RETURN_IF_ERROR(Required(has[0], "Metadata", "state_dict_metadata", rp));
  CompactMetadataBuilder& b = vm_->builder();
  // state_dict_metadata: {fqn: TensorStorageMetadata | BytesStorageMetadata}.
  {
    const ObjectPath p = rp.Field("state_dict_metadata");
    if (KindOf(f[0]) != K::kDict) {
      return Error(p, "expected dict, " + Got(f[0]), &f[0]);
    }
    const std::vector<Val>* entries = nullptr;
    RETURN_IF_ERROR(DictEntries(f[0], &entries, p));
    for (size_t k = 0; k + 1 < entries->size(); k += 2) {
      const Val key = (*entries)[k];
      if (key.tag != Tag::kStr) {
        return Error(p.EntryKey(static_cast<int64_t>(k / 2)),
                     "expected str, " + Got(key), &key);
      }
      RETURN_IF_ERROR(Item(key.a, (*entries)[k + 1], p.Key(vm_->str(key))));
    }
  }
  if (has[1]) b.SetPlannerData(PlannerData(f[1]));
  {
    const ObjectPath p = rp.Field("storage_data");
    if (!has[2]) {
      return Error(p,
                   "expected a dict {MetadataIndex: _StorageInfo} as "
                   "FileSystemWriter writes it, got nothing; checkpoints of "
                   "other StorageWriters are not supported");
    }
    RETURN_IF_ERROR(StorageData(f[2], p));
  }
  if (has[3]) b.SetStorageMeta(StorageMetaOf(f[3]));
  if (has[4] && f[4].tag != Tag::kNone) {
    ASSIGN_OR_RETURN(uint32_t v, String(f[4], rp.Field("version")));
    b.SetVersion(std::string(b.strings().Get(v)));
  }
  return absl::OkStatus();
}

}  // namespace mdvm

namespace {

absl::StatusOr<CompactMetadata> Run(mdvm::Source& src,
                                    const DecodeOptions& options,
                                    DecodeStats* stats) {
  mdvm::MemoRefs refs = mdvm::ScanMemoReferences(src);
  src.Rewind();
  mdvm::Limits limits;
  limits.max_alloc_bytes = options.max_alloc_bytes;
  CompactMetadataBuilder builder;
  // A 2-d chunk and its storage entry take 60-140 bytes of pickle (ckptd's
  // encoding, stock torch's); the arrays grow past the estimate if needed.
  builder.Reserve(src.size() / 56);
  const size_t stored = refs.size();
  mdvm::Vm vm(src, limits, options.source_name, &builder, std::move(refs));
  RETURN_IF_ERROR(vm.Run());
  mdvm::Schema schema(&vm);
  RETURN_IF_ERROR(schema.Decode(vm.root()));
  if (stats != nullptr) {
    stats->input_bytes = src.size();
    stats->memo_slots = vm.memo_count();
    stats->memo_stored = stored;
    stats->buffer_bytes = src.buffer_bytes();
    stats->allocated_bytes = vm.allocated();
    stats->fast_objects = vm.fast_objects();
    stats->fast_sizes = vm.fast_sizes();
  }
  return std::move(builder).Finish();
}

}  // namespace

absl::StatusOr<CompactMetadata> DecodeCompactMetadata(
    std::string_view data, const DecodeOptions& options, DecodeStats* stats) {
  mdvm::Source src(data);
  return Run(src, options, stats);
}

absl::StatusOr<CompactMetadata> ReadCompactMetadata(
    Env* env, const std::string& path, const ReadMetadataOptions& options,
    DecodeStats* stats) {
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                   env->NewRandomAccessFile(path));
  if (file->Size() > options.max_file_bytes) {
    return absl::ResourceExhaustedError(
        fmt::format("{}: {} bytes, more than the limit of {} for a .metadata",
                    path, file->Size(), options.max_file_bytes));
  }
  DecodeOptions dopts = options.decode;
  if (dopts.source_name == ".metadata") dopts.source_name = path;
  mdvm::Source src(file.get(), options.block_bytes);
  return Run(src, dopts, stats);
}

}  // namespace ckptd::format
