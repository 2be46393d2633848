// Copyright 2026 The ckptd Authors.
//
// Client: the only translation unit of libckptd_client that sees gRPC and
// the generated protocol code.
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/batching.h"
#include "client/ckptd_client.h"
#include "client/client_rpc.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "proto/grpc_status.h"
#include "shm/arena.h"
#include "shm/fd_passing.h"

namespace ckptd::client {

namespace pb = ::ckptd::v1;

namespace {

using internal::SetTimeout;

// Largest gRPC message either way (the item index of a big rank).
constexpr int kMaxMessageBytes = 64 << 20;

// grpc::Status → absl::Status: same code (the numbering is shared), the
// daemon's message unchanged.

CheckpointInfo FromProto(const pb::CheckpointStatus& s) {
  CheckpointInfo info;
  info.checkpoint_id = s.checkpoint_id();
  info.job = s.job();
  info.state = pb::CheckpointState_Name(s.state());
  if (info.state.empty()) info.state = absl::StrCat("STATE_", s.state());
  info.error = s.error();
  info.error_code = s.error_code();
  info.world_size = s.world_size();
  info.ranks_staged = s.ranks_staged();
  info.total_bytes = s.total_bytes();
  info.staged_bytes = s.staged_bytes();
  info.written_bytes = s.written_bytes();
  info.file_bytes = s.file_bytes();
  info.items = s.items();
  info.files = s.files();
  info.created_unix_ms = s.created_unix_ms();
  info.staged_unix_ms = s.staged_unix_ms();
  info.finished_unix_ms = s.finished_unix_ms();
  info.num_nodes = s.num_nodes();
  info.coordinator = s.coordinator();
  info.is_coordinator = s.is_coordinator();
  info.nodes_planned = s.nodes_planned();
  info.nodes_prepared = s.nodes_prepared();
  info.awaiting_metadata = s.awaiting_metadata();
  info.memory_tier_bytes = s.memory_tier_bytes();
  info.replica_holders.assign(s.replica_holders().begin(),
                              s.replica_holders().end());
  info.replicas_held.assign(s.replicas_held().begin(), s.replicas_held().end());
  info.local_ranks = s.local_ranks();
  info.local_total_bytes = s.local_total_bytes();
  info.local_written_bytes = s.local_written_bytes();
  return info;
}

void ToProto(const SaveItem& item, const internal::PreparedItem& p,
             pb::Item* out) {
  out->set_fqn(item.fqn);
  out->set_nbytes(p.nbytes);
  if (item.is_bytes) {
    out->set_type(pb::ITEM_TYPE_BYTES);
  } else {
    out->set_type(pb::ITEM_TYPE_TENSOR);
    out->set_dtype(p.dtype);
    out->mutable_global_shape()->Add(item.global_shape.begin(),
                                     item.global_shape.end());
    out->mutable_chunk_offsets()->Add(item.chunk_offsets.begin(),
                                      item.chunk_offsets.end());
    out->mutable_chunk_sizes()->Add(item.chunk_sizes.begin(),
                                    item.chunk_sizes.end());
  }
  for (const PathElement& e : item.path) {
    pb::PathElement* pe = out->add_path();
    if (const auto* key = std::get_if<std::string>(&e)) {
      pe->set_key(*key);
    } else {
      pe->set_index(std::get<int64_t>(e));
    }
  }
}

// A daemon-side timeout in milliseconds for a proto uint32 field (>= 1).
uint32_t TimeoutMs(absl::Duration d) {
  const int64_t ms = absl::ToInt64Milliseconds(d);
  return static_cast<uint32_t>(
      std::clamp<int64_t>(ms, 1, std::numeric_limits<uint32_t>::max()));
}

// Checks Save's own arguments (the items are checked by ValidateItems).
absl::Status ValidateSaveArgs(const std::string& checkpoint_id,
                              const std::string& job, int rank, int world_size,
                              const ClusterSpec& cluster) {
  if (checkpoint_id.empty()) {
    return absl::InvalidArgumentError("checkpoint_id is empty");
  }
  RETURN_IF_ERROR(
      ValidateName("checkpoint_id", checkpoint_id, kMaxCheckpointIdBytes));
  RETURN_IF_ERROR(ValidateName("job", job, kMaxJobBytes));
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank, " is not in [0, world_size) with world_size ",
        world_size));
  }
  return internal::ValidateCluster(cluster, rank, world_size);
}

