// Copyright 2026 The ckptd Authors.

#include "daemon/peer_service.h"

#include <sys/stat.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

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
#include "grpcpp/generic/async_generic_service.h"
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

// At most `max` bytes of `s`, cut on a UTF-8 boundary (proto3 strings must
// be valid UTF-8).
std::string_view TruncateUtf8(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
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
      : ctx_(ctx), service_(service), method_(method), observer_(observer) {}

  // Reads the request; its handler runs on it.
  void ReadRequest() { StartRead(&request_); }

  // Finishes the call with `s` and, when OK, `response`, unless it finished
  // already.
  bool TryFinish(const grpc::Status& s,
                 const google::protobuf::MessageLite* response = nullptr) {
    {
      absl::MutexLock l(&mu_);
      if (finished_) return false;
      finished_ = true;
    }
    grpc::Status status = s;
    bool write = false;
    if (s.ok() && response != nullptr) {
      bool own = false;
      status =
          grpc::SerializationTraits<google::protobuf::MessageLite>::Serialize(
              *response, &response_, &own);
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
  // Holds the call for a coordinator callback, until Unref.
  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  void OnReadDone(bool ok) override;
  void OnCancel() override {
    TryFinish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
  }
  void OnDone() override { Unref(); }

 private:
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

template <typename Req>
absl::Status ParseRequest(grpc::ByteBuffer* buf, std::string_view method,
                          Req* req) {
  if (!grpc::SerializationTraits<Req>::Deserialize(buf, req).ok()) {
    return absl::InvalidArgumentError(
        fmt::format("peer {}: malformed request", method));
  }
  return absl::OkStatus();
}

class PeerServiceImpl final : public grpc::CallbackGenericService {
 public:
  PeerServiceImpl(std::string token, PeerCallObserver observer,
                  int64_t max_request_bytes, int64_t max_small_request_bytes)
      : token_(std::move(token)), observer_(std::move(observer)) {
    methods_ = {
        {"Plan", max_request_bytes, &PeerServiceImpl::Plan},
        {"Prepare", max_request_bytes, &PeerServiceImpl::Prepare},
        {"Heartbeat", max_small_request_bytes, &PeerServiceImpl::Heartbeat},
        {"Abort", max_small_request_bytes, &PeerServiceImpl::Abort},
    };
    for (const PeerMethod& m : methods_) {
      by_path_[fmt::format("/{}/{}", pb::PeerDaemon::service_full_name(),
                           m.name)] = &m;
    }
  }
  // Returns once no handler is inside the previous coordinator.
  void SetCoordinator(CoordinatorLink* c) {
    absl::MutexLock l(&mu_);
    coordinator_ = c;
    mu_.Await(absl::Condition(
        +[](int* active) { return *active == 0; }, &active_));
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
      RETURN_IF_ERROR(ParseRequest(buf, "Plan", &req));
      PlanCall c;
      ASSIGN_OR_RETURN(c.id, FromProto(req.call()));
      c.world_size = req.world_size();
      c.num_nodes = req.num_nodes();
      c.overwrite = req.options().overwrite();
      c.dedup_save_to_lowest_rank = req.options().dedup_save_to_lowest_rank();
      c.keep_last_n = static_cast<int>(
          std::min<uint32_t>(req.options().keep_last_n(), 1 << 20));
      c.index_digest = req.index_digest();
      c.started = absl::FromUnixMillis(req.started_unix_ms());
      c.ranks.assign(req.ranks().begin(), req.ranks().end());
      if (req.has_index()) {
        ASSIGN_OR_RETURN(c.index, DecodeIndex(req.index()));
      }
      return c;
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
      RETURN_IF_ERROR(ParseRequest(buf, "Prepare", &req));
      PrepareCall c;
      ASSIGN_OR_RETURN(c.id, FromProto(req.call()));
      c.progress = FromProto(req.progress());
      for (const pb::RankStorage& rs : req.ranks()) {
        if (rs.offset_size() != rs.length_size()) {
          return absl::InvalidArgumentError(
              fmt::format("rank {}: offsets and lengths differ", rs.rank()));
        }
        PrepareCall::Rank& rank = c.ranks.emplace_back();
        rank.rank = rs.rank();
        rank.offset.assign(rs.offset().begin(), rs.offset().end());
        rank.length.assign(rs.length().begin(), rs.length().end());
      }
      return c;
    }();
    if (!call.ok()) return (void)r->TryFinish(ToGrpc(call.status()));
    CoordinatorLink* coord = nullptr;
    if (absl::Status s = Acquire(&coord); !s.ok())
      return (void)r->TryFinish(ToGrpc(s));
    r->Ref();
    coord->Prepare(*std::move(call), [r](absl::StatusOr<GlobalStatus> g) {
      pb::PrepareResponse resp;
      if (g.ok()) {
        resp.set_state(pb::COMMITTED);
        ToProto(*g, resp.mutable_global());
      }
      r->TryFinish(ToGrpc(g.status()), &resp);
      r->Unref();
    });
    Release();
  }

  void Heartbeat(PeerCall* r, grpc::ByteBuffer* buf) {
    pb::HeartbeatRequest req;
    if (absl::Status s = ParseRequest(buf, "Heartbeat", &req); !s.ok())
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
    if (absl::Status s = ParseRequest(buf, "Abort", &req); !s.ok())
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
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

// The method's limit is checked on the received bytes, before parsing.
void PeerCall::OnReadDone(bool ok) {
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
    // The coordinator keeps that much of it (and takes small Aborts only).
    const absl::string_view why = reason.message();
    c->req.set_reason(std::string(
        TruncateUtf8(std::string_view(why.data(), why.size()), 4096)));
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
