// Copyright 2026 The ckptd Authors.
//
// The peer server: ckptd.v1.PeerDaemon on TCP (cluster/peer_service.h),
// forwarding authenticated calls to this daemon's Coordinator.
#include <sys/stat.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "common/absl_fmt.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "common/tsan_annotations.h"
#include "daemon/cluster/peer_codec.h"
#include "daemon/cluster/peer_grpc.h"
#include "daemon/cluster/peer_service.h"
#include "daemon/cluster/share_wire.h"
#include "daemon/cluster/shares.h"
#include "fmt/format.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_status.h"
#include "proto/request_parse.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

namespace pb = ::ckptd::v1;

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// --- Server ----------------------------------------------------------------
//
// The peer methods are served through gRPC's generic callback API, not as
// the generated unary methods: gRPC (1.51) receives a unary method's whole
// request before its handler runs, so a token checked there is checked after
// the body is in memory. A generic call starts with the initial metadata
// alone; the request is read only once the token is right. The wire format
// is the same (a unary call is a stream of one request and one response).
//
// Nothing in gRPC bounds a request's size before it is received: its
// max_receive_message_length too is checked only once the whole message is
// in memory (grpc/grpc#43012). Each method's limit is checked here, on the
// received bytes, before they are parsed.

class PeerServiceImpl;
class PeerCall;

struct PeerMethod {
  std::string_view name;  // "Plan"; a literal
  int64_t max_request_bytes;
  void (PeerServiceImpl::*handle)(PeerCall* call, grpc::ByteBuffer* request);
};

// One peer call. Finished by its handler or by a coordinator callback that
// may come after the caller went away (or the server shut down): the first
// of OnCancel and the finisher finishes; the response is written only by the
// one that does.
class PeerCall final : public grpc::ServerGenericBidiReactor {
 public:
  // `method` null: not a peer method. `observer` (may be empty) learns the
  // status the call finishes with.
  PeerCall(grpc::CallbackServerContext* ctx, PeerServiceImpl* service,
           const PeerMethod* method, const PeerCallObserver& observer)
      : ctx_(ctx), service_(service), method_(method), observer_(observer) {
    TsanRelease(this);  // gRPC runs the reactions on other threads
  }

  // Reads the request; its handler runs on it.
  void ReadRequest() { StartRead(&request_); }

  // Finishes the call with `s` and, when OK, `response`, unless it finished
  // already.
  bool TryFinish(const grpc::Status& s,
                 const google::protobuf::MessageLite* response = nullptr) {
    if (response == nullptr) return Conclude(s, nullptr);
    auto serialize = [&](grpc::ByteBuffer* out) {
      bool own = false;
      return grpc::SerializationTraits<
          google::protobuf::MessageLite>::Serialize(*response, out, &own);
    };
    absl::FunctionRef<grpc::Status(grpc::ByteBuffer*)> encode = serialize;
    return Conclude(s, &encode);
  }
  // The same with the response's wire bytes made by `encode`.
  bool TryFinishWith(
      const grpc::Status& s,
      absl::FunctionRef<grpc::Status(grpc::ByteBuffer*)> encode) {
    return Conclude(s, &encode);
  }
  // Holds the call for a coordinator callback, until Unref.
  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  void OnReadDone(bool ok) override;
  // Each reaction acquires what the earlier ones (on other gRPC threads)
  // released: gRPC core orders them, but with atomics TSan cannot see.
  void OnCancel() override {
    TsanAcquire(this);
    TryFinish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
    TsanRelease(this);
  }
  void OnDone() override {
    TsanAcquire(this);
    Unref();
  }

 private:
  // `encode` null: no response.
  bool Conclude(const grpc::Status& s,
                absl::FunctionRef<grpc::Status(grpc::ByteBuffer*)>* encode) {
    {
      absl::MutexLock l(&mu_);
      if (finished_) return false;
      finished_ = true;
    }
    grpc::Status status = s;
    bool write = false;
    if (s.ok() && encode != nullptr) {
      status = (*encode)(&response_);
      write = status.ok();
    }
    if (method_ != nullptr && observer_) {
      observer_(method_->name,
                static_cast<absl::StatusCode>(status.error_code()));
    }
    if (write) {
      StartWriteAndFinish(&response_, grpc::WriteOptions(), status);
    } else {
      Finish(status);
    }
    return true;
  }

