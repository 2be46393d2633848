// Copyright 2026 The ckptd Authors.
#include "format/tensor/tensor_payload.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/base/internal/raw_logging.h"
#include "absl/status/status.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "format/tensor/strided_copy.h"
#include "format/tensor/tensor_record_writer.h"

namespace ckptd::format {

static_assert(std::endian::native == std::endian::little,
              "the payload writer labels data as little-endian");

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool TensorView::is_contiguous() const { return IsCContiguous(sizes, strides); }

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t k = sizes.size(); k-- > 0;) {
    strides[k] = s;
    // Like torch: a 0-size dimension counts as 1 for the outer strides.
    s *= std::max<int64_t>(sizes[k], 1);
  }
  return strides;
}

void WriteTensorRebuild(pickle::Writer* w, DType dtype, std::string_view key,
                        const std::vector<int64_t>& sizes) {
  const std::optional<std::string_view> legacy = LegacyStorageClass(dtype);
  int64_t numel = 1;
  for (int64_t s : sizes) numel *= s;
  w->Global("torch._utils",
            legacy ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
  w->Mark();
  w->Mark();  // persistent id
  w->String("storage");
  // As torch.save writes them: legacy classes live in `torch`, the untyped
  // storage class in `torch.storage` (the name the weights-only unpickler
  // of torch 2.x allow-lists; `torch UntypedStorage` is refused there).
  if (legacy) {
    w->Global("torch", *legacy);
  } else {
    w->Global("torch.storage", "UntypedStorage");
  }
  w->String(key);
  w->String("cpu");
  w->Int(legacy ? numel : numel * static_cast<int64_t>(ElementSize(dtype)));
  w->Tuple();
  w->BinPersId();
  w->Int(0);  // storage_offset
  w->IntTuple(sizes);
  w->IntTuple(ContiguousStrides(sizes));
  w->NewFalse();  // requires_grad
  w->Global("collections", "OrderedDict");
  w->EmptyTuple();
  w->Reduce();  // backward_hooks
  if (!legacy) w->Global("torch", DTypeName(dtype));
  w->Tuple();
  w->Reduce();
}

std::string TensorDataPickle(DType dtype, const std::vector<int64_t>& sizes) {
  // The program torch.save emits (dcp-format.md §2.1), no memo.
  std::string pkl;
  pkl.reserve(256);
  pickle::Writer w(&pkl);
  w.Proto(2);
  WriteTensorRebuild(&w, dtype, "0", sizes);
  w.Stop();
  return pkl;
}

void AddTensorRecords(const TensorView& view, ZipArchiveBuilder* builder,
                      std::string* scratch) {
  ABSL_RAW_CHECK(
      view.strides.empty() || view.strides.size() == view.sizes.size(),
      "TensorView: strides and sizes differ in length");
  for (size_t k = 0; k < view.sizes.size(); ++k) {
    ABSL_RAW_CHECK(view.sizes[k] >= 0, "TensorView: negative size");
    ABSL_RAW_CHECK(view.strides.empty() || view.strides[k] >= 0,
                   "TensorView: negative stride");
  }
  const uint64_t nbytes = view.nbytes();

  BeginTorchSaveRecords(builder, TensorDataPickle(view.dtype, view.sizes));
  std::string_view data;
  if (view.is_contiguous() || nbytes == 0) {
    data = std::string_view(view.data, nbytes);
  } else {
    scratch->resize(nbytes);
    StridedCopy(ElementSize(view.dtype), view.sizes, view.data, view.strides,
                scratch->data(), ContiguousStrides(view.sizes));
    data = *scratch;
  }
  AddTorchSaveStorage(builder, "0", absl::MakeConstSpan(&data, 1));
  FinishTorchSaveRecords(builder);
}

namespace {

constexpr int kMaxDims = 64;

// "int", "tuple", ...; globals with their name.
std::string Kind(const pickle::Value& v) {
  if (v.kind == pickle::Value::Kind::kGlobal) {
    return fmt::format("global {}.{}", v.module, v.name);
  }
  return std::string(pickle::KindName(v.kind));
}

// Parses the decimal version record ("3\n"), as stoull would.
bool ParseVersion(std::string_view s, uint64_t* out) {
  size_t i = 0;
  while (i < s.size() &&
         (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r')) {
    ++i;
  }
  uint64_t v = 0;
  size_t digits = 0;
  for (; i < s.size() && s[i] >= '0' && s[i] <= '9' && digits < 6;
       ++i, ++digits) {
    v = v * 10 + static_cast<uint64_t>(s[i] - '0');
  }
  if (digits == 0) return false;
  for (; i < s.size(); ++i) {
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n' && s[i] != '\r') {
      return false;
    }
  }
  *out = v;
  return true;
}

class PayloadParser {
 public:
  PayloadParser(const ZipArchiveReader& archive,
                const TensorPayloadOptions& options)
      : archive_(archive), options_(options) {}

  absl::StatusOr<TensorRecord> Parse();
  // The tensor `root` (a _rebuild_tensor_v2/v3 call) of this archive.
  absl::StatusOr<TensorRecord> FromValue(const pickle::Value& root,
                                         bool big_endian);
  void set_where(std::string where) { where_ = std::move(where); }

 private:
  absl::Status Error(std::string_view what) const {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}: {}", archive_.Describe(), where_, what));
  }
  // An int tuple/list, or a torch.Size(tuple) object.
  absl::StatusOr<std::vector<int64_t>> IntTuple(const pickle::Value& v,
                                                std::string_view field) const;

  // A _rebuild_tensor_v2/v3 call and its arguments (none null).
  struct RebuildCall {
    bool v3 = false;
    const char* fn = nullptr;  // "_rebuild_tensor_v3" or "_rebuild_tensor_v2"
    const std::vector<const pickle::Value*>* args = nullptr;
  };
  absl::StatusOr<RebuildCall> Rebuild(const pickle::Value& root) const;
  // What the persistent id ('storage', storage class, key, location, numel)
  // says of the storage.
  struct StorageId {
    std::string key;
    DType dtype = DType::kUInt8;  // of its elements (UntypedStorage: bytes)
    uint64_t numel = 0;
  };
  absl::StatusOr<StorageId> PersistentId(const pickle::Value& pers,
                                         const char* fn) const;
  // The dtype argument of _rebuild_tensor_v3 (a torch.<dtype> global).
  absl::StatusOr<DType> TensorDtype(const pickle::Value& dt,
                                    const char* fn) const;
  // The view of the call's arguments (storage_offset, size, stride) into
  // *rec.
  absl::Status View(const RebuildCall& call, TensorRecord* rec) const;
  // INVALID_ARGUMENT unless rec's view lies inside its storage.
  absl::Status CheckViewInStorage(const TensorRecord& rec) const;
  // rec's storage record (data/<key>), checked to hold the whole storage.
  absl::Status FindStorageRecord(const StorageId& id, TensorRecord* rec) const;

  const ZipArchiveReader& archive_;
  const TensorPayloadOptions& options_;
  std::string where_ = "data.pkl";
};

absl::StatusOr<std::vector<int64_t>> PayloadParser::IntTuple(
    const pickle::Value& v, std::string_view field) const {
  const pickle::Value* t = &v;
  if (v.kind == pickle::Value::Kind::kObject && v.IsCallTo("torch", "Size") &&
      v.args != nullptr && v.args->kind == pickle::Value::Kind::kTuple &&
      v.args->items.size() == 1 && v.args->items[0] != nullptr) {
    t = v.args->items[0];
  }
  if (t->kind != pickle::Value::Kind::kTuple &&
      t->kind != pickle::Value::Kind::kList) {
    return Error(
        fmt::format("{}: expected a tuple of ints, got {}", field, Kind(*t)));
  }
  if (t->items.size() > kMaxDims) {
    return Error(fmt::format("{}: {} dimensions (at most {} supported)", field,
                             t->items.size(), kMaxDims));
  }
  std::vector<int64_t> out;
  out.reserve(t->items.size());
  for (size_t i = 0; i < t->items.size(); ++i) {
    const pickle::Value* item = t->items[i];
    if (item == nullptr || item->kind != pickle::Value::Kind::kInt) {
      return Error(fmt::format("{}[{}]: expected int, got {}", field, i,
                               item ? Kind(*item) : "null"));
    }
    if (item->i < 0) {
      return Error(fmt::format("{}[{}]: negative value {}", field, i, item->i));
    }
    out.push_back(item->i);
  }
  return out;
}

absl::StatusOr<TensorRecord> PayloadParser::Parse() {
  const std::string desc = archive_.Describe();
  const std::string& prefix = archive_.prefix();

  // Records: version (required), byteorder (optional), data.pkl.
  const ZipEntry* version = archive_.Find("version");
  if (version == nullptr) version = archive_.Find(".data/version");
  if (version == nullptr) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: missing record '{}/version' (not a torch.save archive)", desc,
        prefix));
  }
  {
    ASSIGN_OR_RETURN(const std::string text, archive_.ReadRecord(*version, 64));
    uint64_t v = 0;
    if (!ParseVersion(text, &v) || v < 1 || v > 10) {
      return absl::InvalidArgumentError(fmt::format(
          "{}: record '{}': unsupported version '{}' (expected 1..10)", desc,
          version->name, text.substr(0, 16)));
    }
  }
  bool big_endian = false;
  if (const ZipEntry* bo = archive_.Find("byteorder"); bo != nullptr) {
    ASSIGN_OR_RETURN(const std::string text, archive_.ReadRecord(*bo, 64));
    if (text == "big") {
      big_endian = true;
    } else if (text != "little") {
      return absl::InvalidArgumentError(fmt::format(
          "{}: record '{}': byteorder must be 'little' or 'big', got '{}'",
          desc, bo->name, text.substr(0, 16)));
    }
  }
  const ZipEntry* pkl_entry = archive_.Find("data.pkl");
  if (pkl_entry == nullptr) {
    return absl::InvalidArgumentError(
        fmt::format("{}: missing record '{}/data.pkl'", desc, prefix));
  }
  where_ = pkl_entry->name;
  ASSIGN_OR_RETURN(const std::string pkl,
                   archive_.ReadRecord(*pkl_entry, options_.max_pickle_bytes));
  pickle::ReaderOptions ropts;
  ropts.source_name = fmt::format("{}: {}", desc, pkl_entry->name);
  // A tensor's data.pkl is ~200 bytes; bound what a hostile one can allocate.
  ropts.max_alloc_bytes = (uint64_t{1} << 20) + 256 * uint64_t{pkl.size()};
  ropts.max_string_bytes = pkl.size();
  ropts.max_memo_entries = pkl.size() + 16;
  ropts.max_stack_depth = 1 << 16;
  ASSIGN_OR_RETURN(std::unique_ptr<pickle::PickleDocument> doc,
                   pickle::Parse(pkl, ropts));
  return FromValue(doc->root(), big_endian);
}

