// Copyright 2026 The ckptd Authors.
#include "client/restore_batches.h"

#include <algorithm>
#include <atomic>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/batching.h"
#include "common/parallel.h"
#include "format/tensor/dtype.h"
#include "format/tensor/strided_copy.h"
#include "format/tensor/tensor_payload.h"

namespace ckptd::client::internal {
namespace {

constexpr uint64_t kMaxBytes =
    static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

std::string Dims(const std::vector<int64_t>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
}

absl::Status TensorError(size_t i, const RestoreTensor& t,
                         const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("tensor ", i, " ('", t.fqn, "'): ", what));
}

absl::Status ValidateFqn(const char* kind, size_t i, const std::string& fqn) {
  if (fqn.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " ", i, ": empty fqn"));
  }
  if (fqn.size() > kMaxFqnBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " ", i, ": fqn of ", fqn.size(),
                     " bytes, more than ", kMaxFqnBytes));
  }
  return absl::OkStatus();
}

// The shape checks of one destination; fills want->nbytes.
absl::Status CheckShape(size_t i, const RestoreTensor& t, RestoreWant* want) {
  const size_t n = t.sizes.size();
  if (n > kMaxDims) {
    return TensorError(i, t,
                       absl::StrCat(n, " dimensions, more than ", kMaxDims));
  }
  if (t.offsets.size() != n || (!t.strides.empty() && t.strides.size() != n)) {
    return TensorError(
        i, t,
        absl::StrCat("offsets ", Dims(t.offsets), ", sizes ", Dims(t.sizes),
                     " and strides ", Dims(t.strides),
                     " must have the same number of dimensions"));
  }
  uint64_t numel = 1;
  for (size_t k = 0; k < n; ++k) {
    if (t.offsets[k] < 0 || t.sizes[k] < 0 ||
        (!t.strides.empty() && t.strides[k] < 0)) {
      return TensorError(
          i, t,
          absl::StrCat("negative value in offsets ", Dims(t.offsets),
                       ", sizes ", Dims(t.sizes), " or strides ",
                       Dims(t.strides)));
    }
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(t.sizes[k]),
                               &numel) ||
        numel > kMaxBytes) {
      return TensorError(
          i, t,
          absl::StrCat("sizes ", Dims(t.sizes), " overflow the element count"));
    }
  }
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(want->elem_size),
                             &want->nbytes) ||
      want->nbytes > kMaxBytes) {
    return TensorError(i, t, "byte count overflows");
  }
  if (want->nbytes > 0 && t.data == nullptr) {
    return TensorError(
        i, t, absl::StrCat("data is null for ", want->nbytes, " bytes"));
  }
  return absl::OkStatus();
}

void SplitInto(size_t elem_size, uint64_t limit, size_t first_dim, SubBox box,
               std::vector<SubBox>* out) {
  const size_t n = box.sizes.size();
  uint64_t nbytes = elem_size;
  for (const int64_t s : box.sizes) nbytes *= static_cast<uint64_t>(s);
  if (nbytes <= limit) {
    out->push_back(std::move(box));
    return;
  }
  // nbytes > limit >= elem_size: some dimension from first_dim on is > 1
  // (the ones before it are 1 by construction).
  size_t d = first_dim;
  while (d < n && box.sizes[d] <= 1) ++d;
  uint64_t row = elem_size;
  for (size_t k = d + 1; k < n; ++k) row *= static_cast<uint64_t>(box.sizes[k]);
  const int64_t rows = box.sizes[d];
  const int64_t base = box.offsets[d];
  if (row <= limit) {
    const int64_t per = static_cast<int64_t>(
        std::min<uint64_t>(limit / row, static_cast<uint64_t>(rows)));
    for (int64_t r = 0; r < rows; r += per) {
      SubBox part = box;
      part.offsets[d] = base + r;
      part.sizes[d] = std::min(per, rows - r);
      out->push_back(std::move(part));
    }
    return;
  }
  for (int64_t r = 0; r < rows; ++r) {
    SubBox part = box;
    part.offsets[d] = base + r;
    part.sizes[d] = 1;
    SplitInto(elem_size, limit, d + 1, std::move(part), out);
  }
}

// The batch being filled by PlanRestoreBatches.
class Packer {
 public:
  Packer(uint64_t batch_bytes, uint64_t alignment, uint64_t max_request_bytes)
      : limit_(batch_bytes),
        alignment_(alignment),
        max_request_(max_request_bytes) {}

  // Where `nbytes` (described in `request_bytes`) goes; closes the current
  // batch first if it would not fit.
  // Zero-byte wants take no space (arena offset 0).
  uint64_t Place(uint64_t nbytes, uint64_t request_bytes) {
    uint64_t start = nbytes == 0 ? 0 : Aligned(cur_.arena_end);
    const bool empty = cur_.boxes.empty() && cur_.bytes_items.empty();
    if (!empty && (start > limit_ || nbytes > limit_ - start ||
                   request_ + request_bytes > max_request_)) {
      Flush();
      start = 0;
    }
    request_ += request_bytes;
    cur_.bytes += nbytes;
    if (nbytes > 0) cur_.arena_end = start + nbytes;
    return start;
  }
  RestoreBatch& current() { return cur_; }
  void Flush() {
    batches_.push_back(std::move(cur_));
    cur_ = RestoreBatch{};
    request_ = 0;
  }
  std::vector<RestoreBatch> Finish() {
    if (!cur_.boxes.empty() || !cur_.bytes_items.empty() || batches_.empty()) {
      Flush();
    }
    return std::move(batches_);
  }

