// Copyright 2026 The ckptd Authors.

#include "daemon/peer_service.h"

#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "common/absl_fmt.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "daemon/checkpoint_manager.h"
#include "fmt/format.h"
#include "format/dtype.h"
#include "grpcpp/grpcpp.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

namespace pb = ::ckptd::v1;

constexpr char kAuthHeader[] = "authorization";

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                      std::string(s.message()));
}

absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      s.error_message());
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// --- Conversions -----------------------------------------------------------

void ToProto(const PeerCallId& id, pb::PeerCall* out) {
  out->set_checkpoint_id(id.checkpoint_id);
  out->set_job(id.job);
  out->set_node(id.node);
  out->set_attempt(id.attempt);
  out->set_node_name(id.node_name);
}

absl::StatusOr<PeerCallId> FromProto(const pb::PeerCall& in) {
  if (in.checkpoint_id().size() > 4096 || in.job().size() > 4096 ||
      in.node_name().size() > 1024) {
    return absl::InvalidArgumentError(
        "peer call: checkpoint_id, job or node_name too long");
  }
  if (in.node() < 0)
    return absl::InvalidArgumentError("peer call: negative node");
  return PeerCallId{in.checkpoint_id(), in.job(), in.node(), in.attempt(),
                    in.node_name()};
}

void EncodeIndex(const NodeIndex& index, pb::NodeIndex* out) {
  // Kinds: one table entry per distinct (fqn, type, dtype, shape, path).
  absl::flat_hash_map<std::string_view, std::vector<uint32_t>> by_fqn;
  std::vector<const format::ItemDesc*> kinds;
  auto same_kind = [](const format::ItemDesc& a, const format::ItemDesc& b) {
    return a.type == b.type && a.dtype == b.dtype &&
           a.global_shape == b.global_shape && a.path == b.path;
  };
  for (size_t r = 0; r < index.ranks.size(); ++r) {
    pb::RankIndex* ri = out->add_ranks();
    ri->set_rank(index.ranks[r]);
    const auto& items = index.items[r];
    ri->mutable_kind()->Reserve(items.size());
    ri->mutable_nbytes()->Reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) {
      const format::ItemDesc& it = items[i];
      std::vector<uint32_t>& cands = by_fqn[it.fqn];
      uint32_t k = UINT32_MAX;
      for (uint32_t c : cands) {
        if (same_kind(*kinds[c], it)) {
          k = c;
          break;
        }
      }
      if (k == UINT32_MAX) {
        k = static_cast<uint32_t>(kinds.size());
        kinds.push_back(&it);
        cands.push_back(k);
      }
      ri->add_kind(k);
      ri->add_nbytes(index.nbytes[r][i]);
      for (int64_t v : it.chunk_offsets) ri->add_offsets(v);
      for (int64_t v : it.chunk_sizes) ri->add_sizes(v);
    }
  }
  for (const format::ItemDesc* it : kinds) {
    pb::ItemKind* k = out->add_kinds();
    k->set_fqn(it->fqn);
    k->set_type(it->type == format::ItemDesc::Type::kTensor
                    ? pb::ITEM_TYPE_TENSOR
                    : pb::ITEM_TYPE_BYTES);
    if (it->type == format::ItemDesc::Type::kTensor) {
      k->set_dtype(std::string(format::DTypeName(it->dtype)));
    }
    for (int64_t v : it->global_shape) k->add_global_shape(v);
    for (const format::PathElement& e : it->path) {
      if (const auto* s = std::get_if<std::string>(&e)) {
        k->add_path()->set_key(*s);
      } else {
        k->add_path()->set_index(std::get<int64_t>(e));
      }
    }
  }
}

