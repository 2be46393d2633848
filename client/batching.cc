// Copyright 2026 The ckptd Authors.
#include "client/batching.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/parallel.h"
#include "common/status_macros.h"
#include "format/tensor/dtype.h"
#include "format/tensor/strided_copy.h"

namespace ckptd::client::internal {
namespace {

constexpr uint64_t kMaxBytes =
    static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

absl::Status ItemError(size_t i, const SaveItem& item,
                       const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("item ", i, " ('", item.fqn, "'): ", what));
}

std::string Dims(const std::vector<int64_t>& v) {
  return absl::StrCat("[", absl::StrJoin(v, ", "), "]");
}

// Checks that global_shape, chunk_offsets, chunk_sizes (and strides, when
// given) have the same number of dimensions, at most kMaxDims.
absl::Status CheckRanks(size_t i, const SaveItem& item) {
  const size_t n = item.global_shape.size();
  if (n > kMaxDims) {
    return ItemError(i, item,
                     absl::StrCat(n, " dimensions, more than ", kMaxDims));
  }
  if (item.chunk_offsets.size() != n || item.chunk_sizes.size() != n) {
    return ItemError(i, item,
                     absl::StrCat("global_shape ", Dims(item.global_shape),
                                  ", chunk_offsets ", Dims(item.chunk_offsets),
                                  " and chunk_sizes ", Dims(item.chunk_sizes),
                                  " must have the same number of dimensions"));
  }
  if (!item.strides.empty() && item.strides.size() != n) {
    return ItemError(
        i, item,
        absl::StrCat("strides ", Dims(item.strides), " have ",
                     item.strides.size(), " dimensions, chunk_sizes ",
                     Dims(item.chunk_sizes), " ", n));
  }
  return absl::OkStatus();
}

// The chunk's element count, after checking dimension by dimension that it
// lies inside global_shape, that no value or stride is negative and that
// the count stays below 2^63.
absl::StatusOr<uint64_t> ElementCount(size_t i, const SaveItem& item) {
  uint64_t numel = 1;
  for (size_t k = 0; k < item.global_shape.size(); ++k) {
    const int64_t g = item.global_shape[k], o = item.chunk_offsets[k],
                  s = item.chunk_sizes[k];
    if (g < 0 || o < 0 || s < 0) {
      return ItemError(
          i, item,
          absl::StrCat("negative value in global_shape ",
                       Dims(item.global_shape), ", chunk_offsets ",
                       Dims(item.chunk_offsets), " or chunk_sizes ",
                       Dims(item.chunk_sizes)));
    }
    if (o > g || s > g - o) {
      return ItemError(
          i, item,
          absl::StrCat("chunk at offsets ", Dims(item.chunk_offsets),
                       " with sizes ", Dims(item.chunk_sizes),
                       " is outside global_shape ", Dims(item.global_shape),
                       " in dimension ", k));
    }
    if (!item.strides.empty() && item.strides[k] < 0) {
      return ItemError(i, item,
                       absl::StrCat("negative stride in ", Dims(item.strides)));
    }
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(s), &numel) ||
        numel > kMaxBytes) {
      return ItemError(i, item,
                       absl::StrCat("chunk_sizes ", Dims(item.chunk_sizes),
                                    " overflow the element count"));
    }
  }
  return numel;
}

// Checks that the last byte of the strided view of a non-empty chunk is
// addressable without overflow (`elem_size` bytes per element).
absl::Status CheckStridedSpan(size_t i, const SaveItem& item,
                              size_t elem_size) {
  uint64_t span = 0;
  for (size_t k = 0; k < item.strides.size(); ++k) {
    uint64_t reach;
    if (__builtin_mul_overflow(static_cast<uint64_t>(item.chunk_sizes[k] - 1),
                               static_cast<uint64_t>(item.strides[k]),
                               &reach) ||
        __builtin_add_overflow(span, reach, &span)) {
      return ItemError(i, item,
                       absl::StrCat("strides ", Dims(item.strides),
                                    " overflow the address range"));
    }
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(span, static_cast<uint64_t>(elem_size), &bytes) ||
      bytes > kMaxBytes) {
    return ItemError(i, item,
                     absl::StrCat("strides ", Dims(item.strides),
                                  " overflow the address range"));
  }
  return absl::OkStatus();
}

