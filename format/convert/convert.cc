// Copyright 2026 The ckptd Authors.
#include "format/convert/convert.h"

#include <algorithm>
#include <functional>
#include <map>
#include <memory>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/pickle/pickle.h"
#include "format/tensor/bytes_item.h"
#include "format/tensor/tensor_payload.h"
#include "format/tensor/tensor_record_writer.h"
#include "format/tensor/tensor_slabs.h"
#include "format/zip/zip.h"

namespace ckptd::format {
namespace {

// The nested state dict rebuilt from planner_data (DCP's set_element).
struct Node {
  enum class Kind { kDict, kList, kNone, kTensor, kObject };
  Kind kind = Kind::kNone;
  std::vector<std::pair<std::string, size_t>>
      dict;  // key → node, insertion order
  std::vector<size_t> list;
  std::string fqn;  // kTensor / kObject
};

class Tree {
 public:
  Tree() { nodes_.push_back({Node::Kind::kDict, {}, {}, {}}); }
  const Node& node(size_t i) const { return nodes_[i]; }

  // Places leaf `fqn` at `path`, creating dicts for string keys and lists
  // (padded with None) for integer keys, like DCP's set_element.
  absl::Status Set(const std::vector<PathElement>& path, Node::Kind kind,
                   const std::string& fqn) {
    if (path.empty())
      return absl::InvalidArgumentError(fmt::format("{}: empty path", fqn));
    size_t cur = 0;
    for (size_t i = 0; i < path.size(); ++i) {
      const bool last = i + 1 == path.size();
      Node::Kind want = last ? kind
                        : std::holds_alternative<std::string>(path[i + 1])
                            ? Node::Kind::kDict
                            : Node::Kind::kList;
      ASSIGN_OR_RETURN(size_t child, Child(cur, path[i], want, last, fqn));
      cur = child;
    }
    nodes_[cur].fqn = fqn;
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<size_t> Child(size_t parent, const PathElement& key,
                               Node::Kind want, bool replace,
                               const std::string& fqn) {
    // Note: nodes_ may reallocate in New(); index, never hold references.
    auto New = [&]() {
      nodes_.push_back({want, {}, {}, {}});
      return nodes_.size() - 1;
    };
    if (nodes_[parent].kind == Node::Kind::kDict) {
      const std::string k = std::holds_alternative<std::string>(key)
                                ? std::get<std::string>(key)
                                : std::to_string(std::get<int64_t>(key));
      auto& entries = nodes_[parent].dict;
      auto it = std::find_if(entries.begin(), entries.end(),
                             [&](const auto& e) { return e.first == k; });
      if (it == entries.end()) {
        const size_t n = New();
        nodes_[parent].dict.emplace_back(k, n);
        return n;
      }
      const size_t pos = it - entries.begin();
      const size_t existing = it->second;
      if (replace) {
        const size_t n = New();
        nodes_[parent].dict[pos].second = n;
        return n;
      }
      if (nodes_[existing].kind != want) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: planner_data path conflicts with another item at '{}'", fqn,
            k));
      }
      return existing;
    }
    if (nodes_[parent].kind == Node::Kind::kList) {
      if (!std::holds_alternative<int64_t>(key)) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: planner_data indexes a list with a string key", fqn));
      }
      const int64_t idx = std::get<int64_t>(key);
      if (idx < 0 || idx > (1 << 24)) {
        return absl::InvalidArgumentError(
            fmt::format("{}: list index {} out of range", fqn, idx));
      }
      while (nodes_[parent].list.size() <= static_cast<size_t>(idx)) {
        nodes_.push_back({Node::Kind::kNone, {}, {}, {}});
        const size_t none = nodes_.size() - 1;
        nodes_[parent].list.push_back(none);
      }
      const size_t at = nodes_[parent].list[idx];
      if (replace || nodes_[at].kind == Node::Kind::kNone) {
        const size_t n = New();
        nodes_[parent].list[idx] = n;
        return n;
      }
      if (nodes_[at].kind != want) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: planner_data path conflicts with another item at index {}",
            fqn, idx));
      }
      return at;
    }
    return absl::InvalidArgumentError(
        fmt::format("{}: planner_data path descends into a leaf", fqn));
  }

  std::vector<Node> nodes_;
};

