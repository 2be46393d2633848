// Copyright 2026 The ckptd Authors.
//
// DCP's StorageWriter (SaveOptions.external_metadata) and stream transforms
// (zstd) across nodes, in one process: N CheckpointManagers ("nodes"), each
// with its own state and shm directories and its own PeerServer on
// 127.0.0.1:0, peer calls over real gRPC with the token, one shared
// checkpoint root (as multinode_test.cc). The coordinator's node awaits
// the .metadata once every node is durable, serves the global layout, and
// checks the handed-over bytes against every node's items before
// publishing; every refusal of the single-node commit holds across nodes,
// plus a node going silent before it prepared, a node gone after it
// prepared, the calls on a node that is not the coordinator, and nodes
// that disagree on the options.

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "common/env.h"
#include "daemon/cluster/participant.h"
#include "daemon/cluster/peer_service.h"
#include "daemon/save/checkpoint_manager.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/verify.h"
#include "format/metadata/metadata.h"
#include "format/pickle/py_value.h"
#include "format/tensor/payload_transform.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "tests/testing/manager_util.h"
#include "tests/testing/multinode_fixture.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// When a node goes silent: after its plan round (hung or cut off between
// write_data and finish: its heartbeats and prepare never reach the
// coordinator), or after its prepare (dead: nothing more from it, not even
// the abort of its shutdown).
// kDropLayout: the node's prepare arrives without its items' layout.
enum class Mute { kNever, kAfterPlan, kAfterPrepare, kDropLayout };

class MutingLink final : public CoordinatorLink {
 public:
  MutingLink(std::shared_ptr<CoordinatorLink> inner, Mute mute)
      : inner_(std::move(inner)), mute_(mute) {}
  void Plan(PlanCall call, PlanDone done) override {
    inner_->Plan(std::move(call), std::move(done));
    if (mute_ == Mute::kAfterPlan) muted_ = true;
  }
  void Prepare(PrepareCall call, PrepareDone done) override {
    if (muted_) {
      std::move(done)(absl::UnavailableError("muted"));
      return;
    }
    if (mute_ == Mute::kDropLayout) {
      for (PrepareCall::Rank& r : call.ranks) {
        r.offset.clear();
        r.length.clear();
        r.transforms.clear();
      }
    }
    inner_->Prepare(std::move(call), std::move(done));
    if (mute_ == Mute::kAfterPrepare) muted_ = true;
  }
  void Heartbeat(PeerCallId id, NodeProgress p, HeartbeatDone done) override {
    if (muted_) {
      std::move(done)(absl::UnavailableError("muted"));
      return;
    }
    inner_->Heartbeat(std::move(id), p, std::move(done));
  }
  void Abort(PeerCallId id, absl::Status reason, AbortDone done) override {
    if (!muted_) {
      inner_->Abort(std::move(id), std::move(reason), std::move(done));
    } else if (done) {
      std::move(done)(absl::UnavailableError("muted"));
    }
  }
  void CancelCalls() override { inner_->CancelCalls(); }

 private:
  std::shared_ptr<CoordinatorLink> inner_;
  const Mute mute_;
  std::atomic<bool> muted_{false};
};

// DCP's StorageWriter unless a test says otherwise: each save names
// .external = true.
using Opts = ::ckptd::testing::RankOptions;

class MultiNodeExternalTest : public ::ckptd::testing::MultiNodeFixture {
 protected:
  void Configure(int n, DaemonOptions& o, PeerServerOptions& po,
                 PeerClientOptions& pc) override {
    o.commit_timeout = commit_timeout_;
    prepare_deadline_extra_ = absl::Seconds(30);
  }
  std::shared_ptr<CoordinatorLink> WrapLink(
      int n, std::shared_ptr<CoordinatorLink> link) override {
    if (n != mute_node_) return link;
    return std::make_shared<MutingLink>(link, mute_);
  }

  // Every rank hands its data over; `opts_of(node)` per node.
  void SaveRanks(const std::string& id,
                 const std::function<Opts(int node)>& opts_of) {
    for (int r = 0; r < world(); ++r) {
      (void)SaveSync(NodeOf(r), MakeRank(id, r, opts_of(NodeOf(r))));
    }
  }
  void SaveRanks(const std::string& id, const Opts& opts) {
    SaveRanks(id, [&](int) { return opts; });
  }