  grpc::CallbackServerContext* const ctx_;  // until OnDone
  PeerServiceImpl* const service_;
  const PeerMethod* const method_;
  // A copy: the coordinator's callback may come after the service is gone.
  const PeerCallObserver observer_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;  // written by the finisher
  std::atomic<int> refs_{1};
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// The request of peer method `method` (proto/request_parse.h): an error
// names the method, the message and, for a string that is not UTF-8, the
// field ("peer Plan: ckptd.v1.PlanRequest: call.job (at byte 2) is not
// valid UTF-8 ...").
absl::Status ParsePeerRequest(const grpc::ByteBuffer& buf,
                              std::string_view method,
                              google::protobuf::Message* req) {
  if (absl::Status s = ParseRequest(buf, req); !s.ok()) {
    return absl::Status(s.code(),
                        fmt::format("peer {}: {}", method, s.message()));
  }
  return absl::OkStatus();
}

class PeerServiceImpl final : public grpc::CallbackGenericService {
 public:
  PeerServiceImpl(std::string token, PeerCallObserver observer,
                  int64_t max_request_bytes, int64_t max_small_request_bytes)
      : token_(std::move(token)), observer_(std::move(observer)) {
    // A chunk of a share and its fields.
    const int64_t chunk_request_bytes =
        static_cast<int64_t>(SharesOptions::kChunkBytes) + (64 << 10);
    methods_ = {
        {"Plan", max_request_bytes, &PeerServiceImpl::Plan},
        {"Prepare", max_request_bytes, &PeerServiceImpl::Prepare},
        {"Heartbeat", max_small_request_bytes, &PeerServiceImpl::Heartbeat},
        {"Abort", max_small_request_bytes, &PeerServiceImpl::Abort},
        {"PushShare", chunk_request_bytes, &PeerServiceImpl::PushShare},
        {"ListShares", max_small_request_bytes, &PeerServiceImpl::ListShares},
        {"FetchShare", max_small_request_bytes, &PeerServiceImpl::FetchShare},
    };
    for (const PeerMethod& m : methods_) {
      by_path_[fmt::format("/{}/{}", pb::PeerDaemon::service_full_name(),
                           m.name)] = &m;
    }
  }
  // Returns once no handler is inside the previous coordinator. Handlers
  // hold it only to hand a call over (no I/O, no waiting), so this is
  // quick; should one hang, the wait goes on (the coordinator cannot be
  // freed under it) and says so every 5 s: the shutdown watchdog ends the
  // process.
  void SetCoordinator(CoordinatorLink* c) {
    absl::MutexLock l(&mu_);
    coordinator_ = c;
    AwaitIdleLocked();
  }
  // The same for the replicas' side (shares.h).
  void SetShares(Shares* s) {
    absl::MutexLock l(&mu_);
    shares_ = s;
    AwaitIdleLocked();
  }
  void AwaitIdleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const absl::Time start = absl::Now();
    while (!mu_.AwaitWithTimeout(
        absl::Condition(
            +[](int* active) { return *active == 0; }, &active_),
        absl::Seconds(5))) {
      spdlog::error(
          "peer service: {} peer call handler(s) still inside the "
          "coordinator or the replicas after {}; waiting for them to leave "
          "before they are replaced",
          active_, absl::FormatDuration(absl::Now() - start));
    }
  }