 private:
  uint64_t Aligned(uint64_t pos) const {
    return pos + (alignment_ - pos % alignment_) % alignment_;
  }

  const uint64_t limit_, alignment_, max_request_;
  RestoreBatch cur_;
  uint64_t request_ = 0;
  std::vector<RestoreBatch> batches_;
};

// One unit of CopyBatchOut's work: rows [r0, r1) of dimension `dim` of box
// `box` of the batch (dim == SIZE_MAX: the whole box).
struct CopyTask {
  uint32_t box = 0;
  size_t dim = 0;
  int64_t r0 = 0, r1 = 0;
};

void CopyTaskOut(absl::Span<const RestoreTensor> tensors,
                 absl::Span<const RestoreWant> wants, const RestoreBatch& batch,
                 const char* arena, const CopyTask& task) {
  const RestorePiece& p = batch.boxes[task.box];
  const RestoreWant& w = wants[p.tensor];
  const size_t es = w.elem_size;
  const size_t n = p.box.sizes.size();
  int64_t sizes[kMaxDims], src_strides[kMaxDims];
  int64_t s = 1;
  for (size_t k = n; k-- > 0;) {
    sizes[k] = p.box.sizes[k];
    src_strides[k] = s;
    s *= std::max<int64_t>(p.box.sizes[k], 1);
  }
  const char* src = arena + p.arena_offset;
  char* dst = static_cast<char*>(tensors[p.tensor].data);
  for (size_t k = 0; k < n; ++k) {
    dst += static_cast<int64_t>(es) * p.box.offsets[k] * w.strides[k];
  }
  if (task.dim < n) {
    sizes[task.dim] = task.r1 - task.r0;
    src += static_cast<int64_t>(es) * task.r0 * src_strides[task.dim];
    dst += static_cast<int64_t>(es) * task.r0 * w.strides[task.dim];
  }
  format::StridedCopy(es, absl::MakeConstSpan(sizes, n), src,
                      absl::MakeConstSpan(src_strides, n), dst,
                      absl::MakeConstSpan(w.strides));
}

}  // namespace

absl::StatusOr<std::vector<RestoreWant>> ValidateRestoreTensors(
    absl::Span<const RestoreTensor> tensors) {
  if (tensors.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(tensors.size(), " tensors, more than 2^32-1"));
  }
  std::vector<RestoreWant> out(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const RestoreTensor& t = tensors[i];
    if (absl::Status s = ValidateFqn("tensor", i, t.fqn); !s.ok()) return s;
    RestoreWant& w = out[i];
    auto dtype = format::DTypeFromName(t.dtype);
    if (!dtype.ok()) {
      return TensorError(i, t, absl::StrCat("unknown dtype '", t.dtype, "'"));
    }
    w.dtype = std::string(format::DTypeName(*dtype));
    w.elem_size = format::ElementSize(*dtype);
    if (absl::Status s = CheckShape(i, t, &w); !s.ok()) return s;
    w.sizes = t.sizes;
    w.strides =
        t.strides.empty() ? format::ContiguousStrides(t.sizes) : t.strides;
    w.request_bytes = t.fqn.size() + w.dtype.size() + 24 * t.sizes.size() + 32;
  }
  return out;
}

absl::Status ValidateRestoreBytes(absl::Span<const RestoreBytesItem> items) {
  if (items.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(items.size(), " bytes items, more than 2^32-1"));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (absl::Status s = ValidateFqn("bytes item", i, items[i].fqn); !s.ok()) {
      return s;
    }
    if (items[i].nbytes > kMaxBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("bytes item ", i, " ('", items[i].fqn, "'): nbytes ",
                       items[i].nbytes, " is not a payload length"));
    }
  }
  return absl::OkStatus();
}

std::vector<SubBox> SplitBox(absl::Span<const int64_t> sizes, size_t elem_size,
                             uint64_t limit) {
  std::vector<SubBox> out;
  SubBox whole;
  whole.offsets.assign(sizes.size(), 0);
  whole.sizes.assign(sizes.begin(), sizes.end());
  for (const int64_t s : sizes) {
    if (s == 0) {  // no elements: nothing to split
      out.push_back(std::move(whole));
      return out;
    }
  }
  SplitInto(elem_size, limit, 0, std::move(whole), &out);
  return out;
}

