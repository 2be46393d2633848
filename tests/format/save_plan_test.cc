// Copyright 2026 The ckptd Authors.
#include "format/plan/save_plan.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

ItemDesc Tensor(std::string fqn, std::vector<int64_t> shape, std::vector<int64_t> off,
                std::vector<int64_t> size, DType dt = DType::kFloat32) {
  ItemDesc d;
  d.fqn = std::move(fqn);
  d.type = ItemDesc::Type::kTensor;
  d.dtype = dt;
  d.global_shape = std::move(shape);
  d.chunk_offsets = std::move(off);
  d.chunk_sizes = std::move(size);
  return d;
}
ItemDesc Full(std::string fqn, std::vector<int64_t> shape, DType dt = DType::kFloat32) {
  std::vector<int64_t> zeros(shape.size(), 0);
  return Tensor(std::move(fqn), shape, zeros, shape, dt);
}
ItemDesc Bytes(std::string fqn) {
  ItemDesc d;
  d.fqn = std::move(fqn);
  d.type = ItemDesc::Type::kBytes;
  return d;
}

// Dedup follows DCP's load-balanced rule: each replicated item goes to the
// holder with the smallest running byte total, ties to the lowest rank.
TEST(SavePlanTest, DedupLoadBalancesReplicatedItems) {
  // Three replicated tensors of 400, 400, 40 bytes and a bytes item on 2 ranks.
  std::vector<std::vector<ItemDesc>> ranks(2);
  for (auto& r : ranks) {
    r.push_back(Full("a", {100}));
    r.push_back(Full("b", {100}));
    r.push_back(Full("c", {10}));
    r.push_back(Bytes("step"));
  }
  ASSERT_OK_AND_ASSIGN(SavePlan plan, PlanSave(ranks));
  ASSERT_EQ(plan.items.size(), 4u);
  // a → rank 0 (tie), b → rank 1 (0 has 400), c → rank 0 (400 vs 400, tie),
  // step → rank 1 (440 vs 400).
  std::map<std::string, int> writer;
  for (const auto& pi : plan.items) writer[ranks[pi.rank][pi.item_index].fqn] = pi.rank;
  EXPECT_EQ(writer["a"], 0);
  EXPECT_EQ(writer["b"], 1);
  EXPECT_EQ(writer["c"], 0);
  EXPECT_EQ(writer["step"], 1);
  // Files: one per rank, bytes items first.
  ASSERT_EQ(plan.files.size(), 2u);
  EXPECT_EQ(plan.files[0].relative_path, "__0_0.distcp");
  EXPECT_EQ(plan.files[1].relative_path, "__1_0.distcp");
  const auto& f1 = plan.files[1].items;
  ASSERT_EQ(f1.size(), 2u);
  EXPECT_EQ(ranks[1][plan.items[f1[0]].item_index].fqn, "step");
  EXPECT_EQ(ranks[1][plan.items[f1[1]].item_index].fqn, "b");
}

TEST(SavePlanTest, DedupToLowestRank) {
  std::vector<std::vector<ItemDesc>> ranks(3);
  for (auto& r : ranks) {
    r.push_back(Full("a", {100}));
    r.push_back(Full("b", {100}));
  }
  PlanOptions opts;
  opts.dedup_save_to_lowest_rank = true;
  ASSERT_OK_AND_ASSIGN(SavePlan plan, PlanSave(ranks, opts));
  for (const auto& pi : plan.items) EXPECT_EQ(pi.rank, 0);
  // Empty ranks still get their (empty) file, like stock.
  EXPECT_EQ(plan.files.size(), 3u);
  EXPECT_TRUE(plan.files[2].items.empty());
}

TEST(SavePlanTest, ShardedTensorMetadataInRankOrder) {
  std::vector<std::vector<ItemDesc>> ranks(4);
  for (int r = 0; r < 4; ++r) ranks[r].push_back(Tensor("w", {8, 3}, {2 * r, 0}, {2, 3}));
  ASSERT_OK_AND_ASSIGN(SavePlan plan, PlanSave(ranks));
  ASSERT_EQ(plan.metadata.state_dict_metadata.size(), 1u);
  const auto& t = std::get<TensorStorageMetadata>(plan.metadata.state_dict_metadata[0].second);
  ASSERT_EQ(t.chunks.size(), 4u);
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(t.chunks[r].offsets, (std::vector<int64_t>{2 * r, 0}));
    EXPECT_EQ(plan.chunk_index[r], r);
  }
  ASSERT_TRUE(plan.metadata.planner_data.has_value());
  EXPECT_EQ(std::get<std::string>((*plan.metadata.planner_data)[0].second[0]), "w");
}