  // What DCP's coordinator hands over for the world: every item's metadata,
  // storage_data from the (global) layout.
  format::Metadata DcpMetadata(const Layout& layout) {
    format::Metadata m;
    format::TensorStorageMetadata w;
    w.size = {kRows * world(), kCols};
    for (int r = 0; r < world(); ++r)
      w.chunks.push_back({{r * kRows, 0}, {kRows, kCols}});
    format::TensorStorageMetadata b;
    b.size = {16};
    b.chunks.push_back({{0}, {16}});
    m.state_dict_metadata = {{"w", w}, {"b", b}};
    for (int r = 0; r < world(); ++r) {
      m.state_dict_metadata.push_back(
          {"meta." + std::to_string(r), format::BytesStorageMetadata{}});
    }
    for (const LayoutEntry& e : layout.entries)
      m.storage_data.push_back({e.key, e.info});
    format::StorageMeta sm;
    sm.checkpoint_id = "as DCP names it";
    sm.save_id = "0123abcd";
    m.storage_meta = sm;
    m.BuildIndex();
    return m;
  }

  std::string Encode(const format::Metadata& m) {
    absl::StatusOr<std::string> bytes =
        format::EncodeMetadata(m, {.write_storage_meta = true});
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.value_or("");
  }

  absl::StatusOr<Layout> GetLayout(int node, const std::string& id) {
    return nodes_[node]->manager->GetLayout(id, arena_ids_[node]);
  }
  absl::Status CommitMetadata(int node, const std::string& id,
                              std::string bytes) {
    return nodes_[node]->manager->CommitMetadata(id, arena_ids_[node],
                                                 std::move(bytes));
  }

  // Every node ends `state` with `what` in its error.
  void ExpectAllFinal(const std::string& id, State state,
                      const std::string& what) {
    for (size_t n = 0; n < nodes_.size(); ++n) {
      if (!nodes_[n]->manager) continue;
      ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal(n, id));
      EXPECT_EQ(info.state, state) << "node " << n << ": " << info.error;
      EXPECT_THAT(std::string(info.error.message()), HasSubstr(what))
          << "node " << n;
    }
  }

  // A full external-metadata save that commits (the next one after a
  // failure must).
  void SaveAndCommit(const std::string& id, const Opts& opts) {
    SaveRanks(id, opts);
    ASSERT_OK_AND_ASSIGN(CheckpointInfo durable, WaitFinal(0, id, true));
    ASSERT_TRUE(durable.awaiting_metadata) << durable.error;
    ASSERT_OK_AND_ASSIGN(Layout layout, GetLayout(0, id));
    ASSERT_OK(CommitMetadata(0, id, Encode(DcpMetadata(layout))));
    ExpectAllFinal(id, State::kCommitted, "");
    ExpectCommitted(id);
  }

  absl::Duration commit_timeout_ = absl::Seconds(5);
  int mute_node_ = -1;
  Mute mute_ = Mute::kNever;
};

TEST_F(MultiNodeExternalTest, ThreeNodesCommitDcpsMetadataByteForByte) {
  StartNodes(3, 2);
  SaveRanks("job/s1", Opts{.external = true});
  // The coordinator's node says durable once every node is.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo durable, WaitFinal(0, "job/s1", true));
  ASSERT_TRUE(durable.awaiting_metadata) << durable.error;
  ASSERT_OK_AND_ASSIGN(Layout layout, GetLayout(0, "job/s1"));
  // Every node's items: 6 chunks of w, b once, 6 bytes items.
  ASSERT_EQ(layout.entries.size(), 13u);
  std::set<std::string> files;
  for (const LayoutEntry& e : layout.entries)
    files.insert(e.info.relative_path);
  EXPECT_EQ(files.size(), 6u);
  // The other nodes' daemons are not where DCP's .metadata goes.
  for (int n : {1, 2}) {
    absl::StatusOr<Layout> l = GetLayout(n, "job/s1");
    EXPECT_TRUE(absl::IsFailedPrecondition(l.status())) << l.status();
    EXPECT_THAT(std::string(l.status().message()),
                HasSubstr("goes to the daemon of rank 0's node"));
    absl::Status c = CommitMetadata(n, "job/s1", "x");
    EXPECT_TRUE(absl::IsFailedPrecondition(c)) << c;
    EXPECT_THAT(std::string(c.message()), HasSubstr(nodes_[0]->address));
  }
  const std::string bytes = Encode(DcpMetadata(layout));
  ASSERT_OK(CommitMetadata(0, "job/s1", bytes));
  // Handed over once: a second hand-over is refused.
  absl::Status again = CommitMetadata(0, "job/s1", bytes);
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  ExpectAllFinal("job/s1", State::kCommitted, "");
  EXPECT_EQ(ReadFile(dir_.Join("shared/job/s1/.metadata")), bytes);
  ExpectCommitted("job/s1");
  // And again (the plan cache; a new attempt on every node).
  SaveAndCommit("job/s2", Opts{.external = true});
}

