// Copyright 2026 The ckptd Authors.
//
// The node planner alone (daemon/plan/node_planner.h): rank indexes in,
// WritePlan out — dedup of replicated items, files per rank, the
// coordinator's answer checked against the node's own indexes. Pure: no
// daemon, no threads, no I/O.
#include "daemon/plan/node_planner.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Rank r of `world`: "w" float32 [2*world, 4] sharded on dim 0 (32 bytes),
// "b" float32 [4] replicated (16 bytes).
RankIndex Rank(int r, int world) {
  RankIndex index;
  format::ItemDesc w;
  w.fqn = "w";
  w.global_shape = {2 * world, 4};
  w.chunk_offsets = {2 * r, 0};
  w.chunk_sizes = {2, 4};
  format::ItemDesc b;
  b.fqn = "b";
  b.global_shape = b.chunk_sizes = {4};
  b.chunk_offsets = {0};
  index.items = {w, b};
  index.nbytes = {32, 16};
  index.total = 48;
  return index;
}

std::vector<const RankIndex*> Ptrs(const std::vector<RankIndex>& v) {
  std::vector<const RankIndex*> out;
  for (const RankIndex& r : v) out.push_back(&r);
  return out;
}

TEST(NodePlannerTest, SingleNodeDedupsReplicatedItemsAndGivesEachRankAFile) {
  std::vector<RankIndex> ranks = {Rank(0, 3), Rank(1, 3), Rank(2, 3)};
  ASSERT_OK_AND_ASSIGN(WritePlan lowest,
                       PlanSingleNode(Ptrs(ranks), {true, 1 << 20}));
  ASSERT_EQ(lowest.ranks.size(), 3u);
  // "b" is written once, by rank 0 (dedup_save_to_lowest_rank).
  EXPECT_THAT(lowest.ranks[0].plan_index, ElementsAre(0, 1));
  EXPECT_THAT(lowest.ranks[1].plan_index, ElementsAre(2, -1));
  EXPECT_THAT(lowest.ranks[2].plan_index, ElementsAre(3, -1));
  EXPECT_EQ(lowest.ranks[1].relative_path, "__1_0.distcp");
  EXPECT_EQ(lowest.plan.items.size(), 4u);
  EXPECT_EQ(lowest.plan.metadata.state_dict_metadata.size(), 2u);
  // Load-balanced: "b" goes to some single rank.
  ASSERT_OK_AND_ASSIGN(WritePlan balanced,
                       PlanSingleNode(Ptrs(ranks), {false, 1 << 20}));
  int writers_of_b = 0;
  for (const RankFilePlan& r : balanced.ranks)
    writers_of_b += r.plan_index[1] >= 0;
  EXPECT_EQ(writers_of_b, 1);
}

TEST(NodePlannerTest, SingleNodeRefusesOverlapsAndLimits) {
  std::vector<RankIndex> ranks = {Rank(0, 2),
                                  Rank(0, 2)};  // both claim rows 0:2
  absl::StatusOr<WritePlan> plan =
      PlanSingleNode(Ptrs(ranks), {false, 1 << 20});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<RankIndex> ok = {Rank(0, 1)};
  EXPECT_FALSE(PlanSingleNode(Ptrs(ok), {false, 1}).ok());  // 2 items > max 1
}

TEST(NodePlannerTest, TheCoordinatorsAnswerBecomesTheNodesPlan) {
  // This node holds ranks 2 and 3 of 4.
  std::vector<RankIndex> local = {Rank(2, 4), Rank(3, 4)};
  NodeIndex index = MakeNodeIndex({2, 3}, Ptrs(local));
  EXPECT_THAT(index.ranks, ElementsAre(2, 3));
  ASSERT_EQ(index.items.size(), 2u);
  EXPECT_EQ(index.nbytes[1][0], 32u);
  NodePlan answer;
  answer.ranks = {{2, {true, false}, "__2_0.distcp"},
                  {3, {true, false}, "__3_0.distcp"}};
  ASSERT_OK_AND_ASSIGN(WritePlan plan,
                       PlanFromCoordinator(answer, {2, 3}, Ptrs(local), 4));
  ASSERT_EQ(plan.ranks.size(), 4u);
  EXPECT_THAT(plan.ranks[2].plan_index, ElementsAre(0, -1));
  EXPECT_THAT(plan.ranks[3].plan_index, ElementsAre(1, -1));
  EXPECT_TRUE(plan.ranks[0].plan_index.empty());  // not this node's
  ASSERT_EQ(plan.plan.files.size(), 2u);
  EXPECT_THAT(plan.plan.files[1].items, ElementsAre(1));
  EXPECT_TRUE(plan.plan.metadata.state_dict_metadata
                  .empty());  // the coordinator commits
}

TEST(NodePlannerTest, AnAnswerThatDoesNotMatchTheNodeIsRefused) {
  std::vector<RankIndex> local = {Rank(2, 4), Rank(3, 4)};
  NodePlan short_answer;
  short_answer.ranks = {{2, {true, true}, "__2_0.distcp"}};
  EXPECT_THAT(PlanFromCoordinator(short_answer, {2, 3}, Ptrs(local), 4)
                  .status()
                  .message(),
              HasSubstr("does not cover this node's ranks"));
  NodePlan wrong_items;
  wrong_items.ranks = {{2, {true}, "__2_0.distcp"},
                       {3, {true, true}, "__3_0.distcp"}};
  EXPECT_THAT(PlanFromCoordinator(wrong_items, {2, 3}, Ptrs(local), 4)
                  .status()
                  .message(),
              HasSubstr("plan for rank 2 does not match its 2 items"));
  NodePlan wrong_file;
  wrong_file.ranks = {{2, {true, true}, "../../etc/passwd"},
                      {3, {true, true}, "__3_0.distcp"}};
  EXPECT_THAT(PlanFromCoordinator(wrong_file, {2, 3}, Ptrs(local), 4)
                  .status()
                  .message(),
              HasSubstr("named file '../../etc/passwd' for rank 2"));
}

}  // namespace
}  // namespace ckptd::daemon
