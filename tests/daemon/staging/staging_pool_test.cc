// Copyright 2026 The ckptd Authors.
//
// The staging pool alone (daemon/staging/staging_pool.h): the budget, FIFO
// admission without overtaking, the one-batch-always-fits rule, the
// waiting limit — plain accounting, no daemon, no threads.
#include "daemon/staging/staging_pool.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(StagingPoolTest, AdmitsInArrivalOrderWithinTheBudget) {
  StagingPool pool({/*budget=*/100, /*max_waiting=*/8});
  pool.Enqueue(1, 40);
  pool.Enqueue(2, 40);
  pool.Enqueue(3, 40);
  EXPECT_THAT(pool.Admit(), ElementsAre(1, 2));  // 80 of 100
  EXPECT_EQ(pool.used(), 80u);
  EXPECT_EQ(pool.waiting(), 1u);
  // A later small batch does not overtake the waiting one.
  pool.Enqueue(4, 10);
  EXPECT_THAT(pool.Admit(), IsEmpty());
  pool.Release(40);
  EXPECT_THAT(pool.Admit(), ElementsAre(3, 4));
  EXPECT_EQ(pool.used(), 90u);
}

TEST(StagingPoolTest, ABatchLargerThanTheBudgetRunsAlone) {
  StagingPool pool({100, 8});
  pool.Enqueue(1, 250);  // an idle pool takes it (max_batch bounds it)
  EXPECT_THAT(pool.Admit(), ElementsAre(1));
  pool.Enqueue(2, 1);
  EXPECT_THAT(pool.Admit(), IsEmpty());
  pool.Release(250);
  EXPECT_THAT(pool.Admit(), ElementsAre(2));
}

TEST(StagingPoolTest, DeviceOnlyBatchesAreChargedNothing) {
  StagingPool pool({100, 8});
  pool.Enqueue(1, 100);
  pool.Enqueue(2, 0);  // its bytes are in the pinned pool
  EXPECT_THAT(pool.Admit(), ElementsAre(1, 2));
  EXPECT_EQ(pool.used(), 100u);
}

TEST(StagingPoolTest, RemovedBatchesLeaveUncharged) {
  StagingPool pool({100, 8});
  pool.Enqueue(1, 100);
  pool.Enqueue(2, 50);
  pool.Enqueue(3, 50);
  EXPECT_THAT(pool.Admit(), ElementsAre(1));
  EXPECT_TRUE(pool.Remove(2));  // its checkpoint failed
  EXPECT_FALSE(pool.Remove(2));
  pool.Release(100);
  EXPECT_THAT(pool.Admit(), ElementsAre(3));
  EXPECT_EQ(pool.used(), 50u);
}

TEST(StagingPoolTest, WaitingIsBounded) {
  StagingPool pool({10, 2});
  EXPECT_OK(pool.CheckRoom());
  pool.Enqueue(1, 10);
  pool.Enqueue(2, 10);
  absl::Status s = pool.CheckRoom();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), ::testing::HasSubstr("max_pending_saves"));
  EXPECT_THAT(pool.Admit(), ElementsAre(1));
  EXPECT_OK(pool.CheckRoom());
}

TEST(StagingPoolTest, OverReleaseNeverWrapsAround) {
  StagingPool pool({10, 2});
  pool.Enqueue(1, 10);
  pool.Admit();
  pool.Release(11);  // a broken invariant is logged, not turned into 2^64
  EXPECT_EQ(pool.used(), 0u);
}

}  // namespace
}  // namespace ckptd::daemon
