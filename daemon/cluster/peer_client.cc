// Copyright 2026 The ckptd Authors.
//
// The peer client: CoordinatorLinks to remote coordinators over gRPC
// (cluster/peer_service.h MakeLinkFactory): callback API, per-call
// deadlines, the token attached, errors named with the coordinator.
#include <algorithm>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "common/tsan_annotations.h"
#include "daemon/cluster/peer_codec.h"
#include "daemon/cluster/peer_grpc.h"
#include "daemon/cluster/peer_service.h"
#include "fmt/format.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_status.h"

namespace ckptd::daemon {

namespace pb = ::ckptd::v1;

std::vector<std::pair<std::string, int>> PeerTransportArgs() {
  return {{GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 20},
          {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1},
          {GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 8 << 20}};
}

// peer_grpc.h says why.
void KeepCallbackQueueAlive() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct KeepAlive {
      std::shared_ptr<grpc::Channel> channel;
      std::unique_ptr<pb::PeerDaemon::Stub> stub;
      grpc::ClientContext ctx;
      pb::AbortRequest req;
      pb::AbortResponse resp;
    };
    static KeepAlive* k =
        new KeepAlive();  // never freed, by design (reachable)
    k->channel = grpc::CreateChannel("unix:/nonexistent/ckptd-keepalive.sock",
                                     grpc::InsecureChannelCredentials());
    k->stub = pb::PeerDaemon::NewStub(k->channel);
    k->ctx.set_deadline(std::chrono::system_clock::now());
    k->stub->async()->Abort(&k->ctx, &k->req, &k->resp, [](grpc::Status) {});
  });
}

std::shared_ptr<grpc::ChannelCredentials> ClientCreds(const PeerTls& tls) {
  if (!tls.enabled() && tls.ca_pem.empty())
    return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = tls.ca_pem;
  o.pem_private_key = tls.key_pem;
  o.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(o);
}

namespace {

// Plan and Abort are resent (within their deadline) when the transport
// failed them: a connection that died unseen (the coordinator restarted
// while this node was cut off or stopped) fails the first call written to
// it with "Connection reset by peer", and a Plan lost that way failed the
// whole checkpoint. Resending is safe: a coordinator that did get the
// first Plan refuses the second (a second index of the node: the same
// failure as before), an Abort is idempotent. Prepare is never resent (a
// second one fails a checkpoint that may commit); heartbeats repeat anyway.
constexpr char kRetryServiceConfig[] = R"({"methodConfig": [{
  "name": [{"service": "ckptd.v1.PeerDaemon", "method": "Plan"},
           {"service": "ckptd.v1.PeerDaemon", "method": "Abort"}],
  "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.05s",
                  "maxBackoff": "0.2s", "backoffMultiplier": 2,
                  "retryableStatusCodes": ["UNAVAILABLE"]}}]})";

// --- Client ----------------------------------------------------------------

// Each call's callback runs on one of gRPC's threads and deletes the call.
// gRPC hands it over through its own synchronization, which TSan does not
// see (the library is not instrumented): TsanRelease(c) stands for it, so
// it comes after everything the callback reads is written, the callback
// itself (its captures) included.
class RemoteLink final : public CoordinatorLink {
 public:
  RemoteLink(std::string address, std::shared_ptr<grpc::Channel> channel,
             const PeerClientOptions& options)
      : address_(std::move(address)),
        stub_(pb::PeerDaemon::NewStub(channel)),
        options_(options) {}

  void Plan(PlanCall call, PlanDone done) override {
    auto* c = Start<pb::PlanRequest, pb::PlanResponse>(options_.plan_deadline);
    // Long-polls wait out a coordinator (re)connecting; the heartbeats
    // bound that by peer_timeout.
    c->ctx.set_wait_for_ready(true);
    Send(
        c, "Plan",
        [counts = EncodePlanRequest(call, &c->req)](const pb::PlanResponse& r) {
          return FromProto(r, counts);
        },
        std::move(done),
        [this, c](auto on_done) {
          stub_->async()->Plan(&c->ctx, &c->req, &c->resp, std::move(on_done));
        });
  }

  void Prepare(PrepareCall call, PrepareDone done) override {
    auto* c = Start<pb::PrepareRequest, pb::PrepareResponse>(
        options_.prepare_deadline);
    c->ctx.set_wait_for_ready(true);
    EncodePrepareRequest(call, &c->req);
    Send(
        c, "Prepare", [](const pb::PrepareResponse& r) { return FromProto(r); },
        std::move(done),
        [this, c](auto on_done) {
          stub_->async()->Prepare(&c->ctx, &c->req, &c->resp,
                                  std::move(on_done));
        });
  }

  void Heartbeat(PeerCallId id, NodeProgress progress,
                 HeartbeatDone done) override {
    auto* c = Start<pb::HeartbeatRequest, pb::HeartbeatResponse>(
        options_.call_deadline);
    // Rides out a reconnect (a coordinator that just restarted) up to the
    // call's deadline instead of failing fast; silence is judged against
    // peer_timeout since the last answer either way.
    c->ctx.set_wait_for_ready(true);
    ToProto(id, c->req.mutable_call());
    ToProto(progress, c->req.mutable_progress());
    Send(
        c, "Heartbeat",
        [](const pb::HeartbeatResponse& r) { return FromProto(r); },
        std::move(done),
        [this, c](auto on_done) {
          stub_->async()->Heartbeat(&c->ctx, &c->req, &c->resp,
                                    std::move(on_done));
        });
  }