// A save's items by where their bytes are: host memory (copied into the
// arena) or a CUDA device (staged by the daemon).
struct ItemSizes {
  std::vector<uint64_t> sizes;       // every item's bytes
  std::vector<uint64_t> host_sizes;  // the arena's share, in item order
  std::vector<uint8_t> on_device;    // 1: a CUDA item
  uint64_t total = 0;
  uint64_t host_total = 0;
};

// The byte counts of the prepared items (ValidateItems).
ItemSizes SizeItems(const std::vector<internal::PreparedItem>& prepared) {
  ItemSizes s;
  s.sizes.resize(prepared.size());
  s.on_device.resize(prepared.size(), 0);
  for (size_t i = 0; i < prepared.size(); ++i) {
    s.sizes[i] = prepared[i].nbytes;
    s.total += s.sizes[i];  // each < 2^63; a rank's sum beyond 2^64 is absurd
    s.on_device[i] = prepared[i].device ? 1 : 0;
    if (!prepared[i].device) {
      s.host_sizes.push_back(s.sizes[i]);
      s.host_total += s.sizes[i];
    }
  }
  return s;
}

// The first SaveRequest's own part: the item index and the save's options.
void AddIndexAndOptions(absl::Span<const SaveItem> items,
                        const std::vector<internal::PreparedItem>& prepared,
                        const SaveOptions& options, pb::SaveRequest& req) {
  req.mutable_items()->Reserve(static_cast<int>(items.size()));
  for (size_t i = 0; i < items.size(); ++i) {
    ToProto(items[i], prepared[i], req.add_items());
  }
  pb::SaveOptions* o = req.mutable_options();
  o->set_overwrite(options.overwrite);
  o->set_dedup_save_to_lowest_rank(options.dedup_save_to_lowest_rank);
  o->set_keep_last_n(static_cast<uint32_t>(std::max(0, options.keep_last_n)));
  o->set_keep_every(static_cast<uint32_t>(std::max(0, options.keep_every)));
  o->set_compression(options.compression);
  o->set_external_metadata(options.external_metadata);
  o->set_metadata_timeout_ms(static_cast<uint32_t>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(options.metadata_timeout), 0, 86'400'000)));
  if (!internal::IsSingleNode(options.cluster)) {
    pb::ClusterSpec* cluster = req.mutable_cluster();
    cluster->set_coordinator(options.cluster.coordinator);
    cluster->mutable_local_ranks()->Add(options.cluster.local_ranks.begin(),
                                        options.cluster.local_ranks.end());
    cluster->set_num_nodes(options.cluster.num_nodes);
  }
}

// A batch's extents, and the CUDA buffers its device extents read from:
// one per (device, IPC handle), so views of one allocation share it.
void AddExtents(absl::Span<const SaveItem> items, const internal::Batch& batch,
                pb::SaveRequest& req) {
  req.mutable_extents()->Reserve(static_cast<int>(batch.extents.size()));
  std::map<std::pair<std::string, std::string>, uint32_t> buffers;
  for (const internal::Extent& e : batch.extents) {
    pb::Extent* pe = req.add_extents();
    pe->set_item(e.item);
    pe->set_item_offset(e.item_offset);
    pe->set_arena_offset(e.arena_offset);
    pe->set_length(e.length);
    if (!e.device) continue;
    const CudaSource& src = *items[e.item].cuda;
    std::string handle(reinterpret_cast<const char*>(src.ipc_handle.data()),
                       src.ipc_handle.size());
    auto [it, added] = buffers.try_emplace(
        {src.device, handle}, static_cast<uint32_t>(buffers.size() + 1));
    if (added) {
      pb::CudaBuffer* cb = req.add_cuda_buffers();
      cb->set_ipc_handle(std::move(handle));
      cb->set_device(src.device);
      cb->set_size(src.allocation_size);
    }
    pe->set_cuda_buffer(it->second);
    pe->set_arena_offset(src.offset + e.item_offset);
  }
}

}  // namespace

