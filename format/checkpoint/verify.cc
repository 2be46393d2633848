// Copyright 2026 The ckptd Authors.
#include "format/checkpoint/verify.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <map>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/convert/safetensors.h"
#include "format/metadata/compact_metadata.h"
#include "format/metadata/metadata.h"
#include "format/metadata/metadata_decode.h"
#include "format/pickle/pickle.h"
#include "format/plan/save_plan.h"
#include "format/tensor/bytes_item.h"
#include "format/tensor/tensor_payload.h"
#include "format/zip/zip.h"

namespace ckptd::format {
namespace {

class Verifier {
 public:
  Verifier(const std::string& dir, const VerifyOptions& options)
      : dir_(dir), options_(options) {}

  absl::StatusOr<VerifyReport> Run() {
    Env* env = options_.env;
    const std::string marker = JoinPath(dir_, kMetadataName);
    if (absl::Status e = env->FileExists(marker); !e.ok()) {
      if (absl::IsNotFound(e)) {
        Problem(fmt::format(
            "{}: no .metadata (not a checkpoint, or not committed)", dir_));
        return report_;
      }
      return e;
    }
    ReadMetadataOptions ropts;
    ropts.decode.source_name = marker;
    auto decoded = ReadCompactMetadata(env, marker, ropts);
    if (!decoded.ok()) {
      // An unreadable file is an error of the run; a bad pickle a problem.
      if (!absl::IsInvalidArgument(decoded.status()) &&
          !absl::IsResourceExhausted(decoded.status()) &&
          !absl::IsDataLoss(decoded.status())) {
        return decoded.status();
      }
      Problem(std::string(decoded.status().message()));
      return report_;
    }
    md_ = *std::move(decoded);
    CheckPlan();
    CheckStorage();
    return report_;
  }

 private:
  using Storage = CompactMetadata::Storage;

  void Problem(std::string p) {
    if (report_.problems.size() < options_.max_problems)
      report_.problems.push_back(std::move(p));
  }
  bool Full() const { return report_.problems.size() >= options_.max_problems; }

  // Chunks in bounds, disjoint and covering; one storage entry per item.
  void CheckPlan() {
    for (size_t i = 0; i < md_.num_items() && !Full(); ++i) {
      const CompactMetadata::Item& it = md_.item(i);
      if (it.tensor) {
        report_.tensors++;
        report_.chunks += it.num_chunks;
        if (absl::Status s = ValidateChunks(md_, i, true); !s.ok()) {
          Problem(fmt::format(".metadata: {}", s.message()));
        }
        for (size_t j = 0; j < it.num_chunks && !Full(); ++j) {
          if (md_.chunk_storage(i, j) == nullptr) {
            Problem(fmt::format(".metadata: {}@({}): no storage_data entry",
                                md_.fqn(i),
                                fmt::join(md_.chunk_offsets(i, j), ", ")));
          }
        }
      } else {
        report_.bytes_items++;
        if (md_.bytes_storage(i) == nullptr) {
          Problem(fmt::format(
              ".metadata: {} (bytes item): no storage_data entry", md_.fqn(i)));
        }
      }
    }
    for (const Storage& s : md_.storage_entries()) {
      if (s.item != CompactMetadata::kNone || Full()) continue;
      // An entry whose key names nothing: no such item, or of the other
      // kind (a chunk key of a bytes item or the reverse).
      const std::optional<size_t> i = md_.FindItem(md_.str(s.fqn));
      if (!i.has_value()) {
        Problem(fmt::format(
            ".metadata: storage_data entry {} names no state_dict item",
            md_.DescribeStorageKey(s)));
      } else if (md_.item(*i).tensor != s.has_offset) {
        Problem(fmt::format(
            ".metadata: storage_data entry {} disagrees with the item's kind",
            md_.DescribeStorageKey(s)));
      }
    }
  }

