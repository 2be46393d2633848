// Copyright 2026 The ckptd Authors.
//
// Internal to the streaming `.metadata` decoder: the DCP schema over the
// VM's values (metadata_vm.h). Two uses of the same code:
//  * Fold(): when the VM moves an unshared object off its stack, the
//    object is decoded as the class its callable names and, if that
//    succeeds using nothing that could still change, replaced by its
//    folded form;
//  * Decode(): at STOP, the schema walk of the old decoder
//    (metadata_generic_decode.cc), field by field and in the same order,
//    over folded and generic values alike, filling the builder; errors name
//    the source, the path into the object graph, and the byte offset of the
//    object in the pickle where one made it.
#ifndef CKPTD_FORMAT_METADATA_METADATA_SCHEMA_H_
#define CKPTD_FORMAT_METADATA_METADATA_SCHEMA_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "fmt/format.h"
#include "format/metadata/dcp_modules.h"
#include "format/metadata/metadata_vm.h"
#include "format/metadata/schema_common.h"

namespace ckptd::format::mdvm {

// Python's type names of the old VM's kinds (pickle::KindName).
enum class K : uint8_t {
  kNone,
  kBool,
  kInt,
  kBigInt,
  kFloat,
  kString,
  kBytes,
  kTuple,
  kList,
  kDict,
  kSet,
  kGlobal,
  kObject,
  kPersId,
};

using Ints = absl::InlinedVector<int64_t, 4>;

// The items of a tuple, list or set: node items in place, or (a tuple of
// ints) made here. Not copyable: it may point into itself.
class SeqView {
 public:
  SeqView() = default;
  SeqView(const SeqView&) = delete;
  SeqView& operator=(const SeqView&) = delete;
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const Val& operator[](size_t i) const { return p_[i]; }
  const Val* begin() const { return p_; }
  const Val* end() const { return p_ + n_; }
  void Point(const Val* p, size_t n) {
    p_ = p;
    n_ = n;
  }
  // Owned items: fill owned() then call Adopt().
  absl::InlinedVector<Val, 4>& owned() { return own_; }
  void Adopt() {
    p_ = own_.data();
    n_ = own_.size();
  }

 private:
  const Val* p_ = nullptr;
  size_t n_ = 0;
  absl::InlinedVector<Val, 4> own_;
};

// The classes whose fields Schema reads, and their fields in positional
// order.
enum FieldSetId : int {
  kFsProperties,
  kFsChunk,
  kFsTensor,
  kFsIndex,
  kFsInfo,
  kFsStorageMeta,
  kFsMetadata,
  kNumFieldSets,
};

class Schema {
 public:
  explicit Schema(Vm* vm);

  // Replaces *v by its folded form if *v is an unshared DCP object that
  // decodes; otherwise leaves it.
  void Fold(Val* v);
  // The schema walk from the root into the builder.
  absl::Status Decode(const Val& root);

  K KindOf(const Val& v) const;

  // The folded value of a `cls` object (kClsChunk, kClsIndex or
  // kClsStorageInfo) whose fields, in the order of its FieldSetId, are
  // f/has (one entry per field); false where QuickFold would decline.
  bool FoldFields(int cls, const Val* f, const bool* has, Val* out);
  // Field names as string ids (compared with kStr Vals' ids).
  const uint32_t* field_ids(FieldSetId set) const { return field_ids_[set]; }
  static size_t FieldCount(FieldSetId set);

 private:
  // Interpreters. In fold mode (folding_) any error means "do not fold",
  // and reading what may still change (the contents of a shared list, dict
  // or set, the state of a shared object) is an error.
  absl::Status Error(const ObjectPath& p, std::string_view msg,
                     const Val* at = nullptr) const;
  std::string Got(const Val& v) const;
  std::string Describe(const Val& v, int max_depth, size_t max_len) const;
  bool IsCallTo(const Val& v, int cls) const;
  bool CanRead(const Val& v) const { return !folding_ || !v.shared(); }
  // Items of a tuple/list/set (a typed list is made generic first; in fold
  // mode it is an error).
  absl::Status SeqItems(const Val& v, SeqView* out, const ObjectPath& p);
  // Entries (k0, v0, k1, v1, ...) of a dict.
  absl::Status DictEntries(const Val& v, const std::vector<Val>** out,
                           const ObjectPath& p);

  // The fields of an instance of `set`'s class: positional REDUCE arguments
  // first, then the BUILD state dict (and slot-state dict) on top, as
  // CPython would; out/has have one entry per field.
  absl::Status Fields(const Val& obj, FieldSetId set, Val* out, bool* has,
                      const ObjectPath& p,
                      std::optional<Val>* tuple_state = nullptr);
  absl::Status Required(bool has, std::string_view cls, std::string_view field,
                        const ObjectPath& p) const;
  absl::StatusOr<uint32_t> String(const Val& v, const ObjectPath& p) const;
  absl::StatusOr<uint64_t> UInt(const Val& v, const ObjectPath& p) const;
  absl::StatusOr<bool> Bool(const Val& v, const ObjectPath& p) const;
  absl::Status Size(const Val& v, const ObjectPath& p, Ints* out);
  absl::StatusOr<DType> DTypeOf(const Val& v, const ObjectPath& p) const;
  absl::StatusOr<int> MemoryFormat(const Val& v, const ObjectPath& p) const;
  absl::StatusOr<TensorProperties> Properties(const Val& v,
                                              const ObjectPath& p);
  absl::Status Chunk(const Val& v, const ObjectPath& p, Ints* offsets,
                     Ints* sizes);
  absl::StatusOr<TensorRec> Tensor(const Val& v, const ObjectPath& p);
  // A tensor or bytes item of state_dict_metadata into the builder.
  absl::Status Item(uint32_t fqn, const Val& v, const ObjectPath& p);
  struct KeyData {
    uint32_t fqn = 0;
    bool has_offset = false;
    Ints offset;
    int64_t hint = -1;
  };
  absl::Status Key(const Val& v, const ObjectPath& p, KeyData* out);
  struct InfoData {
    uint32_t path = 0;
    uint64_t offset = 0, length = 0;
    std::vector<uint32_t> transforms;
  };
  absl::Status Info(const Val& v, const ObjectPath& p, InfoData* out);
  std::optional<std::string> PathLike(const Val& v);
  std::optional<StorageMeta> StorageMetaOf(const Val& v);
  std::optional<std::vector<std::pair<std::string, std::vector<PathElement>>>>
  PlannerData(const Val& v);
  absl::Status StorageData(const Val& v, const ObjectPath& p);

  // Folds of each class; false: not foldable. QuickFold handles the shapes
  // writers produce (NEWOBJ + BUILD {dict}, or REDUCE without BUILD, with
  // folded or scalar fields) without the general machinery, and declines
  // the rest (FoldObject then decides).
  bool QuickFields(const Val& obj, FieldSetId set, Val* out, bool* has) const;
  bool QuickFold(const Val& v, int cls, Val* out);
  bool FoldObject(const Val& v, int cls, Val* out);
  void FreeConsumed(const Val& v, int depth);

  Vm* vm_;
  bool folding_ = false;
  // Field names as string ids of the builder's table (compared by id).
  uint32_t field_ids_[kNumFieldSets][5];
};

}  // namespace ckptd::format::mdvm

#endif  // CKPTD_FORMAT_METADATA_METADATA_SCHEMA_H_
