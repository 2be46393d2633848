// Copyright 2026 The ckptd Authors.
//
// Tests of CompactMetadata (format/metadata/compact_metadata.h): the plain model and
// back, Python dict semantics of duplicate keys, storage entries resolved to
// the chunk they name (hints right, wrong or missing; chunks sharing
// offsets), orphans, irregular chunks, and chunk lookup by box against a
// brute-force scan on random shardings, also from many threads at once.
#include "format/metadata/compact_metadata.h"

#include <algorithm>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "format/metadata/metadata.h"
#include "format/metadata/metadata_decode.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

TensorStorageMetadata Tensor(std::vector<int64_t> shape,
                             std::vector<ChunkStorageMetadata> chunks) {
  TensorStorageMetadata t;
  t.properties.dtype = DType::kBFloat16;
  t.size = std::move(shape);
  t.chunks = std::move(chunks);
  return t;
}

StorageInfo Info(std::string path, uint64_t off, uint64_t len) {
  return StorageInfo{std::move(path), off, len, {}};
}

Metadata Example() {
  Metadata md;
  md.state_dict_metadata.emplace_back(
      "w", Tensor({4, 6}, {{{0, 0}, {2, 6}}, {{2, 0}, {2, 6}}}));
  md.state_dict_metadata.emplace_back("step", BytesStorageMetadata{});
  md.state_dict_metadata.emplace_back("s", Tensor({}, {{{}, {}}}));
  md.storage_data.push_back({{"w", true, {2, 0}}, Info("__0_0.distcp", 0, 10)});
  md.storage_data.push_back({{"step", false, {}}, Info("__0_0.distcp", 10, 5)});
  md.storage_data.push_back({{"w", true, {0, 0}}, Info("__1_0.distcp", 0, 10)});
  md.storage_data.push_back({{"s", true, {}}, Info("__1_0.distcp", 10, 3)});
  md.planner_data = {{{"w", {std::string("m"), std::string("w")}},
                      {"step", {std::string("step")}},
                      {"s", {std::string("s"), int64_t{3}}}}};
  md.storage_meta = StorageMeta{"/c", "id", std::nullopt, {"m"}};
  md.version = "1.0.0";
  return md;
}

TEST(CompactMetadataTest, RoundTripAndLookups) {
  const Metadata md = Example();
  const CompactMetadata c = CompactMetadata::FromMetadata(md);
  const Metadata back = c.ToMetadata();
  EXPECT_EQ(back.state_dict_metadata, md.state_dict_metadata);
  EXPECT_EQ(back.storage_data, md.storage_data);
  EXPECT_EQ(back.planner_data, md.planner_data);
  EXPECT_EQ(back.storage_meta, md.storage_meta);
  EXPECT_EQ(back.version, md.version);
  ASSERT_EQ(c.num_items(), 3u);
  EXPECT_EQ(c.num_tensors(), 2u);
  EXPECT_EQ(c.num_chunks(), 3u);
  const auto w = c.FindItem("w");
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(c.fqn(*w), "w");
  EXPECT_FALSE(c.FindItem("nope").has_value());
  // Chunk 0 of w is stored second in storage_data (rank order).
  const auto* s0 = c.chunk_storage(*w, 0);
  ASSERT_NE(s0, nullptr);
  EXPECT_EQ(c.relative_path(*s0), "__1_0.distcp");
  EXPECT_EQ(s0->item, *w);
  EXPECT_EQ(s0->chunk, 0u);
  EXPECT_EQ(c.DescribeStorageKey(*s0), "w@(0, 0)");
  EXPECT_EQ(c.FindStorage({"w", true, {2, 0}}), c.chunk_storage(*w, 1));
  EXPECT_EQ(c.FindStorage({"w", false, {}}), nullptr);
  const auto step = c.FindItem("step");
  ASSERT_NE(c.bytes_storage(*step), nullptr);
  EXPECT_EQ(c.bytes_storage(*step)->offset, 10u);
  const auto s = c.FindItem("s");
  ASSERT_NE(c.chunk_storage(*s, 0), nullptr);  // 0-d: key Size([])
  std::vector<uint32_t> hits;
  c.OverlappingChunks(*s, {}, {}, &hits);
  EXPECT_EQ(hits, std::vector<uint32_t>{0});
  hits.clear();
  c.OverlappingChunks(*w, std::vector<int64_t>{1, 2},
                      std::vector<int64_t>{2, 1}, &hits);
  EXPECT_EQ(hits, (std::vector<uint32_t>{0, 1}));
  hits.clear();
  c.OverlappingChunks(*w, std::vector<int64_t>{3, 0},
                      std::vector<int64_t>{1, 6}, &hits);
  EXPECT_EQ(hits, std::vector<uint32_t>{1});
}

