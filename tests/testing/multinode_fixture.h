// Copyright 2026 The ckptd Authors.
//
// N daemons ("nodes") in one process for the multi-node tests: each a
// CheckpointManager with its own state and shm directories and its own
// PeerServer on 127.0.0.1:0, peer calls over real gRPC with a token (or
// TLS), metrics counted on both sides as daemon_main wires them, one
// shared checkpoint root (dir_/shared). Node 0 coordinates. Every rank
// saves the same small state: "w" [4 * world, 64] sharded on dim 0, "b"
// [16] replicated (written once), "meta.{r}" bytes.
//
// A test changes a node before it starts by overriding Configure (its
// options, its peer server's and client's) and WrapLink (its link to the
// coordinator: a wrapper that loses, holds or mutes calls).
#ifndef CKPTD_TESTS_TESTING_MULTINODE_FIXTURE_H_
#define CKPTD_TESTS_TESTING_MULTINODE_FIXTURE_H_

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/env.h"
#include "daemon/cluster/peer_service.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/save/checkpoint_manager.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/verify.h"
#include "format/metadata/metadata.h"
#include "format/pickle/py_value.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "tests/testing/manager_util.h"
#include "tests/testing/test_util.h"

namespace ckptd::testing {

inline constexpr char kMultiNodeToken[] = "multinode-test-token-0123456789abc";

struct TestNode {
  daemon::DaemonOptions options;
  std::shared_ptr<daemon::DaemonMetrics> metrics =
      std::make_shared<daemon::DaemonMetrics>("test", absl::Now());
  std::unique_ptr<daemon::PeerServer> peer;
  std::unique_ptr<daemon::CheckpointManager> manager;
  std::string address;
};

// A link that passes every call to `inner_`: a test's wrapper overrides
// the calls it loses, holds or changes.
class ForwardingLink : public daemon::CoordinatorLink {
 public:
  explicit ForwardingLink(std::shared_ptr<daemon::CoordinatorLink> inner)
      : inner_(std::move(inner)) {}
  void Plan(daemon::PlanCall call, daemon::PlanDone done) override {
    inner_->Plan(std::move(call), std::move(done));
  }
  void Prepare(daemon::PrepareCall call, daemon::PrepareDone done) override {
    inner_->Prepare(std::move(call), std::move(done));
  }
  void Heartbeat(daemon::PeerCallId id, daemon::NodeProgress p,
                 daemon::HeartbeatDone done) override {
    inner_->Heartbeat(std::move(id), p, std::move(done));
  }
  void Abort(daemon::PeerCallId id, absl::Status reason,
             daemon::AbortDone done) override {
    inner_->Abort(std::move(id), std::move(reason), std::move(done));
  }
  void CancelCalls() override { inner_->CancelCalls(); }

 protected:
  const std::shared_ptr<daemon::CoordinatorLink> inner_;
};

// What every rank's save says besides its items.
struct RankOptions {
  bool overwrite = false;
  bool external = false;  // DCP's StorageWriter hands in the .metadata
  int zstd_level = 0;
  absl::Duration metadata_timeout = absl::Seconds(20);
};

class MultiNodeFixture : public ::testing::Test {
 protected:
  static constexpr int64_t kRows = 4, kCols = 64;

  static float Value(int64_t i, int seed) {
    return static_cast<float>((i * 31 + seed) % 251);
  }

  // Before node n starts: its options (FinalizeOptions runs after), its
  // peer server's and its peer client's (whose Plan and Prepare deadlines
  // follow from the options: stage_timeout + peer_timeout, commit_timeout
  // + peer_timeout + prepare_deadline_extra_).
  virtual void Configure(int n, daemon::DaemonOptions& options,
                         daemon::PeerServerOptions& server,
                         daemon::PeerClientOptions& client) {}
  // Node n's link to the coordinator.
  virtual std::shared_ptr<daemon::CoordinatorLink> WrapLink(
      int n, std::shared_ptr<daemon::CoordinatorLink> link) {
    return link;
  }

