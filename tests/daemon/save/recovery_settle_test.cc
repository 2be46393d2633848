// Copyright 2026 The ckptd Authors.
//
// Start-up recovery of a node's share of a multi-node checkpoint without
// .metadata (daemon/commit/recovery.h): the daemon stopped after its
// prepare, and its coordinator may still rename .metadata in. Recovery
// leaves the node's files alone until the entry's settle_ms has passed
// (simulated clock), holds the directory against new attempts meanwhile,
// and then lets .metadata decide: kept and recorded when it appeared, the
// node's files removed when it did not. Before, recovery removed them at
// once, and a coordinator committing at that moment published a
// .metadata whose files were gone until its second check took it back.

#include <cstring>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/env.h"
#include "daemon/commit/state_record.h"
#include "daemon/save/checkpoint_manager.h"
#include "format/pickle/py_value.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "tests/testing/manager_util.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;

class RecoverySettleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_roots = {dir_.Join("ck")};
    options_.shm_dir = dir_.Join("shm");
    options_.state_dir = dir_.Join("state");
    options_.staging_budget = 16 << 20;
    options_.clock = &clock_;
    options_.env = Env::Default();
    ASSERT_OK(FinalizeOptions(&options_));
    ck_ = dir_.Join("ck/job/step-7");
    ASSERT_OK(Env::Default()->CreateDirs(ck_));
    ASSERT_OK(Env::Default()->CreateDirs(dir_.Join("state/journal")));
  }

  // What a node of ranks [2, 3] leaves when it stops after its prepare:
  // its data files and its journal entry.
  void LeaveANodesShare(int64_t settle_ms) {
    for (const char* f : {"__2_0.distcp", "__3_0.distcp"})
      ASSERT_OK(WriteFileAtomic(Env::Default(), JoinPath(ck_, f), "data"));
    // Another node's file: never this node's to remove.
    ASSERT_OK(
        WriteFileAtomic(Env::Default(), JoinPath(ck_, "__0_0.distcp"), "x"));
    CommitRecord rec;
    rec.dir = ck_;
    rec.job = "job";
    rec.uid = 0;
    rec.ranks = std::vector<int>{2, 3};
    rec.started_ms = absl::ToUnixMillis(clock_.Now());
    rec.settle_ms = settle_ms;
    ASSERT_OK(WriteFileAtomic(Env::Default(), journal_, EncodeJournal(rec)));
  }

  bool Exists(const std::string& path) {
    return Env::Default()->FileExists(path).ok();
  }
  // Waits (up to 10 s) for the deferred decision's task on the pool.
  bool JournalEmptySoon() {
    for (int i = 0; i < 1000 && Exists(journal_); ++i)
      absl::SleepFor(absl::Milliseconds(10));
    return !Exists(journal_);
  }

  TempDir dir_;
  SimulatedClock clock_;
  DaemonOptions options_;
  std::string ck_;
  const std::string journal_ = dir_.Join("state/journal/1-1-1.journal");
};

