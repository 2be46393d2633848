// Copyright 2026 The ckptd Authors.
//
// Every timeout of the daemon's control paths on a SimulatedClock
// (common/clock.h): the test advances the clock and runs one timer pass
// (TickForTest) instead of sleeping — stage_timeout, batch_gap_timeout,
// Wait deadlines and idle arenas in the orchestrator; stage_timeout,
// peer_timeout and commit_timeout in the coordinator; the write rate
// limiter's pauses.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "common/rate_limiter.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/save/checkpoint_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "tests/testing/manager_util.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;

TEST(ClockTest, SimulatedSleepsAdvanceTheClockExactly) {
  SimulatedClock clock;
  const absl::Time t0 = clock.Now();
  clock.SleepFor(absl::Seconds(3));
  clock.Advance(absl::Milliseconds(5));
  clock.SleepFor(-absl::Seconds(1));  // nothing
  EXPECT_EQ(clock.Now() - t0, absl::Milliseconds(3005));
  EXPECT_EQ(clock.slept(), absl::Seconds(3));
  EXPECT_NE(Clock::Real(), nullptr);
}

TEST(RateLimiterTest, PausesAreExactOnASimulatedClock) {
  SimulatedClock clock;
  RateLimiter limiter(/*bytes_per_second=*/1 << 20, &clock);
  std::atomic<bool> aborted{false};
  const absl::Time t0 = clock.Now();
  for (int i = 0; i < 8; ++i) limiter.Acquire(256 << 10, aborted);  // 2 MiB
  // The first piece starts at once; each later one waits for the previous.
  EXPECT_EQ(clock.Now() - t0, absl::Milliseconds(1750));
  RateLimiter unlimited(0, &clock);
  const absl::Time t1 = clock.Now();
  unlimited.Acquire(1 << 30, aborted);
  EXPECT_EQ(clock.Now(), t1);
  // An abort ends a pause early.
  aborted = true;
  const absl::Time t2 = clock.Now();
  limiter.Acquire(64 << 20, aborted);
  limiter.Acquire(64 << 20, aborted);
  EXPECT_LT(clock.Now() - t2, absl::Seconds(1));
}

class ManagerTimeoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_roots = {dir_.Join("ck")};
    options_.shm_dir = dir_.Join("shm");
    options_.state_dir = dir_.Join("state");
    options_.staging_budget = 16 << 20;
    options_.env = Env::Default();
    options_.clock = &clock_;
    options_.cuda = "off";
    ASSERT_OK(FinalizeOptions(&options_));
    ASSERT_OK_AND_ASSIGN(manager_, CheckpointManager::Create(options_));
  }

  // Rank `rank` of `world` saving 64 bytes ("w", float32 [16 * world]).
  SaveBatch Batch(const std::string& id, int rank, int world) {
    auto arena = shm::Arena::Create(options_.shm_dir, 64, "t");
    EXPECT_TRUE(arena.ok()) << arena.status();
    std::memset((*arena)->data(), 1, 64);
    SaveBatch b;
    b.checkpoint_id = id;
    b.rank = rank;
    b.world_size = world;
    format::ItemDesc w;
    w.fqn = "w";
    w.global_shape = {16 * world};
    w.chunk_offsets = {16 * rank};
    w.chunk_sizes = {16};
    b.items = {w};
    b.item_nbytes = {64};
    absl::StatusOr<uint64_t> arena_id =
        manager_->RegisterArena((*arena)->name(), (*arena)->size(), "t");
    EXPECT_TRUE(arena_id.ok()) << arena_id.status();
    b.arena_id = arena_id.value_or(0);
    b.extents = {{0, 0, 0, 64}};
    b.last = true;
    arenas_.push_back(*std::move(arena));
    return b;
  }

  absl::StatusOr<CheckpointInfo> Status(const std::string& id) {
    return manager_->GetStatus(dir_.Join("ck/" + id));
  }

  TempDir dir_;
  SimulatedClock clock_;
  DaemonOptions options_;
  std::vector<std::unique_ptr<shm::Arena>> arenas_;
  std::unique_ptr<CheckpointManager> manager_;
};