std::string DefaultSocketPath() {
  const char* env = std::getenv("CKPTD_SOCKET");
  if (env != nullptr && *env != '\0') return env;
  return "/run/ckptd/ckptd.sock";
}

Client::Client(ClientOptions options, std::unique_ptr<Rpc> rpc, DaemonInfo info)
    : options_(std::move(options)),
      rpc_(std::move(rpc)),
      info_(std::move(info)) {}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
  ClientOptions opts = options;
  if (opts.socket_path.empty()) opts.socket_path = DefaultSocketPath();
  opts.copy_threads = std::max(opts.copy_threads, 1);
  if (opts.owner.empty()) opts.owner = absl::StrCat("pid ", ::getpid());

  auto rpc = std::make_unique<Rpc>();
  rpc->target = absl::StartsWith(opts.socket_path, "unix:")
                    ? opts.socket_path
                    : absl::StrCat("unix:", opts.socket_path);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  // A local daemon that restarts should be found again quickly.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  rpc->channel = grpc::CreateCustomChannel(
      rpc->target, grpc::InsecureChannelCredentials(), args);
  rpc->stub = pb::CheckpointDaemon::NewStub(rpc->channel);

  grpc::ClientContext ctx;
  SetTimeout(&ctx, opts.control_timeout);
  pb::GetInfoRequest req;
  pb::GetInfoResponse resp;
  const absl::Status s = FromGrpc(rpc->stub->GetInfo(&ctx, req, &resp));
  if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
    return absl::Status(
        s.code(), absl::StrCat("cannot reach ckptd at ", opts.socket_path,
                               " (is the daemon running?): ", s.message()));
  }
  if (!s.ok()) {
    return Annotate(s,
                    absl::StrCat("GetInfo from ckptd at ", opts.socket_path));
  }
  DaemonInfo info;
  info.version = resp.version();
  info.shm_dir = resp.shm_dir();
  info.io_backend = resp.io_backend();
  info.staging_budget_bytes = resp.staging_budget_bytes();
  info.max_batch_bytes = resp.max_batch_bytes();
  info.max_items = resp.max_items();
  info.checkpoint_roots.assign(resp.checkpoint_roots().begin(),
                               resp.checkpoint_roots().end());
  info.pid = resp.pid();
  info.peer_address = resp.peer_address();
  info.cuda_ipc = resp.cuda_ipc();
  info.cuda_unavailable = resp.cuda_unavailable();
  info.pinned_staging_bytes = resp.pinned_staging_bytes();
  info.cuda_devices.assign(resp.cuda_devices().begin(),
                           resp.cuda_devices().end());
  info.arena_socket = resp.arena_socket();
  info.named_arenas = resp.named_arenas();
  info.restore = resp.restore();
  info.restore_gather_timeout_ms = resp.restore_gather_timeout_ms();
  return std::unique_ptr<Client>(
      new Client(std::move(opts), std::move(rpc), std::move(info)));
}

Client::~Client() {
  absl::MutexLock lock(&save_mu_);
  ReleaseArena();
}

void Client::ReleaseArena() {
  if (arena_id_ != 0) {
    grpc::ClientContext ctx;
    SetTimeout(&ctx, std::min(options_.control_timeout, absl::Seconds(5)));
    pb::ReleaseArenaRequest req;
    req.set_arena_id(arena_id_);
    pb::ReleaseArenaResponse resp;
    // Best effort: the daemon also drops idle arenas by itself.
    (void)rpc_->stub->ReleaseArena(&ctx, req, &resp);
  }
  arena_id_ = 0;
  arena_.reset();
}