// A storage record the output must contain, in key order.
struct StorageOut {
  std::string key;
  uint64_t bytes = 0;
  // Either a tensor of the checkpoint (streamed through the reader)…
  std::string fqn;
  // …or a storage of a bytes item's inner archive, copied verbatim.
  const ZipArchiveReader* archive = nullptr;
  const ZipEntry* entry = nullptr;
};

class Converter {
 public:
  Converter(CheckpointReader* reader, const ConvertOptions& options)
      : reader_(reader), options_(options) {}

  absl::StatusOr<ConvertStats> Run(const std::string& out) {
    const CompactMetadata& md = reader_->compact();
    // planner_data paths, or flat keys when absent.
    absl::flat_hash_map<std::string, const std::vector<PathElement>*> paths;
    if (md.planner_data()) {
      for (const auto& [fqn, path] : *md.planner_data()) paths[fqn] = &path;
    }
    for (size_t i = 0; i < md.num_items(); ++i) {
      const std::string fqn(md.fqn(i));
      std::vector<PathElement> flat{fqn};
      auto it = paths.find(fqn);
      const auto& path =
          it != paths.end() && !it->second->empty() ? *it->second : flat;
      const bool tensor = md.item(i).tensor;
      RETURN_IF_ERROR(tree_.Set(
          path, tensor ? Node::Kind::kTensor : Node::Kind::kObject, fqn));
    }
    // data.pkl of the whole state dict.
    std::string pkl;
    pickle::Writer w(&pkl);
    w.Proto(2);
    RETURN_IF_ERROR(Emit(0, &w));
    w.Stop();

    // The archive, streamed to out.tmp, then published atomically.
    const std::string tmp = out + ".tmp";
    ASSIGN_OR_RETURN(auto file, options_.env->NewWritableFile(tmp));
    absl::Status s = WriteArchive(file.get(), pkl);
    if (s.ok()) s = file->Sync();
    if (s.ok()) s = file->Close();
    if (s.ok()) s = options_.env->RenameFile(tmp, out);
    if (s.ok()) s = options_.env->SyncDir(DirName(out));
    if (!s.ok()) {
      (void)options_.env->RemoveFile(tmp);
      return s;
    }
    stats_.bytes_written = file->Size();
    return stats_;
  }

 private:
  absl::Status Emit(size_t n, pickle::Writer* w) {
    const Node& node = tree_.node(n);
    switch (node.kind) {
      case Node::Kind::kNone:
        w->None();
        return absl::OkStatus();
      case Node::Kind::kDict:
        w->EmptyDict();
        for (size_t i = 0; i < node.dict.size(); i += 1000) {
          w->Mark();
          for (size_t j = i; j < std::min(node.dict.size(), i + 1000); ++j) {
            w->String(node.dict[j].first);
            RETURN_IF_ERROR(Emit(node.dict[j].second, w));
          }
          w->SetItems();
        }
        return absl::OkStatus();
      case Node::Kind::kList:
        w->EmptyList();
        for (size_t i = 0; i < node.list.size(); i += 1000) {
          w->Mark();
          for (size_t j = i; j < std::min(node.list.size(), i + 1000); ++j) {
            RETURN_IF_ERROR(Emit(node.list[j], w));
          }
          w->Appends();
        }
        return absl::OkStatus();
      case Node::Kind::kTensor: {
        const CompactMetadata& md = reader_->compact();
        const size_t i = *md.FindItem(node.fqn);
        const DType dtype = md.item(i).properties.dtype;
        const std::vector<int64_t> shape(md.shape(i).begin(),
                                         md.shape(i).end());
        StorageOut so;
        so.key = std::to_string(storages_.size());
        so.fqn = node.fqn;
        int64_t numel = 1;
        for (int64_t s : shape) numel *= s;
        so.bytes = static_cast<uint64_t>(numel) * ElementSize(dtype);
        WriteTensorRebuild(w, dtype, so.key, shape);
        storages_.push_back(std::move(so));
        stats_.tensors++;
        return absl::OkStatus();
      }
      case Node::Kind::kObject:
        stats_.objects++;
        return EmitObject(node.fqn, w);
    }
    return absl::InternalError("unreachable");
  }