TEST_F(MultiNodeExternalTest, ZstdAcrossNodesRecordsTheTransforms) {
  StartNodes(2, 2);
  // The coordinator's own .metadata.
  SaveRanks("job/z1", Opts{.external = false, .zstd_level = 3});
  ExpectAllFinal("job/z1", State::kCommitted, "");
  ExpectCommitted("job/z1");
  ASSERT_OK_AND_ASSIGN(
      auto reader, format::CheckpointReader::Open(dir_.Join("shared/job/z1")));
  ASSERT_EQ(reader->metadata().storage_data.size(), 9u);
  for (const auto& [key, info] : reader->metadata().storage_data) {
    EXPECT_EQ(info.transform_descriptors,
              std::vector<std::string>{std::string(format::kZstdDescriptor)})
        << key.fqn;
  }
  // DCP's .metadata with zstd: the global layout names the transforms, and
  // a .metadata that drops one is refused.
  SaveRanks("job/z2", Opts{.external = true, .zstd_level = 5});
  ASSERT_OK_AND_ASSIGN(CheckpointInfo durable, WaitFinal(0, "job/z2", true));
  ASSERT_TRUE(durable.awaiting_metadata) << durable.error;
  ASSERT_OK_AND_ASSIGN(Layout layout, GetLayout(0, "job/z2"));
  for (const LayoutEntry& e : layout.entries)
    EXPECT_EQ(e.info.transform_descriptors.size(), 1u) << e.key.fqn;
  ASSERT_OK(CommitMetadata(0, "job/z2", Encode(DcpMetadata(layout))));
  ExpectAllFinal("job/z2", State::kCommitted, "");
  ExpectCommitted("job/z2");
  SaveRanks("job/z3", Opts{.external = true, .zstd_level = 3});
  ASSERT_OK_AND_ASSIGN(durable, WaitFinal(0, "job/z3", true));
  ASSERT_TRUE(durable.awaiting_metadata) << durable.error;
  ASSERT_OK_AND_ASSIGN(layout, GetLayout(0, "job/z3"));
  format::Metadata md = DcpMetadata(layout);
  md.storage_data.back().second.transform_descriptors.clear();
  ASSERT_OK(CommitMetadata(0, "job/z3", Encode(md)));
  ExpectAllFinal("job/z3", State::kFailed,
                 "does not describe what was written");
  ExpectNoMetadata("job/z3");
}

TEST_F(MultiNodeExternalTest, WrongOrGarbageMetadataIsRefusedOnEveryNode) {
  StartNodes(3, 1);
  // storage_data that moves node 2's item: refused, nothing published.
  SaveRanks("job/bad", Opts{.external = true});
  ASSERT_OK_AND_ASSIGN(CheckpointInfo d1, WaitFinal(0, "job/bad", true));
  ASSERT_TRUE(d1.awaiting_metadata) << d1.error;
  ASSERT_OK_AND_ASSIGN(Layout layout, GetLayout(0, "job/bad"));
  format::Metadata md = DcpMetadata(layout);
  bool moved = false;
  for (auto& [key, info] : md.storage_data) {
    if (key.fqn == "meta.2") {
      info.offset += 1;
      moved = true;
    }
  }
  ASSERT_TRUE(moved);
  ASSERT_OK(CommitMetadata(0, "job/bad", Encode(md)));
  ExpectAllFinal("job/bad", State::kFailed,
                 "does not describe what was written: storage_data puts "
                 "meta.2 in __2_0.distcp at");
  ExpectNoMetadata("job/bad");
  // An item of node 1 missing from state_dict_metadata.
  SaveRanks("job/lacks", Opts{.external = true});
  ASSERT_OK_AND_ASSIGN(d1, WaitFinal(0, "job/lacks", true));
  ASSERT_TRUE(d1.awaiting_metadata) << d1.error;
  ASSERT_OK_AND_ASSIGN(layout, GetLayout(0, "job/lacks"));
  md = DcpMetadata(layout);
  std::erase_if(md.state_dict_metadata,
                [](const auto& e) { return e.first == "meta.1"; });
  ASSERT_OK(CommitMetadata(0, "job/lacks", Encode(md)));
  ExpectAllFinal("job/lacks", State::kFailed, "state_dict_metadata describes");
  ExpectNoMetadata("job/lacks");
  // Garbage: the restricted decoder refuses it.
  SaveRanks("job/garbage", Opts{.external = true});
  ASSERT_OK_AND_ASSIGN(d1, WaitFinal(0, "job/garbage", true));
  ASSERT_TRUE(d1.awaiting_metadata) << d1.error;
  ASSERT_OK(CommitMetadata(0, "job/garbage", "\x80\x02garbage"));
  ExpectAllFinal("job/garbage", State::kFailed,
                 "the .metadata handed to CommitMetadata cannot be decoded");
  ExpectNoMetadata("job/garbage");
  // The next checkpoint commits.
  SaveAndCommit("job/next", Opts{.external = true});
}