absl::StatusOr<std::shared_ptr<NodeIndex>> DecodeIndex(
    const pb::NodeIndex& in) {
  std::vector<format::ItemDesc> kinds(in.kinds_size());
  for (int i = 0; i < in.kinds_size(); ++i) {
    const pb::ItemKind& k = in.kinds(i);
    format::ItemDesc& d = kinds[i];
    if (k.fqn().empty() || k.fqn().size() > 4096) {
      return absl::InvalidArgumentError(
          fmt::format("index kind {}: fqn empty or too long", i));
    }
    d.fqn = k.fqn();
    if (k.type() == pb::ITEM_TYPE_TENSOR) {
      d.type = format::ItemDesc::Type::kTensor;
      absl::StatusOr<format::DType> dt = format::DTypeFromName(k.dtype());
      if (!dt.ok()) {
        return absl::InvalidArgumentError(fmt::format(
            "index item '{}': unknown dtype '{}'", d.fqn, k.dtype()));
      }
      d.dtype = *dt;
    } else if (k.type() == pb::ITEM_TYPE_BYTES) {
      d.type = format::ItemDesc::Type::kBytes;
    } else {
      return absl::InvalidArgumentError(
          fmt::format("index item '{}': bad type", d.fqn));
    }
    if (k.global_shape_size() > 64 || k.path_size() > 256) {
      return absl::InvalidArgumentError(
          fmt::format("index item '{}': too many dims", d.fqn));
    }
    d.global_shape.assign(k.global_shape().begin(), k.global_shape().end());
    for (const pb::PathElement& e : k.path()) {
      if (e.has_key()) {
        d.path.emplace_back(e.key());
      } else {
        d.path.emplace_back(e.index());
      }
    }
  }
  auto index = std::make_shared<NodeIndex>();
  for (const pb::RankIndex& ri : in.ranks()) {
    index->ranks.push_back(ri.rank());
    auto& items = index->items.emplace_back();
    auto& nbytes = index->nbytes.emplace_back();
    if (ri.nbytes_size() != ri.kind_size()) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: index columns differ", ri.rank()));
    }
    items.reserve(ri.kind_size());
    nbytes.assign(ri.nbytes().begin(), ri.nbytes().end());
    int pos = 0;
    for (int i = 0; i < ri.kind_size(); ++i) {
      if (ri.kind(i) >= kinds.size()) {
        return absl::InvalidArgumentError(
            fmt::format("rank {} item {}: bad kind", ri.rank(), i));
      }
      const format::ItemDesc& k = kinds[ri.kind(i)];
      const int nd = k.type == format::ItemDesc::Type::kTensor
                         ? static_cast<int>(k.global_shape.size())
                         : 0;
      if (pos + nd > ri.offsets_size() || pos + nd > ri.sizes_size()) {
        return absl::InvalidArgumentError(
            fmt::format("rank {} item {}: boxes run short", ri.rank(), i));
      }
      format::ItemDesc& d = items.emplace_back(k);
      d.chunk_offsets.assign(ri.offsets().begin() + pos,
                             ri.offsets().begin() + pos + nd);
      d.chunk_sizes.assign(ri.sizes().begin() + pos,
                           ri.sizes().begin() + pos + nd);
      pos += nd;
    }
    if (pos != ri.offsets_size() || pos != ri.sizes_size()) {
      return absl::InvalidArgumentError(
          fmt::format("rank {}: extra box values", ri.rank()));
    }
  }
  return index;
}

void ToProto(const NodePlan& plan, pb::PlanResponse* out) {
  out->set_cached(plan.cached);
  for (const NodePlan::Rank& r : plan.ranks) {
    pb::RankPlan* rp = out->add_ranks();
    rp->set_rank(r.rank);
    rp->set_file(r.file);
    std::string bits((r.keep.size() + 7) / 8, '\0');
    for (size_t i = 0; i < r.keep.size(); ++i) {
      if (r.keep[i]) bits[i / 8] |= static_cast<char>(1 << (i % 8));
    }
    rp->set_keep(std::move(bits));
  }
}