absl::StatusOr<TensorRecord> PayloadParser::FromValue(const pickle::Value& root,
                                                      bool big_endian) {
  ASSIGN_OR_RETURN(const RebuildCall call, Rebuild(root));
  const auto& args = *call.args;
  ASSIGN_OR_RETURN(const StorageId id, PersistentId(*args[0], call.fn));
  TensorRecord rec;
  rec.big_endian = big_endian;
  rec.storage_key = id.key;
  rec.dtype = id.dtype;
  if (call.v3) {
    ASSIGN_OR_RETURN(rec.dtype, TensorDtype(*args[6], call.fn));
  }
  if (__builtin_mul_overflow(id.numel, ElementSize(id.dtype),
                             &rec.storage_nbytes)) {
    return Error(fmt::format("storage: numel {} overflows", id.numel));
  }
  RETURN_IF_ERROR(View(call, &rec));
  RETURN_IF_ERROR(CheckViewInStorage(rec));
  RETURN_IF_ERROR(FindStorageRecord(id, &rec));
  return rec;
}

absl::StatusOr<PayloadParser::RebuildCall> PayloadParser::Rebuild(
    const pickle::Value& root) const {
  using K = pickle::Value::Kind;
  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks
  //                    [, metadata])
  // _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, hooks,
  //                    dtype)
  RebuildCall call;
  if (root.kind == K::kObject &&
      root.IsCallTo("torch._utils", "_rebuild_tensor_v2")) {
    call.v3 = false;
  } else if (root.kind == K::kObject &&
             root.IsCallTo("torch._utils", "_rebuild_tensor_v3")) {
    call.v3 = true;
  } else {
    return Error(fmt::format(
        "expected a call to torch._utils._rebuild_tensor_v2/v3 (a tensor), "
        "got {}",
        pickle::DebugString(root, 3, 200)));
  }
  const bool v3 = call.v3;
  const char* fn = v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2";
  call.fn = fn;
  if (root.args == nullptr || root.args->kind != K::kTuple) {
    return Error(fmt::format("{}: arguments are not a tuple", fn));
  }
  const auto& args = root.args->items;
  if (v3 ? args.size() != 7 : (args.size() != 6 && args.size() != 7)) {
    return Error(fmt::format("{}: {} arguments (expected {})", fn, args.size(),
                             v3 ? "7" : "6 or 7"));
  }
  for (const pickle::Value* a : args) {
    if (a == nullptr) return Error(fmt::format("{}: null argument", fn));
  }
  call.args = &args;
  return call;
}