  // Every file's payloads: inside it, disjoint, well-formed; then the data
  // files nothing references.
  void CheckStorage() {
    std::vector<std::vector<const Storage*>> by_path = EntriesByFile();
    const std::vector<uint32_t> paths = FilesInNameOrder(by_path);
    report_.files = paths.size();
    absl::flat_hash_set<std::string_view> referenced;
    for (uint32_t p : paths) {
      referenced.insert(md_.str(p));
      if (Full()) return;
      if (!CheckFile(p, by_path[p])) return;
    }
    NoteUnreferencedFiles(referenced);
  }

  // The storage entries by file (file names are interned: by_path[name]),
  // those whose relative_path leaves the directory reported instead.
  std::vector<std::vector<const Storage*>> EntriesByFile() {
    std::vector<std::vector<const Storage*>> by_path;
    for (const Storage& s : md_.storage_entries()) {
      if (!IsSafeRelativePath(md_.relative_path(s))) {
        Problem(fmt::format(
            ".metadata: {}: relative_path '{}' leaves the checkpoint directory",
            md_.DescribeStorageKey(s), md_.relative_path(s)));
        continue;
      }
      if (s.path >= by_path.size()) by_path.resize(s.path + 1);
      by_path[s.path].push_back(&s);
    }
    return by_path;
  }

  // The files that hold entries, in name order (as the report always
  // listed them).
  std::vector<uint32_t> FilesInNameOrder(
      const std::vector<std::vector<const Storage*>>& by_path) const {
    std::vector<uint32_t> paths;
    for (uint32_t p = 0; p < by_path.size(); ++p) {
      if (!by_path[p].empty()) paths.push_back(p);
    }
    std::sort(paths.begin(), paths.end(),
              [&](uint32_t a, uint32_t b) { return md_.str(a) < md_.str(b); });
    return paths;
  }

  // The payloads of file `p` (its entries `items`, sorted here by offset),
  // and a note of its trailing bytes. False once the report is full (the
  // check stops).
  bool CheckFile(uint32_t p, std::vector<const Storage*>& items) {
    const std::string rel(md_.str(p));
    auto file = options_.env->NewRandomAccessFile(JoinPath(dir_, rel));
    if (!file.ok()) {
      Problem(fmt::format("{}: {} (referenced by {} items)", rel,
                          file.status().message(), items.size()));
      return true;
    }
    std::stable_sort(items.begin(), items.end(),
                     [](const Storage* a, const Storage* b) {
                       return a->offset < b->offset;
                     });
    uint64_t prev_end = 0;
    const Storage* prev = nullptr;
    std::optional<SafetensorsHeader> blob;  // SAFETENSORS-format file
    uint64_t blob_offset = 0;
    for (const Storage* s : items) {
      if (Full()) return false;
      const std::string where = fmt::format("{} @ {}: {}", rel, s->offset,
                                            md_.DescribeStorageKey(*s));
      if (s->offset > (*file)->Size() ||
          s->length > (*file)->Size() - s->offset) {
        Problem(
            fmt::format("{}: payload [{}, +{}) extends past the end of the "
                        "file ({} bytes)",
                        where, s->offset, s->length, (*file)->Size()));
        continue;
      }
      if (blob.has_value() && s->offset == blob_offset) {
        CheckSafetensorsChunk(*blob, *s, where);  // another of its tensors
        continue;
      }
      if (prev != nullptr && s->offset < prev_end) {
        Problem(fmt::format("{}: payload overlaps the payload of {}", where,
                            md_.DescribeStorageKey(*prev)));
      }
      if (std::optional<SafetensorsHeader> h =
              SafetensorsBlobAt(file->get(), *s, where);
          h.has_value()) {
        // SAFETENSORS format: the file's tensor chunks share the offset
        // of its safetensors blob, which ends after its last tensor.
        blob = std::move(h);
        blob_offset = s->offset;
        prev_end = blob->data_start;
        for (const auto& [name, t] : blob->tensors)
          prev_end = std::max(prev_end, t.end);
        prev = s;
        CheckSafetensorsChunk(*blob, *s, where);
        continue;
      }
      prev_end = s->offset + s->length;
      prev = s;
      report_.payload_bytes += s->length;
      CheckPayload(file->get(), *s, where);
    }
    uint64_t size = (*file)->Size();
    if (prev_end < size) {
      report_.notes.push_back(
          fmt::format("{}: {} trailing bytes after the last payload", rel,
                      size - prev_end));
    }
    return true;
  }

