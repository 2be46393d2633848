// Copyright 2026 The ckptd Authors.
//
// Tests of RestoreProgress (daemon/restore/restore_progress.h): a restore's
// life from its first batch to DONE / FAILED / CANCELLED / ABANDONED,
// cancels of groups and of ranks alone, and the bounds on what is kept.
#include "daemon/restore/restore_progress.h"

#include <string>

#include "gtest/gtest.h"

namespace ckptd::daemon {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

RestoreKey Group(const std::string& g) { return {1000, "/ckpt/a", g}; }

ServedBatch Batch(int ranks, int last, uint64_t copied,
                  absl::Status error = absl::OkStatus()) {
  return ServedBatch{ranks, last, copied, copied / ranks, std::move(error)};
}

TEST(RestoreProgressTest, AGroupRunsUntilEachRankWasServedItsLastBatch) {
  RestoreProgress p;
  ASSERT_TRUE(p.Admit(Group("g#0"), 2, 0, kT0).ok());
  ASSERT_TRUE(p.Admit(Group("g#0"), 2, 0, kT0).ok());
  p.Served(Group("g#0"), Batch(2, 1, 200), kT0 + absl::Seconds(1));
  auto info = p.List().at(0);
  EXPECT_EQ(info.id, "r1");
  EXPECT_EQ(info.state, "RUNNING");
  EXPECT_EQ(info.ranks_done, 1);
  ASSERT_TRUE(p.Admit(Group("g#0"), 2, 1, kT0 + absl::Seconds(2)).ok());
  p.Served(Group("g#0"), Batch(1, 1, 50), kT0 + absl::Seconds(3));
  info = *p.Find("r1");
  EXPECT_EQ(info.state, "DONE");
  EXPECT_EQ(info.batches, 2u);
  EXPECT_EQ(info.copied_bytes, 250u);
  EXPECT_EQ(info.storage_bytes, 150u);
  EXPECT_EQ(info.started, kT0);
  EXPECT_EQ(info.last_active, kT0 + absl::Seconds(3));
}

TEST(RestoreProgressTest, AFailedBatchEndsItFailedWithTheFirstError) {
  RestoreProgress p;
  ASSERT_TRUE(p.Admit(Group("g#0"), 1, 0, kT0).ok());
  p.Served(Group("g#0"), Batch(1, 0, 0, absl::DataLossError("crc in f")), kT0);
  ASSERT_TRUE(p.Admit(Group("g#0"), 1, 1, kT0).ok());
  p.Served(Group("g#0"), Batch(1, 1, 0, absl::NotFoundError("second")), kT0);
  const auto info = *p.Find("r1");
  EXPECT_EQ(info.state, "FAILED");
  EXPECT_NE(info.error.find("crc in f"), std::string::npos) << info.error;
}

TEST(RestoreProgressTest, ACancelledGroupRefusesEveryLaterBatch) {
  RestoreProgress p;
  ASSERT_TRUE(p.Admit(Group("g#0"), 4, 0, kT0).ok());
  EXPECT_EQ(p.Cancel("r7", "", kT0).status().code(),
            absl::StatusCode::kNotFound);
  auto key = p.Cancel("r1", "", kT0);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(*key, Group("g#0"));
  // The cancelled load's later batches are refused.
  const absl::Status late = p.Admit(Group("g#0"), 4, 1, kT0);
  EXPECT_EQ(late.code(), absl::StatusCode::kCancelled);
  EXPECT_NE(late.message().find("cancelled by an operator"), std::string::npos);
  EXPECT_EQ(p.Cancel("r1", "", kT0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Another load names another group.
  ASSERT_TRUE(p.Admit(Group("g#1"), 4, 0, kT0).ok());
  EXPECT_EQ(p.List().at(0).id, "r2");
  EXPECT_EQ(p.List().at(0).state, "RUNNING");
  // A batch 0 under the cancelled name: the job failed with CANCELLED,
  // restarted and loads under the same name again; a new restore, which
  // its other ranks join.
  ASSERT_TRUE(p.Admit(Group("g#0"), 4, 0, kT0).ok());
  EXPECT_EQ(p.List().at(0).id, "r3");
  ASSERT_TRUE(p.Admit(Group("g#0"), 4, 0, kT0).ok());
  EXPECT_EQ(p.Find("r3")->state, "RUNNING");
  EXPECT_EQ(p.tracked(), 2u);  // r1 gave way to r3 under its key
}

TEST(RestoreProgressTest, AGroupStartedAnewIsANewRestore) {
  RestoreProgress p;
  ASSERT_TRUE(p.Admit(Group("g#0"), 2, 0, kT0).ok());
  ASSERT_TRUE(p.Admit(Group("g#0"), 2, 0, kT0).ok());
  p.Served(Group("g#0"), Batch(2, 0, 200), kT0);
  // The job restarts mid-load: restore_groups sees rank 0's second batch 0.
  ASSERT_TRUE(
      p.Admit(Group("g#0"), 2, 0, kT0 + absl::Seconds(30), /*starts_anew=*/true)
          .ok());
  const RestoreProgressInfo info = p.List().at(0);
  EXPECT_EQ(info.id, "r2");
  EXPECT_EQ(info.state, "RUNNING");
  EXPECT_EQ(info.started, kT0 + absl::Seconds(30));
  EXPECT_EQ(info.batches, 0u);
  EXPECT_EQ(info.copied_bytes, 0u);
}

TEST(RestoreProgressTest, RanksAloneStartANewRestoreWithBatchZero) {
  RestoreProgress p;
  ASSERT_TRUE(p.Admit(Group(""), 1, 0, kT0).ok());
  ASSERT_TRUE(p.Cancel("r1", "stop", kT0).ok());
  EXPECT_EQ(p.Admit(Group(""), 1, 3, kT0).code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(p.Admit(Group(""), 1, 0, kT0).ok());
  EXPECT_EQ(p.List().at(0).id, "r2");
  // Each load of a rank alone ends with its last batch.
  p.Served(Group(""), Batch(1, 1, 10), kT0);
  EXPECT_EQ(p.Find("r2")->state, "DONE");
  ASSERT_TRUE(p.Admit(Group(""), 1, 0, kT0).ok());
  EXPECT_EQ(p.List().at(0).id, "r3");
}

TEST(RestoreProgressTest, AnIdleRestoreIsAbandoned) {
  RestoreProgress p(RestoreProgressOptions{absl::Minutes(1), 64, 4096});
  ASSERT_TRUE(p.Admit(Group("g#0"), 2, 0, kT0).ok());
  p.Expire(kT0 + absl::Seconds(59));
  EXPECT_EQ(p.Find("r1")->state, "RUNNING");
  p.Expire(kT0 + absl::Seconds(60));
  const auto info = *p.Find("r1");
  EXPECT_EQ(info.state, "ABANDONED");
  EXPECT_NE(info.error.find("0 of 2 ranks"), std::string::npos) << info.error;
}

TEST(RestoreProgressTest, WhatItKeepsIsBounded) {
  RestoreProgress p(RestoreProgressOptions{absl::Minutes(1), 3, 10});
  for (int i = 0; i < 6; ++i) {
    const RestoreKey k = Group("done#" + std::to_string(i));
    ASSERT_TRUE(p.Admit(k, 1, 0, kT0 + absl::Seconds(i)).ok());
    p.Served(k, Batch(1, 1, 1), kT0 + absl::Seconds(i));
  }
  EXPECT_EQ(p.tracked(), 3u);  // the newest 3 ended ones
  EXPECT_FALSE(p.Find("r1").has_value());
  EXPECT_TRUE(p.Find("r6").has_value());
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(
        p.Admit(Group("run#" + std::to_string(i)), 2, 0, kT0 + absl::Hours(1))
            .ok());
  }
  EXPECT_EQ(p.tracked(), 10u);
  // Running ones are listed first, newest first.
  EXPECT_EQ(p.List().front().group, "run#19");
  EXPECT_EQ(p.List().front().state, "RUNNING");
}

}  // namespace
}  // namespace ckptd::daemon