absl::StatusOr<std::vector<RestoreBatch>> PlanRestoreBatches(
    absl::Span<const RestoreWant> wants,
    absl::Span<const uint64_t> bytes_capacity,
    absl::Span<const std::string> bytes_fqns, uint64_t batch_bytes,
    uint64_t alignment, uint64_t max_request_bytes) {
  if (batch_bytes < kMinRestoreBatchBytes) {
    return absl::InvalidArgumentError(absl::StrCat("batch_bytes ", batch_bytes,
                                                   " is below the minimum of ",
                                                   kMinRestoreBatchBytes));
  }
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", alignment, " is not a power of two"));
  }
  if (wants.size() > std::numeric_limits<uint32_t>::max() ||
      bytes_capacity.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("more than 2^32-1 wants");
  }
  if (bytes_fqns.size() != bytes_capacity.size()) {
    return absl::InvalidArgumentError(
        "bytes_fqns and bytes_capacity differ in size");
  }
  Packer packer(batch_bytes, alignment, max_request_bytes);
  for (size_t t = 0; t < wants.size(); ++t) {
    const RestoreWant& w = wants[t];
    for (SubBox& box : SplitBox(w.sizes, w.elem_size, batch_bytes)) {
      RestorePiece p;
      p.tensor = static_cast<uint32_t>(t);
      p.nbytes = w.elem_size;
      for (const int64_t s : box.sizes) p.nbytes *= static_cast<uint64_t>(s);
      p.box = std::move(box);
      p.arena_offset = packer.Place(p.nbytes, w.request_bytes);
      packer.current().boxes.push_back(std::move(p));
    }
  }
  for (size_t i = 0; i < bytes_capacity.size(); ++i) {
    const uint64_t cap = bytes_capacity[i];
    const uint64_t request = bytes_fqns[i].size() + 32;
    if (cap > batch_bytes) {  // alone in a batch sized for it
      RestoreBatch& cur = packer.current();
      if (!cur.boxes.empty() || !cur.bytes_items.empty()) packer.Flush();
      packer.current().bytes += cap;
      packer.current().arena_end = cap;
      packer.current().bytes_items.push_back(
          RestoreBytesSlot{static_cast<uint32_t>(i), cap, 0});
      packer.Flush();
      continue;
    }
    const uint64_t at = packer.Place(cap, request);
    packer.current().bytes_items.push_back(
        RestoreBytesSlot{static_cast<uint32_t>(i), cap, at});
  }
  return packer.Finish();
}

void AlternateArenaHalves(std::vector<RestoreBatch>& batches) {
  uint64_t half = 0;
  for (const RestoreBatch& b : batches) half = std::max(half, b.arena_end);
  half = (half + kRestoreAlignment - 1) / kRestoreAlignment * kRestoreAlignment;
  for (size_t i = 1; i < batches.size(); i += 2) {
    RestoreBatch& b = batches[i];
    for (RestorePiece& p : b.boxes) p.arena_offset += half;
    for (RestoreBytesSlot& s : b.bytes_items) s.arena_offset += half;
    b.arena_end += half;
  }
}

uint64_t RestoreArenaBytes(absl::Span<const RestoreBatch> batches) {
  uint64_t need = kArenaGranule;
  for (const RestoreBatch& b : batches) need = std::max(need, b.arena_end);
  const uint64_t rounded = need / kArenaGranule * kArenaGranule;
  return rounded == need ? need : rounded + kArenaGranule;
}

void CopyBatchOut(absl::Span<const RestoreTensor> tensors,
                  absl::Span<const RestoreWant> wants,
                  const RestoreBatch& batch, const char* arena, int threads) {
  // Pieces of about 1 MiB or more, so that all threads work on large boxes.
  constexpr uint64_t kPiece = uint64_t{1} << 20;
  constexpr uint64_t kMinParallelBytes = uint64_t{4} << 20;
  std::vector<CopyTask> tasks;
  uint64_t total = 0;
  for (uint32_t b = 0; b < batch.boxes.size(); ++b) {
    const RestorePiece& p = batch.boxes[b];
    if (p.nbytes == 0) continue;
    total += p.nbytes;
    const std::vector<int64_t>& sizes = p.box.sizes;
    size_t d = 0;
    while (d < sizes.size() && sizes[d] <= 1) ++d;
    if (p.nbytes < 2 * kPiece || d == sizes.size()) {
      tasks.push_back(CopyTask{b, SIZE_MAX, 0, 0});
      continue;
    }
    const uint64_t row = p.nbytes / static_cast<uint64_t>(sizes[d]);
    const int64_t per =
        static_cast<int64_t>(std::max<uint64_t>(1, kPiece / row));
    for (int64_t r = 0; r < sizes[d]; r += per) {
      tasks.push_back(CopyTask{b, d, r, std::min(sizes[d], r + per)});
    }
  }
  threads = std::max(threads, 1);
  if (threads == 1 || total < kMinParallelBytes) {
    for (const CopyTask& t : tasks)
      CopyTaskOut(tensors, wants, batch, arena, t);
    return;
  }
  threads = static_cast<int>(std::min<uint64_t>(
      static_cast<uint64_t>(threads), total / (kMinParallelBytes / 2)));
  std::atomic<size_t> next{0};
  RunOnThreads(threads, [&] {
    for (size_t k;
         (k = next.fetch_add(1, std::memory_order_relaxed)) < tasks.size();) {
      CopyTaskOut(tensors, wants, batch, arena, tasks[k]);
    }
  });
}

}  // namespace ckptd::client::internal