  // Data files that nothing references (e.g. from an earlier, larger save).
  void NoteUnreferencedFiles(
      const absl::flat_hash_set<std::string_view>& referenced) {
    auto names = options_.env->ListDir(dir_);
    if (!names.ok()) return;
    for (const auto& n : *names) {
      if (n.size() > 7 && n.substr(n.size() - 7) == ".distcp" &&
          !referenced.contains(std::string_view(n))) {
        report_.notes.push_back(
            fmt::format("{}: not referenced by .metadata", n));
      }
    }
  }

  // The header of the safetensors blob where tensor chunk `s` is stored,
  // if its payload is one (nullopt: an archive, or a bad header reported).
  std::optional<SafetensorsHeader> SafetensorsBlobAt(
      const RandomAccessFile* file, const Storage& s,
      const std::string& where) {
    if (s.transforms != CompactMetadata::kNone || s.item >= md_.num_items() ||
        !md_.item(s.item).tensor || file->Size() - s.offset < 8) {
      return std::nullopt;
    }
    char head[8];
    if (!file->ReadExact(s.offset, 8, head).ok() ||
        std::memcmp(head, "PK\x03\x04", 4) == 0 ||
        !LooksLikeSafetensors(head, file->Size() - s.offset)) {
      return std::nullopt;
    }
    absl::StatusOr<SafetensorsHeader> h = ReadSafetensorsHeader(file, s.offset);
    if (!h.ok()) {
      Problem(fmt::format("{}: {}", where, h.status().message()));
      return std::nullopt;
    }
    return *std::move(h);
  }

  // Tensor chunk `s` in a safetensors blob: its tensor is there, with the
  // chunk's dtype and shape (safetensors carries no checksum).
  void CheckSafetensorsChunk(const SafetensorsHeader& blob, const Storage& s,
                             const std::string& where) {
    const std::string fqn(md_.str(s.fqn));
    auto t = blob.tensors.find(fqn);
    if (t == blob.tensors.end()) {
      Problem(fmt::format("{}: the safetensors blob has no tensor '{}'", where,
                          fqn));
      return;
    }
    report_.payload_bytes += t->second.end - t->second.begin;
    const DType dtype = md_.item(s.item).properties.dtype;
    if (t->second.dtype != dtype) {
      Problem(fmt::format("{}: safetensors dtype {} but .metadata says {}",
                          where, DTypeName(t->second.dtype), DTypeName(dtype)));
    }
    if (s.chunk != CompactMetadata::kNone) {
      const auto sizes = md_.chunk_sizes(s.item, s.chunk);
      if (!std::equal(t->second.shape.begin(), t->second.shape.end(),
                      sizes.begin(), sizes.end())) {
        Problem(fmt::format(
            "{}: safetensors shape {} but the chunk is {}", where,
            DescribeBox(std::vector<int64_t>(t->second.shape.size(), 0),
                        t->second.shape),
            DescribeBox(md_.chunk_offsets(s.item, s.chunk), sizes)));
      }
    }
  }