TEST(SavePlanTest, RejectsOverlapOutOfBoundsAndGaps) {
  {
    std::vector<std::vector<ItemDesc>> ranks(2);
    ranks[0].push_back(Tensor("w", {6, 6}, {0, 0}, {4, 6}));
    ranks[1].push_back(Tensor("w", {6, 6}, {2, 0}, {4, 6}));
    auto s = PlanSave(ranks);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("overlaps"), absl::string_view::npos) << s.status();
    EXPECT_NE(s.status().message().find("w:"), absl::string_view::npos);
  }
  {
    std::vector<std::vector<ItemDesc>> ranks(1);
    ranks[0].push_back(Tensor("w", {6, 6}, {4, 0}, {4, 6}));
    auto s = PlanSave(ranks);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("out of bounds"), absl::string_view::npos) << s.status();
  }
  {
    std::vector<std::vector<ItemDesc>> ranks(2);
    ranks[0].push_back(Tensor("w", {6, 6}, {0, 0}, {2, 6}));
    ranks[1].push_back(Tensor("w", {6, 6}, {4, 0}, {2, 6}));
    auto s = PlanSave(ranks);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.status().message().find("cover"), absl::string_view::npos) << s.status();
  }
  {
    std::vector<std::vector<ItemDesc>> ranks(2);
    ranks[0].push_back(Full("w", {6}));
    ranks[1].push_back(Full("w", {6}, DType::kBFloat16));
    EXPECT_FALSE(PlanSave(ranks).ok());
  }
  {
    std::vector<std::vector<ItemDesc>> ranks(1);
    ranks[0].push_back(Bytes("x"));
    ranks[0].push_back(Full("x", {2}));
    EXPECT_FALSE(PlanSave(ranks).ok());
  }
  {
    std::vector<std::vector<ItemDesc>> ranks(1);
    ranks[0].push_back(Tensor("w", {6}, {0, 0}, {6}));
    EXPECT_FALSE(PlanSave(ranks).ok());
  }
  {
    std::vector<std::vector<ItemDesc>> ranks(1);
    ranks[0].push_back(Full("w", {-1}));
    EXPECT_FALSE(PlanSave(ranks).ok());
  }
}

TEST(SavePlanTest, TwoDimensionalShardingAndZeroSizedChunks) {
  // A 4x4 grid of 2x3 tiles of an 8x12 tensor, plus zero-sized chunks.
  std::vector<std::vector<ItemDesc>> ranks(16);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 4; ++j) {
      ranks[i * 4 + j].push_back(Tensor("w", {8, 12}, {2 * i, 3 * j}, {2, 3}));
      ranks[i * 4 + j].push_back(Tensor("e", {0, 5}, {0, 0}, {0, 5}));
    }
  }
  ASSERT_OK_AND_ASSIGN(SavePlan plan, PlanSave(ranks));
  // "e" is replicated (same key on every rank): written once.
  size_t e_count = 0;
  for (const auto& pi : plan.items) e_count += ranks[pi.rank][pi.item_index].fqn == "e";
  EXPECT_EQ(e_count, 1u);
}

TEST(SavePlanTest, FilesPerRankBucketsLikeStock) {
  std::vector<std::vector<ItemDesc>> ranks(1);
  ranks[0].push_back(Full("small", {10}));
  ranks[0].push_back(Full("big", {1000}));
  ranks[0].push_back(Full("mid", {500}));
  ranks[0].push_back(Bytes("o1"));
  ranks[0].push_back(Bytes("o2"));
  PlanOptions opts;
  opts.files_per_rank = 2;
  ASSERT_OK_AND_ASSIGN(SavePlan plan, PlanSave(ranks, opts));
  ASSERT_EQ(plan.files.size(), 2u);
  auto names = [&](const PlannedFile& f) {
    std::vector<std::string> n;
    for (size_t p : f.items) n.push_back(ranks[0][plan.items[p].item_index].fqn);
    return n;
  };
  // Bytes round-robin; tensors largest first to the lightest bucket.
  EXPECT_EQ(names(plan.files[0]), (std::vector<std::string>{"o1", "big"}));
  EXPECT_EQ(names(plan.files[1]), (std::vector<std::string>{"o2", "mid", "small"}));
}