  // Re-emits the object pickled in a bytes item, remapping the storages it
  // references to keys of the output archive.
  absl::Status EmitObject(const std::string& fqn, pickle::Writer* w) {
    const StorageKey key{fqn, false, {}};
    ASSIGN_OR_RETURN(const StorageInfo* info, reader_->Locate(key));
    // Decoded first when stored with a transform (zstd); the archive reads
    // from it for as long as the conversion runs.
    ASSIGN_OR_RETURN(DecodedPayload payload,
                     reader_->OpenPayload(*info, key, uint64_t{1} << 30));
    ASSIGN_OR_RETURN(
        auto archive,
        ZipArchiveReader::Open(payload.file, payload.offset, payload.length));
    if (payload.owned != nullptr) payloads_.push_back(std::move(payload));
    if (options_.verify_crc) {
      RETURN_IF_ERROR(CheckpointReader::VerifyArchiveCrcs(
          *archive, StorageKey{fqn, false, {}}));
    }
    if (!options_.allow_unsafe_globals) {
      ASSIGN_OR_RETURN(BytesItemCheck check,
                       CheckBytesItem(*archive, fqn, /*check_crc=*/false));
      if (!check.unsafe_globals.empty()) {
        return absl::InvalidArgumentError(fmt::format(
            "bytes item '{}' references the global {} (outside the allowlist "
            "of README \"Security model\"): the output would run it when "
            "loaded with a full unpickler; convert refuses it "
            "(--allow-unsafe-globals to convert it anyway)",
            fqn, check.unsafe_globals[0]));
      }
    }
    ASSIGN_OR_RETURN(auto doc,
                     ParseArchivePickle(*archive, uint64_t{1} << 30, fqn));
    ObjectEmitter emitter{this, archive.get(), w, {}, {}, {}};
    RETURN_IF_ERROR(Annotate(emitter.Emit(doc->root(), 0), fqn));
    archives_.push_back(std::move(archive));
    docs_.push_back(std::move(doc));
    return absl::OkStatus();
  }

  struct ObjectEmitter {
    Converter* conv;
    const ZipArchiveReader* archive;
    pickle::Writer* w;
    absl::flat_hash_map<const pickle::Value*, uint32_t> memo;
    absl::flat_hash_set<const pickle::Value*> in_progress;
    absl::flat_hash_map<std::string, std::string> key_map;  // inner → outer key

    void Memoize(const pickle::Value* v) {
      const uint32_t idx = conv->next_memo_++;
      w->Put(idx);
      memo[v] = idx;
    }

    // Emits `v` (nested `depth` deep), or a GET of it once memoized.
    absl::Status Emit(const pickle::Value& v, int depth) {
      using K = pickle::Value::Kind;
      if (depth > 500)
        return absl::InvalidArgumentError("object nested too deeply");
      if (auto it = memo.find(&v); it != memo.end()) {
        w->Get(it->second);
        return absl::OkStatus();
      }
      switch (v.kind) {
        case K::kList:
          w->EmptyList();
          Memoize(&v);
          return Items(v.items, depth);
        case K::kDict:
          w->EmptyDict();
          Memoize(&v);
          return Entries(v.entries, depth);
        case K::kSet:
        case K::kTuple:
          return EmitTupleOrSet(v, depth);
        case K::kPersId:
          return EmitStorageRef(v, depth);
        case K::kObject:
          return EmitReduced(v, depth);
        default:
          return EmitScalar(v);
      }
    }

