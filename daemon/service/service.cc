// Copyright 2026 The ckptd Authors.

#include "daemon/service/service.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "common/absl_fmt.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/service/item_codec.h"
#include "daemon/service/restore_codec.h"
#include "daemon/service/socket_path.h"
#include "fmt/format.h"
#include "format/dtype.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_status.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

namespace pb = ::ckptd::v1;

int64_t UnixMs(absl::Time t) {
  return t == absl::InfinitePast() ? 0 : absl::ToUnixMillis(t);
}

void ToProto(const CheckpointInfo& info, pb::CheckpointStatus* out) {
  out->set_checkpoint_id(info.checkpoint_id);
  out->set_job(info.job);
  out->set_state(static_cast<pb::CheckpointState>(info.state));
  out->set_world_size(info.world_size);
  out->set_ranks_staged(info.ranks_staged);
  out->set_total_bytes(info.total_bytes);
  out->set_staged_bytes(info.staged_bytes);
  out->set_written_bytes(info.written_bytes);
  out->set_file_bytes(info.file_bytes);
  if (!info.error.ok()) {
    out->set_error(std::string(info.error.message()));
    out->set_error_code(static_cast<int>(info.error.code()));
  }
  out->set_created_unix_ms(UnixMs(info.created));
  out->set_staged_unix_ms(UnixMs(info.staged));
  out->set_finished_unix_ms(UnixMs(info.finished));
  out->set_items(info.items);
  out->set_files(info.files);
  out->set_num_nodes(info.num_nodes);
  out->set_coordinator(info.coordinator);
  out->set_is_coordinator(info.is_coordinator);
  out->set_nodes_planned(info.nodes_planned);
  out->set_nodes_prepared(info.nodes_prepared);
  out->set_awaiting_metadata(info.awaiting_metadata);
  out->set_memory_tier_bytes(info.memory_tier_bytes);
  out->set_local_ranks(info.local_ranks);
  out->set_local_total_bytes(info.local_total_bytes);
  out->set_local_written_bytes(info.local_written_bytes);
}

// SaveOptions.compression: "" → 0 (none), "zstd" → 3, "zstd:N" → N.
absl::StatusOr<int> ZstdLevelOf(std::string_view compression) {
  if (compression.empty()) return 0;
  if (compression == "zstd") return 3;
  constexpr std::string_view kPrefix = "zstd:";
  if (compression.starts_with(kPrefix)) {
    const std::string_view digits = compression.substr(kPrefix.size());
    int level = 0;
    const auto [end, ec] =
        std::from_chars(digits.data(), digits.data() + digits.size(), level);
    if (ec == std::errc() && end == digits.data() + digits.size() &&
        level >= 1 && level <= 19) {
      return level;
    }
  }
  return absl::InvalidArgumentError(fmt::format(
      "options.compression '{}' is not one of \"\", \"zstd\", \"zstd:N\" "
      "(N in 1..19)",
      EscapeForLog(compression)));
}

absl::Time DeadlineOf(grpc::CallbackServerContext* ctx, uint32_t timeout_ms) {
  absl::Time d = absl::InfiniteFuture();
  if (timeout_ms > 0) d = absl::Now() + absl::Milliseconds(timeout_ms);
  const auto ctx_deadline = ctx->deadline();
  if (ctx_deadline != std::chrono::system_clock::time_point::max()) {
    d = std::min(d, absl::FromChrono(ctx_deadline));
  }
  return d;
}

// SaveOptions into the batch (bounds checked).
absl::Status DecodeOptions(const pb::SaveOptions& o, SaveBatch* b) {
  b->overwrite = o.overwrite();
  b->dedup_save_to_lowest_rank = o.dedup_save_to_lowest_rank();
  if (o.keep_last_n() > (1u << 20)) {
    return absl::InvalidArgumentError(
        fmt::format("options.keep_last_n {} is above the limit of {}",
                    o.keep_last_n(), 1 << 20));
  }
  b->keep_last_n = static_cast<int>(o.keep_last_n());
  b->keep_every = std::min<int64_t>(o.keep_every(), INT32_MAX);
  ASSIGN_OR_RETURN(b->zstd_level, ZstdLevelOf(o.compression()));
  b->external_metadata = o.external_metadata();
  if (o.metadata_timeout_ms() > 86'400'000u) {
    return absl::InvalidArgumentError(
        fmt::format("options.metadata_timeout_ms {} is above the limit of "
                    "86400000 (one day)",
                    o.metadata_timeout_ms()));
  }
  if (o.metadata_timeout_ms() > 0) {
    b->metadata_timeout = absl::Milliseconds(o.metadata_timeout_ms());
  }
  return absl::OkStatus();
}