NodePlan FromProto(const pb::PlanResponse& in,
                   const std::vector<size_t>& item_counts) {
  NodePlan plan;
  plan.cached = in.cached();
  for (int i = 0; i < in.ranks_size(); ++i) {
    const pb::RankPlan& rp = in.ranks(i);
    NodePlan::Rank& r = plan.ranks.emplace_back();
    r.rank = rp.rank();
    r.file = rp.file();
    const size_t n =
        i < static_cast<int>(item_counts.size()) ? item_counts[i] : 0;
    if (rp.keep().size() * 8 < n)
      continue;  // the manager rejects the size mismatch
    r.keep.resize(n);
    for (size_t k = 0; k < n; ++k)
      r.keep[k] = (rp.keep()[k / 8] >> (k % 8)) & 1;
  }
  return plan;
}

void ToProto(const GlobalStatus& g, pb::HeartbeatResponse* out) {
  out->set_state(static_cast<pb::CheckpointState>(g.state));
  out->set_num_nodes(g.num_nodes);
  out->set_nodes_planned(g.nodes_planned);
  out->set_nodes_prepared(g.nodes_prepared);
  out->set_ranks_staged(g.ranks_staged);
  out->set_total_bytes(g.total_bytes);
  out->set_staged_bytes(g.staged_bytes);
  out->set_written_bytes(g.written_bytes);
  if (!g.error.ok()) {
    out->set_error(std::string(g.error.message()));
    out->set_error_code(static_cast<int>(g.error.code()));
  }
}

GlobalStatus FromProto(const pb::HeartbeatResponse& in) {
  GlobalStatus g;
  g.state = static_cast<State>(in.state());
  g.num_nodes = in.num_nodes();
  g.nodes_planned = in.nodes_planned();
  g.nodes_prepared = in.nodes_prepared();
  g.ranks_staged = in.ranks_staged();
  g.total_bytes = in.total_bytes();
  g.staged_bytes = in.staged_bytes();
  g.written_bytes = in.written_bytes();
  if (in.error_code() != 0) {
    g.error = absl::Status(static_cast<absl::StatusCode>(in.error_code()),
                           in.error());
  }
  return g;
}

bool ValidState(int s) { return s >= 1 && s <= 8; }

void ToProto(const NodeProgress& p, pb::NodeProgress* out) {
  out->set_state(static_cast<pb::CheckpointState>(p.state));
  out->set_ranks_staged(p.ranks_staged);
  out->set_total_bytes(p.total_bytes);
  out->set_staged_bytes(p.staged_bytes);
  out->set_written_bytes(p.written_bytes);
}

NodeProgress FromProto(const pb::NodeProgress& in) {
  NodeProgress p;
  p.state = ValidState(in.state()) ? static_cast<State>(in.state()) : State{};
  p.ranks_staged = std::max(0, in.ranks_staged());
  p.total_bytes = in.total_bytes();
  p.staged_bytes = in.staged_bytes();
  p.written_bytes = in.written_bytes();
  return p;
}

// --- Server ----------------------------------------------------------------

// A unary reactor finished by a coordinator callback that may come after
// the caller went away (or the server shut down): the first of OnCancel and
// the callback finishes; the response is touched only by the one that does.
class LongPoll : public grpc::ServerUnaryReactor {
 public:
  // `observer` (may be empty) learns the status the call finishes with.
  LongPoll(const PeerCallObserver& observer, std::string_view method)
      : observer_(observer), method_(method) {}

  // The callback holds a reference until it runs.
  bool TryFinish(const grpc::Status& s,
                 const std::function<void()>& fill = nullptr) {
    {
      absl::MutexLock l(&mu_);
      if (finished_) return false;
      finished_ = true;
      if (fill) fill();
    }
    if (observer_) {
      observer_(method_, static_cast<absl::StatusCode>(s.error_code()));
    }
    Finish(s);
    return true;
  }
  void CallbackDone() { Unref(); }
  void OnCancel() override {
    TryFinish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override { Unref(); }

 private:
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }
  // A copy: the coordinator's callback may come after the service is gone.
  const PeerCallObserver observer_;
  const std::string_view method_;  // a literal
  std::atomic<int> refs_{2};
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

class PeerServiceImpl final : public pb::PeerDaemon::CallbackService {
 public:
  PeerServiceImpl(std::string token, PeerCallObserver observer)
      : token_(std::move(token)), observer_(std::move(observer)) {}
  // Returns once no handler is inside the previous coordinator.
  void SetCoordinator(CoordinatorLink* c) {
    absl::MutexLock l(&mu_);
    coordinator_ = c;
    mu_.Await(absl::Condition(
        +[](int* active) { return *active == 0; }, &active_));
  }