absl::StatusOr<PayloadParser::StorageId> PayloadParser::PersistentId(
    const pickle::Value& pers, const char* fn) const {
  using K = pickle::Value::Kind;
  if (pers.kind != K::kPersId || pers.pid == nullptr) {
    return Error(fmt::format("{}: storage: expected a persistent id, got {}",
                             fn, Kind(pers)));
  }
  const pickle::Value& pid = *pers.pid;
  if (pid.kind != K::kTuple || pid.items.size() != 5) {
    return Error(fmt::format(
        "storage: persistent id must be a 5-tuple ('storage', class, key, "
        "location, numel), got {}",
        pickle::DebugString(pid, 3, 200)));
  }
  for (const pickle::Value* a : pid.items) {
    if (a == nullptr) return Error("storage: null persistent id field");
  }
  if (pid.items[0]->kind != K::kString || pid.items[0]->str != "storage") {
    return Error(
        fmt::format("storage: persistent id tag must be 'storage', "
                    "got {}",
                    pickle::DebugString(*pid.items[0], 2, 100)));
  }
  const pickle::Value& cls = *pid.items[1];
  // torch.save writes `torch.storage UntypedStorage` (the class's module);
  // `torch UntypedStorage` names the same class and is accepted too.
  const bool untyped = cls.kind == K::kGlobal && cls.name == "UntypedStorage" &&
                       (cls.module == "torch" || cls.module == "torch.storage");
  if (cls.kind != K::kGlobal || (cls.module != "torch" && !untyped)) {
    return Error(fmt::format("storage: expected a torch storage class, got {}",
                             pickle::DebugString(cls, 2, 100)));
  }
  StorageId id;
  const pickle::Value& key = *pid.items[2];
  if (key.kind == K::kString) {
    id.key = key.str;
  } else if (key.kind == K::kInt) {
    id.key = std::to_string(key.i);
  } else {
    return Error(fmt::format("storage: key must be a str, got {}", Kind(key)));
  }
  const pickle::Value& numel_v = *pid.items[4];
  if (numel_v.kind != K::kInt || numel_v.i < 0) {
    return Error(
        fmt::format("storage: numel must be a non-negative int, got {}",
                    pickle::DebugString(numel_v, 2, 100)));
  }
  id.numel = static_cast<uint64_t>(numel_v.i);

  // Storage element type: legacy typed class, or bytes (UntypedStorage).
  if (untyped) {
    id.dtype = DType::kUInt8;
  } else {
    absl::StatusOr<DType> d = DTypeFromStorageClass(cls.name);
    if (!d.ok())
      return Error(
          fmt::format("storage: {}", std::string(d.status().message())));
    id.dtype = *d;
  }
  return id;
}