// Decodes a SaveRequest into the manager's plain struct; syntax only (the
// manager checks everything that needs state).
absl::StatusOr<SaveBatch> DecodeSave(const pb::SaveRequest& req) {
  SaveBatch b;
  b.checkpoint_id = req.checkpoint_id();
  b.job = req.job();
  if (b.job.size() > 4096)
    return absl::InvalidArgumentError("job is longer than 4096 bytes");
  b.rank = req.rank();
  b.world_size = req.world_size();
  b.sequence = req.sequence();
  b.arena_id = req.arena_id();
  b.last = req.last();
  RETURN_IF_ERROR(DecodeOptions(req.options(), &b));
  if (req.has_cluster()) {
    const pb::ClusterSpec& cl = req.cluster();
    if (cl.coordinator().size() > 1024) {
      return absl::InvalidArgumentError(
          "cluster.coordinator is longer than 1024 bytes");
    }
    if (cl.num_nodes() < 0 || cl.local_ranks_size() > (1 << 16)) {
      return absl::InvalidArgumentError(
          fmt::format("cluster: num_nodes {} or {} local_ranks out of range",
                      cl.num_nodes(), cl.local_ranks_size()));
    }
    b.cluster.coordinator = cl.coordinator();
    b.cluster.local_ranks.assign(cl.local_ranks().begin(),
                                 cl.local_ranks().end());
    b.cluster.num_nodes = std::max(1, cl.num_nodes());
  }
  b.items.reserve(req.items_size());
  b.item_nbytes.reserve(req.items_size());
  for (int i = 0; i < req.items_size(); ++i) {
    const pb::Item& it = req.items(i);
    ASSIGN_OR_RETURN(format::ItemDesc d,
                     DecodeItemFields(it, fmt::format("item {}", i)));
    if (it.chunk_offsets_size() > kMaxItemDims ||
        it.chunk_sizes_size() > kMaxItemDims) {
      return absl::InvalidArgumentError(fmt::format(
          "item '{}': more than {} dimensions", d.fqn, kMaxItemDims));
    }
    if (d.type == format::ItemDesc::Type::kBytes &&
        (it.chunk_offsets_size() || it.chunk_sizes_size())) {
      return absl::InvalidArgumentError(
          fmt::format("item '{}': a BYTES item has no shape", d.fqn));
    }
    d.chunk_offsets.assign(it.chunk_offsets().begin(),
                           it.chunk_offsets().end());
    d.chunk_sizes.assign(it.chunk_sizes().begin(), it.chunk_sizes().end());
    b.items.push_back(std::move(d));
    b.item_nbytes.push_back(it.nbytes());
  }
  b.extents.reserve(req.extents_size());
  for (const pb::Extent& e : req.extents()) {
    b.extents.push_back({e.item(), e.item_offset(), e.arena_offset(),
                         e.length(), e.cuda_buffer()});
  }
  b.cuda_buffers.reserve(req.cuda_buffers_size());
  for (const pb::CudaBuffer& cb : req.cuda_buffers()) {
    b.cuda_buffers.push_back({cb.ipc_handle(), cb.device(), cb.size()});
  }
  return b;
}

// A unary reactor whose reply comes from a manager callback. It lives until
// both gRPC (OnDone) and the handler that started the manager call are done
// with it, so a callback that finishes inline is safe; OnCancel tells the
// manager the caller went away.
class AsyncReactor : public grpc::ServerUnaryReactor {
 public:
  explicit AsyncReactor(CheckpointManager* manager) : manager_(manager) {}
  // The handler started the manager call, which returned `token`.
  void Started(uint64_t token) {
    bool gone;
    {
      absl::MutexLock l(&mu_);
      token_ = token;
      gone = cancelled_;
    }
    if (gone) manager_->CallerGone(token);
    Unref();
  }
  void OnCancel() override {
    uint64_t token;
    {
      absl::MutexLock l(&mu_);
      cancelled_ = true;
      token = token_;
    }
    if (token != 0) manager_->CallerGone(token);
  }
  void OnDone() override { Unref(); }

 private:
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }
  CheckpointManager* const manager_;
  std::atomic<int> refs_{2};
  absl::Mutex mu_;
  uint64_t token_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx,
                                const absl::Status& s) {
  grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
  r->Finish(ToGrpc(s));
  return r;
}

// A unary reactor finished from a restorer callback (which runs exactly
// once, so the reactor lives until then: gRPC calls OnDone only after
// Finish).
class RestoreReactor : public grpc::ServerUnaryReactor {
 public:
  void OnDone() override { delete this; }
};