absl::StatusOr<PreparedItem> ValidateTensor(size_t i, const SaveItem& item) {
  PreparedItem p;
  auto dtype = format::DTypeFromName(item.dtype);
  if (!dtype.ok()) {
    return ItemError(i, item, absl::StrCat("unknown dtype '", item.dtype, "'"));
  }
  p.dtype = std::string(format::DTypeName(*dtype));
  p.elem_size = format::ElementSize(*dtype);
  RETURN_IF_ERROR(CheckRanks(i, item));
  ASSIGN_OR_RETURN(const uint64_t numel, ElementCount(i, item));
  if (__builtin_mul_overflow(numel, static_cast<uint64_t>(p.elem_size),
                             &p.nbytes) ||
      p.nbytes > kMaxBytes) {
    return ItemError(i, item, "byte count overflows");
  }
  if (p.nbytes > 0) {
    if (item.data == nullptr && item.cuda == nullptr) {
      return ItemError(i, item,
                       absl::StrCat("data is null for ", p.nbytes, " bytes"));
    }
    if (!item.strides.empty()) {
      RETURN_IF_ERROR(CheckStridedSpan(i, item, p.elem_size));
    }
  }
  p.contiguous = format::IsCContiguous(item.chunk_sizes, item.strides);
  p.src = static_cast<const char*>(item.data);
  return p;
}

// Copies C-order elements [lo, hi) of the box `sizes` (n dims, element
// strides `strides`, element [0..] at `src`) to contiguous `dst`.
void GatherElems(size_t es, const int64_t* sizes, const int64_t* strides,
                 size_t n, const char* src, uint64_t lo, uint64_t hi,
                 char* dst) {
  if (lo >= hi) return;
  if (n == 0) {  // a scalar: lo == 0, hi == 1
    std::memcpy(dst, src, es);
    return;
  }
  uint64_t inner = 1;
  for (size_t k = 1; k < n; ++k) inner *= static_cast<uint64_t>(sizes[k]);
  const int64_t row_bytes = strides[0] * static_cast<int64_t>(es);
  uint64_t r0 = lo / inner;
  const uint64_t r1 = hi / inner;
  const uint64_t lo_in = lo % inner, hi_in = hi % inner;
  if (r0 == r1) {  // inside one row
    GatherElems(es, sizes + 1, strides + 1, n - 1,
                src + static_cast<int64_t>(r0) * row_bytes, lo_in, hi_in, dst);
    return;
  }
  if (lo_in != 0) {  // partial first row
    GatherElems(es, sizes + 1, strides + 1, n - 1,
                src + static_cast<int64_t>(r0) * row_bytes, lo_in, inner, dst);
    dst += (inner - lo_in) * es;
    ++r0;
  }
  if (r1 > r0) {  // whole rows: one box
    int64_t box[kMaxDims];
    int64_t dst_strides[kMaxDims];
    box[0] = static_cast<int64_t>(r1 - r0);
    for (size_t k = 1; k < n; ++k) box[k] = sizes[k];
    int64_t s = 1;
    for (size_t k = n; k-- > 0;) {
      dst_strides[k] = s;
      s *= box[k];
    }
    format::StridedCopy(es, absl::MakeConstSpan(box, n),
                        src + static_cast<int64_t>(r0) * row_bytes,
                        absl::MakeConstSpan(strides, n), dst,
                        absl::MakeConstSpan(dst_strides, n));
    dst += (r1 - r0) * inner * es;
  }
  if (hi_in != 0) {  // partial last row
    GatherElems(es, sizes + 1, strides + 1, n - 1,
                src + static_cast<int64_t>(r1) * row_bytes, 0, hi_in, dst);
  }
}

}  // namespace