  // `nodes` daemons of `ranks_per_node` ranks each (the running ones
  // stopped first); tokens[n], if given, is node n's client token.
  void StartNodes(int nodes, int ranks_per_node,
                  std::vector<std::string> tokens = {}) {
    StopNodes();
    ranks_per_node_ = ranks_per_node;
    for (int n = 0; n < nodes; ++n) {
      auto node = std::make_unique<TestNode>();
      daemon::DaemonOptions& o = node->options;
      o.checkpoint_roots = {dir_.Join("shared")};
      o.shm_dir = dir_.Join("shm" + std::to_string(n));
      o.state_dir = dir_.Join("state" + std::to_string(n));
      o.staging_budget = 64 << 20;
      o.stage_timeout = absl::Seconds(3);
      o.peer_timeout = absl::Milliseconds(1500);
      o.peer_heartbeat = absl::Milliseconds(50);
      o.commit_timeout = absl::Seconds(5);
      o.env = Env::Default();
      daemon::PeerServerOptions po;
      po.listen = "127.0.0.1:0";
      po.token = kMultiNodeToken;
      po.on_request = [m = node->metrics](std::string_view method,
                                          absl::StatusCode code) {
        m->PeerRequest(method, code);
      };
      daemon::PeerClientOptions pc;
      pc.token =
          n < static_cast<int>(tokens.size()) ? tokens[n] : kMultiNodeToken;
      pc.call_deadline = absl::Milliseconds(700);
      pc.on_call = [m = node->metrics](std::string_view method,
                                       absl::StatusCode code) {
        m->PeerCall(method, code);
      };
      Configure(n, o, po, pc);
      ASSERT_OK(daemon::FinalizeOptions(&o));
      pc.plan_deadline = o.stage_timeout + o.peer_timeout;
      pc.prepare_deadline =
          o.commit_timeout + o.peer_timeout + prepare_deadline_extra_;
      ASSERT_OK_AND_ASSIGN(node->peer, daemon::PeerServer::Start(po));
      node->address = "127.0.0.1:" + std::to_string(node->peer->port());
      o.node_name = node->address;
      o.link_factory = [this, n, inner = daemon::MakeLinkFactory(pc)](
                           const std::string& address)
          -> absl::StatusOr<std::shared_ptr<daemon::CoordinatorLink>> {
        auto link = inner(address);
        if (!link.ok()) return link;
        return WrapLink(n, *std::move(link));
      };
      o.share_link_factory = daemon::MakeShareLinkFactory(pc);
      ASSERT_OK_AND_ASSIGN(node->manager, daemon::CheckpointManager::Create(o));
      node->peer->SetCoordinator(node->manager->coordinator());
      node->peer->SetShares(node->manager->shares());
      nodes_.push_back(std::move(node));
    }
  }

  // Node n's daemon gone (its peer server first: it forwards to the
  // manager's coordinator).
  void StopNode(int n) {
    if (nodes_[n]->peer) {
      nodes_[n]->peer->SetCoordinator(nullptr);
      nodes_[n]->peer->SetShares(nullptr);
    }
    nodes_[n]->peer.reset();
    nodes_[n]->manager.reset();
  }
  void StopNodes() {
    for (auto& n : nodes_) {
      if (n->peer) {
        n->peer->SetCoordinator(nullptr);
        n->peer->SetShares(nullptr);
      }
    }
    for (auto& n : nodes_) n->peer.reset();
    nodes_.clear();
  }
  void TearDown() override { StopNodes(); }

  int world() const {
    return static_cast<int>(nodes_.size()) * ranks_per_node_;
  }
  int NodeOf(int rank) const { return rank / ranks_per_node_; }

  // Rank r's batch of the state above, in an arena registered on its node
  // (kept until the test ends).
  daemon::SaveBatch MakeRank(const std::string& id, int rank,
                             const RankOptions& opts = {}) {
    TestNode& node = *nodes_[NodeOf(rank)];
    const uint64_t w_bytes = kRows * kCols * 4;
    const std::string meta = format::EncodeTorchSaveObject(
        format::PyValue::Str("meta " + std::to_string(rank)));
    auto arena = shm::Arena::Create(node.options.shm_dir,
                                    w_bytes + 64 + meta.size(), "test");
    EXPECT_TRUE(arena.ok()) << arena.status();
    char* p = (*arena)->data();
    auto* w = reinterpret_cast<float*>(p);
    for (int64_t i = 0; i < kRows * kCols; ++i)
      w[i] = Value(rank * kRows * kCols + i, 1);
    auto* b = reinterpret_cast<float*>(p + w_bytes);
    for (int i = 0; i < 16; ++i) b[i] = Value(i, 2);
    std::memcpy(p + w_bytes + 64, meta.data(), meta.size());
    daemon::SaveBatch sb;
    sb.checkpoint_id = id;
    sb.rank = rank;
    sb.world_size = world();
    sb.overwrite = opts.overwrite;
    sb.external_metadata = opts.external;
    sb.metadata_timeout = opts.metadata_timeout;
    sb.zstd_level = opts.zstd_level;
    format::ItemDesc wd;
    wd.fqn = "w";
    wd.global_shape = {kRows * world(), kCols};
    wd.chunk_offsets = {rank * kRows, 0};
    wd.chunk_sizes = {kRows, kCols};
    format::ItemDesc bd;
    bd.fqn = "b";
    bd.global_shape = bd.chunk_sizes = {16};
    bd.chunk_offsets = {0};
    format::ItemDesc md;
    md.fqn = "meta." + std::to_string(rank);
    md.type = format::ItemDesc::Type::kBytes;
    sb.items = {wd, bd, md};
    sb.item_nbytes = {w_bytes, 64, meta.size()};
    auto aid =
        node.manager->RegisterArena((*arena)->name(), (*arena)->size(), "test");
    EXPECT_TRUE(aid.ok()) << aid.status();
    sb.arena_id = aid.value_or(0);
    arena_ids_[NodeOf(rank)] = sb.arena_id;
    sb.extents = {{0, 0, 0, w_bytes},
                  {1, 0, w_bytes, 64},
                  {2, 0, w_bytes + 64, meta.size()}};
    sb.last = true;
    sb.cluster.num_nodes = static_cast<int>(nodes_.size());
    sb.cluster.coordinator = nodes_[0]->address;
    for (int k = 0; k < ranks_per_node_; ++k)
      sb.cluster.local_ranks.push_back(NodeOf(rank) * ranks_per_node_ + k);
    arenas_.push_back(*std::move(arena));
    return sb;
  }