TEST_F(ManagerTimeoutTest, ARankThatNeverComesFailsAtStageTimeout) {
  ASSERT_OK(testing::SaveSync(*manager_, Batch("job/s1", 0, 2)).status());
  clock_.Advance(options_.stage_timeout - absl::Seconds(1));
  manager_->TickForTest(clock_.Now());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo before, Status("job/s1"));
  EXPECT_FALSE(IsFinal(before.state));
  clock_.Advance(absl::Seconds(2));
  manager_->TickForTest(clock_.Now());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo after, Status("job/s1"));
  EXPECT_EQ(after.state, State::kFailed);
  EXPECT_EQ(after.error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(
      after.error.message(),
      HasSubstr("ranks [1] of 2 made no progress for 2m (stage_timeout)"));
  // Rank 1 never sent anything: perhaps it is on another node.
  EXPECT_THAT(after.error.message(),
              HasSubstr("ranks [1] never reached this daemon: if they run on "
                        "other nodes (another daemon), the save needs a "
                        "cluster (ckptd.discover_cluster()"));
}

TEST_F(ManagerTimeoutTest, ASilentClientBetweenBatchesFailsAtBatchGapTimeout) {
  // Rank 0 streams: its first batch (half of "w") is answered, the second
  // never comes.
  SaveBatch first = Batch("job/s2", 0, 1);
  first.extents = {{0, 0, 0, 32}};
  first.last = false;
  ASSERT_OK(testing::SaveSync(*manager_, first).status());
  clock_.Advance(options_.batch_gap_timeout + absl::Seconds(1));
  manager_->TickForTest(clock_.Now());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, Status("job/s2"));
  EXPECT_EQ(info.state, State::kFailed);
  EXPECT_THAT(info.error.message(), HasSubstr("sent no next batch for 15s"));
}