  void Abort(PeerCallId id, absl::Status reason, AbortDone done) override {
    auto* c =
        Start<pb::AbortRequest, pb::AbortResponse>(options_.call_deadline);
    ToProto(id, c->req.mutable_call());
    // The coordinator keeps that much of it (and takes small Aborts only).
    const absl::string_view why = reason.message();
    c->req.set_reason(std::string(
        TruncateUtf8(std::string_view(why.data(), why.size()), 4096)));
    c->req.set_code(static_cast<int>(reason.code()));
    auto on_done =
        [this, c,
         done = std::make_shared<AbortDone>(std::move(done))](grpc::Status s) {
          TsanAcquire(c);
          absl::Status st = Result(s, "Abort");
          Finish(c);
          if (*done) std::move (*done)(st);
        };
    TsanRelease(c);  // last: see the class comment
    stub_->async()->Abort(&c->ctx, &c->req, &c->resp, std::move(on_done));
  }

  void CancelCalls() override {
    absl::MutexLock l(&mu_);
    for (grpc::ClientContext* ctx : live_) ctx->TryCancel();
  }

 private:
  template <typename Req, typename Resp>
  struct Call {
    grpc::ClientContext ctx;
    Req req;
    Resp resp;
  };

  template <typename Req, typename Resp>
  Call<Req, Resp>* Start(absl::Duration deadline) {
    auto* c = new Call<Req, Resp>();
    c->ctx.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    c->ctx.AddMetadata(kAuthHeader, "Bearer " + options_.token);
    absl::MutexLock l(&mu_);
    live_.insert(&c->ctx);
    return c;
  }

  // Sends `c` (`start` calls the stub's method with the callback); its
  // answer, through `convert` (the response → the caller's value), goes to
  // `done`. The callback is built before TsanRelease(c): see the class
  // comment.
  template <typename Req, typename Resp, typename Convert, typename Done,
            typename StartFn>
  void Send(Call<Req, Resp>* c, std::string_view method, Convert convert,
            Done done, StartFn start) {
    using Value = std::invoke_result_t<Convert&, const Resp&>;
    auto on_done = [this, c, method, convert = std::move(convert),
                    done = std::make_shared<Done>(std::move(done))](
                       grpc::Status s) {
      TsanAcquire(c);
      const absl::Status st = Result(s, method);
      absl::StatusOr<Value> v = st.ok()
                                    ? absl::StatusOr<Value>(convert(c->resp))
                                    : absl::StatusOr<Value>(st);
      Finish(c);
      std::move (*done)(std::move(v));
    };
    TsanRelease(c);
    start(std::move(on_done));
  }

  // On a gRPC callback thread. The call was filled on the thread that
  // started it, ordered before the callback by gRPC core (uninstrumented:
  // told to TSan by TsanRelease before each stub call and TsanAcquire first
  // thing in its callback).
  template <typename C>
  void Finish(C* c) {
    {
      absl::MutexLock l(&mu_);
      live_.erase(&c->ctx);
    }
    delete c;
  }

  // A transport or coordinator error, named with the coordinator's address.
  absl::Status Result(const grpc::Status& s, std::string_view method) {
    if (options_.on_call) {
      options_.on_call(method, static_cast<absl::StatusCode>(s.error_code()));
    }
    if (s.ok()) return absl::OkStatus();
    if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
      return absl::UnauthenticatedError(
          fmt::format("coordinator {} refused this daemon: {}", address_,
                      s.error_message()));
    }
    if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
        s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                          fmt::format("coordinator {} {}: {}", address_, method,
                                      s.error_message()));
    }
    return FromGrpc(s);
  }

  const std::string address_;
  std::unique_ptr<pb::PeerDaemon::Stub> stub_;
  const PeerClientOptions options_;
  absl::Mutex mu_;
  std::set<grpc::ClientContext*> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

LinkFactory MakeLinkFactory(const PeerClientOptions& options) {
  struct Cache {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::shared_ptr<CoordinatorLink>> links
        ABSL_GUARDED_BY(mu);
  };
  KeepCallbackQueueAlive();
  auto cache = std::make_shared<Cache>();
  return [options, cache](const std::string& address)
             -> absl::StatusOr<std::shared_ptr<CoordinatorLink>> {
    if (address.empty() || address.size() > 1024 ||
        address.find_first_of(" \t\n/") != std::string::npos) {
      return absl::InvalidArgumentError(
          fmt::format("'{}' is not a peer address (host:port)", address));
    }
    absl::MutexLock l(&cache->mu);
    auto& link = cache->links[address];
    if (!link) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(options.max_message_bytes);
      args.SetMaxSendMessageSize(options.max_message_bytes);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
      args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
      args.SetServiceConfigJSON(kRetryServiceConfig);
      // A Plan carries a node's whole index: kept for a resend up to the
      // message limit.
      args.SetInt(GRPC_ARG_PER_RPC_RETRY_BUFFER_SIZE,
                  options.max_message_bytes);
      // A coordinator that restarted is reached again well within
      // peer_timeout (the backoff's cap comes from it, daemon_main.cc).
      const int max_ms = static_cast<int>(std::clamp<int64_t>(
          absl::ToInt64Milliseconds(options.max_reconnect_backoff), 100, 2000));
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, std::min(200, max_ms));
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, std::min(200, max_ms));
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, max_ms);
      auto channel =
          grpc::CreateCustomChannel(address, ClientCreds(options.tls), args);
      link = std::make_shared<RemoteLink>(address, std::move(channel), options);
    }
    return link;
  };
}

}  // namespace ckptd::daemon
