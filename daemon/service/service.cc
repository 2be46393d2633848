// Copyright 2026 The ckptd Authors.

#include "daemon/service/service.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "common/absl_fmt.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/service/restore_codec.h"
#include "daemon/service/socket_path.h"
#include "fmt/format.h"
#include "format/tensor/dtype.h"
#include "format/tensor/payload_transform.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_status.h"
#include "proto/item_codec.h"
#include "proto/request_parse.h"
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
  for (const std::string& h : info.replica_holders) out->add_replica_holders(h);
  for (const std::string& h : info.replicas_held) out->add_replicas_held(h);
  out->set_local_ranks(info.local_ranks);
  out->set_local_total_bytes(info.local_total_bytes);
  out->set_local_written_bytes(info.local_written_bytes);
}

// SaveOptions.compression: "" → 0 (none), "zstd" → 3, "zstd:N" → N.
absl::StatusOr<int> ZstdLevelOf(std::string_view compression) {
  if (compression == "zstd") return 3;
  if (std::optional<int> level = format::ZstdLevelOfName(compression)) {
    return *level;
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

// The calls the service holds (dispatched, not yet done), and whether it
// takes new ones: a daemon that shuts down refuses new calls first and
// answers the ones it holds before gRPC stops (daemon_main.cc).
class CallTracker {
 public:
  void Enter() {
    absl::MutexLock l(&mu_);
    ++live_;
  }
  void Leave() {
    absl::MutexLock l(&mu_);
    --live_;
  }
  void Refuse(const absl::Status& why) {
    absl::MutexLock l(&mu_);
    refusal_ = why;
  }
  absl::Status refusal() const {
    absl::MutexLock l(&mu_);
    return refusal_;
  }
  // The number of calls still held after waiting up to `timeout` for none.
  int AwaitNone(absl::Duration timeout) {
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(
                             +[](int* live) { return *live == 0; }, &live_),
                         timeout);
    return live_;
  }

 private:
  mutable absl::Mutex mu_;
  int live_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status refusal_ ABSL_GUARDED_BY(mu_);
};

// One unary call of the service. Its request arrives as bytes and is
// parsed here (proto/request_parse.h: a request gRPC could not parse would get
// a bare UNIMPLEMENTED); its response is serialized into the raw reply when it
// is answered. The reactor lives until both gRPC (OnDone) and the handler that
// dispatched it are done with it, so an answer that comes inline, from a
// manager or restorer callback, is safe. OnCancel tells the manager the caller
// went away when the handler started a manager operation (Started).
template <typename Req, typename Resp>
class Call final : public grpc::ServerUnaryReactor {
 public:
  Call(CheckpointManager* manager, std::shared_ptr<CallTracker> tracker,
       grpc::ByteBuffer* out)
      : manager_(manager), tracker_(std::move(tracker)), out_(out) {
    tracker_->Enter();
  }
  ~Call() override { tracker_->Leave(); }

  Req request;
  Resp response;  // sent if the answer is OK

  // The one answer. `response` must not be touched afterwards.
  void Answer(const absl::Status& s) {
    absl::Status st = s;
    if (st.ok()) st = SerializeResponse(response, out_);
    Finish(ToGrpc(st));
  }
  // The handler started a manager operation, which returned `token`.
  void Started(uint64_t token) {
    bool gone;
    {
      absl::MutexLock l(&mu_);
      token_ = token;
      gone = cancelled_;
    }
    if (gone) manager_->CallerGone(token);
  }
  // The dispatching handler is done with the call.
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
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
  CheckpointManager* const manager_;
  // Shared: a call may end (OnDone, or a late manager callback) after
  // the service is gone, and gRPC's own ordering of OnDone before its
  // Shutdown returns is invisible to TSan (an uninstrumented libgrpc).
  const std::shared_ptr<CallTracker> tracker_;
  grpc::ByteBuffer* const out_;
  std::atomic<int> refs_{2};
  absl::Mutex mu_;
  uint64_t token_ ABSL_GUARDED_BY(mu_) = 0;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

// Mixins M1<M2<...<Base>>>, each a template over its base class.
template <typename Base, template <typename> class... Mixins>
struct Stack {
  using type = Base;
};
template <typename Base, template <typename> class M,
          template <typename> class... Rest>
struct Stack<Base, M, Rest...> {
  using type = M<typename Stack<Base, Rest...>::type>;
};

// Every method of ckptd.v1.CheckpointDaemon as a raw callback method (a
// method left out would stay a synchronous one answering UNIMPLEMENTED).
using svc = pb::CheckpointDaemon;
using RawMethods =
    Stack<svc::Service, svc::WithRawCallbackMethod_GetInfo,
          svc::WithRawCallbackMethod_RegisterArena,
          svc::WithRawCallbackMethod_ReleaseArena,
          svc::WithRawCallbackMethod_WaitArenaIdle,
          svc::WithRawCallbackMethod_Save, svc::WithRawCallbackMethod_GetStatus,
          svc::WithRawCallbackMethod_List, svc::WithRawCallbackMethod_Cancel,
          svc::WithRawCallbackMethod_Wait, svc::WithRawCallbackMethod_GetLayout,
          svc::WithRawCallbackMethod_CommitMetadata,
          svc::WithRawCallbackMethod_GetRestoreIndex,
          svc::WithRawCallbackMethod_Restore,
          svc::WithRawCallbackMethod_ListRestores,
          svc::WithRawCallbackMethod_CancelRestore>::type;

// The raw entry point of method M: the bytes parsed into Req, then
// Service::Handle for Call<Req, Resp>.
#define CKPTD_RAW_METHOD(M, Req, Resp)                          \
  grpc::ServerUnaryReactor* M(grpc::CallbackServerContext* ctx, \
                              const grpc::ByteBuffer* in,       \
                              grpc::ByteBuffer* out) override { \
    return Dispatch<pb::Req, pb::Resp>(ctx, in, out, #M);       \
  }

class Service final : public RawMethods {
 public:
  Service(CheckpointManager* manager, Restorer* restorer)
      : manager_(manager), restorer_(restorer) {}

  CallTracker& tracker() { return *tracker_; }

  CKPTD_RAW_METHOD(GetInfo, GetInfoRequest, GetInfoResponse)
  CKPTD_RAW_METHOD(RegisterArena, RegisterArenaRequest, RegisterArenaResponse)
  CKPTD_RAW_METHOD(ReleaseArena, ReleaseArenaRequest, ReleaseArenaResponse)
  CKPTD_RAW_METHOD(WaitArenaIdle, WaitArenaIdleRequest, WaitArenaIdleResponse)
  CKPTD_RAW_METHOD(Save, SaveRequest, SaveResponse)
  CKPTD_RAW_METHOD(GetStatus, GetStatusRequest, CheckpointStatus)
  CKPTD_RAW_METHOD(List, ListRequest, ListResponse)
  CKPTD_RAW_METHOD(Cancel, CancelRequest, CancelResponse)
  CKPTD_RAW_METHOD(Wait, WaitRequest, CheckpointStatus)
  CKPTD_RAW_METHOD(GetLayout, LayoutRequest, LayoutResponse)
  CKPTD_RAW_METHOD(CommitMetadata, CommitMetadataRequest,
                   CommitMetadataResponse)
  CKPTD_RAW_METHOD(GetRestoreIndex, RestoreIndexRequest, RestoreIndexResponse)
  CKPTD_RAW_METHOD(Restore, RestoreRequest, RestoreResponse)
  CKPTD_RAW_METHOD(ListRestores, ListRestoresRequest, ListRestoresResponse)
  CKPTD_RAW_METHOD(CancelRestore, CancelRestoreRequest, CancelRestoreResponse)

 private:
  template <typename Req, typename Resp>
  grpc::ServerUnaryReactor* Dispatch(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* in,
                                     grpc::ByteBuffer* out,
                                     std::string_view method) {
    auto* call = new Call<Req, Resp>(manager_, tracker_, out);
    if (absl::Status refused = tracker_->refusal(); !refused.ok()) {
      call->Answer(refused);
      call->Unref();
      return call;
    }
    const absl::Status parsed = ParseRequest(*in, &call->request);
    if (parsed.ok()) {
      Handle(ctx, call);
    } else {
      spdlog::warn("{} from {} rejected: {}", method, ctx->peer(),
                   EscapeForLog(parsed.ToString()));
      call->Answer(parsed);
    }
    call->Unref();
    return call;
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::RestoreIndexRequest, pb::RestoreIndexResponse>* c) {
    if (restorer_ == nullptr) {
      return c->Answer(
          absl::UnimplementedError("restore is off on this daemon"));
    }
    if (c->request.checkpoint_id().size() > 4096) {
      return c->Answer(absl::InvalidArgumentError(
          "checkpoint_id is longer than 4096 bytes"));
    }
    restorer_->GetIndex(c->request.checkpoint_id(), c->request.arena_id(),
                        [c](absl::StatusOr<RestoreIndex> index) {
                          if (index.ok()) {
                            c->response.set_checkpoint_id(index->checkpoint_id);
                            c->response.set_index_json(*index->index_json);
                            c->response.set_identity(index->identity);
                          }
                          c->Answer(index.status());
                        });
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::RestoreRequest, pb::RestoreResponse>* c) {
    if (restorer_ == nullptr) {
      return c->Answer(
          absl::UnimplementedError("restore is off on this daemon"));
    }
    absl::StatusOr<RestoreBatch> batch = DecodeRestore(c->request);
    if (!batch.ok()) {
      spdlog::warn("Restore {} local rank {} from {} rejected: {}",
                   EscapeForLog(c->request.checkpoint_id()),
                   c->request.local_rank(), ctx->peer(),
                   EscapeForLog(batch.status().ToString()));
      return c->Answer(batch.status());
    }
    restorer_->Restore(*std::move(batch),
                       [c](absl::StatusOr<RestoreReply> reply) {
                         if (reply.ok())
                           RestoreReplyToProto(*reply, &c->response);
                         c->Answer(reply.status());
                       });
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::GetInfoRequest, pb::GetInfoResponse>* c) {
    const DaemonOptions& o = manager_->options();
    c->response.set_version(CKPTD_VERSION);
    c->response.set_shm_dir(o.shm_dir);
    c->response.set_staging_budget_bytes(o.staging_budget);
    c->response.set_max_batch_bytes(o.max_batch);
    c->response.set_max_items(o.max_items);
    for (const std::string& r : o.checkpoint_roots)
      c->response.add_checkpoint_roots(r);
    c->response.set_io_backend(o.io_backend);
    c->response.set_pid(::getpid());
    c->response.set_peer_address(o.node_name);
    const CudaInfo cuda = manager_->cuda_info();
    c->response.set_cuda_ipc(cuda.available);
    c->response.set_cuda_unavailable(cuda.unavailable_reason);
    c->response.set_pinned_staging_bytes(cuda.pinned_bytes);
    for (const std::string& d : cuda.devices) c->response.add_cuda_devices(d);
    c->response.set_arena_socket(o.arena_socket);
    c->response.set_named_arenas(o.allow_named_arenas);
    c->response.set_restore(restorer_ != nullptr);
    c->response.set_restore_gather_timeout_ms(static_cast<uint32_t>(
        absl::ToInt64Milliseconds(o.restore_gather_timeout)));
    return c->Answer(absl::OkStatus());
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::RegisterArenaRequest, pb::RegisterArenaResponse>* c) {
    // By name the daemon would map any file it can open for whoever asks
    // (another user's arena: a confused deputy), unsealed (SIGBUS when its
    // owner truncates it). Only the arena socket knows who is asking.
    if (!manager_->options().allow_named_arenas) {
      spdlog::warn(
          "RegisterArena by name '{}' from {} (claimed pid {}) refused: named "
          "arenas are off",
          EscapeForLog(c->request.name()), ctx->peer(),
          c->request.client_pid());
      return c->Answer(absl::FailedPreconditionError(fmt::format(
          "RegisterArena by name is disabled on this daemon: register "
          "the arena "
          "over the arena socket {} (a sealed memfd passed with "
          "SCM_RIGHTS; "
          "libckptd_client does this), or start ckptd with the unsafe "
          "allow_named_arenas = true on a single-user node",
          manager_->options().arena_socket)));
    }
    absl::StatusOr<uint64_t> id =
        manager_->RegisterArena(c->request.name(), c->request.size_bytes(),
                                c->request.owner(), c->request.client_pid());
    if (id.ok()) {
      c->response.set_arena_id(*id);
    } else {
      spdlog::warn("RegisterArena '{}' from pid {} ({}) refused: {}",
                   EscapeForLog(c->request.name()), c->request.client_pid(),
                   EscapeForLog(c->request.owner()),
                   EscapeForLog(id.status().ToString()));
    }
    return c->Answer(id.status());
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::ReleaseArenaRequest, pb::ReleaseArenaResponse>* c) {
    return c->Answer(manager_->ReleaseArena(c->request.arena_id()));
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::WaitArenaIdleRequest, pb::WaitArenaIdleResponse>* c) {
    c->Started(manager_->WaitArenaIdle(c->request.arena_id(),
                                       DeadlineOf(ctx, c->request.timeout_ms()),
                                       [c](absl::Status s) { c->Answer(s); }));
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::SaveRequest, pb::SaveResponse>* c) {
    absl::StatusOr<SaveBatch> batch = DecodeSave(c->request);
    if (!batch.ok()) {
      spdlog::warn("Save {} rank {} from {} rejected: {}",
                   EscapeForLog(c->request.checkpoint_id()), c->request.rank(),
                   ctx->peer(), EscapeForLog(batch.status().ToString()));
      return c->Answer(batch.status());
    }
    c->Started(
        manager_->Save(*std::move(batch), [c](absl::StatusOr<SaveReply> reply) {
          if (reply.ok()) {
            c->response.set_checkpoint_id(reply->checkpoint_id);
            c->response.set_state(
                static_cast<pb::CheckpointState>(reply->state));
            c->response.set_staged_bytes(reply->staged_bytes);
          }
          c->Answer(reply.status());
        }));
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::ListRestoresRequest, pb::ListRestoresResponse>* c) {
    if (restorer_ == nullptr) {
      return c->Answer(absl::OkStatus());  // none served
    }
    for (const RestoreProgressInfo& p : restorer_->ListRestores()) {
      RestoreProgressToProto(p, c->response.add_restores());
    }
    return c->Answer(absl::OkStatus());
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::CancelRestoreRequest, pb::CancelRestoreResponse>* c) {
    if (restorer_ == nullptr) {
      return c->Answer(
          absl::UnimplementedError("restore is off on this daemon"));
    }
    if (c->request.id().size() > 64 || c->request.reason().size() > 1024) {
      return c->Answer(absl::InvalidArgumentError(
          "restore id longer than 64 bytes or reason "
          "longer than 1024 bytes"));
    }
    spdlog::info("CancelRestore {} requested by {}: {}",
                 EscapeForLog(c->request.id()), ctx->peer(),
                 EscapeForLog(c->request.reason()));
    return c->Answer(
        restorer_->CancelRestore(c->request.id(), c->request.reason()));
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::GetStatusRequest, pb::CheckpointStatus>* c) {
    absl::StatusOr<CheckpointInfo> info =
        manager_->GetStatus(c->request.checkpoint_id());
    if (info.ok()) ToProto(*info, &c->response);
    return c->Answer(info.status());
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::ListRequest, pb::ListResponse>* c) {
    for (const CheckpointInfo& info :
         manager_->List(c->request.job(), c->request.include_disk())) {
      ToProto(info, c->response.add_checkpoints());
    }
    return c->Answer(absl::OkStatus());
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::CancelRequest, pb::CancelResponse>* c) {
    spdlog::info("Cancel {} requested by {}: {}",
                 EscapeForLog(c->request.checkpoint_id()), ctx->peer(),
                 EscapeForLog(c->request.reason()));
    absl::StatusOr<State> state =
        manager_->Cancel(c->request.checkpoint_id(), c->request.reason());
    if (state.ok())
      c->response.set_state(static_cast<pb::CheckpointState>(*state));
    return c->Answer(state.status());
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::WaitRequest, pb::CheckpointStatus>* c) {
    c->Started(manager_->Wait(
        c->request.checkpoint_id(), DeadlineOf(ctx, c->request.timeout_ms()),
        [c](absl::StatusOr<CheckpointInfo> info) {
          if (info.ok()) ToProto(*info, &c->response);
          c->Answer(info.status());
        },
        c->request.until_data_durable()));
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::LayoutRequest, pb::LayoutResponse>* c) {
    absl::StatusOr<Layout> layout =
        manager_->GetLayout(c->request.checkpoint_id(), c->request.arena_id());
    if (layout.ok()) {
      c->response.set_checkpoint_id(layout->checkpoint_id);
      c->response.mutable_entries()->Reserve(layout->entries.size());
      for (const LayoutEntry& e : layout->entries) {
        pb::LayoutEntry* out = c->response.add_entries();
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
    return c->Answer(layout.status());
  }

  void Handle(grpc::CallbackServerContext* ctx,
              Call<pb::CommitMetadataRequest, pb::CommitMetadataResponse>* c) {
    const absl::Status s =
        manager_->CommitMetadata(c->request.checkpoint_id(),
                                 c->request.arena_id(), c->request.metadata());
    if (!s.ok()) {
      spdlog::warn("CommitMetadata {} from {}: {}",
                   EscapeForLog(c->request.checkpoint_id()), ctx->peer(), s);
    }
    return c->Answer(s);
  }

 private:
  CheckpointManager* const manager_;
  Restorer* const restorer_;  // null: restore off
  const std::shared_ptr<CallTracker> tracker_ = std::make_shared<CallTracker>();
};
#undef CKPTD_RAW_METHOD

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

void Server::RefuseNewCalls(const absl::Status& why) {
  impl_->service->tracker().Refuse(why);
}

int Server::AwaitCallsAnswered(absl::Duration timeout) {
  return impl_->service->tracker().AwaitNone(timeout);
}

void Server::Shutdown() {
  // In-flight calls get a deadline of now: their reactors see OnCancel and
  // the manager answers them.
  impl_->server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace ckptd::daemon
