// Copyright 2026 The ckptd Authors.
//
// One tensor as a torch.save archive (dcp-format.md §2.1): building the
// archive for a (possibly strided) tensor, and parsing an archive written by
// torch.save / by us back into a description of its storage and view.
#ifndef CKPTD_FORMAT_TENSOR_TENSOR_PAYLOAD_H_
#define CKPTD_FORMAT_TENSOR_TENSOR_PAYLOAD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/tensor/dtype.h"
#include "format/pickle/pickle.h"
#include "format/zip/zip.h"

namespace ckptd::format {

// A dense strided view of host memory. `data` points at element [0, ..., 0];
// strides are in elements and may be any non-negative values (a transposed
// or sliced view), sizes may contain 0, and a 0-d tensor has empty sizes.
struct TensorView {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // empty: C-contiguous
  const char* data = nullptr;

  int64_t numel() const;
  uint64_t nbytes() const {
    return static_cast<uint64_t>(numel()) * ElementSize(dtype);
  }
  // True if strides are empty or equal the C-contiguous strides (dims of
  // size 1 may have any stride).
  bool is_contiguous() const;
};

// C-contiguous strides (in elements) for `sizes`.
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& sizes);

// Adds the records of torch.save(tensor) to `builder`, in the order
// data.pkl, byteorder ("little"), data/0, version ("3\n"). The pickle is
// protocol 2, _rebuild_tensor_v2 with the legacy storage class for the twelve
// legacy dtypes and _rebuild_tensor_v3 with UntypedStorage otherwise; storage
// offset 0; C-contiguous strides; requires_grad False; OrderedDict() hooks.
//
// A contiguous `view` is referenced, not copied (it must outlive the
// builder's use). A non-contiguous one is gathered into `*scratch` (resized
// to nbytes()) first, which must also outlive that use.
void AddTensorRecords(const TensorView& view, ZipArchiveBuilder* builder,
                      std::string* scratch);

// The records of a torch.save(tensor) archive, in the order AddTensorRecords
// adds them, for writers that stream the payload (the daemon):
//   "data.pkl" = TensorDataPickle(dtype, sizes), "byteorder" = "little",
//   "data/0" = the C-order payload, "version" = "3\n".
std::string TensorDataPickle(DType dtype, const std::vector<int64_t>& sizes);

// Emits (without PROTO/STOP) the pickle call torch.save writes for a
// C-contiguous CPU tensor whose storage is the record data/<key>:
// _rebuild_tensor_v2 with the legacy storage class, or _rebuild_tensor_v3
// with UntypedStorage and the dtype for the newer dtypes.
void WriteTensorRebuild(pickle::Writer* w, DType dtype, std::string_view key,
                        const std::vector<int64_t>& sizes);

// A tensor payload as described by its data.pkl.
struct TensorRecord {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // elements
  int64_t storage_offset = 0;    // elements
  std::string storage_key;       // "0"
  uint64_t storage_nbytes =
      0;                    // from the persistent id (numel*elsize or bytes)
  bool big_endian = false;  // byteorder record == "big"
  const ZipEntry* entry = nullptr;  // archive/data/<key>, owned by the reader
};

struct TensorPayloadOptions {
  // data.pkl larger than this is rejected.
  uint64_t max_pickle_bytes = uint64_t{16} << 20;
};

// Parses data.pkl of a torch.save(tensor) archive: _rebuild_tensor_v2 (6 or
// 7 args) or _rebuild_tensor_v3 with a persistent id
// ('storage', torch.<X>Storage | torch.UntypedStorage, key, location, numel).
// Checks that the view (offset, sizes, strides) lies inside the storage and
// that the storage record exists with at least storage_nbytes bytes.
absl::StatusOr<TensorRecord> ParseTensorPayload(
    const ZipArchiveReader& archive, const TensorPayloadOptions& options = {});

// True for a tensor inside a pickled object: a _rebuild_tensor_v2/v3 call,
// or a _rebuild_parameter(_with_state) around one (nn.Parameter).
bool IsTensorValue(const pickle::Value& v);

// The tensor `v` (IsTensorValue) of a torch.save archive holding a larger
// object (a state dict): its storage record in `archive`, view checked as
// ParseTensorPayload does. `big_endian`: the archive's byteorder record
// said "big". `where` names the value in errors ("model.w").
absl::StatusOr<TensorRecord> ParseTensorValue(const ZipArchiveReader& archive,
                                              const pickle::Value& v,
                                              bool big_endian,
                                              std::string_view where);

// Reads (at most max_bytes) and parses data.pkl of any torch.save archive —
// the pickled object of a DCP bytes item. `what` names the item in errors
// ("<file> @ <offset> (step): ..."). The allocation limit scales with the
// pickle's size (64 bytes of values per byte, at least 64 MiB).
absl::StatusOr<std::unique_ptr<pickle::PickleDocument>> ParseArchivePickle(
    const ZipArchiveReader& archive, uint64_t max_bytes, std::string_view what);

}  // namespace ckptd::format

#endif  // CKPTD_FORMAT_TENSOR_TENSOR_PAYLOAD_H_