  // Called with the call's initial metadata only: nothing of the request is
  // read before its token is checked.
  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* ctx) override {
    auto it = by_path_.find(ctx->method());
    const PeerMethod* method = it == by_path_.end() ? nullptr : it->second;
    auto* call = new PeerCall(ctx, this, method, observer_);
    if (method == nullptr) {
      call->TryFinish(grpc::Status(
          grpc::StatusCode::UNIMPLEMENTED,
          fmt::format("no method {} on the peer service", ctx->method())));
    } else if (absl::Status s = CheckToken(ctx, method->name); !s.ok()) {
      call->TryFinish(ToGrpc(s));
    } else {
      call->ReadRequest();
    }
    return call;
  }

  void Plan(PeerCall* r, grpc::ByteBuffer* buf) {
    absl::StatusOr<PlanCall> call = [&]() -> absl::StatusOr<PlanCall> {
      pb::PlanRequest req;
      RETURN_IF_ERROR(ParsePeerRequest(*buf, "Plan", &req));
      return DecodePlanRequest(req);
    }();
    if (!call.ok()) return (void)r->TryFinish(ToGrpc(call.status()));
    CoordinatorLink* coord = nullptr;
    if (absl::Status s = Acquire(&coord); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    r->Ref();
    coord->Plan(*std::move(call), [r](absl::StatusOr<NodePlan> plan) {
      pb::PlanResponse resp;
      if (plan.ok()) ToProto(*plan, &resp);
      r->TryFinish(ToGrpc(plan.status()), &resp);
      r->Unref();
    });
    Release();
  }

  void Prepare(PeerCall* r, grpc::ByteBuffer* buf) {
    absl::StatusOr<PrepareCall> call = [&]() -> absl::StatusOr<PrepareCall> {
      pb::PrepareRequest req;
      RETURN_IF_ERROR(ParsePeerRequest(*buf, "Prepare", &req));
      return DecodePrepareRequest(req);
    }();
    if (!call.ok()) return (void)r->TryFinish(ToGrpc(call.status()));
    CoordinatorLink* coord = nullptr;
    if (absl::Status s = Acquire(&coord); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    r->Ref();
    coord->Prepare(*std::move(call), [r](absl::StatusOr<GlobalStatus> g) {
      pb::PrepareResponse resp;
      if (g.ok()) ToProto(*g, &resp);
      r->TryFinish(ToGrpc(g.status()), &resp);
      r->Unref();
    });
    Release();
  }

  void Heartbeat(PeerCall* r, grpc::ByteBuffer* buf) {
    pb::HeartbeatRequest req;
    if (absl::Status s = ParsePeerRequest(*buf, "Heartbeat", &req); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    absl::StatusOr<PeerCallId> id = FromProto(req.call());
    if (!id.ok()) return (void)r->TryFinish(ToGrpc(id.status()));
    NodeProgress p = FromProto(req.progress());
    CoordinatorLink* coord = nullptr;
    if (absl::Status s = Acquire(&coord); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    r->Ref();
    coord->Heartbeat(*std::move(id), p, [r](absl::StatusOr<GlobalStatus> g) {
      pb::HeartbeatResponse resp;
      if (g.ok()) ToProto(*g, &resp);
      r->TryFinish(ToGrpc(g.status()), &resp);
      r->Unref();
    });
    Release();
  }

  void Abort(PeerCall* r, grpc::ByteBuffer* buf) {
    pb::AbortRequest req;
    if (absl::Status s = ParsePeerRequest(*buf, "Abort", &req); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    absl::StatusOr<PeerCallId> id = FromProto(req.call());
    if (!id.ok()) return (void)r->TryFinish(ToGrpc(id.status()));
    absl::StatusCode code = static_cast<absl::StatusCode>(req.code());
    if (req.code() <= 0 || req.code() > 16) code = absl::StatusCode::kAborted;
    CoordinatorLink* coord = nullptr;
    if (absl::Status s = Acquire(&coord); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    r->Ref();
    static const pb::AbortResponse kEmpty;
    coord->Abort(
        *std::move(id),
        absl::Status(code, std::string(TruncateUtf8(req.reason(), 4096))),
        [r](absl::Status s) {
          r->TryFinish(ToGrpc(s), &kEmpty);
          r->Unref();
        });
    Release();
  }

  // Replicas (shares.h): a chunk of a node's share.
  void PushShare(PeerCall* r, grpc::ByteBuffer* buf) {
    pb::PushShareRequest req;
    if (absl::Status s = ParsePeerRequest(*buf, "PushShare", &req); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    absl::StatusOr<PeerCallId> id = FromProto(req.call());
    if (!id.ok()) return (void)r->TryFinish(ToGrpc(id.status()));
    ShareChunk c;
    c.id = *std::move(id);
    c.file_index = req.file_index();
    c.num_files = req.num_files();
    c.file = req.file();
    c.file_size = req.file_size();
    c.file_identity = std::string(TruncateUtf8(req.file_identity(), 256));
    c.offset = req.offset();
    c.data = std::move(*req.mutable_data());
    c.crc32 = req.crc32();
    c.file_crc32 = req.file_crc32();
    Shares* shares = nullptr;
    if (absl::Status s = AcquireShares(&shares); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    r->Ref();
    shares->Push(std::move(c), [r](absl::StatusOr<bool> held) {
      pb::PushShareResponse resp;
      if (held.ok()) resp.set_held(*held);
      r->TryFinish(ToGrpc(held.status()), &resp);
      r->Unref();
    });
    Release();
  }

  void ListShares(PeerCall* r, grpc::ByteBuffer* buf) {
    pb::ListSharesRequest req;
    if (absl::Status s = ParsePeerRequest(*buf, "ListShares", &req); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    Shares* shares = nullptr;
    if (absl::Status s = AcquireShares(&shares); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    pb::ListSharesResponse resp;
    for (const ShareFile& f : shares->List(req.dir(), req.metadata())) {
      pb::HeldShareFile* o = resp.add_files();
      o->set_file(f.file);
      o->set_size(f.size);
      o->set_node(f.node);
      o->set_file_identity(f.identity);
    }
    Release();
    r->TryFinish(grpc::Status::OK, &resp);
  }

  void FetchShare(PeerCall* r, grpc::ByteBuffer* buf) {
    pb::FetchShareRequest req;
    if (absl::Status s = ParsePeerRequest(*buf, "FetchShare", &req); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    Shares* shares = nullptr;
    if (absl::Status s = AcquireShares(&shares); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    r->Ref();
    shares->Read(
        req.dir(), req.metadata(), req.file(), req.offset(), req.length(),
        [r](absl::StatusOr<Shares::Bytes> data) {
          r->TryFinishWith(ToGrpc(data.status()), [&](grpc::ByteBuffer* out) {
            // A copy's bytes are in `copy` (moved strings move short
            // ones' bytes: `data` would point into the moved-from one).
            const char* bytes =
                data->file != nullptr ? data->data : data->copy.data();
            *out = EncodeFetchAnswer(std::move(data->file), bytes, data->size,
                                     data->crc32);
            return grpc::Status::OK;
          });
          r->Unref();
        });
    Release();
  }

 private:
  // Before anything of a call's request is read.
  absl::Status CheckToken(grpc::CallbackServerContext* ctx,
                          std::string_view method) {
    const auto& md = ctx->client_metadata();
    auto it = md.find(kAuthHeader);
    const std::string expect = "Bearer " + token_;
    if (it == md.end() ||
        !ConstantTimeEqual(
            std::string_view(it->second.data(), it->second.size()), expect)) {
      spdlog::warn("peer {} from {} refused: {} token", method, ctx->peer(),
                   it == md.end() ? "no" : "wrong");
      return absl::UnauthenticatedError(
          "peer call refused: missing or wrong peer token (peer_token_file "
          "must hold the same "
          "token on every node)");
    }
    return absl::OkStatus();
  }
  // The coordinator to hand a call to, held until Release().
  absl::Status Acquire(CoordinatorLink** coord) {
    absl::MutexLock l(&mu_);
    *coord = coordinator_;
    if (*coord == nullptr)
      return absl::UnavailableError("the daemon is starting or stopping");
    ++active_;  // until Release(): the coordinator is not swapped away
                // meanwhile
    return absl::OkStatus();
  }
  absl::Status AcquireShares(Shares** shares) {
    absl::MutexLock l(&mu_);
    *shares = shares_;
    if (*shares == nullptr)
      return absl::UnavailableError("the daemon is starting or stopping");
    ++active_;
    return absl::OkStatus();
  }
  void Release() {
    absl::MutexLock l(&mu_);
    --active_;
  }

  const std::string token_;
  const PeerCallObserver observer_;
  std::vector<PeerMethod> methods_;  // fixed after construction
  absl::flat_hash_map<std::string, const PeerMethod*> by_path_;
  absl::Mutex mu_;
  CoordinatorLink* coordinator_ ABSL_GUARDED_BY(mu_) = nullptr;
  Shares* shares_ ABSL_GUARDED_BY(mu_) = nullptr;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

// The method's limit is checked on the received bytes, before parsing.
void PeerCall::OnReadDone(bool ok) {
  // This reaction holds the call too: OnDone (on another gRPC thread, after
  // this returns) then releases the last reference after everything done
  // here, through our own atomic rather than gRPC core's ordering alone (which
  // ThreadSanitizer cannot see).
  TsanAcquire(this);
  Ref();
  absl::Cleanup unref = [this] {
    TsanRelease(this);
    Unref();
  };
  if (!ok) {
    TryFinish(ctx_->IsCancelled()
                  ? grpc::Status(grpc::StatusCode::CANCELLED, "cancelled")
                  : grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 fmt::format("peer {}: no request message",
                                             method_->name)));
    return;
  }
  const size_t size = request_.Length();
  if (size > static_cast<uint64_t>(method_->max_request_bytes)) {
    request_.Clear();
    spdlog::warn("peer {} from {} refused: a request of {} bytes",
                 method_->name, ctx_->peer(), size);
    TryFinish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        fmt::format("peer {}: the request has {} bytes, more than the {} "
                    "bytes the method takes",
                    method_->name, size, method_->max_request_bytes)));
    return;
  }
  (service_->*method_->handle)(this, &request_);
}

std::shared_ptr<grpc::ServerCredentials> ServerCreds(const PeerTls& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions o(
      tls.ca_pem.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  o.pem_root_certs = tls.ca_pem;
  o.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(o);
}

}  // namespace

// --- PeerServer ------------------------------------------------------------

struct PeerServer::Impl {
  std::unique_ptr<PeerServiceImpl> service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

absl::StatusOr<std::unique_ptr<PeerServer>> PeerServer::Start(
    const PeerServerOptions& options) {
  if (options.token.empty()) {
    return absl::InvalidArgumentError(
        "the peer service needs a token (peer_token_file)");
  }
  KeepCallbackQueueAlive();
  auto impl = std::make_unique<Impl>();
  impl->service = std::make_unique<PeerServiceImpl>(
      options.token, options.on_request, options.max_message_bytes,
      options.max_small_message_bytes);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, ServerCreds(options.tls),
                           &impl->port);
  builder.RegisterCallbackGenericService(impl->service.get());
  // Each method's limit is checked by the service (naming the method); gRPC's
  // own limit would be checked no sooner (once the message is in memory) and
  // answer first without the method's name.
  builder.SetMaxReceiveMessageSize(-1);
  // Replicas and restores move shares at memory speed: HTTP/2 windows and
  // frames sized for 4 MiB chunks, not gRPC's 64 KiB start.
  for (const auto& [key, value] : PeerTransportArgs()) {
    builder.AddChannelArgument(key, value);
  }
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  impl->server = builder.BuildAndStart();
  if (!impl->server || impl->port == 0) {
    return absl::UnavailableError(
        fmt::format("could not listen on {} (peer_listen)", options.listen));
  }
  spdlog::info(
      "peer service ckptd.v1.PeerDaemon listening on {} (port {}, {})",
      options.listen, impl->port,
      options.tls.enabled() ? "TLS" : "plaintext, token-authenticated");
  return std::unique_ptr<PeerServer>(new PeerServer(std::move(impl)));
}

PeerServer::PeerServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PeerServer::~PeerServer() {
  impl_->service->SetCoordinator(nullptr);
  impl_->service->SetShares(nullptr);
  impl_->server->Shutdown(std::chrono::system_clock::now());
}
int PeerServer::port() const { return impl_->port; }
void PeerServer::SetCoordinator(CoordinatorLink* coordinator) {
  impl_->service->SetCoordinator(coordinator);
}
void PeerServer::SetShares(Shares* shares) {
  impl_->service->SetShares(shares);
}

absl::StatusOr<std::string> ReadTokenFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::ErrnoToStatus(errno, fmt::format("peer_token_file {}", path));
  }
  if ((st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(
        fmt::format("peer_token_file {} is readable by group or others (mode "
                    "{:o}); chmod 600 it",
                    path, st.st_mode & 0777));
  }
  ASSIGN_OR_RETURN(std::string token,
                   ReadFileToString(Env::Default(), path, 4096));
  absl::StripTrailingAsciiWhitespace(&token);
  if (token.size() < 16) {
    return absl::InvalidArgumentError(fmt::format(
        "peer_token_file {} holds a token shorter than 16 characters", path));
  }
  return token;
}

}  // namespace ckptd::daemon