  void CheckPayload(const RandomAccessFile* file, const Storage& s,
                    const std::string& where) {
    // A transformed (zstd) payload is decoded, then checked like any other.
    absl::StatusOr<DecodedPayload> payload =
        s.transforms == CompactMetadata::kNone
            ? DecodePayload(file, s.offset, s.length, {}, 0, where)
            : DecodePayload(
                  file, s.offset, s.length, md_.transform_descriptors(s),
                  MaxDecodedPayload(md_, s), md_.DescribeStorageKey(s));
    if (!payload.ok()) {
      Problem(fmt::format("{}: {}", where, payload.status().message()));
      return;
    }
    if (payload->owned != nullptr) report_.decoded_bytes += payload->length;
    auto archive =
        ZipArchiveReader::Open(payload->file, payload->offset, payload->length);
    if (!archive.ok()) {
      Problem(fmt::format("{}: {}", where, archive.status().message()));
      return;
    }
    if (options_.check_crc) {
      for (const ZipEntry& e : (*archive)->entries()) {
        if (absl::Status st = (*archive)->VerifyCrc(e); !st.ok()) {
          Problem(fmt::format("{}: {}", where, st.message()));
          return;
        }
        report_.crc_bytes += e.size;
      }
    }
    const std::optional<size_t> item = md_.FindItem(md_.str(s.fqn));
    if (!item.has_value()) return;
    if (md_.item(*item).tensor) {
      auto rec = ParseTensorPayload(**archive);
      if (!rec.ok()) {
        Problem(fmt::format("{}: {}", where, rec.status().message()));
        return;
      }
      const DType dtype = md_.item(*item).properties.dtype;
      if (rec->dtype != dtype) {
        Problem(fmt::format("{}: payload dtype {} but .metadata says {}", where,
                            DTypeName(rec->dtype), DTypeName(dtype)));
      }
      // The chunk the key names (resolved when the metadata was read).
      if (s.item == *item && s.chunk != CompactMetadata::kNone) {
        const auto sizes = md_.chunk_sizes(*item, s.chunk);
        if (!std::equal(rec->sizes.begin(), rec->sizes.end(), sizes.begin(),
                        sizes.end())) {
          Problem(fmt::format(
              "{}: payload shape {} but the chunk is {}", where,
              DescribeBox(std::vector<int64_t>(rec->sizes.size(), 0),
                          rec->sizes),
              DescribeBox(md_.chunk_offsets(*item, s.chunk), sizes)));
        }
      }
      return;
    }
    // Bytes item: data.pkl must parse and reference only allowlisted
    // globals (the CRCs were checked above).
    const std::string fqn(md_.str(s.fqn));
    absl::StatusOr<BytesItemCheck> check =
        CheckBytesItem(**archive, fqn, /*check_crc=*/false);
    if (!check.ok()) {
      Problem(fmt::format("{}: {}", where, check.status().message()));
      return;
    }
    for (const std::string& full : check->unsafe_globals) {
      std::string msg = fmt::format(
          "{}: bytes item '{}' references the global {} (outside the allowlist "
          "of README \"Security model\"): loading it with a full unpickler "
          "could run code",
          where, fqn, full);
      if (options_.allow_unsafe_globals) {
        report_.notes.push_back(std::move(msg));
      } else {
        Problem(std::move(msg));
      }
    }
  }