TEST_F(MultiNodeExternalTest, MetadataTimeoutAbortsEveryNode) {
  StartNodes(2, 1);
  const absl::Time start = absl::Now();
  SaveRanks("job/late", Opts{.external = true,
                             .metadata_timeout = absl::Milliseconds(400)});
  ASSERT_OK_AND_ASSIGN(CheckpointInfo d, WaitFinal(0, "job/late", true));
  EXPECT_TRUE(d.awaiting_metadata) << d.error;
  ExpectAllFinal("job/late", State::kFailed, "(metadata_timeout)");
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ExpectNoMetadata("job/late");
  // No data file of it stays behind.
  absl::SleepFor(absl::Milliseconds(300));
  auto names = Env::Default()->ListDir(dir_.Join("shared/job/late"));
  if (names.ok()) {
    for (const auto& n : *names) EXPECT_FALSE(n.ends_with(".distcp")) << n;
  }
  // A late hand-over is refused precisely.
  absl::Status late = CommitMetadata(0, "job/late", "x");
  EXPECT_TRUE(absl::IsFailedPrecondition(late)) << late;
  SaveAndCommit("job/next", Opts{.external = true});
}

TEST_F(MultiNodeExternalTest, MetadataAfterCommitTimeoutWithinMetadataTimeout) {
  // DCP's finish may come later than commit_timeout after the prepares:
  // the commit window is commit_timeout + metadata_timeout.
  commit_timeout_ = absl::Milliseconds(300);
  StartNodes(2, 1);
  SaveRanks("job/slow",
            Opts{.external = true, .metadata_timeout = absl::Seconds(20)});
  ASSERT_OK_AND_ASSIGN(CheckpointInfo d, WaitFinal(0, "job/slow", true));
  ASSERT_TRUE(d.awaiting_metadata) << d.error;
  absl::SleepFor(absl::Milliseconds(800));
  ASSERT_OK_AND_ASSIGN(Layout layout, GetLayout(0, "job/slow"));
  ASSERT_OK(CommitMetadata(0, "job/slow", Encode(DcpMetadata(layout))));
  ExpectAllFinal("job/slow", State::kCommitted, "");
  ExpectCommitted("job/slow");
}

TEST(ParticipantWindowTest, InDoubtWindowIncludesMetadataTimeout) {
  ParticipantState p;
  const absl::Time t0 = absl::UnixEpoch();
  p.prepare_sent = true;
  p.prepare_sent_at = p.last_contact = p.last_heartbeat = t0;
  p.heartbeat_in_flight = true;  // only kResolve may come
  ParticipantTimeouts t;
  t.peer_timeout = absl::Seconds(30);
  t.commit_timeout = absl::Seconds(300);
  EXPECT_EQ(NextHeartbeatStep(p, t0 + absl::Seconds(331), t),
            HeartbeatStep::kResolve);
  t.metadata_timeout = absl::Seconds(600);
  EXPECT_EQ(NextHeartbeatStep(p, t0 + absl::Seconds(331), t),
            HeartbeatStep::kNothing);
  EXPECT_EQ(NextHeartbeatStep(p, t0 + absl::Seconds(930), t),
            HeartbeatStep::kNothing);
  EXPECT_EQ(NextHeartbeatStep(p, t0 + absl::Seconds(931), t),
            HeartbeatStep::kResolve);
}

TEST_F(MultiNodeExternalTest, NodesThatDisagreeOnOptionsAreRefused) {
  StartNodes(2, 1);
  SaveRanks("job/ext", [](int node) { return Opts{.external = node == 0}; });
  ExpectAllFinal("job/ext", State::kFailed,
                 "disagrees with the other nodes of checkpoint");
  SaveRanks("job/zstd", [](int node) {
    return Opts{.external = true, .zstd_level = node == 0 ? 0 : 3};
  });
  ExpectAllFinal("job/zstd", State::kFailed, "compression (zstd level");
  SaveRanks("job/timeout", [](int node) {
    return Opts{.external = true,
                .metadata_timeout = absl::Seconds(node == 0 ? 20 : 30)};
  });
  ExpectAllFinal("job/timeout", State::kFailed, "metadata_timeout (");
  ExpectNoMetadata("job/ext");
  SaveAndCommit("job/next", Opts{.external = true});
}