class Service final : public pb::CheckpointDaemon::CallbackService {
 public:
  Service(CheckpointManager* manager, Restorer* restorer)
      : manager_(manager), restorer_(restorer) {}

  grpc::ServerUnaryReactor* GetRestoreIndex(
      grpc::CallbackServerContext* ctx, const pb::RestoreIndexRequest* req,
      pb::RestoreIndexResponse* resp) override {
    if (restorer_ == nullptr) {
      return Reply(ctx,
                   absl::UnimplementedError("restore is off on this daemon"));
    }
    if (req->checkpoint_id().size() > 4096) {
      return Reply(ctx, absl::InvalidArgumentError(
                            "checkpoint_id is longer than 4096 bytes"));
    }
    auto* r = new RestoreReactor;
    restorer_->GetIndex(req->checkpoint_id(), req->arena_id(),
                        [r, resp](absl::StatusOr<RestoreIndex> index) {
                          if (index.ok()) {
                            resp->set_checkpoint_id(index->checkpoint_id);
                            resp->set_index_json(*index->index_json);
                            resp->set_identity(index->identity);
                          }
                          r->Finish(ToGrpc(index.status()));
                        });
    return r;
  }

  grpc::ServerUnaryReactor* Restore(grpc::CallbackServerContext* ctx,
                                    const pb::RestoreRequest* req,
                                    pb::RestoreResponse* resp) override {
    if (restorer_ == nullptr) {
      return Reply(ctx,
                   absl::UnimplementedError("restore is off on this daemon"));
    }
    absl::StatusOr<RestoreBatch> batch = DecodeRestore(*req);
    if (!batch.ok()) {
      spdlog::warn("Restore {} local rank {} from {} rejected: {}",
                   EscapeForLog(req->checkpoint_id()), req->local_rank(),
                   ctx->peer(), EscapeForLog(batch.status().ToString()));
      return Reply(ctx, batch.status());
    }
    auto* r = new RestoreReactor;
    restorer_->Restore(
        *std::move(batch), [r, resp](absl::StatusOr<RestoreReply> reply) {
          if (reply.ok()) {
            for (uint64_t n : reply->bytes_lengths) {
              resp->add_bytes_lengths(n);
            }
            resp->set_storage_bytes(reply->storage_bytes);
            resp->set_copied_bytes(reply->copied_bytes);
            resp->set_group_ranks(reply->group_ranks);
            resp->set_group_buffer_token(reply->group_buffer_token);
            resp->set_group_buffer_size(reply->group_buffer_size);
            for (uint64_t off : reply->box_buffer_offsets) {
              resp->add_box_buffer_offsets(off);
            }
          }
          r->Finish(ToGrpc(reply.status()));
        });
    return r;
  }