absl::StatusOr<DType> PayloadParser::TensorDtype(const pickle::Value& dt,
                                                 const char* fn) const {
  if (dt.kind != pickle::Value::Kind::kGlobal || dt.module != "torch") {
    return Error(fmt::format("{}: dtype: expected a torch dtype global, got {}",
                             fn, pickle::DebugString(dt, 2, 100)));
  }
  absl::StatusOr<DType> d = DTypeFromName(dt.name);
  if (!d.ok())
    return Error(fmt::format("dtype: {}", std::string(d.status().message())));
  return *d;
}

absl::Status PayloadParser::View(const RebuildCall& call,
                                 TensorRecord* rec) const {
  const auto& args = *call.args;
  if (args[1]->kind != pickle::Value::Kind::kInt || args[1]->i < 0) {
    return Error(
        fmt::format("storage_offset: expected a non-negative int, "
                    "got {}",
                    pickle::DebugString(*args[1], 2, 100)));
  }
  rec->storage_offset = args[1]->i;
  ASSIGN_OR_RETURN(rec->sizes, IntTuple(*args[2], "size"));
  ASSIGN_OR_RETURN(rec->strides, IntTuple(*args[3], "stride"));
  if (rec->sizes.size() != rec->strides.size()) {
    return Error(fmt::format("size has {} dimensions but stride has {}",
                             rec->sizes.size(), rec->strides.size()));
  }
  return absl::OkStatus();
}