TEST_F(MultiNodeExternalTest, ANodeSilentBeforeItPreparedIsNamed) {
  mute_node_ = 2;
  mute_ = Mute::kAfterPlan;
  StartNodes(3, 1);
  const absl::Time start = absl::Now();
  SaveRanks("job/silent", Opts{.external = true});
  // Rank 0's finish waits for durable data: it gets the abort naming the
  // node instead, after peer_timeout.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo d, WaitFinal(0, "job/silent", true));
  EXPECT_EQ(d.state, State::kFailed) << d.error;
  EXPECT_THAT(std::string(d.error.message()),
              HasSubstr(fmt::format("node 2 ({}) was not heard from",
                                    nodes_[2]->address)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo n1, WaitFinal(1, "job/silent"));
  EXPECT_EQ(n1.state, State::kFailed);
  EXPECT_THAT(std::string(n1.error.message()), HasSubstr("node 2"));
  ExpectNoMetadata("job/silent");
}

TEST_F(MultiNodeExternalTest, ANodeWhoseLayoutIsMissingAbortsEveryNode) {
  mute_node_ = 1;
  mute_ = Mute::kDropLayout;
  StartNodes(2, 1);
  SaveRanks("job/nolayout", Opts{.external = true});
  ASSERT_OK_AND_ASSIGN(CheckpointInfo d, WaitFinal(0, "job/nolayout", true));
  EXPECT_EQ(d.state, State::kFailed) << d.error;
  ExpectAllFinal(
      "job/nolayout", State::kFailed,
      fmt::format("node 1 ({}) prepared checkpoint", nodes_[1]->address));
  ExpectAllFinal("job/nolayout", State::kFailed,
                 "with storage that does not match its plan");
  ExpectNoMetadata("job/nolayout");
}

TEST_F(MultiNodeExternalTest, ANodeGoneAfterItPreparedStillCommits) {
  mute_node_ = 2;
  mute_ = Mute::kAfterPrepare;
  StartNodes(3, 1);
  SaveRanks("job/gone", Opts{.external = true});
  ASSERT_OK_AND_ASSIGN(CheckpointInfo d, WaitFinal(0, "job/gone", true));
  ASSERT_TRUE(d.awaiting_metadata) << d.error;
  // Node 2's daemon goes away between its prepare and the hand-over: its
  // files are durable and stay (its restart settles them from .metadata).
  StopNode(2);
  ASSERT_OK_AND_ASSIGN(Layout layout, GetLayout(0, "job/gone"));
  ASSERT_OK(CommitMetadata(0, "job/gone", Encode(DcpMetadata(layout))));
  ExpectAllFinal("job/gone", State::kCommitted, "");
  ExpectCommitted("job/gone");
}

TEST_F(MultiNodeExternalTest,
       MalformedOptionsAndTransformsAreRefusedPrecisely) {
  StartNodes(2, 1);
  namespace pb = ::ckptd::v1;
  auto stub = pb::PeerDaemon::NewStub(grpc::CreateChannel(
      nodes_[0]->address, grpc::InsecureChannelCredentials()));
  auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    ctx.AddMetadata("authorization",
                    std::string("Bearer ") + ::ckptd::testing::kMultiNodeToken);
    return ((*stub).*method)(&ctx, req, resp);
  };
  pb::PlanRequest plan;
  plan.mutable_call()->set_checkpoint_id("job/bad");
  plan.mutable_call()->set_node(1);
  plan.set_world_size(2);
  plan.set_num_nodes(2);
  plan.add_ranks(1);
  plan.mutable_options()->set_compression("lz4");
  pb::PlanResponse pr;
  grpc::Status st = call(&pb::PeerDaemon::Stub::Plan, plan, &pr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("compression 'lz4'"));
  pb::PrepareRequest prep;
  prep.mutable_call()->set_checkpoint_id("job/bad");
  pb::RankStorage* rs = prep.add_ranks();
  rs->set_rank(1);
  rs->add_offset(0);
  rs->add_length(8);
  rs->add_transforms()->add_descriptors("stream.evil/1");
  pb::PrepareResponse pres;
  st = call(&pb::PeerDaemon::Stub::Prepare, prep, &pres);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("stream.evil/1"));
  rs->mutable_transforms(0)->set_descriptors(0, "stream.zstd/1");
  rs->add_transforms();  // two lists for one item
  st = call(&pb::PeerDaemon::Stub::Prepare, prep, &pres);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("2 transform lists for 1"));
  // Nothing changed: a save commits.
  SaveAndCommit("job/after", Opts{.external = true});
}

}  // namespace
}  // namespace ckptd::daemon