std::string Client::ArenaSocketPath() const {
  // The daemon reports the path as it sees it. A client in another mount
  // namespace (a container with the socket directory mounted elsewhere)
  // reaches it beside its own gRPC socket under the same name, so that is
  // tried first; the reported path otherwise.
  std::string own = options_.socket_path;
  if (absl::StartsWith(own, "unix:")) own = own.substr(5);
  const size_t slash = own.rfind('/');
  const size_t base = info_.arena_socket.rfind('/');
  if (slash != std::string::npos) {
    const std::string sibling = absl::StrCat(
        own.substr(0, slash + 1),
        info_.arena_socket.substr(base == std::string::npos ? 0 : base + 1));
    struct stat st;
    if (::stat(sibling.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      return sibling;
    }
  }
  return info_.arena_socket;
}

absl::Status Client::PrepareArena(uint64_t bytes, bool need_idle,
                                  bool populate) {
  if (arena_ != nullptr && arena_->size() >= bytes) {
    absl::Status s = absl::OkStatus();
    if (need_idle) {
      grpc::ClientContext ctx;
      SetTimeout(&ctx, options_.rpc_timeout);
      pb::WaitArenaIdleRequest req;
      req.set_arena_id(arena_id_);
      pb::WaitArenaIdleResponse resp;
      s = FromGrpc(rpc_->stub->WaitArenaIdle(&ctx, req, &resp));
    }
    if (s.ok()) {
      // An arena a restore made, now to be written by a save (or reserved
      // for one): its pages are faulted in here, as a new one's are at
      // creation. This changes no byte, so a checkpoint still reading it is
      // not disturbed.
      if (populate && !arena_populated_) {
        RETURN_IF_ERROR(arena_->Populate());
        arena_populated_ = true;
      }
      return s;
    }
    if (!absl::IsNotFound(s)) return s;
    // The daemon dropped the arena (idle timeout, restart): make a new one.
    arena_id_ = 0;
    arena_.reset();
  } else if (arena_ != nullptr) {
    ReleaseArena();  // too small
  }

  if (!info_.arena_socket.empty()) {
    // A sealed memfd passed over the arena socket: the daemon learns who we
    // are from the kernel and maps exactly the memory we hand it.
    ASSIGN_OR_RETURN(std::unique_ptr<shm::Arena> arena,
                     shm::Arena::CreateMemfd(bytes, "ckptd-arena", populate));
    ASSIGN_OR_RETURN(
        const uint64_t id,
        shm::RegisterArenaFd(ArenaSocketPath(), arena->fd(), arena->size(),
                             options_.owner, options_.control_timeout));
    arena_ = std::move(arena);
    arena_id_ = id;
    arena_populated_ = populate;
    return absl::OkStatus();
  }
  // An older daemon without the arena socket: a named file in its shm_dir.
  ASSIGN_OR_RETURN(std::unique_ptr<shm::Arena> arena,
                   shm::Arena::Create(info_.shm_dir, bytes, "ckptd-arena"));
  grpc::ClientContext ctx;
  SetTimeout(&ctx, options_.control_timeout);
  pb::RegisterArenaRequest req;
  req.set_name(arena->name());
  req.set_size_bytes(arena->size());
  req.set_owner(options_.owner);
  req.set_client_pid(::getpid());
  pb::RegisterArenaResponse resp;
  // On failure `arena` is destroyed, which unlinks its file.
  RETURN_IF_ERROR(FromGrpc(rpc_->stub->RegisterArena(&ctx, req, &resp)));
  if (resp.arena_id() == 0) {
    return absl::InternalError("RegisterArena returned arena id 0");
  }
  arena_ = std::move(arena);
  arena_id_ = resp.arena_id();
  arena_populated_ = true;  // Arena::Create pre-faults
  return absl::OkStatus();
}

absl::StatusOr<std::string> Client::Save(const std::string& checkpoint_id,
                                         const std::string& job, int rank,
                                         int world_size,
                                         absl::Span<const SaveItem> items,
                                         const SaveOptions& options,
                                         SaveStats* stats) {
  const absl::Time start = absl::Now();
  // Local validation: nothing has been sent yet if this fails.
  RETURN_IF_ERROR(
      ValidateSaveArgs(checkpoint_id, job, rank, world_size, options.cluster));
  ASSIGN_OR_RETURN(std::vector<internal::PreparedItem> prepared,
                   internal::ValidateItems(items, info_.max_items));
  const ItemSizes sizes = SizeItems(prepared);
  if (sizes.host_total != sizes.total && !info_.cuda_ipc) {
    return absl::FailedPreconditionError(
        absl::StrCat("the daemon does not stage CUDA tensors (",
                     info_.cuda_unavailable.empty() ? "an older daemon"
                                                    : info_.cuda_unavailable,
                     "); copy them to host memory"));
  }

  absl::MutexLock lock(&save_mu_);
  // An arena only for host bytes (a rank of CUDA tensors needs none).
  if (sizes.host_total > 0 || arena_ == nullptr) {
    RETURN_IF_ERROR(PrepareArena(
        internal::ArenaSizeFor(
            internal::SpanBytes(sizes.host_sizes, internal::kItemAlignment),
            info_.max_batch_bytes, info_.staging_budget_bytes),
        /*need_idle=*/sizes.host_total > 0));
  }
  uint64_t device_capacity = info_.pinned_staging_bytes;
  if (info_.max_batch_bytes != 0) {
    device_capacity = std::min(device_capacity, info_.max_batch_bytes);
  }
  ASSIGN_OR_RETURN(
      std::vector<internal::Batch> batches,
      internal::PlanMixedBatches(sizes.sizes, sizes.on_device, arena_->size(),
                                 device_capacity, info_.max_batch_bytes,
                                 internal::kItemAlignment));

  double copy_seconds = 0;
  std::string resolved;
  for (size_t b = 0; b < batches.size(); ++b) {
    const internal::Batch& batch = batches[b];
    const absl::Time copy_start = absl::Now();
    internal::CopyBatch(items, prepared, batch, arena_->data(),
                        options_.copy_threads);
    copy_seconds += absl::ToDoubleSeconds(absl::Now() - copy_start);

    pb::SaveRequest req;
    req.set_checkpoint_id(checkpoint_id);
    req.set_job(job);
    req.set_rank(rank);
    req.set_world_size(world_size);
    req.set_sequence(static_cast<uint32_t>(b));
    req.set_arena_id(arena_id_);
    req.set_last(b + 1 == batches.size());
    if (b == 0) AddIndexAndOptions(items, prepared, options, req);
    AddExtents(items, batch, req);
    grpc::ClientContext ctx;
    SetTimeout(&ctx, options_.rpc_timeout);
    pb::SaveResponse resp;
    RETURN_IF_ERROR(FromGrpc(rpc_->stub->Save(&ctx, req, &resp)));
    if (!resp.checkpoint_id().empty()) resolved = resp.checkpoint_id();
  }
  if (stats != nullptr) {
    stats->copy_seconds = copy_seconds;
    stats->total_seconds = absl::ToDoubleSeconds(absl::Now() - start);
    stats->bytes = sizes.total;
    stats->batches = static_cast<int>(batches.size());
  }
  return resolved.empty() ? checkpoint_id : resolved;
}

absl::Status Client::Reserve(uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  const uint64_t sizes[1] = {bytes};
  absl::MutexLock lock(&save_mu_);
  return PrepareArena(internal::ArenaSizeFor(
                          internal::SpanBytes(sizes, internal::kItemAlignment),
                          info_.max_batch_bytes, info_.staging_budget_bytes),
                      /*need_idle=*/false);
}

absl::StatusOr<CheckpointInfo> Client::Wait(const std::string& checkpoint_id,
                                            absl::Duration timeout,
                                            bool until_data_durable) {
  // One call per rpc_timeout slice, so a dead connection is noticed and a
  // long wait needs no long deadline.
  const absl::Time end =
      timeout == absl::InfiniteDuration()
          ? absl::InfiniteFuture()
          : absl::Now() + std::max(timeout, absl::ZeroDuration());
  // Each call's own deadline, beyond the WaitRequest's timeout_ms.
  constexpr absl::Duration kSlack = absl::Seconds(10);
  while (true) {
    const absl::Duration left = end - absl::Now();
    const absl::Duration slice =
        std::max(std::min(left, options_.rpc_timeout), absl::ZeroDuration());
    const absl::Time own_deadline = absl::Now() + slice + kSlack;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(own_deadline));
    pb::WaitRequest req;
    req.set_checkpoint_id(checkpoint_id);
    req.set_timeout_ms(TimeoutMs(slice));
    req.set_until_data_durable(until_data_durable);
    pb::CheckpointStatus resp;
    const absl::Status s = FromGrpc(rpc_->stub->Wait(&ctx, req, &resp));
    if (s.ok()) return FromProto(resp);
    if (!absl::IsDeadlineExceeded(s)) return s;
    // DEADLINE_EXCEEDED comes either from the daemon ("not final yet",
    // answered at timeout_ms, kSlack before our deadline) or from our own
    // deadline passing without any answer: the daemon stopped answering
    // (SIGSTOP, a hung host). Only the first may loop; calling again after
    // the second would wait for ever.
    if (absl::Now() >= own_deadline - kSlack / 2) {
      return absl::DeadlineExceededError(
          absl::StrCat("the daemon at ", options_.socket_path,
                       " did not answer a Wait for checkpoint ", checkpoint_id,
                       " within ", absl::FormatDuration(slice + kSlack)));
    }
    if (absl::Now() >= end) return s;
  }
}