  absl::StatusOr<daemon::SaveReply> SaveSync(int node,
                                             daemon::SaveBatch batch) {
    return ::ckptd::testing::SaveSync(*nodes_[node]->manager, std::move(batch));
  }
  absl::StatusOr<daemon::CheckpointInfo> WaitFinal(
      int node, const std::string& id, bool until_data_durable = false) {
    return ::ckptd::testing::WaitFinal(*nodes_[node]->manager, id,
                                       absl::Seconds(30), until_data_durable);
  }

  // Every rank saves (staging replies ignored); each node's final info.
  std::vector<absl::StatusOr<daemon::CheckpointInfo>> SaveAll(
      const std::string& id, const RankOptions& opts = {}) {
    for (int r = 0; r < world(); ++r)
      (void)SaveSync(NodeOf(r), MakeRank(id, r, opts));
    std::vector<absl::StatusOr<daemon::CheckpointInfo>> out;
    for (size_t n = 0; n < nodes_.size(); ++n) out.push_back(WaitFinal(n, id));
    return out;
  }

  // The checkpoint verifies, every value reads back (transforms decoded),
  // the replicated item is written once and every rank's bytes item is
  // there.
  void ExpectCommitted(const std::string& id) {
    const std::string dir = dir_.Join("shared/" + id);
    ASSERT_OK_AND_ASSIGN(format::VerifyReport report,
                         format::VerifyCheckpoint(dir));
    ASSERT_TRUE(report.ok()) << report.problems[0];
    ASSERT_OK_AND_ASSIGN(auto reader, format::CheckpointReader::Open(dir));
    const int64_t rows = kRows * world();
    std::vector<float> w(rows * kCols), b(16);
    format::TensorRequest rw{"w",
                             {0, 0},
                             {format::DType::kFloat32,
                              {rows, kCols},
                              {},
                              reinterpret_cast<char*>(w.data())}};
    format::TensorRequest rb{
        "b",
        {0},
        {format::DType::kFloat32, {16}, {}, reinterpret_cast<char*>(b.data())}};
    ASSERT_OK(reader->ReadTensors({rw, rb}));
    for (int64_t i = 0; i < rows * kCols; ++i)
      ASSERT_EQ(w[i], Value(i, 1)) << i;
    for (int i = 0; i < 16; ++i) ASSERT_EQ(b[i], Value(i, 2));
    int b_chunks = 0, metas = 0;
    for (const auto& [key, info] : reader->metadata().storage_data) {
      b_chunks += key.fqn == "b";
      metas += key.fqn.starts_with("meta.");
    }
    EXPECT_EQ(b_chunks, 1)
        << "the replicated item is written once across all nodes";
    EXPECT_EQ(metas, world());
  }

  void ExpectNoMetadata(const std::string& id) {
    EXPECT_TRUE(absl::IsNotFound(Env::Default()->FileExists(
        dir_.Join("shared/" + id + "/" + format::kMetadataName))));
  }

  TempDir dir_;
  int ranks_per_node_ = 1;
  absl::Duration prepare_deadline_extra_ = absl::ZeroDuration();
  std::map<int, uint64_t> arena_ids_;  // per node: an arena of its ranks
  std::vector<std::unique_ptr<TestNode>> nodes_;
  std::vector<std::unique_ptr<shm::Arena>> arenas_;
};

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_MULTINODE_FIXTURE_H_
