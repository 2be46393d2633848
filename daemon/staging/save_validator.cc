// Copyright 2026 The ckptd Authors.
#include "daemon/staging/save_validator.h"

#include <algorithm>

#include "common/absl_fmt.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "format/tensor/dtype.h"

namespace ckptd::daemon {
namespace {

// A tensor item's box against its global shape and its byte count.
absl::Status ValidateTensorItem(const format::ItemDesc& it, uint64_t nbytes) {
  const size_t nd = it.global_shape.size();
  if (nd > 64) {
    return absl::InvalidArgumentError(
        fmt::format("item '{}': {} dimensions; the limit is 64", it.fqn, nd));
  }
  if (it.chunk_offsets.size() != nd || it.chunk_sizes.size() != nd) {
    return absl::InvalidArgumentError(fmt::format(
        "item '{}': global_shape has {} dimensions but chunk_offsets {} and "
        "chunk_sizes {}",
        it.fqn, nd, it.chunk_offsets.size(), it.chunk_sizes.size()));
  }
  unsigned __int128 numel = 1;
  for (size_t k = 0; k < nd; ++k) {
    const int64_t g = it.global_shape[k], o = it.chunk_offsets[k],
                  z = it.chunk_sizes[k];
    if (g < 0 || o < 0 || z < 0 || o > g || z > g - o) {
      return absl::InvalidArgumentError(fmt::format(
          "item '{}': chunk {} is out of bounds of the global shape {}", it.fqn,
          format::DescribeBox(it.chunk_offsets, it.chunk_sizes),
          format::DescribeBox(std::vector<int64_t>(nd, 0), it.global_shape)));
    }
    numel *= static_cast<uint64_t>(z);
    if (numel > (static_cast<unsigned __int128>(1) << 62)) {
      return absl::InvalidArgumentError(
          fmt::format("item '{}': chunk too large", it.fqn));
    }
  }
  const unsigned __int128 expect = numel * format::ElementSize(it.dtype);
  if (expect != nbytes) {
    return absl::InvalidArgumentError(fmt::format(
        "item '{}': nbytes is {} but chunk {} of {} holds {} bytes", it.fqn,
        nbytes, format::DescribeBox(it.chunk_offsets, it.chunk_sizes),
        format::DTypeName(it.dtype), static_cast<uint64_t>(expect)));
  }
  return absl::OkStatus();
}

// Moves the cursor past items it has completed (and empty items).
ExtentCursor Settle(const RankIndex& index, ExtentCursor c) {
  while (c.item < index.items.size() && c.offset == index.nbytes[c.item]) {
    ++c.item;
    c.offset = 0;
  }
  return c;
}

}  // namespace

absl::Status ValidateSaveHeader(const SaveBatch& batch,
                                const SaveValidatorOptions& options) {
  if (batch.world_size < 1 || batch.world_size > options.max_world_size) {
    return absl::InvalidArgumentError(
        fmt::format("world_size {} is not in [1, {}]", batch.world_size,
                    options.max_world_size));
  }
  if (batch.rank < 0 || batch.rank >= batch.world_size) {
    return absl::InvalidArgumentError(
        fmt::format("rank {} is not in [0, {})", batch.rank, batch.world_size));
  }
  RETURN_IF_ERROR(ValidateName("checkpoint_id", batch.checkpoint_id,
                               kMaxCheckpointIdBytes));
  return ValidateName("job", batch.job, kMaxJobBytes);
}

absl::StatusOr<LocalRanks> ValidateCluster(const ClusterSpec& cl,
                                           int world_size) {
  LocalRanks out;
  if (cl.num_nodes <= 1) {
    if (!cl.local_ranks.empty() &&
        static_cast<int>(cl.local_ranks.size()) != world_size) {
      return absl::InvalidArgumentError(fmt::format(
          "cluster.local_ranks lists {} of {} ranks but num_nodes is {}",
          cl.local_ranks.size(), world_size, cl.num_nodes));
    }
    out.ranks.resize(world_size);
    for (int r = 0; r < world_size; ++r) out.ranks[r] = r;
    return out;
  }
  if (cl.num_nodes > world_size) {
    return absl::InvalidArgumentError(
        fmt::format("cluster.num_nodes {} exceeds world_size {}", cl.num_nodes,
                    world_size));
  }
  std::vector<int> ranks = cl.local_ranks;
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty() || ranks.front() < 0 || ranks.back() >= world_size ||
      std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    return absl::InvalidArgumentError(fmt::format(
        "cluster.local_ranks [{}] must be distinct ranks in [0, {})",
        fmt::join(ranks, ", "), world_size));
  }
  out.ranks = std::move(ranks);
  out.multi = true;
  return out;
}

absl::StatusOr<RankIndex> ValidateIndex(SaveBatch& batch,
                                        const SaveValidatorOptions& options) {
  if (batch.items.size() != batch.item_nbytes.size()) {
    return absl::InternalError("item sizes and items differ in length");
  }
  if (batch.items.size() > options.max_items) {
    return absl::ResourceExhaustedError(
        fmt::format("rank {} sent {} items; the limit is {} (max_items)",
                    batch.rank, batch.items.size(), options.max_items));
  }
  RankIndex index;
  for (size_t i = 0; i < batch.items.size(); ++i) {
    const format::ItemDesc& it = batch.items[i];
    const uint64_t nb = batch.item_nbytes[i];
    if (it.fqn.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("rank {} item {}: empty fqn", batch.rank, i));
    }
    if (it.type == format::ItemDesc::Type::kTensor)
      RETURN_IF_ERROR(ValidateTensorItem(it, nb));
    if (it.type == format::ItemDesc::Type::kBytes && nb == 0) {
      return absl::InvalidArgumentError(
          fmt::format("rank {} item '{}': an empty bytes item (a bytes item "
                      "holds a torch.save archive)",
                      batch.rank, it.fqn));
    }
    index.total += nb;
  }
  index.items = std::move(batch.items);
  index.nbytes = std::move(batch.item_nbytes);
  return index;
}