TEST_F(RecoverySettleTest, NoMetadataByTheEndOfTheWindowRemovesOnlyTheNodes) {
  LeaveANodesShare(/*settle_ms=*/60'000);
  ASSERT_OK_AND_ASSIGN(auto manager, CheckpointManager::Create(options_));
  ASSERT_EQ(manager->recovery().deferred.size(), 1u);
  EXPECT_TRUE(manager->recovery().removed.empty());
  // Within the window: nothing decided.
  clock_.Advance(absl::Seconds(59));
  manager->TickForTest(clock_.Now());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(Exists(JoinPath(ck_, "__2_0.distcp")));
  EXPECT_TRUE(Exists(journal_));
  // Past it, still no .metadata: the coordinator can no longer commit.
  clock_.Advance(absl::Seconds(2));
  manager->TickForTest(clock_.Now());
  ASSERT_TRUE(JournalEmptySoon());
  EXPECT_FALSE(Exists(JoinPath(ck_, "__2_0.distcp")));
  EXPECT_FALSE(Exists(JoinPath(ck_, "__3_0.distcp")));
  EXPECT_TRUE(Exists(JoinPath(ck_, "__0_0.distcp")));
}

TEST_F(RecoverySettleTest, MetadataWithinTheWindowKeepsAndRecordsTheShare) {
  LeaveANodesShare(/*settle_ms=*/60'000);
  ASSERT_OK_AND_ASSIGN(auto manager, CheckpointManager::Create(options_));
  ASSERT_EQ(manager->recovery().deferred.size(), 1u);
  // The coordinator renames .metadata in during the window.
  clock_.Advance(absl::Seconds(30));
  ASSERT_OK(WriteFileAtomic(Env::Default(), JoinPath(ck_, ".metadata"), "md"));
  clock_.Advance(absl::Seconds(31));
  manager->TickForTest(clock_.Now());
  ASSERT_TRUE(JournalEmptySoon());
  EXPECT_TRUE(Exists(JoinPath(ck_, "__2_0.distcp")));
  EXPECT_TRUE(Exists(JoinPath(ck_, "__3_0.distcp")));
  EXPECT_TRUE(Exists(JoinPath(ck_, ".metadata")));
  // Recorded in the job's history (step 7), as a start-up commit is.
  std::vector<std::string> names =
      *Env::Default()->ListDir(dir_.Join("state/history"));
  EXPECT_FALSE(names.empty());
}

TEST_F(RecoverySettleTest, AnEntryWithoutSettleMsWaitsTheDaemonsOwnWindow) {
  options_.commit_timeout = absl::Seconds(20);
  options_.peer_timeout = absl::Seconds(5);
  LeaveANodesShare(/*settle_ms=*/0);  // written by an earlier version
  ASSERT_OK_AND_ASSIGN(auto manager, CheckpointManager::Create(options_));
  ASSERT_EQ(manager->recovery().deferred.size(), 1u);
  clock_.Advance(absl::Seconds(24));
  manager->TickForTest(clock_.Now());
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(Exists(JoinPath(ck_, "__2_0.distcp")));
  clock_.Advance(absl::Seconds(2));
  manager->TickForTest(clock_.Now());
  ASSERT_TRUE(JournalEmptySoon());
  EXPECT_FALSE(Exists(JoinPath(ck_, "__2_0.distcp")));
}

// A new save of the directory (a one-rank, single-node retry) waits for
// the decision: the deferred cleanup never removes a retry's files.
TEST_F(RecoverySettleTest, ASaveOfTheDirectoryWaitsForTheDecision) {
  LeaveANodesShare(/*settle_ms=*/60'000);
  ASSERT_OK_AND_ASSIGN(auto manager, CheckpointManager::Create(options_));
  const std::string meta =
      format::EncodeTorchSaveObject(format::PyValue::Str("retry"));
  ASSERT_OK_AND_ASSIGN(auto arena,
                       shm::Arena::Create(options_.shm_dir, meta.size(), "t"));
  std::memcpy(arena->data(), meta.data(), meta.size());
  ASSERT_OK_AND_ASSIGN(
      uint64_t aid, manager->RegisterArena(arena->name(), arena->size(), "t"));
  SaveBatch sb;
  sb.checkpoint_id = ck_;
  sb.rank = 0;
  sb.world_size = 1;
  sb.overwrite = true;
  format::ItemDesc md;
  md.fqn = "meta";
  md.type = format::ItemDesc::Type::kBytes;
  sb.items = {md};
  sb.item_nbytes = {meta.size()};
  sb.arena_id = aid;
  sb.extents = {{0, 0, 0, meta.size()}};
  sb.last = true;
  ASSERT_OK(::ckptd::testing::SaveSync(*manager, sb));
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo waiting, manager->GetStatus(ck_));
  EXPECT_NE(waiting.state, State::kCommitted) << "it did not wait";
  EXPECT_TRUE(Exists(JoinPath(ck_, "__2_0.distcp")));
  clock_.Advance(absl::Seconds(61));
  manager->TickForTest(clock_.Now());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo done,
                       ::ckptd::testing::WaitFinal(*manager, ck_));
  EXPECT_EQ(done.state, State::kCommitted) << done.error;
  EXPECT_TRUE(Exists(JoinPath(ck_, ".metadata")));
  EXPECT_TRUE(Exists(JoinPath(ck_, "__0_0.distcp")));   // the retry's
  EXPECT_FALSE(Exists(JoinPath(ck_, "__2_0.distcp")));  // the old share's
}

TEST_F(RecoverySettleTest, ASingleNodeEntryIsDecidedAtOnce) {
  ASSERT_OK(
      WriteFileAtomic(Env::Default(), JoinPath(ck_, "__0_0.distcp"), "data"));
  CommitRecord rec;
  rec.dir = ck_;
  rec.job = "job";
  ASSERT_OK(WriteFileAtomic(Env::Default(), journal_, EncodeJournal(rec)));
  ASSERT_OK_AND_ASSIGN(auto manager, CheckpointManager::Create(options_));
  EXPECT_TRUE(manager->recovery().deferred.empty());
  ASSERT_EQ(manager->recovery().removed.size(), 1u);
  EXPECT_FALSE(Exists(JoinPath(ck_, "__0_0.distcp")));
  EXPECT_FALSE(Exists(journal_));
}

}  // namespace
}  // namespace ckptd::daemon