TEST(CompactMetadataTest, DuplicatesFollowPythonDicts) {
  Metadata md;
  md.state_dict_metadata.emplace_back("a", BytesStorageMetadata{});
  md.state_dict_metadata.emplace_back("w", Tensor({2}, {{{0}, {2}}}));
  md.state_dict_metadata.emplace_back("a", Tensor({1}, {{{0}, {1}}}));
  md.storage_data.push_back({{"w", true, {0}}, Info("f", 0, 1)});
  md.storage_data.push_back({{"a", true, {0}}, Info("f", 1, 1)});
  md.storage_data.push_back({{"w", true, {0}}, Info("g", 5, 7)});
  md.storage_data.push_back({{"zz", true, {9}}, Info("f", 2, 1)});  // orphan
  md.storage_data.push_back({{"zz", true, {9}}, Info("h", 3, 1)});  // dup
  const CompactMetadata c = CompactMetadata::FromMetadata(md);
  ASSERT_EQ(c.num_items(), 2u);  // "a" keeps its first position
  EXPECT_EQ(c.fqn(0), "a");
  EXPECT_TRUE(c.item(0).tensor);  // ... and its last value
  ASSERT_EQ(c.num_storage(), 3u);
  EXPECT_EQ(c.relative_path(c.storage(0)), "g");  // first position, last value
  EXPECT_EQ(c.storage(0).offset, 5u);
  EXPECT_EQ(c.storage(2).item, CompactMetadata::kNone);
  EXPECT_EQ(c.relative_path(c.storage(2)), "h");
  EXPECT_EQ(c.FindStorage({"zz", true, {9}}), &c.storage(2));
  // The same through the plain model.
  Metadata plain = md;
  plain.BuildIndex();
  for (size_t k = 0; k < c.num_storage(); ++k) {
    const StorageInfo* info = plain.FindStorage(c.Key(c.storage(k)));
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(*info, c.Info(c.storage(k)));
  }
}

TEST(CompactMetadataTest, ChunksSharingOffsetsShareTheirEntry) {
  // Empty shards can have the offsets of another chunk; DCP's dict then
  // holds one entry for both.
  Metadata md;
  md.state_dict_metadata.emplace_back(
      "w",
      Tensor({4, 2}, {{{0, 0}, {4, 2}}, {{0, 0}, {0, 2}}, {{4, 0}, {0, 2}}}));
  md.storage_data.push_back({{"w", true, {0, 0}}, Info("f", 0, 9)});
  md.storage_data.push_back({{"w", true, {4, 0}}, Info("f", 9, 9)});
  md.storage_data.push_back({{"w", true, {0, 0}}, Info("f", 18, 9)});
  const CompactMetadata c = CompactMetadata::FromMetadata(md);
  ASSERT_EQ(c.num_storage(), 2u);
  EXPECT_EQ(c.chunk_storage(0, 0), c.chunk_storage(0, 1));
  EXPECT_EQ(c.chunk_storage(0, 0)->offset, 18u);
  EXPECT_EQ(c.chunk_storage(0, 2)->offset, 9u);
}

TEST(CompactMetadataTest, IrregularChunksSurvive) {
  Metadata md;
  md.state_dict_metadata.emplace_back(
      "w", Tensor({4, 6}, {{{0, 0}, {2, 6}}, {{2}, {2, 6, 1}}}));
  md.storage_data.push_back({{"w", true, {2}}, Info("f", 0, 1)});
  const CompactMetadata c = CompactMetadata::FromMetadata(md);
  EXPECT_EQ(c.ToMetadata().state_dict_metadata, md.state_dict_metadata);
  ASSERT_NE(c.chunk_storage(0, 1), nullptr);
  std::vector<uint32_t> hits;
  c.OverlappingChunks(0, std::vector<int64_t>{0, 0}, std::vector<int64_t>{4, 6},
                      &hits);
  EXPECT_EQ(hits, std::vector<uint32_t>{0});  // the odd chunk never overlaps
}