absl::StatusOr<std::vector<PreparedItem>> ValidateItems(
    absl::Span<const SaveItem> items, uint32_t max_items) {
  if (max_items != 0 && items.size() > max_items) {
    return absl::ResourceExhaustedError(absl::StrCat(
        items.size(), " items, more than the daemon's max_items ", max_items));
  }
  if (items.size() > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(items.size(), " items, more than 2^32-1"));
  }
  std::vector<PreparedItem> out;
  out.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const SaveItem& item = items[i];
    if (item.fqn.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i, ": empty fqn"));
    }
    if (item.fqn.size() > kMaxFqnBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("item ", i, ": fqn of ", item.fqn.size(),
                       " bytes, more than ", kMaxFqnBytes));
    }
    if (item.is_bytes) {
      if (!item.global_shape.empty() || !item.chunk_offsets.empty() ||
          !item.chunk_sizes.empty() || !item.strides.empty()) {
        return ItemError(i, item,
                         "a bytes item has no shape, offsets, sizes or "
                         "strides");
      }
      PreparedItem p;
      p.nbytes = item.bytes.size();
      p.src = item.bytes.data();
      if (p.nbytes > 0 && p.src == nullptr) {
        return ItemError(i, item, "bytes payload is null");
      }
      out.push_back(std::move(p));
      continue;
    }
    auto p = ValidateTensor(i, item);
    if (!p.ok()) return p.status();
    if (item.cuda != nullptr) {
      const CudaSource& c = *item.cuda;
      if (!p->contiguous) {
        return ItemError(i, item,
                         "a CUDA chunk must be C-contiguous (make it so on "
                         "the device first)");
      }
      if (c.device.empty()) {
        return ItemError(i, item, "CUDA source without a device (PCI bus id)");
      }
      if (c.offset > c.allocation_size ||
          p->nbytes > c.allocation_size - c.offset) {
        return ItemError(
            i, item,
            absl::StrCat("CUDA chunk [", c.offset, ", +", p->nbytes,
                         ") is outside its allocation of ", c.allocation_size,
                         " bytes"));
      }
      p->device = true;
      p->src = nullptr;
    }
    out.push_back(*std::move(p));
  }
  return out;
}

uint64_t SpanBytes(absl::Span<const uint64_t> item_sizes, uint64_t alignment) {
  uint64_t total = 0;
  for (const uint64_t n : item_sizes) {
    if (n == 0) continue;
    uint64_t padded;
    if (__builtin_add_overflow(n, alignment - 1, &padded)) {
      return std::numeric_limits<uint64_t>::max();
    }
    padded -= padded % alignment;
    if (__builtin_add_overflow(total, padded, &total)) {
      return std::numeric_limits<uint64_t>::max();
    }
  }
  return total;
}

uint64_t ArenaSizeFor(uint64_t span_bytes, uint64_t max_batch_bytes,
                      uint64_t staging_budget_bytes) {
  uint64_t want = span_bytes;
  if (max_batch_bytes != 0) want = std::min(want, max_batch_bytes);
  if (staging_budget_bytes != 0) want = std::min(want, staging_budget_bytes);
  want = std::max(want, kArenaGranule);
  const uint64_t rounded = want / kArenaGranule * kArenaGranule;
  return rounded == want ? want : rounded + kArenaGranule;
}

absl::Status ValidateCluster(const ClusterSpec& cluster, int rank,
                             int world_size) {
  auto bad = [](const auto&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("cluster: ", parts...));
  };
  if (cluster.num_nodes < 1) {
    return bad("num_nodes ", cluster.num_nodes, " must be >= 1");
  }
  if (cluster.num_nodes > world_size) {
    return bad("num_nodes ", cluster.num_nodes, " exceeds world_size ",
               world_size, " (every node saves at least one rank)");
  }
  if (cluster.num_nodes > 1) {
    if (cluster.coordinator.empty()) {
      return bad("coordinator is empty with num_nodes ", cluster.num_nodes,
                 " (the peer address of rank 0's daemon, host:port)");
    }
    if (cluster.local_ranks.empty()) {
      return bad("local_ranks is empty with num_nodes ", cluster.num_nodes,
                 " (the ranks saving through this node's daemon)");
    }
  }
  if (cluster.local_ranks.empty()) return absl::OkStatus();
  std::vector<int> sorted = cluster.local_ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.front() < 0 || sorted.back() >= world_size) {
    const int r = sorted.front() < 0 ? sorted.front() : sorted.back();
    return bad("local rank ", r, " is not in [0, world_size) with world_size ",
               world_size);
  }
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end());
      dup != sorted.end()) {
    return bad("local rank ", *dup, " appears more than once in local_ranks");
  }
  if (!std::binary_search(sorted.begin(), sorted.end(), rank)) {
    return bad("local_ranks [", absl::StrJoin(cluster.local_ranks, ", "),
               "] does not hold this rank (", rank, ")");
  }
  return absl::OkStatus();
}