  const std::string dir_;
  const VerifyOptions options_;
  CompactMetadata md_;
  VerifyReport report_;
};

// One flat list: "module.name" of every allowed global.
const absl::flat_hash_set<std::string_view>& SafeGlobals() {
  static const auto* const kSet = new absl::flat_hash_set<std::string_view>{
      // torch 1.13 weights_only
      "collections.OrderedDict", "torch.nn.parameter.Parameter",
      "torch.serialization._get_layout", "torch.Size", "torch.Tensor",
      "torch._utils._rebuild_parameter", "torch._utils._rebuild_tensor",
      "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_sparse_tensor",
      "torch._utils._rebuild_meta_tensor_no_storage",
      "torch._utils._rebuild_sparse_csr_tensor",
      // torch 2.x tensors
      "torch._utils._rebuild_tensor_v3",
      "torch._utils._rebuild_parameter_with_state",
      "torch._utils._rebuild_wrapper_subclass",
      "torch._utils._rebuild_device_tensor_from_numpy",
      "torch._utils._rebuild_qtensor", "torch._utils._rebuild_nested_tensor",
      "torch._tensor._rebuild_from_type", "torch._tensor._rebuild_from_type_v2",
      "torch.storage.UntypedStorage", "torch.storage.TypedStorage",
      "torch.UntypedStorage", "torch.TypedStorage", "torch.device",
      // plain values
      "builtins.set", "builtins.frozenset", "builtins.complex",
      "builtins.slice", "builtins.range", "builtins.bytes",
      "builtins.bytearray", "builtins.list", "builtins.dict", "builtins.tuple",
      "builtins.int", "builtins.float", "builtins.str", "builtins.bool",
      "_codecs.encode", "collections.defaultdict", "collections.Counter",
      // numpy
      "numpy.core.multiarray._reconstruct", "numpy.core.multiarray.scalar",
      "numpy._core.multiarray._reconstruct", "numpy._core.multiarray.scalar",
      "numpy.ndarray", "numpy.dtype", "numpy.random._pickle.__randomstate_ctor",
      "numpy.random._pickle.__generator_ctor",
      "numpy.random._pickle.__bit_generator_ctor"};
  return *kSet;
}

// torch.<name> values that are constants (dtypes, layouts, memory formats,
// qschemes), as the Python side allows them by type.
const absl::flat_hash_set<std::string_view>& TorchConstants() {
  static const auto* const kSet = new absl::flat_hash_set<std::string_view>{
      "float32",
      "float",
      "float64",
      "double",
      "float16",
      "half",
      "bfloat16",
      "complex32",
      "chalf",
      "complex64",
      "cfloat",
      "complex128",
      "cdouble",
      "uint8",
      "int8",
      "int16",
      "short",
      "int32",
      "int",
      "int64",
      "long",
      "bool",
      "uint16",
      "uint32",
      "uint64",
      "qint8",
      "quint8",
      "qint32",
      "quint4x2",
      "quint2x4",
      "float8_e4m3fn",
      "float8_e5m2",
      "float8_e4m3fnuz",
      "float8_e5m2fnuz",
      "float8_e8m0fnu",
      "float4_e2m1fn_x2",
      "bits1x8",
      "bits2x4",
      "bits4x2",
      "bits8",
      "bits16",
      "strided",
      "sparse_coo",
      "sparse_csr",
      "sparse_csc",
      "sparse_bsr",
      "sparse_bsc",
      "jagged",
      "contiguous_format",
      "channels_last",
      "channels_last_3d",
      "preserve_format",
      "per_tensor_affine",
      "per_channel_affine",
      "per_tensor_symmetric",
      "per_channel_symmetric",
      "per_channel_affine_float_qparams"};
  return *kSet;
}

bool IsIdentifier(std::string_view s) {
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

bool IsAllowedPickleGlobal(std::string_view module, std::string_view name) {
  if (module == "__builtin__") module = "builtins";  // protocol 2 from Python 3
  const std::string full = fmt::format("{}.{}", module, name);
  if (SafeGlobals().contains(full)) return true;
  if (module == "torch") {
    if (TorchConstants().contains(name)) return true;
    // Legacy tensor and storage classes: torch.FloatTensor, torch.ByteStorage,
    // ...
    return IsIdentifier(name) && name[0] != '_' &&
           (EndsWith(name, "Tensor") || EndsWith(name, "Storage"));
  }
  // numpy >= 1.25 pickles dtypes through their classes.
  return module == "numpy.dtypes" && IsIdentifier(name) &&
         EndsWith(name, "DType");
}

absl::StatusOr<VerifyReport> VerifyCheckpoint(const std::string& dir,
                                              const VerifyOptions& options) {
  if (absl::Status s = options.env->FileExists(dir); !s.ok()) return s;
  return Verifier(dir, options).Run();
}

}  // namespace ckptd::format