  grpc::ServerUnaryReactor* Plan(grpc::CallbackServerContext* ctx,
                                 const pb::PlanRequest* req,
                                 pb::PlanResponse* resp) override {
    if (absl::Status s = CheckToken(ctx, "Plan"); !s.ok())
      return Reply(ctx, "Plan", s);
    absl::StatusOr<PlanCall> call = [&]() -> absl::StatusOr<PlanCall> {
      PlanCall c;
      ASSIGN_OR_RETURN(c.id, FromProto(req->call()));
      c.world_size = req->world_size();
      c.num_nodes = req->num_nodes();
      c.overwrite = req->options().overwrite();
      c.dedup_save_to_lowest_rank = req->options().dedup_save_to_lowest_rank();
      c.keep_last_n = static_cast<int>(
          std::min<uint32_t>(req->options().keep_last_n(), 1 << 20));
      c.index_digest = req->index_digest();
      c.started = absl::FromUnixMillis(req->started_unix_ms());
      c.ranks.assign(req->ranks().begin(), req->ranks().end());
      if (req->has_index()) {
        ASSIGN_OR_RETURN(c.index, DecodeIndex(req->index()));
      }
      return c;
    }();
    if (!call.ok()) return Reply(ctx, "Plan", call.status());
    CoordinatorLink* coord = nullptr;
    if (absl::Status s = Acquire(&coord); !s.ok()) return Reply(ctx, "Plan", s);
    auto* r = new LongPoll(observer_, "Plan");
    coord->Plan(*std::move(call), [r, resp](absl::StatusOr<NodePlan> plan) {
      r->TryFinish(ToGrpc(plan.status()), [&] {
        if (plan.ok()) ToProto(*plan, resp);
      });
      r->CallbackDone();
    });
    Release();
    return r;
  }

