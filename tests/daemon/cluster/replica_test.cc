// Copyright 2026 The ckptd Authors.
//
// Peer replicas (cluster/shares.h, docs/restore.md "Peer replicas") with N
// daemons in one process (tests/testing/multinode_fixture.h: real gRPC on
// 127.0.0.1:0 with the token): placement around the ring and across
// failure domains, a newer checkpoint's replica replacing the older one,
// a replaced node restoring its lost share from a peer's memory through
// the restore path's CheckpointCache (and the clear error once no holder
// is left), a holder that fails handing over to storage, and what the
// holding side refuses (unknown checkpoint, a node not of it, a damaged
// chunk, chunks out of order, a missing token). Whole daemons in network
// namespaces: tests/netns/test_replicas_netns.py.

#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/crc32.h"
#include "common/env.h"
#include "daemon/cluster/peer_service.h"
#include "daemon/cluster/placement.h"
#include "daemon/cluster/shares.h"
#include "daemon/restore/checkpoint_cache.h"
#include "daemon/restore/peer_env.h"
#include "daemon/save/checkpoint_manager.h"
#include "daemon/tier/memory_tier.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/multinode_fixture.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr const char* kToken = ::ckptd::testing::kMultiNodeToken;

TEST(PlacementTest, RingSkipsSelfAndItsFailureDomain) {
  std::vector<ClusterNode> nodes = {
      {4, "d", ""}, {0, "a", ""}, {2, "b", ""}, {3, "c", ""}};
  auto ids = [](const std::vector<ClusterNode>& v) {
    std::vector<int> out;
    for (const ClusterNode& n : v) out.push_back(n.node);
    return out;
  };
  EXPECT_THAT(ids(ReplicaHolders(nodes, 0, 1)), ElementsAre(2));
  EXPECT_THAT(ids(ReplicaHolders(nodes, 4, 2)), ElementsAre(0, 2));
  EXPECT_THAT(ids(ReplicaHolders(nodes, 3, 5)), ElementsAre(4, 0, 2));
  EXPECT_TRUE(ReplicaHolders(nodes, 7, 1).empty());  // not a node of it
  EXPECT_TRUE(ReplicaHolders(nodes, 0, 0).empty());
  EXPECT_THAT(ids(ReplicaSources(nodes, 0, 1)), ElementsAre(4));
  EXPECT_THAT(ids(ReplicaSources(nodes, 0, 2)), ElementsAre(3, 4));
  // Racks: 0 and 2 share one, 3 and 4 another.
  nodes = {{0, "a", "r1"}, {2, "b", "r1"}, {3, "c", "r2"}, {4, "d", "r2"}};
  EXPECT_THAT(ids(ReplicaHolders(nodes, 0, 1)), ElementsAre(3));
  EXPECT_THAT(ids(ReplicaHolders(nodes, 2, 2)), ElementsAre(3, 4));
  EXPECT_THAT(ids(ReplicaHolders(nodes, 4, 1)), ElementsAre(0));
  // One rack: nowhere to go.
  nodes = {{0, "a", "r1"}, {1, "b", "r1"}};
  EXPECT_TRUE(ReplicaHolders(nodes, 0, 1).empty());
}

class ReplicaTest : public ::ckptd::testing::MultiNodeFixture {
 protected:
  void Configure(int n, DaemonOptions& o, PeerServerOptions& po,
                 PeerClientOptions& pc) override {
    o.memory_tier_bytes = budget_;
    o.peer_replicas = replicas_;
    o.peer_listen = "127.0.0.1:0";  // (the fixture starts the server)
    o.peer_token_file = dir_.Join("token");
    if (n < static_cast<int>(domains_.size())) o.failure_domain = domains_[n];
    client_ = pc;
  }