TEST_F(ManagerTimeoutTest, WaitAndArenaIdleDeadlinesAndIdleArenas) {
  ASSERT_OK(testing::SaveSync(*manager_, Batch("job/s3", 0, 2)).status());
  absl::Notification waited;
  absl::StatusOr<CheckpointInfo> wait_result;
  manager_->Wait(dir_.Join("ck/job/s3"), clock_.Now() + absl::Seconds(10),
                 [&](absl::StatusOr<CheckpointInfo> r) {
                   wait_result = std::move(r);
                   waited.Notify();
                 });
  manager_->TickForTest(clock_.Now() + absl::Seconds(9));
  EXPECT_FALSE(waited.HasBeenNotified());
  manager_->TickForTest(clock_.Now() + absl::Seconds(11));
  ASSERT_TRUE(waited.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(wait_result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(wait_result.status().message(),
              HasSubstr("did not finish in time"));
  // Arenas nobody used for arena_idle_timeout are unmapped.
  ASSERT_OK(manager_->Cancel(dir_.Join("ck/job/s3"), "test").status());
  const int before = manager_->arenas_registered();
  EXPECT_EQ(before, 1);
  clock_.Advance(options_.arena_idle_timeout + absl::Seconds(1));
  manager_->TickForTest(clock_.Now());
  EXPECT_EQ(manager_->arenas_registered(), 0);
}

class CoordinatorTimeoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorOptions o;
    o.env = Env::Default();
    o.checkpoint_roots = {dir_.Join("ck")};
    o.clock = &clock_;
    o.stage_timeout = absl::Seconds(120);
    o.peer_timeout = absl::Seconds(30);
    o.commit_timeout = absl::Seconds(300);
    ASSERT_OK(CreateDirsDurably(Env::Default(), dir_.Join("ck")));
    ASSERT_OK_AND_ASSIGN(coordinator_, Coordinator::Create(o));
  }

  // Node `node` (rank == node) of 2 sends its index for `id`; its plan
  // answer lands in `*answer` / `*planned`.
  void SendIndex(const std::string& id, int node, absl::Notification* planned,
                 absl::StatusOr<NodePlan>* answer) {
    auto index = std::make_shared<NodeIndex>();
    index->ranks = {node};
    format::ItemDesc w;
    w.fqn = "w";
    w.global_shape = {8};
    w.chunk_offsets = {4 * node};
    w.chunk_sizes = {4};
    index->items = {{w}};
    index->nbytes = {{16}};
    PlanCall call;
    call.id = {id, "job", node, 100u + node, "node" + std::to_string(node)};
    call.world_size = 2;
    call.num_nodes = 2;
    call.index_digest = IndexDigest(*index);
    call.started = clock_.Now();
    call.ranks = {node};
    call.item_counts = {1};
    call.index = index;
    coordinator_->Plan(std::move(call),
                       [planned, answer](absl::StatusOr<NodePlan> p) {
                         *answer = std::move(p);
                         planned->Notify();
                       });
  }

  TempDir dir_;
  SimulatedClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTimeoutTest, AMissingNodeFailsTheRoundAtStageTimeout) {
  const std::string id = dir_.Join("ck/job/g1");
  absl::Notification planned;
  absl::StatusOr<NodePlan> answer;
  SendIndex(id, 0, &planned, &answer);
  // Node 0 beats while it waits for its plan (so peer_timeout never fires).
  for (int t = 0; t < 6; ++t) {
    clock_.Advance(absl::Seconds(t < 5 ? 20 : 19));  // 119 s in all
    absl::Notification beat;
    coordinator_->Heartbeat(
        {id, "job", 0, 100, "node0"}, {},
        [&](absl::StatusOr<GlobalStatus>) { beat.Notify(); });
    ASSERT_TRUE(beat.WaitForNotificationWithTimeout(absl::Seconds(30)));
    coordinator_->TickForTest(clock_.Now());
  }
  EXPECT_FALSE(planned.HasBeenNotified());
  clock_.Advance(absl::Seconds(2));
  coordinator_->TickForTest(clock_.Now());
  ASSERT_TRUE(planned.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(
      answer.status().message(),
      HasSubstr(
          "1 of 2 nodes sent their index within stage_timeout 2m; ranks [1]"));
}

TEST_F(CoordinatorTimeoutTest, ASilentNodeFailsItAtPeerTimeout) {
  const std::string id = dir_.Join("ck/job/g2");
  absl::Notification p0, p1;
  absl::StatusOr<NodePlan> a0, a1;
  SendIndex(id, 0, &p0, &a0);
  SendIndex(id, 1, &p1, &a1);
  ASSERT_TRUE(p0.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(p1.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_OK(a0.status());
  // Node 1 keeps beating, node 0 goes silent.
  clock_.Advance(absl::Seconds(20));
  absl::Notification beat;
  coordinator_->Heartbeat({id, "job", 1, 101, "node1"}, {},
                          [&](absl::StatusOr<GlobalStatus>) { beat.Notify(); });
  ASSERT_TRUE(beat.WaitForNotificationWithTimeout(absl::Seconds(30)));
  clock_.Advance(absl::Seconds(11));  // node 0 silent 31 s, node 1 11 s
  coordinator_->TickForTest(clock_.Now());
  ASSERT_OK_AND_ASSIGN(GlobalStatus g, coordinator_->Status(id));
  EXPECT_EQ(g.state, State::kFailed);
  EXPECT_THAT(
      g.error.message(),
      HasSubstr("node 0 (node0) was not heard from for 31s (peer_timeout)"));
}

TEST_F(CoordinatorTimeoutTest, ANodeThatNeverPreparesFailsAtCommitTimeout) {
  const std::string id = dir_.Join("ck/job/g3");
  absl::Notification p0, p1;
  absl::StatusOr<NodePlan> a0, a1;
  SendIndex(id, 0, &p0, &a0);
  SendIndex(id, 1, &p1, &a1);
  ASSERT_TRUE(p0.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_TRUE(p1.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // Node 0 prepares (its data is durable); node 1 keeps beating but never
  // prepares.
  PrepareCall prep;
  prep.id = {id, "job", 0, 100, "node0"};
  prep.ranks = {{0, {0}, {100}}};
  absl::Notification decided;
  absl::StatusOr<GlobalStatus> decision;
  coordinator_->Prepare(prep, [&](absl::StatusOr<GlobalStatus> g) {
    decision = std::move(g);
    decided.Notify();
  });
  for (int t = 0; t < 11; ++t) {
    clock_.Advance(absl::Seconds(28));
    absl::Notification beat;
    coordinator_->Heartbeat(
        {id, "job", 1, 101, "node1"}, {},
        [&](absl::StatusOr<GlobalStatus>) { beat.Notify(); });
    ASSERT_TRUE(beat.WaitForNotificationWithTimeout(absl::Seconds(30)));
    coordinator_->TickForTest(clock_.Now());
  }
  ASSERT_TRUE(decided.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(decision.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(
      decision.status().message(),
      HasSubstr(
          "nodes [1] were not durable within commit_timeout 5m of node 0's"));
}

}  // namespace
}  // namespace ckptd::daemon