absl::Status PayloadParser::CheckViewInStorage(const TensorRecord& rec) const {
  // For a non-empty view, the last element (offset + sum((size - 1) *
  // stride)) ends within storage_nbytes. An empty view needs no storage
  // (like at::detail::computeStorageNbytes).
  const uint64_t esize = ElementSize(rec.dtype);
  bool empty = false;
  for (int64_t s : rec.sizes) empty = empty || s == 0;
  uint64_t numel = 1;
  for (int64_t s : rec.sizes) {
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(s), &numel)) {
      return Error("size: element count overflows");
    }
  }
  if (empty) return absl::OkStatus();
  uint64_t last = static_cast<uint64_t>(rec.storage_offset);
  for (size_t k = 0; k < rec.sizes.size(); ++k) {
    uint64_t span;
    if (__builtin_mul_overflow(static_cast<uint64_t>(rec.sizes[k] - 1),
                               static_cast<uint64_t>(rec.strides[k]), &span) ||
        __builtin_add_overflow(last, span, &last)) {
      return Error("view extent overflows");
    }
  }
  uint64_t end;
  if (__builtin_add_overflow(last, 1, &end) ||
      __builtin_mul_overflow(end, esize, &end) || end > rec.storage_nbytes) {
    return Error(fmt::format(
        "view (offset {}, size ({}), stride ({})) of {} elements of {} bytes "
        "extends past its storage of {} bytes",
        rec.storage_offset, fmt::join(rec.sizes, ", "),
        fmt::join(rec.strides, ", "), numel, esize, rec.storage_nbytes));
  }
  return absl::OkStatus();
}

absl::Status PayloadParser::FindStorageRecord(const StorageId& id,
                                              TensorRecord* rec) const {
  const std::string record_name = "data/" + rec->storage_key;
  rec->entry = archive_.Find(record_name);
  if (rec->entry == nullptr) {
    return Error(fmt::format("storage record '{}/{}' is missing",
                             archive_.prefix(), record_name));
  }
  if (rec->entry->size < rec->storage_nbytes) {
    return Error(fmt::format(
        "storage record '{}' has {} bytes, its persistent id needs {} ({} x "
        "{} bytes)",
        rec->entry->name, rec->entry->size, rec->storage_nbytes, id.numel,
        ElementSize(id.dtype)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TensorRecord> ParseTensorPayload(
    const ZipArchiveReader& archive, const TensorPayloadOptions& options) {
  return PayloadParser(archive, options).Parse();
}

bool IsTensorValue(const pickle::Value& v) {
  return v.kind == pickle::Value::Kind::kObject &&
         (v.IsCallTo("torch._utils", "_rebuild_tensor_v2") ||
          v.IsCallTo("torch._utils", "_rebuild_tensor_v3") ||
          v.IsCallTo("torch._utils", "_rebuild_parameter") ||
          v.IsCallTo("torch._utils", "_rebuild_parameter_with_state"));
}

absl::StatusOr<TensorRecord> ParseTensorValue(const ZipArchiveReader& archive,
                                              const pickle::Value& v,
                                              bool big_endian,
                                              std::string_view where) {
  const pickle::Value* t = &v;
  if (v.kind == pickle::Value::Kind::kObject &&
      (v.IsCallTo("torch._utils", "_rebuild_parameter") ||
       v.IsCallTo("torch._utils", "_rebuild_parameter_with_state")) &&
      v.args != nullptr && v.args->kind == pickle::Value::Kind::kTuple &&
      !v.args->items.empty() && v.args->items[0] != nullptr) {
    t = v.args->items[0];  // Parameter(tensor, requires_grad, hooks[, state])
  }
  static const TensorPayloadOptions kOptions;
  PayloadParser parser(archive, kOptions);
  parser.set_where(std::string(where));
  return parser.FromValue(*t, big_endian);
}

absl::StatusOr<std::unique_ptr<pickle::PickleDocument>> ParseArchivePickle(
    const ZipArchiveReader& archive, uint64_t max_bytes,
    std::string_view what) {
  const ZipEntry* pkl = archive.Find("data.pkl");
  if (pkl == nullptr) {
    return absl::DataLossError(fmt::format("{} ({}): archive has no data.pkl",
                                           archive.Describe(), what));
  }
  ASSIGN_OR_RETURN(std::string bytes, archive.ReadRecord(*pkl, max_bytes));
  pickle::ReaderOptions popts;
  popts.source_name =
      fmt::format("{} ({}): data.pkl", archive.Describe(), what);
  popts.max_alloc_bytes =
      std::max<uint64_t>(uint64_t{64} << 20, bytes.size() * 64);
  return pickle::Parse(bytes, popts);
}

}  // namespace ckptd::format
