// Copyright 2026 The ckptd Authors.
//
// The replicas' client side (peer_service.h MakeShareLinkFactory): calls to
// other daemons' PushShare, ListShares and FetchShare, the token attached,
// errors named with the daemon called.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "common/absl_fmt.h"
#include "common/crc32.h"
#include "daemon/cluster/peer_codec.h"
#include "daemon/cluster/peer_grpc.h"
#include "daemon/cluster/peer_service.h"
#include "daemon/cluster/share_wire.h"
#include "fmt/format.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/grpc_status.h"

namespace ckptd::daemon {
namespace {

namespace pb = ::ckptd::v1;

// FetchShare calls in flight for one Fetch.
constexpr int kFetchesInFlight = 8;

class GrpcShareLink final : public ShareLink {
 public:
  GrpcShareLink(std::string address, std::shared_ptr<grpc::Channel> channel,
                std::string token)
      : address_(std::move(address)),
        stub_(pb::PeerDaemon::NewStub(channel)),
        generic_(channel),
        token_(std::move(token)) {}

  absl::StatusOr<bool> Push(const ShareChunk& c,
                            absl::Duration deadline) override {
    pb::PushShareRequest req;
    ToProto(c.id, req.mutable_call());
    req.set_file_index(c.file_index);
    req.set_num_files(c.num_files);
    req.set_file(c.file);
    req.set_file_size(c.file_size);
    req.set_file_identity(c.file_identity);
    req.set_offset(c.offset);
    req.set_data(c.data);
    req.set_crc32(c.crc32);
    req.set_file_crc32(c.file_crc32);
    grpc::ClientContext ctx;
    Prepare(ctx, deadline);
    pb::PushShareResponse resp;
    if (grpc::Status s = stub_->PushShare(&ctx, req, &resp); !s.ok())
      return Named("PushShare", s);
    return resp.held();
  }

  absl::StatusOr<std::vector<ShareFile>> List(
      const std::string& dir, const std::string& metadata,
      absl::Duration deadline) override {
    pb::ListSharesRequest req;
    req.set_dir(dir);
    req.set_metadata(metadata);
    grpc::ClientContext ctx;
    Prepare(ctx, deadline);
    pb::ListSharesResponse resp;
    if (grpc::Status s = stub_->ListShares(&ctx, req, &resp); !s.ok())
      return Named("ListShares", s);
    std::vector<ShareFile> out;
    for (const pb::HeldShareFile& f : resp.files()) {
      out.push_back({f.file(), f.size(), f.node(), f.file_identity()});
    }
    return out;
  }

  absl::Status Fetch(const std::string& dir, const std::string& metadata,
                     const std::string& file, uint64_t offset, uint64_t n,
                     char* dst, absl::Duration deadline) override {
    // Pieces of at most kChunkBytes, kFetchesInFlight at a time; each
    // checked against the CRC-32 its holder sent with it.
    constexpr uint64_t kPiece = SharesOptions::kChunkBytes;
    if (n == 0) return absl::OkStatus();
    std::vector<std::unique_ptr<Piece>> pieces;
    for (uint64_t at = 0; at < n; at += kPiece) {
      auto p = std::make_unique<Piece>();
      pb::FetchShareRequest req;
      req.set_dir(dir);
      req.set_metadata(metadata);
      req.set_file(file);
      req.set_offset(offset + at);
      req.set_length(std::min(kPiece, n - at));
      p->offset = req.offset();
      p->length = req.length();
      grpc::Slice slice(req.SerializeAsString());
      p->req = grpc::ByteBuffer(&slice, 1);
      p->dst = dst + at;
      pieces.push_back(std::move(p));
    }
    const absl::Time until = absl::Now() + deadline;
    FetchState st;
    size_t next = 0;
    absl::MutexLock l(&st.mu);
    for (;;) {
      while (st.in_flight < kFetchesInFlight && next < pieces.size() &&
             st.first_error.ok()) {
        Piece* p = pieces[next++].get();
        Prepare(p->ctx, until - absl::Now());
        ++st.in_flight;
        // The generic stub: the answer's bytes are decoded straight into
        // place (no parse into a message first).
        generic_.UnaryCall(&p->ctx, "/ckptd.v1.PeerDaemon/FetchShare",
                           grpc::StubOptions(), &p->req, &p->resp,
                           [this, p, &st, &file](grpc::Status s) {
                             absl::Status result = Check(s, file, *p);
                             absl::MutexLock l(&st.mu);
                             if (!result.ok() && st.first_error.ok())
                               st.first_error = std::move(result);
                             --st.in_flight;
                             ++st.finished;
                           });
      }
      if (st.in_flight == 0) break;
      // Every call has the deadline: each wait ends when one call does.
      st.seen = st.finished;
      st.mu.Await(absl::Condition(
          +[](FetchState* f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(f->mu) {
            return f->finished > f->seen;
          },
          &st));
    }
    return st.first_error;
  }

 private:
  struct Piece {
    grpc::ClientContext ctx;
    grpc::ByteBuffer req;   // a FetchShareRequest
    grpc::ByteBuffer resp;  // a FetchShareResponse's wire bytes
    uint64_t offset = 0;
    uint64_t length = 0;
    char* dst = nullptr;
  };
  struct FetchState {
    absl::Mutex mu;
    int in_flight ABSL_GUARDED_BY(mu) = 0;
    uint64_t finished ABSL_GUARDED_BY(mu) = 0;
    uint64_t seen ABSL_GUARDED_BY(mu) = 0;
    absl::Status first_error ABSL_GUARDED_BY(mu);
  };
  // A piece's answer decoded into its place and checked (share_wire.h).
  absl::Status Check(const grpc::Status& s, const std::string& file,
                     Piece& p) const {
    if (!s.ok()) return Named("FetchShare", s);
    absl::Status d = DecodeFetchAnswer(p.resp, p.length, p.dst);
    if (!d.ok()) {
      return absl::DataLossError(fmt::format("FetchShare from {}: {} at {}: {}",
                                             address_, file, p.offset,
                                             d.message()));
    }
    return absl::OkStatus();
  }

  void Prepare(grpc::ClientContext& ctx, absl::Duration deadline) {
    ctx.set_deadline(absl::ToChronoTime(
        absl::Now() + std::max(deadline, absl::Milliseconds(1))));
    ctx.AddMetadata(kAuthHeader, "Bearer " + token_);
  }
  absl::Status Named(std::string_view method, const grpc::Status& s) const {
    return absl::Status(
        static_cast<absl::StatusCode>(s.error_code()),
        fmt::format("{} to {}: {}", method, address_, s.error_message()));
  }

  const std::string address_;
  const std::unique_ptr<pb::PeerDaemon::Stub> stub_;
  grpc::GenericStub generic_;
  const std::string token_;
};

}  // namespace

ShareLinkFactory MakeShareLinkFactory(const PeerClientOptions& options) {
  struct Cache {
    absl::Mutex mu;
    absl::flat_hash_map<std::string, std::shared_ptr<ShareLink>> links
        ABSL_GUARDED_BY(mu);
  };
  KeepCallbackQueueAlive();
  auto cache = std::make_shared<Cache>();
  return [options, cache](const std::string& address)
             -> absl::StatusOr<std::shared_ptr<ShareLink>> {
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
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
      for (const auto& [key, value] : PeerTransportArgs()) {
        args.SetInt(key, value);
      }
      link = std::make_shared<GrpcShareLink>(
          address,
          grpc::CreateCustomChannel(address, ClientCreds(options.tls), args),
          options.token);
    }
    return link;
  };
}

}  // namespace ckptd::daemon