TEST(SavePlanTest, RandomShardingsValidateAndOverlapsAreFound) {
  std::mt19937_64 rng(::ckptd::testing::TestSeed());
  for (int iter = 0; iter < 200; ++iter) {
    const int nd = 1 + rng() % 3;
    std::vector<int64_t> shape(nd);
    for (auto& s : shape) s = 1 + rng() % 9;
    // Split every dim into random pieces: a full, non-overlapping grid.
    std::vector<std::vector<int64_t>> cuts(nd);
    for (int d = 0; d < nd; ++d) {
      cuts[d] = {0, shape[d]};
      for (int k = 0; k < 2; ++k) cuts[d].push_back(rng() % (shape[d] + 1));
      std::sort(cuts[d].begin(), cuts[d].end());
      cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
    }
    std::vector<ChunkStorageMetadata> chunks;
    std::vector<size_t> idx(nd, 0);
    for (;;) {
      ChunkStorageMetadata c;
      for (int d = 0; d < nd; ++d) {
        c.offsets.push_back(cuts[d][idx[d]]);
        c.sizes.push_back(cuts[d][idx[d] + 1] - cuts[d][idx[d]]);
      }
      chunks.push_back(c);
      int d = nd - 1;
      while (d >= 0 && ++idx[d] + 1 >= cuts[d].size()) idx[d--] = 0;
      if (d < 0) break;
    }
    std::shuffle(chunks.begin(), chunks.end(), rng);
    ASSERT_OK(ValidateChunks("t", shape, chunks, true));
    // Grow one chunk by one element along some dim (if room): an overlap or
    // an out-of-bounds box must be reported.
    auto bad = chunks;
    auto& c = bad[rng() % bad.size()];
    const int d = rng() % nd;
    c.sizes[d] += 1;
    EXPECT_FALSE(ValidateChunks("t", shape, bad, true).ok());
  }
}

// The scale the planner is sized for: 1,000 ranks × 2,000 FSDP-sharded tensors.
// Timing goes to the benchmark; here we only check it plans correctly.
TEST(SavePlanTest, ThousandRanksFsdp) {
  const int kRanks = 1000, kTensors = 200;  // a tenth, to keep the test fast
  std::vector<std::vector<ItemDesc>> ranks(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    for (int t = 0; t < kTensors; ++t) {
      ranks[r].push_back(Tensor("layer" + std::to_string(t) + ".weight", {kRanks * 4, 64},
                                {r * 4, 0}, {4, 64}, DType::kBFloat16));
    }
  }
  ASSERT_OK_AND_ASSIGN(SavePlan plan, PlanSave(ranks));
  EXPECT_EQ(plan.items.size(), static_cast<size_t>(kRanks) * kTensors);
  EXPECT_EQ(plan.files.size(), static_cast<size_t>(kRanks));
}

// Plans of 2^18 chunks or more validate their tensors on several threads;
// the error is still the first bad tensor in state_dict_metadata order (as
// one thread reports it), and a good plan is the same.
TEST(SavePlanTest, LargePlanValidatesInParallelAndReportsTheFirstBadTensor) {
  const int kRanks = 128, kTensors = 2100;  // 268,800 chunks
  auto make = [&](const std::vector<int>& bad) {
    std::vector<std::vector<ItemDesc>> ranks(kRanks);
    for (int r = 0; r < kRanks; ++r) {
      ranks[r].reserve(kTensors);
      for (int t = 0; t < kTensors; ++t) {
        // On a bad tensor rank 5 holds rows [11:13]: rank 6 [12:14] overlaps it.
        const bool shift = r == 5 && std::find(bad.begin(), bad.end(), t) != bad.end();
        ranks[r].push_back(Tensor("t" + std::to_string(t), {kRanks * 2, 4},
                                  {r * 2 + (shift ? 1 : 0), 0}, {2, 4}));
      }
    }
    return ranks;
  };
  ASSERT_OK_AND_ASSIGN(SavePlan plan, PlanSave(make({})));
  ASSERT_EQ(plan.items.size(), static_cast<size_t>(kRanks) * kTensors);
  ASSERT_EQ(plan.metadata.state_dict_metadata.size(), static_cast<size_t>(kTensors));
  for (size_t i = 0; i < plan.items.size(); ++i) {
    ASSERT_EQ(plan.items[i].rank, static_cast<int>(i / kTensors));
    ASSERT_EQ(plan.items[i].item_index, i % kTensors);
  }
  // Bad tensors in the last block, the first and the middle: the first wins.
  for (const std::vector<int>& bad :
       {std::vector<int>{2050, 100, 1500}, std::vector<int>{2099}, std::vector<int>{0, 1}}) {
    auto s = PlanSave(make(bad));
    ASSERT_FALSE(s.ok());
    const int first = *std::min_element(bad.begin(), bad.end());
    EXPECT_EQ(s.status().message(),
              "t" + std::to_string(first) + ": chunk [12:14, 0:4] overlaps chunk [11:13, 0:4]")
        << s.status();
  }
}

}  // namespace
}  // namespace ckptd::format