absl::Status ValidateCudaBuffers(
    int rank, absl::Span<const CudaBufferDesc> buffers,
    const std::function<absl::StatusOr<int>(std::string_view)>& device_index,
    const SaveValidatorOptions& options) {
  if (buffers.size() > options.max_cuda_buffers) {
    return absl::ResourceExhaustedError(
        fmt::format("rank {}: {} CUDA buffers in one batch; at most {}", rank,
                    buffers.size(), options.max_cuda_buffers));
  }
  for (size_t k = 0; k < buffers.size(); ++k) {
    const CudaBufferDesc& b = buffers[k];
    if (b.ipc_handle.size() != options.cuda_ipc_handle_size) {
      return absl::InvalidArgumentError(fmt::format(
          "rank {}: CUDA buffer {} has a {}-byte IPC handle; expected {}", rank,
          k + 1, b.ipc_handle.size(), options.cuda_ipc_handle_size));
    }
    if (b.size == 0) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: CUDA buffer {} has size 0", rank, k + 1));
    }
    if (absl::StatusOr<int> dev = device_index(b.device); !dev.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: CUDA buffer {}: {} (the trainer must save "
                      "through its own node's daemon)",
                      rank, k + 1, dev.status().message()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ValidatedBatch> ValidateExtents(
    int rank, const RankIndex& index, ExtentCursor cursor,
    absl::Span<const ExtentRef> extents, const shm::Mapping* arena,
    absl::Span<const CudaBufferDesc> cuda_buffers,
    const SaveValidatorOptions& options) {
  ValidatedBatch out;
  const uint32_t n = index.items.size();
  for (const ExtentRef& e : extents) {
    cursor = Settle(index, cursor);
    if (e.length == 0) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: extent of item {} has length 0", rank, e.item));
    }
    if (cursor.item >= n || e.item != cursor.item ||
        e.item_offset != cursor.offset) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: extent (item {}, offset {}) out of order; "
                      "expected item {} at offset {}",
                      rank, e.item, e.item_offset, cursor.item, cursor.offset));
    }
    const std::string& fqn = index.items[cursor.item].fqn;
    const uint64_t nb = index.nbytes[cursor.item];
    if (e.length > nb - cursor.offset) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: extent of {} bytes at offset {} overruns item "
                      "'{}' of {} bytes",
                      rank, e.length, cursor.offset, fqn, nb));
    }
    StagedExtent staged{nullptr,  nullptr,      e.arena_offset,
                        e.length, e.item,       e.item_offset,
                        {},       e.cuda_buffer};
    if (e.cuda_buffer != 0) {
      if (e.cuda_buffer > cuda_buffers.size()) {
        return absl::InvalidArgumentError(
            fmt::format("rank {} item '{}': extent names CUDA buffer {} of {}",
                        rank, fqn, e.cuda_buffer, cuda_buffers.size()));
      }
      const uint64_t size = cuda_buffers[e.cuda_buffer - 1].size;
      if (e.arena_offset > size || e.length > size - e.arena_offset) {
        return absl::InvalidArgumentError(
            fmt::format("rank {} item '{}': range [{}, {}) is outside CUDA "
                        "buffer {} of {} bytes",
                        rank, fqn, e.arena_offset, e.arena_offset + e.length,
                        e.cuda_buffer, size));
      }
      out.device_bytes += e.length;
    } else {
      if (arena == nullptr) {
        return absl::InternalError(
            fmt::format("rank {}: a host extent without an arena", rank));
      }
      absl::StatusOr<absl::Span<const char>> span =
          arena->Slice(e.arena_offset, e.length);
      if (!span.ok()) {
        return absl::InvalidArgumentError(fmt::format(
            "rank {} item '{}': {}", rank, fqn, span.status().message()));
      }
      staged.data = span->data();
      out.arena_bytes += e.length;
    }
    out.extents.push_back(std::move(staged));
    cursor.offset += e.length;
    out.bytes += e.length;
  }
  if (out.bytes > options.max_batch) {
    return absl::ResourceExhaustedError(fmt::format(
        "rank {}: batch of {} bytes exceeds max_batch {}; send smaller batches",
        rank, out.bytes, options.max_batch));
  }
  out.next = cursor;
  return out;
}

absl::Status CheckComplete(int rank, const RankIndex& index,
                           ExtentCursor cursor) {
  cursor = Settle(index, cursor);
  if (cursor.item < index.items.size()) {
    return absl::InvalidArgumentError(fmt::format(
        "rank {} sent its last batch but item '{}' has only {} of {} bytes",
        rank, index.items[cursor.item].fqn, cursor.offset,
        index.nbytes[cursor.item]));
  }
  return absl::OkStatus();
}

}  // namespace ckptd::daemon