  grpc::ServerUnaryReactor* GetInfo(grpc::CallbackServerContext* ctx,
                                    const pb::GetInfoRequest*,
                                    pb::GetInfoResponse* resp) override {
    const DaemonOptions& o = manager_->options();
    resp->set_version(CKPTD_VERSION);
    resp->set_shm_dir(o.shm_dir);
    resp->set_staging_budget_bytes(o.staging_budget);
    resp->set_max_batch_bytes(o.max_batch);
    resp->set_max_items(o.max_items);
    for (const std::string& r : o.checkpoint_roots)
      resp->add_checkpoint_roots(r);
    resp->set_io_backend(o.io_backend);
    resp->set_pid(::getpid());
    resp->set_peer_address(o.node_name);
    const CudaInfo cuda = manager_->cuda_info();
    resp->set_cuda_ipc(cuda.available);
    resp->set_cuda_unavailable(cuda.unavailable_reason);
    resp->set_pinned_staging_bytes(cuda.pinned_bytes);
    for (const std::string& d : cuda.devices) resp->add_cuda_devices(d);
    resp->set_arena_socket(o.arena_socket);
    resp->set_named_arenas(o.allow_named_arenas);
    resp->set_restore(restorer_ != nullptr);
    resp->set_restore_gather_timeout_ms(static_cast<uint32_t>(
        absl::ToInt64Milliseconds(o.restore_gather_timeout)));
    return Reply(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* RegisterArena(
      grpc::CallbackServerContext* ctx, const pb::RegisterArenaRequest* req,
      pb::RegisterArenaResponse* resp) override {
    // By name the daemon would map any file it can open for whoever asks
    // (another user's arena: a confused deputy), unsealed (SIGBUS when its
    // owner truncates it). Only the arena socket knows who is asking.
    if (!manager_->options().allow_named_arenas) {
      spdlog::warn(
          "RegisterArena by name '{}' from {} (claimed pid {}) refused: named "
          "arenas are off",
          EscapeForLog(req->name()), ctx->peer(), req->client_pid());
      return Reply(
          ctx, absl::FailedPreconditionError(fmt::format(
                   "RegisterArena by name is disabled on this daemon: register "
                   "the arena "
                   "over the arena socket {} (a sealed memfd passed with "
                   "SCM_RIGHTS; "
                   "libckptd_client does this), or start ckptd with the unsafe "
                   "allow_named_arenas = true on a single-user node",
                   manager_->options().arena_socket)));
    }
    absl::StatusOr<uint64_t> id = manager_->RegisterArena(
        req->name(), req->size_bytes(), req->owner(), req->client_pid());
    if (id.ok()) {
      resp->set_arena_id(*id);
    } else {
      spdlog::warn("RegisterArena '{}' from pid {} ({}) refused: {}",
                   EscapeForLog(req->name()), req->client_pid(),
                   EscapeForLog(req->owner()),
                   EscapeForLog(id.status().ToString()));
    }
    return Reply(ctx, id.status());
  }

  grpc::ServerUnaryReactor* ReleaseArena(grpc::CallbackServerContext* ctx,
                                         const pb::ReleaseArenaRequest* req,
                                         pb::ReleaseArenaResponse*) override {
    return Reply(ctx, manager_->ReleaseArena(req->arena_id()));
  }

  grpc::ServerUnaryReactor* WaitArenaIdle(grpc::CallbackServerContext* ctx,
                                          const pb::WaitArenaIdleRequest* req,
                                          pb::WaitArenaIdleResponse*) override {
    auto* r = new AsyncReactor(manager_);
    r->Started(manager_->WaitArenaIdle(
        req->arena_id(), DeadlineOf(ctx, req->timeout_ms()),
        [r](absl::Status s) { r->Finish(ToGrpc(s)); }));
    return r;
  }

  grpc::ServerUnaryReactor* Save(grpc::CallbackServerContext* ctx,
                                 const pb::SaveRequest* req,
                                 pb::SaveResponse* resp) override {
    absl::StatusOr<SaveBatch> batch = DecodeSave(*req);
    if (!batch.ok()) {
      spdlog::warn("Save {} rank {} from {} rejected: {}",
                   EscapeForLog(req->checkpoint_id()), req->rank(), ctx->peer(),
                   EscapeForLog(batch.status().ToString()));
      return Reply(ctx, batch.status());
    }
    auto* r = new AsyncReactor(manager_);
    r->Started(manager_->Save(
        *std::move(batch), [r, resp](absl::StatusOr<SaveReply> reply) {
          if (reply.ok()) {
            resp->set_checkpoint_id(reply->checkpoint_id);
            resp->set_state(static_cast<pb::CheckpointState>(reply->state));
            resp->set_staged_bytes(reply->staged_bytes);
          }
          r->Finish(ToGrpc(reply.status()));
        }));
    return r;
  }

  grpc::ServerUnaryReactor* ListRestores(
      grpc::CallbackServerContext* ctx, const pb::ListRestoresRequest* req,
      pb::ListRestoresResponse* resp) override {
    if (restorer_ == nullptr) {
      return Reply(ctx, absl::OkStatus());  // none served
    }
    for (const RestoreProgressInfo& p : restorer_->ListRestores()) {
      RestoreProgressToProto(p, resp->add_restores());
    }
    return Reply(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* CancelRestore(
      grpc::CallbackServerContext* ctx, const pb::CancelRestoreRequest* req,
      pb::CancelRestoreResponse* resp) override {
    if (restorer_ == nullptr) {
      return Reply(ctx,
                   absl::UnimplementedError("restore is off on this daemon"));
    }
    if (req->id().size() > 64 || req->reason().size() > 1024) {
      return Reply(ctx, absl::InvalidArgumentError(
                            "restore id longer than 64 bytes or reason "
                            "longer than 1024 bytes"));
    }
    spdlog::info("CancelRestore {} requested by {}: {}",
                 EscapeForLog(req->id()), ctx->peer(),
                 EscapeForLog(req->reason()));
    return Reply(ctx, restorer_->CancelRestore(req->id(), req->reason()));
  }

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* ctx,
                                      const pb::GetStatusRequest* req,
                                      pb::CheckpointStatus* resp) override {
    absl::StatusOr<CheckpointInfo> info =
        manager_->GetStatus(req->checkpoint_id());
    if (info.ok()) ToProto(*info, resp);
    return Reply(ctx, info.status());
  }

  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx,
                                 const pb::ListRequest* req,
                                 pb::ListResponse* resp) override {
    for (const CheckpointInfo& info :
         manager_->List(req->job(), req->include_disk())) {
      ToProto(info, resp->add_checkpoints());
    }
    return Reply(ctx, absl::OkStatus());
  }

  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* ctx,
                                   const pb::CancelRequest* req,
                                   pb::CancelResponse* resp) override {
    spdlog::info("Cancel {} requested by {}: {}",
                 EscapeForLog(req->checkpoint_id()), ctx->peer(),
                 EscapeForLog(req->reason()));
    absl::StatusOr<State> state =
        manager_->Cancel(req->checkpoint_id(), req->reason());
    if (state.ok()) resp->set_state(static_cast<pb::CheckpointState>(*state));
    return Reply(ctx, state.status());
  }

  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx,
                                 const pb::WaitRequest* req,
                                 pb::CheckpointStatus* resp) override {
    auto* r = new AsyncReactor(manager_);
    r->Started(manager_->Wait(
        req->checkpoint_id(), DeadlineOf(ctx, req->timeout_ms()),
        [r, resp](absl::StatusOr<CheckpointInfo> info) {
          if (info.ok()) ToProto(*info, resp);
          r->Finish(ToGrpc(info.status()));
        },
        req->until_data_durable()));
    return r;
  }