  // Node `holder` holds a replica of node `of`'s share of `id` within 10 s.
  bool HeldSoon(int holder, int of, const std::string& id) {
    const std::string dir = dir_.Join("shared/" + id);
    for (int i = 0; i < 1000; ++i) {
      for (const TierHeld& h : nodes_[holder]->manager->memory_tier()->List()) {
        if (h.dir == dir && h.replica_node == of) return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }
  // The nodes whose shares node `holder` holds, of any checkpoint.
  std::vector<int> SourcesAt(int holder) {
    std::vector<int> out;
    for (const TierHeld& h : nodes_[holder]->manager->memory_tier()->List()) {
      if (!h.replica_of.empty()) out.push_back(h.replica_node);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  // A daemon on a replaced node: an empty memory tier, no commits, the
  // other daemons named by restore_peers.
  std::unique_ptr<Shares> Replacement(std::vector<std::string> peers) {
    fresh_tier_ = std::make_unique<MemoryTier>(MemoryTierOptions{});
    return std::make_unique<Shares>(
        SharesOptions{.restore_peers = std::move(peers),
                      .call_deadline = absl::Seconds(10),
                      .locate_deadline = absl::Seconds(2),
                      .tier = fresh_tier_.get(),
                      .links = MakeShareLinkFactory(client_)});
  }

  static absl::StatusOr<std::shared_ptr<const CachedCheckpoint>> Decode(
      CheckpointCache& cache, const std::string& dir) {
    absl::StatusOr<std::shared_ptr<const CachedCheckpoint>> out =
        absl::UnknownError("not answered");
    cache.Get(dir, [&](auto r) { out = std::move(r); });
    return out;
  }

  // Every value of "w" and "b" read through `ckpt`.
  absl::Status ReadAll(const CachedCheckpoint& ckpt) {
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
    if (absl::Status s = ckpt.reader->ReadTensors({rw, rb}); !s.ok()) return s;
    for (int64_t i = 0; i < rows * kCols; ++i) {
      if (w[i] != Value(i, 1))
        return absl::InternalError(fmt::format("w[{}] differs", i));
    }
    for (int i = 0; i < 16; ++i) {
      if (b[i] != Value(i, 2)) return absl::InternalError("b differs");
    }
    return absl::OkStatus();
  }

  // Saves `id` on every node and waits until each share is held by the
  // next node around the ring.
  void SaveAndReplicate(const std::string& id) {
    for (const auto& info : SaveAll(id)) {
      ASSERT_OK(info.status());
      ASSERT_EQ(info->state, State::kCommitted);
    }
    const int n = static_cast<int>(nodes_.size());
    for (int k = 0; k < n; ++k) ASSERT_TRUE(HeldSoon((k + 1) % n, k, id)) << k;
  }

  int replicas_ = 1;
  uint64_t budget_ = 64 << 20;
  std::vector<std::string> domains_;
  PeerClientOptions client_;
  std::unique_ptr<MemoryTier> fresh_tier_;
};

TEST_F(ReplicaTest, EachShareIsHeldByTheNextNodeAroundTheRing) {
  StartNodes(3, 1);
  SaveAndReplicate("job/ck1");
  for (int k = 0; k < 3; ++k) {
    EXPECT_THAT(SourcesAt((k + 1) % 3), ElementsAre(k));
    // The sender learns it from the answer to its last chunk, after the
    // holder held it.
    const std::string want = fmt::format("node {} ({}) held", (k + 1) % 3,
                                         nodes_[(k + 1) % 3]->address);
    std::vector<std::string> holders;
    for (int i = 0; i < 1000; ++i) {
      holders =
          nodes_[k]->manager->shares()->HoldersOf(dir_.Join("shared/job/ck1"));
      if (holders.size() == 1 && holders[0] == want) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_THAT(holders, ElementsAre(want));
  }
  // The replica is the share as written: each byte and the tier's size.
  for (int k = 0; k < 3; ++k) {
    const std::string dir = dir_.Join("shared/job/ck1");
    ASSERT_OK_AND_ASSIGN(std::string md_id,
                         StatIdentity(dir + "/.metadata", false));
    auto shares = nodes_[(k + 1) % 3]->manager->memory_tier()->FindShares(
        dir, PortableIdentity(md_id));
    bool found = false;
    for (const auto& h : shares) {
      if (h->replica_node != k) continue;
      found = true;
      const std::string name = fmt::format("__{}_0.distcp", k);
      ASSERT_TRUE(h->files.contains(name));
      ASSERT_OK_AND_ASSIGN(
          std::string disk,
          ReadFileToString(Env::Default(), dir + "/" + name, 64 << 20));
      const TierFileBytes& f = *h->files.at(name);
      std::string mem(f.size, '\0');
      ASSERT_OK(f.CopyOut(0, f.size, mem.data()));
      EXPECT_EQ(mem, disk);
    }
    EXPECT_TRUE(found) << k;
  }
}

TEST_F(ReplicaTest, FailureDomainsAreSkippedAndANewerCheckpointReplacesIt) {
  domains_ = {"rack-a", "rack-a", "rack-b"};
  StartNodes(3, 1);
  for (const auto& info : SaveAll("job/ck1")) ASSERT_OK(info.status());
  ASSERT_TRUE(HeldSoon(2, 0, "job/ck1"));  // not node 1: the same rack
  ASSERT_TRUE(HeldSoon(2, 1, "job/ck1"));
  ASSERT_TRUE(HeldSoon(0, 2, "job/ck1"));
  EXPECT_TRUE(SourcesAt(1).empty());
  for (const auto& info : SaveAll("job/ck2")) ASSERT_OK(info.status());
  ASSERT_TRUE(HeldSoon(2, 0, "job/ck2"));
  ASSERT_TRUE(HeldSoon(2, 1, "job/ck2"));
  ASSERT_TRUE(HeldSoon(0, 2, "job/ck2"));
  // One replica per node's share of the job: ck1's went.
  EXPECT_THAT(SourcesAt(2), ElementsAre(0, 1));
  EXPECT_THAT(SourcesAt(0), ElementsAre(2));
}

TEST_F(ReplicaTest, AReplacedNodeRestoresItsLostShareFromAPeer) {
  StartNodes(3, 1);
  SaveAndReplicate("job/ck1");
  const std::string dir = dir_.Join("shared/job/ck1");
  // Node 1 is lost with its local copy of its file: only node 2's memory
  // has it.
  ASSERT_EQ(::unlink((dir + "/__1_0.distcp").c_str()), 0);
  StopNode(1);
  std::unique_ptr<Shares> fresh =
      Replacement({nodes_[0]->address, nodes_[2]->address});
  {
    CheckpointCache cache({.peers = fresh.get()});
    ASSERT_OK_AND_ASSIGN(auto ckpt, Decode(cache, dir));
    EXPECT_EQ(ckpt->peer_files, 3u);  // node 0's and 2's own, node 1's replica
    ASSERT_OK(ReadAll(*ckpt));
    EXPECT_GT(ckpt->peer_bytes.load(), 0u);
  }
  {
    // peer_restore=missing: only the lost file comes from a peer.
    CheckpointCache cache({.peers = fresh.get(), .peers_only_missing = true});
    ASSERT_OK_AND_ASSIGN(auto ckpt, Decode(cache, dir));
    ASSERT_OK(ReadAll(*ckpt));
    ASSERT_OK_AND_ASSIGN(uint64_t size,
                         Env::Default()->GetFileSize(dir + "/__0_0.distcp"));
    EXPECT_GT(ckpt->peer_bytes.load(), 0u);
    EXPECT_LT(ckpt->peer_bytes.load(), 2 * size);
  }
  // The holder lost too (k + 1 nodes): a clear error naming the file.
  StopNode(2);
  {
    CheckpointCache cache({.peers = fresh.get()});
    absl::StatusOr<std::shared_ptr<const CachedCheckpoint>> ckpt =
        Decode(cache, dir);
    absl::Status s = ckpt.ok() ? ReadAll(**ckpt) : ckpt.status();
    EXPECT_TRUE(absl::IsDataLoss(s) || absl::IsNotFound(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr("__1_0.distcp"));
  }
  // What node 0 still has is unharmed: its own files read from storage and
  // from its memory.
  ASSERT_EQ(nodes_[0]->manager->memory_tier()->List().size(), 2u);
}

// A holder whose answers fail (as a damaged piece does: DATA_LOSS) hands
// the file over to storage; the bytes read are right.
class FailingSource : public ShareSource {
 public:
  explicit FailingSource(ShareSource* inner) : inner_(inner) {}
  std::vector<PeerHeldFile> Locate(const std::string& dir,
                                   const std::string& md) override {
    return inner_->Locate(dir, md);
  }
  absl::Status Fetch(const std::string& holder, const std::string&,
                     const std::string&, const std::string& file, uint64_t,
                     uint64_t, char*) override {
    ++calls;
    return absl::DataLossError(
        fmt::format("FetchShare from {}: {} arrived damaged", holder, file));
  }
  ShareSource* const inner_;
  std::atomic<int> calls{0};
};

TEST_F(ReplicaTest, AFailingHolderHandsTheFileOverToStorage) {
  StartNodes(2, 1);
  for (const auto& info : SaveAll("job/ck1")) ASSERT_OK(info.status());
  ASSERT_TRUE(HeldSoon(1, 0, "job/ck1"));
  ASSERT_TRUE(HeldSoon(0, 1, "job/ck1"));
  std::unique_ptr<Shares> fresh =
      Replacement({nodes_[0]->address, nodes_[1]->address});
  FailingSource failing(fresh.get());
  CheckpointCache cache({.peers = &failing});
  ASSERT_OK_AND_ASSIGN(auto ckpt, Decode(cache, dir_.Join("shared/job/ck1")));
  ASSERT_OK(ReadAll(*ckpt));
  EXPECT_GT(failing.calls.load(), 0);
  EXPECT_EQ(ckpt->peer_bytes.load(), 0u);
}

TEST_F(ReplicaTest, TheHoldingSideRefusesWhatItShouldNotTake) {
  StartNodes(2, 1);
  for (const auto& info : SaveAll("job/ck1")) ASSERT_OK(info.status());
  ASSERT_TRUE(HeldSoon(1, 0, "job/ck1"));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<ShareLink> link,
                       MakeShareLinkFactory(client_)(nodes_[1]->address));
  ShareChunk c;
  c.id = {"job/ck1", dir_.Join("shared/job"), 0, 1, nodes_[0]->address};
  c.num_files = 1;
  c.file = "__0_0.distcp";
  c.file_size = 8;
  c.data = "12345678";
  c.crc32 = Crc32(0, c.data.data(), c.data.size());
  c.file_crc32 = c.crc32;
  const absl::Duration d = absl::Seconds(5);
  // Which job's checkpoint? The id as the trainers gave it, and its job.
  {
    ShareChunk x = c;
    x.id.checkpoint_id = "job/ck9";
    absl::StatusOr<bool> r = link->Push(x, d);
    EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("not committed on this node"));
  }
  {
    ShareChunk x = c;
    x.id.node = 5;  // not a node of it
    absl::StatusOr<bool> r = link->Push(x, d);
    EXPECT_TRUE(absl::IsPermissionDenied(r.status())) << r.status();
    x = c;
    x.id.node = 1;  // the holder itself
    x.id.node_name = nodes_[1]->address;
    EXPECT_TRUE(absl::IsPermissionDenied(link->Push(x, d).status()));
  }
  {
    ShareChunk x = c;
    x.data[0] ^= 1;  // damaged on the way
    absl::StatusOr<bool> r = link->Push(x, d);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  }
  {
    ShareChunk x = c;
    x.offset = 4;  // not where the share starts
    x.data = "5678";
    x.crc32 = Crc32(0, x.data.data(), x.data.size());
    absl::StatusOr<bool> r = link->Push(x, d);
    EXPECT_TRUE(absl::IsFailedPrecondition(r.status())) << r.status();
    x.file = "../escape";
    EXPECT_TRUE(absl::IsInvalidArgument(link->Push(x, d).status()));
  }
  {
    // A whole file whose CRC is not the sender's: not held.
    ShareChunk x = c;
    x.file_crc32 ^= 1;
    absl::StatusOr<bool> r = link->Push(x, d);
    EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  }
  {
    PeerClientOptions bad = client_;
    bad.token = "not-the-token-0123456789";
    ASSERT_OK_AND_ASSIGN(auto l, MakeShareLinkFactory(bad)(nodes_[1]->address));
    EXPECT_TRUE(absl::IsUnauthenticated(l->Push(c, d).status()));
    EXPECT_TRUE(absl::IsUnauthenticated(
        l->List(dir_.Join("shared/job/ck1"), "x", d).status()));
  }
  // FetchShare: nothing held under another identity; at most 4 MiB a call.
  std::string buf(16, '\0');
  absl::Status s = link->Fetch(dir_.Join("shared/job/ck1"), "1:2",
                               "__0_0.distcp", 0, 16, buf.data(), d);
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  // A short range (a record's header: a few bytes) and a long one come
  // back as on disk.
  {
    const std::string dir = dir_.Join("shared/job/ck1");
    ASSERT_OK_AND_ASSIGN(std::string md,
                         StatIdentity(dir + "/.metadata", false));
    ASSERT_OK_AND_ASSIGN(
        std::string disk,
        ReadFileToString(Env::Default(), dir + "/__1_0.distcp", 1 << 20));
    for (uint64_t n : {uint64_t{8}, uint64_t{12}, uint64_t{disk.size() - 3}}) {
      std::string got(n, '\0');
      ASSERT_OK(link->Fetch(dir, PortableIdentity(md), "__1_0.distcp", 3, n,
                            got.data(), d));
      EXPECT_EQ(got, disk.substr(3, n)) << n;
    }
  }
  // The real replica is still held, and still the only one from node 0.
  EXPECT_THAT(SourcesAt(1), ElementsAre(0));
  (void)kToken;
}

}  // namespace
}  // namespace ckptd::daemon