  grpc::ServerUnaryReactor* Prepare(grpc::CallbackServerContext* ctx,
                                    const pb::PrepareRequest* req,
                                    pb::PrepareResponse* resp) override {
    if (absl::Status s = CheckToken(ctx, "Prepare"); !s.ok())
      return Reply(ctx, "Prepare", s);
    PrepareCall call;
    absl::StatusOr<PeerCallId> id = FromProto(req->call());
    if (!id.ok()) return Reply(ctx, "Prepare", id.status());
    call.id = *std::move(id);
    call.progress = FromProto(req->progress());
    for (const pb::RankStorage& rs : req->ranks()) {
      if (rs.offset_size() != rs.length_size()) {
        return Reply(ctx, "Prepare",
                     absl::InvalidArgumentError(fmt::format(
                         "rank {}: offsets and lengths differ", rs.rank())));
      }
      PrepareCall::Rank& r = call.ranks.emplace_back();
      r.rank = rs.rank();
      r.offset.assign(rs.offset().begin(), rs.offset().end());
      r.length.assign(rs.length().begin(), rs.length().end());
    }
    CoordinatorLink* coord = nullptr;
    if (absl::Status s = Acquire(&coord); !s.ok())
      return Reply(ctx, "Prepare", s);
    auto* r = new LongPoll(observer_, "Prepare");
    coord->Prepare(std::move(call), [r, resp](absl::StatusOr<GlobalStatus> g) {
      r->TryFinish(ToGrpc(g.status()), [&] {
        if (g.ok()) {
          resp->set_state(pb::COMMITTED);
          ToProto(*g, resp->mutable_global());
        }
      });
      r->CallbackDone();
    });
    Release();
    return r;
  }

  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const pb::HeartbeatRequest* req,
                                      pb::HeartbeatResponse* resp) override {
    if (absl::Status s = CheckToken(ctx, "Heartbeat"); !s.ok())
      return Reply(ctx, "Heartbeat", s);
    absl::StatusOr<PeerCallId> id = FromProto(req->call());
    if (!id.ok()) return Reply(ctx, "Heartbeat", id.status());
    NodeProgress p = FromProto(req->progress());
    CoordinatorLink* coord = nullptr;
    if (absl::Status s = Acquire(&coord); !s.ok())
      return Reply(ctx, "Heartbeat", s);
    auto* r = new LongPoll(observer_, "Heartbeat");
    coord->Heartbeat(*std::move(id), p,
                     [r, resp](absl::StatusOr<GlobalStatus> g) {
                       r->TryFinish(ToGrpc(g.status()), [&] {
                         if (g.ok()) ToProto(*g, resp);
                       });
                       r->CallbackDone();
                     });
    Release();
    return r;
  }

  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx,
                                  const pb::AbortRequest* req,
                                  pb::AbortResponse*) override {
    if (absl::Status s = CheckToken(ctx, "Abort"); !s.ok())
      return Reply(ctx, "Abort", s);
    absl::StatusOr<PeerCallId> id = FromProto(req->call());
    if (!id.ok()) return Reply(ctx, "Abort", id.status());
    absl::StatusCode code = static_cast<absl::StatusCode>(req->code());
    if (req->code() <= 0 || req->code() > 16) code = absl::StatusCode::kAborted;
    CoordinatorLink* coord = nullptr;
    if (absl::Status s = Acquire(&coord); !s.ok())
      return Reply(ctx, "Abort", s);
    auto* r = new LongPoll(observer_, "Abort");
    coord->Abort(*std::move(id),
                 absl::Status(code, req->reason().substr(0, 4096)),
                 [r](absl::Status s) {
                   r->TryFinish(ToGrpc(s));
                   r->CallbackDone();
                 });
    Release();
    return r;
  }

 private:
  grpc::ServerUnaryReactor* Reply(grpc::CallbackServerContext* ctx,
                                  std::string_view method,
                                  const absl::Status& s) {
    if (observer_) observer_(method, s.code());
    grpc::ServerUnaryReactor* r = ctx->DefaultReactor();
    r->Finish(ToGrpc(s));
    return r;
  }

  // Before anything else is read of a call.
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
  void Release() {
    absl::MutexLock l(&mu_);
    --active_;
  }

  const std::string token_;
  const PeerCallObserver observer_;
  absl::Mutex mu_;
  CoordinatorLink* coordinator_ ABSL_GUARDED_BY(mu_) = nullptr;
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

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

std::shared_ptr<grpc::ChannelCredentials> ClientCreds(const PeerTls& tls) {
  if (!tls.enabled() && tls.ca_pem.empty())
    return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = tls.ca_pem;
  o.pem_private_key = tls.key_pem;
  o.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(o);
}

// gRPC runs callback-API completions on a process-wide queue whose threads
// stop when its last user (server or channel) goes away; a channel destroyed
// right after its last callback returned can race that shutdown (gRPC 1.51:
// "assertion failed: prior > 0" in grpc_cq_internal_unref). One leaked
// channel that made a callback call keeps the queue for the process.
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

