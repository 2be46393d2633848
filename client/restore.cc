// Copyright 2026 The ckptd Authors.
//
// Client::GetRestoreIndex and Client::Restore: reading a checkpoint through
// the daemon (daemon.proto, Restore). The wants are planned into batches by
// restore_batches.h; each batch is one Restore call that the daemon fills
// in the arena, then copied out into the caller's destinations.
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/batching.h"
#include "client/ckptd_client.h"
#include "client/client_rpc.h"
#include "client/restore_batches.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "common/tsan_annotations.h"
#include "proto/grpc_status.h"
#include "shm/arena.h"
#include "shm/fd_passing.h"
#include "shm/huge_pages.h"

namespace ckptd::client {

namespace pb = ::ckptd::v1;

namespace {

constexpr uint64_t kPageBytes = 4096;  // mmap offsets are page multiples

// Longest restore group name (daemon.proto RestoreRequest.group).
constexpr size_t kMaxGroupBytes = 1024;

// The daemon's refusal of a restore, for a daemon that does not serve them.
absl::Status NoRestoreService(const std::string& socket) {
  return absl::FailedPreconditionError(absl::StrCat(
      "the daemon at ", socket,
      " does not serve restores (an older daemon): read the checkpoint "
      "directly"));
}

absl::Status CheckOptions(const RestoreOptions& o) {
  if (o.local_world_size < 1 || o.local_rank < 0 ||
      o.local_rank >= o.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "local_rank ", o.local_rank, " is not in [0, local_world_size) with ",
        "local_world_size ", o.local_world_size));
  }
  if (o.group.size() > kMaxGroupBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group of ", o.group.size(), " bytes, more than ", kMaxGroupBytes));
  }
  if (o.batch_bytes < internal::kMinRestoreBatchBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch_bytes ", o.batch_bytes, " is below the minimum of ",
                     internal::kMinRestoreBatchBytes));
  }
  return absl::OkStatus();
}

// The Restore call of batch `b` of `n`.
pb::RestoreRequest RequestFor(const std::string& checkpoint_id,
                              const RestoreOptions& options, uint64_t arena_id,
                              absl::Span<const RestoreTensor> tensors,
                              absl::Span<const internal::RestoreWant> wants,
                              absl::Span<const RestoreBytesItem> bytes_items,
                              const internal::RestoreBatch& batch, size_t b,
                              size_t n) {
  pb::RestoreRequest req;
  req.set_checkpoint_id(checkpoint_id);
  req.set_group(options.group);
  req.set_local_rank(options.local_rank);
  req.set_local_world_size(options.local_world_size);
  req.set_batch(static_cast<uint32_t>(b));
  req.set_last(b + 1 == n);
  req.set_arena_id(arena_id);
  req.set_skip_crc(!options.verify_crc);
  req.set_identity(options.identity);
  req.set_accept_group_buffer(options.group_buffer);
  req.set_accept_held_buffers(options.held_buffers);
  req.mutable_boxes()->Reserve(static_cast<int>(batch.boxes.size()));
  for (const internal::RestorePiece& p : batch.boxes) {
    const RestoreTensor& t = tensors[p.tensor];
    pb::RestoreBox* box = req.add_boxes();
    box->set_fqn(t.fqn);
    box->set_dtype(wants[p.tensor].dtype);
    for (size_t k = 0; k < p.box.sizes.size(); ++k) {
      box->add_offsets(t.offsets[k] + p.box.offsets[k]);
      box->add_sizes(p.box.sizes[k]);
    }
    box->set_arena_offset(p.arena_offset);
  }
  for (const internal::RestoreBytesSlot& s : batch.bytes_items) {
    pb::RestoreBytes* item = req.add_bytes_items();
    item->set_fqn(bytes_items[s.item].fqn);
    item->set_arena_offset(s.arena_offset);
    item->set_capacity(s.capacity);
  }
  return req;
}

// Where boxes of no bytes "lie" when no buffer had to be mapped for them.
constexpr char kNothing = 0;