  grpc::ServerUnaryReactor* GetLayout(grpc::CallbackServerContext* ctx,
                                      const pb::LayoutRequest* req,
                                      pb::LayoutResponse* resp) override {
    absl::StatusOr<Layout> layout =
        manager_->GetLayout(req->checkpoint_id(), req->arena_id());
    if (layout.ok()) {
      resp->set_checkpoint_id(layout->checkpoint_id);
      resp->mutable_entries()->Reserve(layout->entries.size());
      for (const LayoutEntry& e : layout->entries) {
        pb::LayoutEntry* out = resp->add_entries();
        out->set_fqn(e.key.fqn);
        out->set_is_bytes(!e.key.has_offset);
        out->mutable_offsets()->Add(e.key.offset.begin(), e.key.offset.end());
        out->set_relative_path(e.info.relative_path);
        out->set_offset(e.info.offset);
        out->set_length(e.info.length);
        for (const std::string& t : e.info.transform_descriptors) {
          out->add_transform_descriptors(t);
        }
      }
    }
    return Reply(ctx, layout.status());
  }

  grpc::ServerUnaryReactor* CommitMetadata(
      grpc::CallbackServerContext* ctx, const pb::CommitMetadataRequest* req,
      pb::CommitMetadataResponse*) override {
    const absl::Status s = manager_->CommitMetadata(
        req->checkpoint_id(), req->arena_id(), req->metadata());
    if (!s.ok()) {
      spdlog::warn("CommitMetadata {} from {}: {}",
                   EscapeForLog(req->checkpoint_id()), ctx->peer(), s);
    }
    return Reply(ctx, s);
  }

 private:
  CheckpointManager* const manager_;
  Restorer* const restorer_;  // null: restore off
};

}  // namespace

struct Server::Impl {
  std::unique_ptr<Service> service;
  std::unique_ptr<grpc::Server> server;
  std::string socket_path;
};

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const ServerOptions& options, CheckpointManager* manager,
    Restorer* restorer) {
  const std::string& path = options.socket_path;
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path)) {
    return absl::InvalidArgumentError(
        fmt::format("socket path '{}' must be 1..{} bytes", path,
                    sizeof(sockaddr_un::sun_path) - 1));
  }
  RETURN_IF_ERROR(ClaimSocketPath(path, SOCK_STREAM));
  auto impl = std::make_unique<Impl>();
  impl->socket_path = path;
  impl->service = std::make_unique<Service>(manager, restorer);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(impl->service.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  // The socket appears with umask 077, then gets the configured mode.
  const mode_t old_umask = ::umask(077);
  impl->server = builder.BuildAndStart();
  ::umask(old_umask);
  if (!impl->server) {
    return absl::UnavailableError(
        fmt::format("could not listen on unix:{}", path));
  }
  if (::chmod(path.c_str(), options.socket_mode) != 0) {
    return absl::ErrnoToStatus(errno, fmt::format("chmod {}", path));
  }
  spdlog::info("serving ckptd.v1.CheckpointDaemon on unix:{} (mode {:o})", path,
               options.socket_mode);
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  Shutdown();
  ::unlink(impl_->socket_path.c_str());
}

void Server::Wait() { impl_->server->Wait(); }

void Server::Shutdown() {
  // In-flight calls get a deadline of now: their reactors see OnCancel and
  // the manager answers them.
  impl_->server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace ckptd::daemon
