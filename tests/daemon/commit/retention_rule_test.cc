// Copyright 2026 The ckptd Authors.
//
// History::Record, the retention rule (daemon/commit/retention.h), alone:
// keep_last_n, keep_every (steps from directory names: StepOf), ordering by
// save start, and the checkpoints it may never prune.

#include <string>
#include <vector>

#include "common/env.h"
#include "daemon/commit/retention.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckptd::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(StepOfTest, TrailingDigitsOfTheName) {
  EXPECT_EQ(StepOf("/ck/run/step_1200"), 1200);
  EXPECT_EQ(StepOf("/ck/run/1200"), 1200);
  EXPECT_EQ(StepOf("step7"), 7);
  EXPECT_EQ(StepOf("/ck/run/step_0"), 0);
  EXPECT_EQ(StepOf("/ck/run7/latest"), std::nullopt);
  EXPECT_EQ(StepOf("/ck/run/"), std::nullopt);
  EXPECT_EQ(StepOf("/ck/run/step_1234567890123456789"), std::nullopt);
}

std::vector<std::string> Doomed(History& h, const std::string& dir,
                                int64_t started, int keep_last_n,
                                int64_t keep_every) {
  return h.Record("job", 1000, dir, started, keep_last_n, keep_every).doomed;
}

TEST(RetentionRuleTest, KeepEveryKeepsMultiplesBeyondTheLastN) {
  History h;
  std::vector<std::string> doomed;
  for (int step = 5; step <= 30; step += 5) {
    for (const std::string& d :
         Doomed(h, "/ck/run/step_" + std::to_string(step), step, 2, 10)) {
      doomed.push_back(d);
    }
  }
  EXPECT_THAT(doomed, ElementsAre("/ck/run/step_5", "/ck/run/step_15"));
  std::vector<std::string> kept;
  for (const auto& [job, dir] : h.Committed("job")) kept.push_back(dir);
  EXPECT_THAT(kept, ElementsAre("/ck/run/step_10", "/ck/run/step_20",
                                "/ck/run/step_25", "/ck/run/step_30"));
}

TEST(RetentionRuleTest, NamesWithoutAStepAreNotKeptForIt) {
  History h;
  EXPECT_THAT(Doomed(h, "/ck/run/a", 1, 1, 10), IsEmpty());
  EXPECT_THAT(Doomed(h, "/ck/run/b", 2, 1, 10), ElementsAre("/ck/run/a"));
  EXPECT_THAT(Doomed(h, "/ck/run/step_20", 3, 1, 10), ElementsAre("/ck/run/b"));
  // step_20 stays for its step; the newest one for keep_last_n.
  EXPECT_THAT(Doomed(h, "/ck/run/c", 4, 1, 10), IsEmpty());
  EXPECT_THAT(Doomed(h, "/ck/run/d", 5, 1, 10), ElementsAre("/ck/run/c"));
}

TEST(RetentionRuleTest, ZeroKeepEveryIsKeepLastNAlone) {
  History h;
  std::vector<std::string> doomed;
  for (int step = 10; step <= 40; step += 10) {
    for (const std::string& d :
         Doomed(h, "/ck/run/step_" + std::to_string(step), step, 2, 0)) {
      doomed.push_back(d);
    }
  }
  EXPECT_THAT(doomed, ElementsAre("/ck/run/step_10", "/ck/run/step_20"));
}

TEST(RetentionRuleTest, NeverTheJustCommittedOrANewerSave) {
  History h;
  EXPECT_THAT(Doomed(h, "/ck/run/step_3", 30, 1, 0), IsEmpty());
  // An older save committing late prunes nothing newer than itself.
  EXPECT_THAT(Doomed(h, "/ck/run/step_1", 10, 1, 0), IsEmpty());
  EXPECT_THAT(Doomed(h, "/ck/run/step_4", 40, 1, 0),
              ElementsAre("/ck/run/step_1", "/ck/run/step_3"));
}

}  // namespace
}  // namespace ckptd::daemon