// A group buffer mapped read-only (RestoreResponse.group_buffer_token),
// unmapped on destruction.
class MappedBuffer {
 public:
  MappedBuffer() = default;
  MappedBuffer(const char* data, size_t size) : data_(data), size_(size) {}
  MappedBuffer(MappedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)) {}
  MappedBuffer& operator=(MappedBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  ~MappedBuffer() {
    if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
  }
  const char* data() const { return data_; }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// Maps [offset, offset + len) of `fd` read-only at a huge page alignment
// matching the file's (shm/huge_pages.h): the files of the daemon's memory
// tier are kept in huge pages, and mapped so each of them costs one fault.
absl::StatusOr<MappedBuffer> MapAligned(int fd, uint64_t offset, size_t len) {
  ASSIGN_OR_RETURN(const char* m, shm::MapReadOnlyAligned(fd, offset, len));
  return MappedBuffer(m, len);
}

// Fetches the daemon's buffer `token`, which its reply says has `size`
// bytes. INTERNAL when it has not, or when a box of `part` (arena_offset:
// its offset in the buffer) does not fit in it.
absl::StatusOr<shm::FetchedFd> FetchBuffer(const std::string& arena_socket,
                                           const std::string& token,
                                           uint64_t size,
                                           absl::Duration timeout,
                                           const internal::RestoreBatch& part) {
  ASSIGN_OR_RETURN(shm::FetchedFd fetched,
                   shm::FetchGroupBuffer(arena_socket, token, timeout));
  if (fetched.size != size) {
    return absl::InternalError(absl::StrCat("the daemon's buffer has ",
                                            fetched.size,
                                            " bytes, its reply says ", size));
  }
  for (const internal::RestorePiece& p : part.boxes) {
    if (p.arena_offset > size || p.nbytes > size - p.arena_offset) {
      return absl::InternalError(
          absl::StrCat("the daemon put a box of ", p.nbytes, " bytes at ",
                       p.arena_offset, " of a ", size, "-byte buffer"));
    }
  }
  return fetched;
}

// Maps the part of a fetched buffer that the boxes of `part` lie in (their
// arena_offset are offsets in the buffer; afterwards, in the mapping).
absl::StatusOr<MappedBuffer> MapRange(const shm::FetchedFd& fetched,
                                      internal::RestoreBatch* part) {
  uint64_t lo = fetched.size, hi = 0;
  for (const internal::RestorePiece& p : part->boxes) {
    lo = std::min(lo, p.arena_offset);
    hi = std::max(hi, p.arena_offset + p.nbytes);
  }
  if (hi <= lo) {
    for (internal::RestorePiece& p : part->boxes) p.arena_offset = 0;
    return MappedBuffer();  // nothing to read
  }
  // Whole huge pages where the file has them: from the extent `lo` lies in
  // to the end of the one `hi` lies in, or the file's last page.
  lo -= lo % shm::kHugePageBytes;
  const uint64_t file_end =
      (fetched.size + kPageBytes - 1) / kPageBytes * kPageBytes;
  hi = std::min(file_end, (hi + shm::kHugePageBytes - 1) / shm::kHugePageBytes *
                              shm::kHugePageBytes);
  ASSIGN_OR_RETURN(MappedBuffer mapped,
                   MapAligned(fetched.fd.get(), lo, hi - lo));
  for (internal::RestorePiece& p : part->boxes) p.arena_offset -= lo;
  return mapped;
}

// The group buffers one restore has mapped, by memfd. A group alternates
// between two buffers that the daemon reads into again and again
// (daemon/restore/group_buffers.h): each is mapped whole once, at its first
// batch, not once per batch, so that the kernel does not populate and the
// CPU does not fault in the same pages again at every batch. The batch
// protocol keeps this safe: the daemon reads into a buffer again only after
// every rank sent the batch after next, i.e. copied this one out. The
// newest kMaxMaps stay mapped (a buffer the daemon replaced is unmapped).
class GroupBufferMaps {
 public:
  // The whole buffer behind `fetched`, mapped read-only.
  absl::StatusOr<const char*> Map(const shm::FetchedFd& fetched) {
    if (fetched.size == 0) return &kNothing;  // no box has a byte in it
    struct stat st;
    if (::fstat(fetched.fd.get(), &st) != 0) {
      return absl::ErrnoToStatus(errno, "fstat of the daemon's buffer");
    }
    const Key key{st.st_dev, st.st_ino, fetched.size};
    for (const auto& [k, mapped] : maps_) {
      if (k == key) return mapped.data();
    }
    // Not populated: a rank may take only a few of the buffer's boxes
    // (sharded restores); the pages it reads fault in once.
    ASSIGN_OR_RETURN(MappedBuffer mapped,
                     MapAligned(fetched.fd.get(), 0, fetched.size));
    if (maps_.size() == kMaxMaps) maps_.erase(maps_.begin());
    maps_.emplace_back(key, std::move(mapped));
    return maps_.back().second.data();
  }

 private:
  static constexpr size_t kMaxMaps = 2;
  struct Key {
    dev_t dev;
    ino_t ino;
    uint64_t size;
    bool operator==(const Key&) const = default;
  };
  std::vector<std::pair<Key, MappedBuffer>> maps_;  // oldest first
};

// Copies the boxes of a served batch into their destinations: from the
// arena, from the group buffer the daemon read once for the group's ranks,
// or from the files of its memory tier it lends (RestoreResponse.
// box_buffers), each fetched and mapped read-only.
absl::Status CopyBoxesOut(const std::string& arena_socket,
                          const pb::RestoreResponse& resp,
                          const internal::RestoreBatch& batch,
                          const char* arena, absl::Duration timeout,
                          absl::Span<const RestoreTensor> tensors,
                          absl::Span<const internal::RestoreWant> wants,
                          int threads, GroupBufferMaps* group_maps) {
  const bool group = !resp.group_buffer_token().empty();
  const int held = resp.held_buffers_size();
  if (!group && held == 0) {
    internal::CopyBatchOut(tensors, wants, batch, arena, threads);
    return absl::OkStatus();
  }
  const size_t n = batch.boxes.size();
  if (static_cast<size_t>(resp.box_buffer_offsets_size()) != n ||
      (held > 0 && static_cast<size_t>(resp.box_buffers_size()) != n)) {
    return absl::InternalError(absl::StrCat(
        "the daemon's reply places ", resp.box_buffer_offsets_size(),
        " boxes in ", resp.box_buffers_size(), " buffers for ", n, " boxes"));
  }
  // parts[0]: where boxes are without lent memory; parts[i]: held buffer i-1.
  std::vector<internal::RestoreBatch> parts(1 + static_cast<size_t>(held));
  for (size_t j = 0; j < n; ++j) {
    const int i = static_cast<int>(j);
    const uint32_t src = held > 0 ? resp.box_buffers(i) : 0;
    if (src > static_cast<uint32_t>(held)) {
      return absl::InternalError(absl::StrCat(
          "the daemon put box ", j, " in buffer ", src, " of ", held));
    }
    internal::RestorePiece p = batch.boxes[j];
    if (src > 0 || group) p.arena_offset = resp.box_buffer_offsets(i);
    parts[src].boxes.push_back(std::move(p));
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    internal::RestoreBatch& part = parts[k];
    if (part.boxes.empty()) continue;
    if (k == 0 && !group) {
      internal::CopyBatchOut(tensors, wants, part, arena, threads);
      continue;
    }
    const std::string& token =
        k == 0 ? resp.group_buffer_token()
               : resp.held_buffers(static_cast<int>(k - 1)).token();
    const uint64_t size =
        k == 0 ? resp.group_buffer_size()
               : resp.held_buffers(static_cast<int>(k - 1)).size();
    ASSIGN_OR_RETURN(const shm::FetchedFd fetched,
                     FetchBuffer(arena_socket, token, size, timeout, part));
    if (k == 0) {  // the group buffer: mapped whole, once per restore
      ASSIGN_OR_RETURN(const char* data, group_maps->Map(fetched));
      internal::CopyBatchOut(tensors, wants, part, data, threads);
      continue;
    }
    // A held file: each of its pages is read once, so only the range of
    // this batch's boxes is mapped, and unmapped after the copy.
    ASSIGN_OR_RETURN(const MappedBuffer mapped, MapRange(fetched, &part));
    internal::CopyBatchOut(tensors, wants, part,
                           mapped.data() != nullptr ? mapped.data() : &kNothing,
                           threads);
  }
  return absl::OkStatus();
}

// Whether the reply put every box outside the arena (a group buffer, lent
// memory), so that the next batch may be filled into the arena while these
// boxes are copied out.
bool BoxesOutsideArena(const pb::RestoreResponse& resp) {
  if (!resp.group_buffer_token().empty()) return true;
  if (resp.held_buffers_size() == 0) return false;
  for (uint32_t b : resp.box_buffers()) {
    if (b == 0) return false;
  }
  return true;
}

// Copies the bytes items of a served batch out of the arena.
absl::Status TakeBytesItems(const internal::RestoreBatch& batch,
                            const pb::RestoreResponse& resp, const char* arena,
                            absl::Span<RestoreBytesItem> bytes_items,
                            uint64_t* delivered) {
  if (resp.bytes_lengths_size() != static_cast<int>(batch.bytes_items.size())) {
    return absl::InternalError(absl::StrCat(
        "the daemon answered ", resp.bytes_lengths_size(),
        " bytes lengths for ", batch.bytes_items.size(), " bytes items"));
  }
  for (size_t k = 0; k < batch.bytes_items.size(); ++k) {
    const internal::RestoreBytesSlot& s = batch.bytes_items[k];
    const uint64_t len = resp.bytes_lengths(static_cast<int>(k));
    RestoreBytesItem& item = bytes_items[s.item];
    if (len > s.capacity) {
      return absl::InternalError(
          absl::StrCat("the daemon reports ", len, " bytes for bytes item '",
                       item.fqn, "' in a slot of ", s.capacity));
    }
    item.value.assign(arena + s.arena_offset, len);
    *delivered += len;
  }
  return absl::OkStatus();
}

// After batch `failed` of a group restore failed: sends this rank's last
// batch, empty, so that the group's other ranks do not wait for it at each
// of their later batches (until the gather deadline). Best effort: the
// daemon counts the rank finished as the call arrives, so its answer
// (which comes when the group's batch is served) is not waited for long.
void LeaveGroup(pb::CheckpointDaemon::Stub* stub,
                const pb::RestoreRequest& failed, absl::Duration timeout) {
  pb::RestoreRequest req;
  req.set_checkpoint_id(failed.checkpoint_id());
  req.set_group(failed.group());
  req.set_local_rank(failed.local_rank());
  req.set_local_world_size(failed.local_world_size());
  req.set_batch(failed.batch() + 1);
  req.set_last(true);
  req.set_arena_id(failed.arena_id());
  req.set_identity(failed.identity());
  grpc::ClientContext ctx;
  internal::SetTimeout(&ctx, timeout);
  pb::RestoreResponse resp;
  (void)stub->Restore(&ctx, req, &resp);
}

// One Restore call in flight (the stub's callback API), so that the call
// of the next batch can overlap copying this one out.
struct BatchCall {
  grpc::ClientContext ctx;
  pb::RestoreRequest req;
  pb::RestoreResponse resp;
  absl::Notification done;
  grpc::Status status;

  void Start(pb::CheckpointDaemon::Stub* stub, absl::Duration timeout) {
    internal::SetTimeout(&ctx, timeout);
    // gRPC core (uninstrumented) orders this thread's writes before the
    // callback on its thread: told to TSan.
    TsanRelease(this);
    stub->async()->Restore(&ctx, &req, &resp, [this](grpc::Status s) {
      TsanAcquire(this);
      status = std::move(s);
      done.Notify();
    });
  }
  // gRPC ends every call by its deadline; past that and a slack, the call
  // is cancelled (its callback then comes at once).
  absl::Status Finish(absl::Duration timeout) {
    if (!done.WaitForNotificationWithTimeout(timeout + absl::Seconds(10))) {
      ctx.TryCancel();
      done.WaitForNotification();
    }
    return FromGrpc(status);
  }
};

// What the batches of one Client::Restore share.
struct BatchRun {
  pb::CheckpointDaemon::Stub* stub;
  const ClientOptions& client;
  std::string arena_socket;
  const char* arena;
  uint64_t arena_id;
  const std::string& checkpoint_id;
  const RestoreOptions& options;
  absl::Span<const RestoreTensor> tensors;
  absl::Span<const internal::RestoreWant> wants;
  absl::Span<RestoreBytesItem> bytes_items;
  const std::vector<internal::RestoreBatch>& batches;
  // Odd batches lie in the arena's second half (AlternateArenaHalves).
  bool double_buffered = false;

  std::unique_ptr<BatchCall> Start(size_t b) const {
    auto c = std::make_unique<BatchCall>();
    c->req = RequestFor(checkpoint_id, options, arena_id, tensors, wants,
                        bytes_items, batches[b], b, batches.size());
    c->Start(stub, client.rpc_timeout);
    return c;
  }
};

// Sends the batches and copies each out. The call of batch b+1 goes out
// before batch b is copied when b came in a group buffer (the arena is then
// free: the daemon reads batch b+1 while this rank copies batch b; it never
// reuses a group buffer before the group sent the batch after next), or
// when the batches alternate between the arena's halves (batch b+2, in b's
// half, goes out only after b was copied). On an error: the batch number
// it happened in, and a group rank leaves its group.
absl::Status RunBatches(const BatchRun& run, RestoreStats* stats,
                        size_t* failed) {
  const size_t n = run.batches.size();
  GroupBufferMaps group_maps;
  std::unique_ptr<BatchCall> cur = run.Start(0), next;
  for (size_t b = 0; b < n; ++b, cur = std::move(next)) {
    *failed = b;
    const internal::RestoreBatch& batch = run.batches[b];
    absl::Status s = cur->Finish(run.client.rpc_timeout);
    if (s.ok()) {
      s = TakeBytesItems(batch, cur->resp, run.arena, run.bytes_items,
                         &stats->bytes);
    }
    const bool overlap = run.double_buffered || BoxesOutsideArena(cur->resp);
    if (s.ok() && overlap && b + 1 < n) next = run.Start(b + 1);
    if (s.ok()) {
      s = CopyBoxesOut(run.arena_socket, cur->resp, batch, run.arena,
                       run.client.control_timeout, run.tensors, run.wants,
                       run.client.copy_threads, &group_maps);
    }
    if (!s.ok()) {
      // The next batch's call, if out, ends first (bounded by the gather).
      const pb::RestoreRequest* last_sent = &cur->req;
      if (next != nullptr && next->Finish(run.client.rpc_timeout).ok()) {
        last_sent = &next->req;
      }
      if (!last_sent->last() && !run.options.group.empty() &&
          run.options.local_world_size > 1) {
        LeaveGroup(run.stub, *last_sent,
                   std::min(run.client.control_timeout, absl::Seconds(2)));
      }
      return s;
    }
    for (const internal::RestorePiece& p : batch.boxes) {
      stats->bytes += p.nbytes;
    }
    stats->storage_bytes += cur->resp.storage_bytes();
    stats->copied_bytes += cur->resp.copied_bytes();
    stats->group_ranks = std::max(stats->group_ranks, cur->resp.group_ranks());
    ++stats->batches;
    if (next == nullptr && b + 1 < n) next = run.Start(b + 1);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RestoreIndex> Client::GetRestoreIndex(
    std::string_view checkpoint_id) {
  const std::string id(checkpoint_id);
  if (id.empty()) return absl::InvalidArgumentError("checkpoint_id is empty");
  RETURN_IF_ERROR(ValidateName("checkpoint_id", id, kMaxCheckpointIdBytes));
  if (!info_.restore) return NoRestoreService(options_.socket_path);
  pb::RestoreIndexRequest req;
  req.set_checkpoint_id(id);
  {
    // The arena tells the daemon who asks (its uid, from the kernel): the
    // index is served if that user may read the checkpoint.
    absl::MutexLock lock(&save_mu_);
    if (arena_ == nullptr) {
      RETURN_IF_ERROR(PrepareArena(internal::kArenaGranule,
                                   /*need_idle=*/false, /*populate=*/false));
    }
    req.set_arena_id(arena_id_);
  }
  grpc::ClientContext ctx;
  internal::SetTimeout(&ctx, options_.rpc_timeout);
  pb::RestoreIndexResponse resp;
  RETURN_IF_ERROR(FromGrpc(rpc_->stub->GetRestoreIndex(&ctx, req, &resp)));
  RestoreIndex out;
  out.checkpoint_id = std::move(*resp.mutable_checkpoint_id());
  out.index_json = std::move(*resp.mutable_index_json());
  out.identity = std::move(*resp.mutable_identity());
  if (out.checkpoint_id.empty()) out.checkpoint_id = id;
  return out;
}

absl::StatusOr<RestoreStats> Client::Restore(
    std::string_view checkpoint_id, const RestoreOptions& options,
    absl::Span<const RestoreTensor> tensors,
    absl::Span<RestoreBytesItem> bytes_items) {
  const absl::Time start = absl::Now();
  const std::string id(checkpoint_id);
  const std::string context = absl::StrCat("restore of checkpoint ", id);
  // Local validation: nothing has been sent yet if this fails.
  if (id.empty()) return absl::InvalidArgumentError("checkpoint_id is empty");
  RETURN_IF_ERROR(ValidateName("checkpoint_id", id, kMaxCheckpointIdBytes));
  RETURN_IF_ERROR(Annotate(CheckOptions(options), context));
  if (!info_.restore) return NoRestoreService(options_.socket_path);
  auto wants = internal::ValidateRestoreTensors(tensors);
  if (!wants.ok()) return Annotate(wants.status(), context);
  RETURN_IF_ERROR(
      Annotate(internal::ValidateRestoreBytes(bytes_items), context));
  std::vector<uint64_t> capacity(bytes_items.size());
  std::vector<std::string> bytes_fqns(bytes_items.size());
  for (size_t i = 0; i < bytes_items.size(); ++i) {
    capacity[i] = bytes_items[i].nbytes;
    bytes_fqns[i] = bytes_items[i].fqn;
  }
  // The same limit for every rank of the node: the group's batches match.
  uint64_t limit = options.batch_bytes;
  if (info_.max_batch_bytes != 0) {
    limit = std::max(std::min(limit, info_.max_batch_bytes),
                     internal::kMinRestoreBatchBytes);
  }
  auto batches =
      internal::PlanRestoreBatches(*wants, capacity, bytes_fqns, limit);
  if (!batches.ok()) return Annotate(batches.status(), context);
  // A rank alone (no group, so no group buffers) with several batches:
  // batches of half the size in the two halves of the same arena, so that
  // the daemon fills batch b+1 while this rank copies batch b out.
  bool double_buffered = false;
  if (options.group.empty() && batches->size() > 1 &&
      limit / 2 >= internal::kMinRestoreBatchBytes) {
    auto halves =
        internal::PlanRestoreBatches(*wants, capacity, bytes_fqns, limit / 2);
    if (halves.ok()) {
      internal::AlternateArenaHalves(*halves);
      batches = std::move(halves);
      double_buffered = true;
    }
  }

  absl::MutexLock lock(&save_mu_);
  RETURN_IF_ERROR(Annotate(
      PrepareArena(internal::RestoreArenaBytes(*batches), /*need_idle=*/true,
                   /*populate=*/false),
      context));
  RestoreStats stats;
  const BatchRun run{rpc_->stub.get(), options_,  ArenaSocketPath(),
                     arena_->data(),   arena_id_, id,
                     options,          tensors,   *wants,
                     bytes_items,      *batches,  double_buffered};
  size_t failed = 0;
  if (absl::Status s = RunBatches(run, &stats, &failed); !s.ok()) {
    const size_t n = batches->size();
    return Annotate(s, n == 1 ? context
                              : absl::StrCat(context, " (batch ", failed + 1,
                                             " of ", n, ")"));
  }
  stats.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return stats;
}

}  // namespace ckptd::client