absl::StatusOr<CheckpointInfo> Client::GetStatus(
    const std::string& checkpoint_id) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, options_.control_timeout);
  pb::GetStatusRequest req;
  req.set_checkpoint_id(checkpoint_id);
  pb::CheckpointStatus resp;
  RETURN_IF_ERROR(FromGrpc(rpc_->stub->GetStatus(&ctx, req, &resp)));
  return FromProto(resp);
}

absl::StatusOr<std::vector<CheckpointInfo>> Client::List(const std::string& job,
                                                         bool include_disk) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, options_.control_timeout);
  pb::ListRequest req;
  req.set_job(job);
  req.set_include_disk(include_disk);
  pb::ListResponse resp;
  RETURN_IF_ERROR(FromGrpc(rpc_->stub->List(&ctx, req, &resp)));
  std::vector<CheckpointInfo> out;
  out.reserve(static_cast<size_t>(resp.checkpoints_size()));
  for (const auto& c : resp.checkpoints()) out.push_back(FromProto(c));
  return out;
}

absl::Status Client::Cancel(const std::string& checkpoint_id,
                            const std::string& reason) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, options_.control_timeout);
  pb::CancelRequest req;
  req.set_checkpoint_id(checkpoint_id);
  req.set_reason(reason);
  pb::CancelResponse resp;
  return FromGrpc(rpc_->stub->Cancel(&ctx, req, &resp));
}

absl::StatusOr<std::vector<RestoreProgress>> Client::ListRestores() {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, options_.control_timeout);
  pb::ListRestoresResponse resp;
  RETURN_IF_ERROR(FromGrpc(
      rpc_->stub->ListRestores(&ctx, pb::ListRestoresRequest(), &resp)));
  std::vector<RestoreProgress> out;
  for (const pb::RestoreProgress& p : resp.restores()) {
    out.push_back(RestoreProgress{
        p.id(), p.checkpoint_id(), p.group(), p.uid(), p.local_world_size(),
        p.state(), p.started_unix_ms(), p.last_active_unix_ms(), p.batches(),
        p.copied_bytes(), p.storage_bytes(), p.ranks_done(), p.error(),
        p.peer_bytes()});
  }
  return out;
}

absl::Status Client::CancelRestore(const std::string& id,
                                   const std::string& reason) {
  grpc::ClientContext ctx;
  SetTimeout(&ctx, options_.control_timeout);
  pb::CancelRestoreRequest req;
  req.set_id(id);
  req.set_reason(reason);
  pb::CancelRestoreResponse resp;
  return FromGrpc(rpc_->stub->CancelRestore(&ctx, req, &resp));
}

}  // namespace ckptd::client