// --- Client ----------------------------------------------------------------

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
    ToProto(call.id, c->req.mutable_call());
    c->req.set_world_size(call.world_size);
    c->req.set_num_nodes(call.num_nodes);
    c->req.mutable_options()->set_overwrite(call.overwrite);
    c->req.mutable_options()->set_dedup_save_to_lowest_rank(
        call.dedup_save_to_lowest_rank);
    c->req.mutable_options()->set_keep_last_n(
        static_cast<uint32_t>(std::max(0, call.keep_last_n)));
    c->req.set_index_digest(call.index_digest);
    c->req.set_started_unix_ms(absl::ToUnixMillis(call.started));
    for (int r : call.ranks) c->req.add_ranks(r);
    std::vector<size_t> counts;
    if (call.index) {
      EncodeIndex(*call.index, c->req.mutable_index());
      for (const auto& items : call.index->items)
        counts.push_back(items.size());
    } else {
      counts = call.item_counts;
    }
    stub_->async()->Plan(
        &c->ctx, &c->req, &c->resp,
        [this, c, done = std::make_shared<PlanDone>(std::move(done)),
         counts](grpc::Status s) {
          absl::Status st = Result(s, "Plan");
          absl::StatusOr<NodePlan> plan =
              st.ok() ? absl::StatusOr<NodePlan>(FromProto(c->resp, counts))
                      : absl::StatusOr<NodePlan>(st);
          Finish(c);
          std::move (*done)(std::move(plan));
        });
  }

  void Prepare(PrepareCall call, PrepareDone done) override {
    auto* c = Start<pb::PrepareRequest, pb::PrepareResponse>(
        options_.prepare_deadline);
    c->ctx.set_wait_for_ready(true);
    ToProto(call.id, c->req.mutable_call());
    for (const PrepareCall::Rank& r : call.ranks) {
      pb::RankStorage* rs = c->req.add_ranks();
      rs->set_rank(r.rank);
      rs->mutable_offset()->Add(r.offset.begin(), r.offset.end());
      rs->mutable_length()->Add(r.length.begin(), r.length.end());
    }
    ToProto(call.progress, c->req.mutable_progress());
    stub_->async()->Prepare(
        &c->ctx, &c->req, &c->resp,
        [this, c, done = std::make_shared<PrepareDone>(std::move(done))](
            grpc::Status s) {
          absl::Status st = Result(s, "Prepare");
          absl::StatusOr<GlobalStatus> g =
              st.ok()
                  ? absl::StatusOr<GlobalStatus>(FromProto(c->resp.global()))
                  : absl::StatusOr<GlobalStatus>(st);
          Finish(c);
          std::move (*done)(std::move(g));
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
    stub_->async()->Heartbeat(
        &c->ctx, &c->req, &c->resp,
        [this, c, done = std::make_shared<HeartbeatDone>(std::move(done))](
            grpc::Status s) {
          absl::Status st = Result(s, "Heartbeat");
          absl::StatusOr<GlobalStatus> g =
              st.ok() ? absl::StatusOr<GlobalStatus>(FromProto(c->resp))
                      : absl::StatusOr<GlobalStatus>(st);
          Finish(c);
          std::move (*done)(std::move(g));
        });
  }

  void Abort(PeerCallId id, absl::Status reason, AbortDone done) override {
    auto* c =
        Start<pb::AbortRequest, pb::AbortResponse>(options_.call_deadline);
    ToProto(id, c->req.mutable_call());
    c->req.set_reason(std::string(reason.message()));
    c->req.set_code(static_cast<int>(reason.code()));
    stub_->async()->Abort(
        &c->ctx, &c->req, &c->resp,
        [this, c,
         done = std::make_shared<AbortDone>(std::move(done))](grpc::Status s) {
          absl::Status st = Result(s, "Abort");
          Finish(c);
          if (*done) std::move (*done)(st);
        });
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
  impl->service =
      std::make_unique<PeerServiceImpl>(options.token, options.on_request);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, ServerCreds(options.tls),
                           &impl->port);
  builder.RegisterService(impl->service.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
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
  impl_->server->Shutdown(std::chrono::system_clock::now());
}
int PeerServer::port() const { return impl_->port; }
void PeerServer::SetCoordinator(CoordinatorLink* coordinator) {
  impl_->service->SetCoordinator(coordinator);
}

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
      // A coordinator that restarted is reached again within seconds.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
      auto channel =
          grpc::CreateCustomChannel(address, ClientCreds(options.tls), args);
      link = std::make_shared<RemoteLink>(address, std::move(channel), options);
    }
    return link;
  };
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