bool IsSingleNode(const ClusterSpec& cluster) {
  return cluster.num_nodes <= 1 && cluster.coordinator.empty() &&
         cluster.local_ranks.empty();
}

// What PlanBatches and PlanMixedBatches require of their arguments.
static absl::Status CheckPlanArgs(size_t items, uint64_t alignment) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", alignment, " is not a power of two"));
  }
  if (items > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(items, " items, more than 2^32-1"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Batch>> PlanBatches(
    absl::Span<const uint64_t> item_sizes, uint64_t capacity,
    uint64_t alignment) {
  RETURN_IF_ERROR(CheckPlanArgs(item_sizes.size(), alignment));
  uint64_t total = 0;
  for (const uint64_t n : item_sizes) {
    if (__builtin_add_overflow(total, n, &total)) {
      return absl::InvalidArgumentError("total item bytes overflow");
    }
  }
  if (total > 0 && capacity == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(total, " bytes to place in a batch capacity of 0"));
  }
  std::vector<Batch> batches;
  Batch cur;
  uint64_t pos = 0;  // next free arena byte of `cur`
  for (size_t i = 0; i < item_sizes.size(); ++i) {
    const uint64_t size = item_sizes[i];
    uint64_t off = 0;
    while (off < size) {
      // Aligned start; computed without overflow as pos <= capacity.
      uint64_t start = pos + (alignment - pos % alignment) % alignment;
      if (start < pos || start >= capacity) {  // arena full: next batch
        batches.push_back(std::move(cur));
        cur = Batch{};
        pos = start = 0;
      }
      const uint64_t take = std::min(capacity - start, size - off);
      cur.extents.push_back(Extent{static_cast<uint32_t>(i), off, start, take});
      cur.bytes += take;
      pos = start + take;
      cur.arena_end = pos;
      off += take;
    }
  }
  if (!cur.extents.empty() || batches.empty())
    batches.push_back(std::move(cur));
  return batches;
}

absl::StatusOr<std::vector<Batch>> PlanMixedBatches(
    absl::Span<const uint64_t> item_sizes, absl::Span<const uint8_t> on_device,
    uint64_t arena_capacity, uint64_t device_capacity, uint64_t max_batch,
    uint64_t alignment) {
  if (on_device.size() != item_sizes.size()) {
    return absl::InvalidArgumentError(
        "on_device and item_sizes differ in size");
  }
  const bool any_device = std::any_of(on_device.begin(), on_device.end(),
                                      [](uint8_t d) { return d != 0; });
  const uint64_t limit =
      max_batch == 0 ? std::numeric_limits<uint64_t>::max() : max_batch;
  if (!any_device)
    return PlanBatches(item_sizes, std::min(arena_capacity, limit), alignment);
  RETURN_IF_ERROR(CheckPlanArgs(item_sizes.size(), alignment));
  uint64_t host = 0, device = 0;
  for (size_t i = 0; i < item_sizes.size(); ++i) {
    uint64_t& sum = on_device[i] ? device : host;
    if (__builtin_add_overflow(sum, item_sizes[i], &sum)) {
      return absl::InvalidArgumentError("total item bytes overflow");
    }
  }
  if ((host > 0 && std::min(arena_capacity, limit) == 0) ||
      (device > 0 && std::min(device_capacity, limit) == 0)) {
    return absl::InvalidArgumentError(
        "bytes to place in a batch capacity of 0");
  }
  std::vector<Batch> batches;
  Batch cur;
  uint64_t pos = 0;  // next free arena byte of `cur`
  auto flush = [&] {
    batches.push_back(std::move(cur));
    cur = Batch{};
    pos = 0;
  };
  for (size_t i = 0; i < item_sizes.size(); ++i) {
    const uint64_t size = item_sizes[i];
    uint64_t off = 0;
    while (off < size) {
      if (cur.bytes == limit) flush();
      uint64_t take;
      if (on_device[i]) {
        if (cur.device_bytes == device_capacity) flush();
        take = std::min({size - off, device_capacity - cur.device_bytes,
                         limit - cur.bytes});
        cur.extents.push_back(
            Extent{static_cast<uint32_t>(i), off, 0, take, true});
        cur.device_bytes += take;
      } else {
        uint64_t start = pos + (alignment - pos % alignment) % alignment;
        if (start < pos || start >= arena_capacity) {
          flush();
          start = 0;
        }
        take =
            std::min({arena_capacity - start, size - off, limit - cur.bytes});
        cur.extents.push_back(
            Extent{static_cast<uint32_t>(i), off, start, take});
        pos = start + take;
        cur.arena_end = pos;
      }
      cur.bytes += take;
      off += take;
    }
  }
  if (!cur.extents.empty() || batches.empty())
    batches.push_back(std::move(cur));
  return batches;
}

void CopyItemRange(const SaveItem& item, const PreparedItem& p, uint64_t begin,
                   uint64_t end, char* dst) {
  if (begin >= end) return;
  if (p.contiguous) {
    std::memcpy(dst, p.src + begin, end - begin);
    return;
  }
  const size_t es = p.elem_size;
  const size_t n = item.chunk_sizes.size();
  const int64_t* sizes = item.chunk_sizes.data();
  const int64_t* strides = item.strides.data();
  char tmp[16];  // the largest element (complex128)
  uint64_t pos = begin;
  if (pos % es != 0) {  // starts inside an element
    const uint64_t e = pos / es;
    GatherElems(es, sizes, strides, n, p.src, e, e + 1, tmp);
    const uint64_t from = pos % es;
    const uint64_t to = std::min<uint64_t>(es, end - e * es);
    std::memcpy(dst, tmp + from, to - from);
    dst += to - from;
    pos = e * es + to;
    if (pos >= end) return;
  }
  const uint64_t e_lo = pos / es, e_hi = end / es;
  GatherElems(es, sizes, strides, n, p.src, e_lo, e_hi, dst);
  dst += (e_hi - e_lo) * es;
  pos = e_hi * es;
  if (pos < end) {  // ends inside an element
    GatherElems(es, sizes, strides, n, p.src, e_hi, e_hi + 1, tmp);
    std::memcpy(dst, tmp, end - pos);
  }
}

void CopyBatch(absl::Span<const SaveItem> items,
               absl::Span<const PreparedItem> prepared, const Batch& batch,
               char* arena, int threads) {
  threads = std::max(threads, 1);
  // Below this a thread is not worth starting.
  constexpr uint64_t kMinParallelBytes = uint64_t{4} << 20;
  const uint64_t host_bytes = batch.bytes - batch.device_bytes;
  if (threads == 1 || host_bytes < kMinParallelBytes) {
    for (const Extent& e : batch.extents) {
      if (e.device) continue;  // the daemon copies it from the GPU
      CopyItemRange(items[e.item], prepared[e.item], e.item_offset,
                    e.item_offset + e.length, arena + e.arena_offset);
    }
    return;
  }
  threads = static_cast<int>(std::min<uint64_t>(
      static_cast<uint64_t>(threads), host_bytes / (kMinParallelBytes / 2)));
  // Pieces of about 1/(4*threads) of the batch, at least 1 MiB, so threads
  // finish together whatever the item sizes.
  const uint64_t piece = std::max<uint64_t>(
      uint64_t{1} << 20, host_bytes / (4 * static_cast<uint64_t>(threads)));
  struct Piece {
    uint32_t extent;
    uint64_t begin, end;  // within the extent
  };
  std::vector<Piece> pieces;
  for (uint32_t x = 0; x < batch.extents.size(); ++x) {
    if (batch.extents[x].device) continue;
    const uint64_t len = batch.extents[x].length;
    for (uint64_t b = 0; b < len; b += piece) {
      pieces.push_back(Piece{x, b, std::min(len, b + piece)});
    }
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k;
         (k = next.fetch_add(1, std::memory_order_relaxed)) < pieces.size();) {
      const Piece& pc = pieces[k];
      const Extent& e = batch.extents[pc.extent];
      CopyItemRange(items[e.item], prepared[e.item], e.item_offset + pc.begin,
                    e.item_offset + pc.end, arena + e.arena_offset + pc.begin);
    }
  };
  RunOnThreads(threads, work);
}

}  // namespace ckptd::client::internal