    // A value without parts: None, bool, int, float, str, bytes, a wide
    // int, a global.
    absl::Status EmitScalar(const pickle::Value& v) {
      using K = pickle::Value::Kind;
      switch (v.kind) {
        case K::kNone:
          w->None();
          return absl::OkStatus();
        case K::kBool:
          w->Bool(v.b);
          return absl::OkStatus();
        case K::kInt:
          w->Int(v.i);
          return absl::OkStatus();
        case K::kFloat:
          w->Float(v.f);
          return absl::OkStatus();
        case K::kString:
          w->String(v.str);
          return absl::OkStatus();
        case K::kBytes:
          w->Bytes(v.str);
          return absl::OkStatus();
        case K::kBigInt:
          if (v.str.size() > 255)
            return absl::UnimplementedError("integer wider than 255 bytes");
          w->out()->push_back('\x8a');
          w->out()->push_back(static_cast<char>(v.str.size()));
          w->out()->append(v.str);
          return absl::OkStatus();
        case K::kGlobal:
          w->Global(v.module, v.name);
          return absl::OkStatus();
        default:
          return absl::InternalError("unreachable");
      }
    }

    // A tuple, or a set (as builtins.set applied to a list), memoized after
    // its items.
    absl::Status EmitTupleOrSet(const pickle::Value& v, int depth) {
      using K = pickle::Value::Kind;
      if (!in_progress.insert(&v).second) {
        return absl::UnimplementedError("recursive tuple or set");
      }
      if (v.kind == K::kSet) w->Global("builtins", "set");
      w->Mark();
      if (v.kind == K::kSet) w->EmptyList(), w->Mark();
      for (const pickle::Value* it : v.items)
        RETURN_IF_ERROR(Emit(*it, depth + 1));
      if (v.kind == K::kSet) {
        w->Appends();
      }
      w->Tuple();
      if (v.kind == K::kSet) w->Reduce();
      in_progress.erase(&v);
      Memoize(&v);
      return absl::OkStatus();
    }

    // A persistent id ('storage', cls, key, location, numel): a new key of
    // the output archive for the storage, the same rest.
    absl::Status EmitStorageRef(const pickle::Value& v, int depth) {
      using K = pickle::Value::Kind;
      const pickle::Value* pid = v.pid;
      if (pid == nullptr || pid->kind != K::kTuple || pid->items.size() < 3 ||
          pid->items[2]->kind != K::kString) {
        return absl::UnimplementedError(
            "persistent id that is not a torch storage");
      }
      const std::string& inner = pid->items[2]->str;
      auto [it, inserted] = key_map.try_emplace(inner, "");
      if (inserted) {
        const ZipEntry* e = archive->Find("data/" + inner);
        if (e == nullptr) {
          return absl::DataLossError(
              fmt::format("{}: no record data/{}", archive->Describe(), inner));
        }
        it->second = std::to_string(conv->storages_.size());
        conv->storages_.push_back({it->second, e->size, "", archive, e});
      }
      w->Mark();
      for (size_t k = 0; k < pid->items.size(); ++k) {
        if (k == 2) {
          w->String(it->second);
        } else {
          RETURN_IF_ERROR(Emit(*pid->items[k], depth + 1));
        }
      }
      w->Tuple();
      w->BinPersId();
      return absl::OkStatus();
    }