// Random shardings (row bands, grids, shuffled orders, empty chunks) and
// random boxes: OverlappingChunks equals a scan of every chunk.
TEST(CompactMetadataTest, OverlappingChunksMatchesAScan) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int iter = 0; iter < 300; ++iter) {
    const int nd = static_cast<int>(uniform(1, 3));
    std::vector<int64_t> shape(nd);
    for (auto& s : shape) s = uniform(1, 40);
    // Split each dimension into 1..5 intervals (some empty): a grid.
    std::vector<std::vector<int64_t>> cuts(nd);
    for (int d = 0; d < nd; ++d) {
      cuts[d] = {0, shape[d]};
      for (int k = uniform(0, 4); k > 0; --k)
        cuts[d].push_back(uniform(0, shape[d]));
      std::sort(cuts[d].begin(), cuts[d].end());
    }
    std::vector<ChunkStorageMetadata> chunks;
    std::vector<size_t> idx(nd, 0);
    while (true) {
      ChunkStorageMetadata c;
      for (int d = 0; d < nd; ++d) {
        c.offsets.push_back(cuts[d][idx[d]]);
        c.sizes.push_back(cuts[d][idx[d] + 1] - cuts[d][idx[d]]);
      }
      chunks.push_back(std::move(c));
      int d = 0;
      while (d < nd && ++idx[d] + 1 == cuts[d].size()) idx[d++] = 0;
      if (d == nd) break;
    }
    std::shuffle(chunks.begin(), chunks.end(), rng);
    Metadata md;
    md.state_dict_metadata.emplace_back("t", Tensor(shape, chunks));
    const CompactMetadata c = CompactMetadata::FromMetadata(md);
    for (int q = 0; q < 20; ++q) {
      std::vector<int64_t> off(nd), size(nd);
      for (int d = 0; d < nd; ++d) {
        off[d] = uniform(0, shape[d]);
        size[d] = uniform(0, shape[d] - off[d]);
      }
      std::vector<uint32_t> want;
      for (uint32_t j = 0; j < chunks.size(); ++j) {
        // As the reader plans (dcp-format.md §5.3): start < end in every
        // dimension (a zero-length dimension never overlaps).
        bool overlap = true;
        for (int d = 0; d < nd; ++d) {
          const int64_t start = std::max(off[d], chunks[j].offsets[d]);
          const int64_t end = std::min(
              off[d] + size[d], chunks[j].offsets[d] + chunks[j].sizes[d]);
          overlap = overlap && start < end;
        }
        if (overlap) want.push_back(j);
      }
      std::vector<uint32_t> got;
      c.OverlappingChunks(0, off, size, &got);
      ASSERT_EQ(got, want) << "seed " << seed << " iteration " << iter;
    }
  }
}

// Eight threads ask for the box index of the same large tensor at once: one
// builds it (≈ 200 k chunks, milliseconds), the others wait for it inside
// the once-flag. Under TSan this is the case CI caught: the waiters' reads
// of the index were not ordered after its construction.
TEST(CompactMetadataTest, BoxIndexBuiltOnceForConcurrentCallers) {
  constexpr int64_t kRows = 200000;
  std::vector<ChunkStorageMetadata> chunks;
  chunks.reserve(kRows);
  for (int64_t r = kRows - 1; r >= 0; --r) chunks.push_back({{r, 0}, {1, 4}});
  Metadata md;
  md.state_dict_metadata.emplace_back("t", Tensor({kRows, 4}, chunks));
  const CompactMetadata c = CompactMetadata::FromMetadata(md);
  std::vector<std::vector<uint32_t>> got(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&c, &got, t] {
      const std::vector<int64_t> off = {1000 * t, 1};
      const std::vector<int64_t> size = {3, 2};
      c.OverlappingChunks(0, off, size, &got[t]);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) {
    // Chunk j covers row kRows - 1 - j.
    std::vector<uint32_t> want;
    for (int64_t r = 1000 * t; r < 1000 * t + 3; ++r) {
      want.push_back(static_cast<uint32_t>(kRows - 1 - r));
    }
    std::sort(got[t].begin(), got[t].end());
    std::sort(want.begin(), want.end());
    EXPECT_EQ(got[t], want) << "thread " << t;
  }
}

TEST(CompactMetadataTest, DecodedFromAPickle) {
  const Metadata md = Example();
  ASSERT_OK_AND_ASSIGN(std::string bytes, EncodeMetadata(md));
  ASSERT_OK_AND_ASSIGN(CompactMetadata c, DecodeCompactMetadata(bytes));
  const Metadata back = c.ToMetadata();
  EXPECT_EQ(back.state_dict_metadata, md.state_dict_metadata);
  EXPECT_EQ(back.storage_data, md.storage_data);
  // The encoder writes the index hints: every entry resolved.
  for (size_t k = 0; k < c.num_storage(); ++k) {
    EXPECT_NE(c.storage(k).item, CompactMetadata::kNone);
  }
  DecodeStats stats;
  ASSERT_OK(DecodeCompactMetadata(bytes, {}, &stats).status());
  EXPECT_EQ(stats.input_bytes, bytes.size());
  EXPECT_GT(stats.allocated_bytes, 0u);
}

}  // namespace
}  // namespace ckptd::format