    // An object made by REDUCE or NEWOBJ, memoized, then its list items,
    // dict entries and BUILD state.
    absl::Status EmitReduced(const pickle::Value& v, int depth) {
      if (v.kwargs != nullptr) {
        return absl::UnimplementedError("NEWOBJ_EX with keyword arguments");
      }
      if (!in_progress.insert(&v).second)
        return absl::UnimplementedError("recursive object");
      RETURN_IF_ERROR(Emit(*v.callable, depth + 1));
      if (v.args != nullptr) {
        RETURN_IF_ERROR(Emit(*v.args, depth + 1));
      } else {
        w->EmptyTuple();
      }
      if (v.newobj) {
        w->NewObj();
      } else {
        w->Reduce();
      }
      in_progress.erase(&v);
      Memoize(&v);
      if (!v.items.empty()) RETURN_IF_ERROR(Items(v.items, depth));
      if (!v.entries.empty()) RETURN_IF_ERROR(Entries(v.entries, depth));
      if (v.state != nullptr) {
        RETURN_IF_ERROR(Emit(*v.state, depth + 1));
        w->Build();
      }
      return absl::OkStatus();
    }

    absl::Status Items(const std::vector<const pickle::Value*>& items,
                       int depth) {
      for (size_t i = 0; i < items.size(); i += 1000) {
        w->Mark();
        for (size_t j = i; j < std::min(items.size(), i + 1000); ++j) {
          RETURN_IF_ERROR(Emit(*items[j], depth + 1));
        }
        w->Appends();
      }
      return absl::OkStatus();
    }
    absl::Status Entries(const std::vector<std::pair<const pickle::Value*,
                                                     const pickle::Value*>>& e,
                         int depth) {
      for (size_t i = 0; i < e.size(); i += 1000) {
        w->Mark();
        for (size_t j = i; j < std::min(e.size(), i + 1000); ++j) {
          RETURN_IF_ERROR(Emit(*e[j].first, depth + 1));
          RETURN_IF_ERROR(Emit(*e[j].second, depth + 1));
        }
        w->SetItems();
      }
      return absl::OkStatus();
    }
  };

  absl::Status WriteArchive(WritableFile* file, const std::string& pkl) {
    TorchSaveStream zip(file);
    RETURN_IF_ERROR(zip.Begin(pkl));
    std::string buf;
    for (const StorageOut& so : storages_) {
      RETURN_IF_ERROR(zip.BeginStorage(so.key, so.bytes));
      if (so.archive != nullptr) {
        for (uint64_t done = 0; done < so.bytes;) {
          const uint64_t n =
              std::min<uint64_t>(so.bytes - done, options_.block_bytes);
          buf.resize(n);
          RETURN_IF_ERROR(
              so.archive->ReadRange(*so.entry, done, n, buf.data()));
          RETURN_IF_ERROR(zip.Append(buf));
          done += n;
        }
      } else {
        RETURN_IF_ERROR(StreamTensorSlabs(
            *reader_, so.fqn, options_.block_bytes,
            [&zip](std::string_view slab) { return zip.Append(slab); }));
      }
      RETURN_IF_ERROR(zip.EndStorage());
    }
    return zip.Finish();
  }

  CheckpointReader* reader_;
  const ConvertOptions options_;
  Tree tree_;
  std::vector<StorageOut> storages_;
  std::vector<DecodedPayload> payloads_;  // decoded bytes the archives read
  std::vector<std::unique_ptr<ZipArchiveReader>> archives_;
  std::vector<std::unique_ptr<pickle::PickleDocument>> docs_;
  uint32_t next_memo_ = 0;
  ConvertStats stats_;
};

}  // namespace

absl::StatusOr<ConvertStats> ConvertToTorchSave(const std::string& dir,
                                                const std::string& out,
                                                const ConvertOptions& options) {
  if (!options.overwrite && options.env->FileExists(out).ok()) {
    return absl::AlreadyExistsError(
        fmt::format("{} exists (pass overwrite to replace it)", out));
  }
  CheckpointReaderOptions ropts;
  ropts.env = options.env;
  ropts.verify_crc = options.verify_crc;
  ASSIGN_OR_RETURN(auto reader, CheckpointReader::Open(dir, ropts));
  return Converter(reader.get(), options).Run(out);
}

}  // namespace ckptd::format
