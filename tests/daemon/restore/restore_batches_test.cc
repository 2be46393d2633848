// Copyright 2026 The ckptd Authors.
//
// The pure parts of Client::Restore (client/restore_batches.h), no daemon:
// local validation of the destinations, the split of boxes larger than a
// batch, the packing into batches (identical for identical wants: the
// group's batches must match), and the copy out of the arena into strided
// destinations.
#include "client/restore_batches.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "client/batching.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::client::internal {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

uint64_t Numel(const std::vector<int64_t>& sizes) {
  uint64_t n = 1;
  for (const int64_t s : sizes) n *= static_cast<uint64_t>(s);
  return n;
}

RestoreWant Want(std::vector<int64_t> sizes, size_t elem_size = 4,
                 std::string fqn = "w") {
  RestoreWant w;
  w.dtype = elem_size == 4 ? "float32" : "other";
  w.elem_size = elem_size;
  w.nbytes = Numel(sizes) * elem_size;
  w.sizes = std::move(sizes);
  w.request_bytes = fqn.size() + 64;
  return w;
}

// Every element of the box is covered exactly once by the sub-boxes, each
// of which fits `limit`.
void ExpectPartition(const std::vector<int64_t>& sizes, size_t es,
                     uint64_t limit, const std::vector<SubBox>& parts) {
  const size_t n = sizes.size();
  std::vector<int> hits(Numel(sizes), 0);
  for (const SubBox& p : parts) {
    ASSERT_EQ(p.offsets.size(), n);
    ASSERT_EQ(p.sizes.size(), n);
    if (Numel(sizes) > 0) {
      EXPECT_LE(Numel(p.sizes) * es, limit);
    }
    // Walk the sub-box's elements in C order.
    const uint64_t count = Numel(p.sizes);
    for (uint64_t e = 0; e < count; ++e) {
      uint64_t rem = e, flat = 0, stride = 1;
      std::vector<int64_t> idx(n);
      for (size_t k = n; k-- > 0;) {
        idx[k] = static_cast<int64_t>(rem % static_cast<uint64_t>(p.sizes[k]));
        rem /= static_cast<uint64_t>(p.sizes[k]);
      }
      for (size_t k = n; k-- > 0;) {
        const int64_t g = p.offsets[k] + idx[k];
        ASSERT_LT(g, sizes[k]);
        flat += static_cast<uint64_t>(g) * stride;
        stride *= static_cast<uint64_t>(sizes[k]);
      }
      ++hits[flat];
    }
  }
  for (size_t i = 0; i < hits.size(); ++i) {
    ASSERT_EQ(hits[i], 1) << "element " << i;
  }
}

TEST(SplitBoxTest, FittingBoxIsWhole) {
  const auto parts = SplitBox({4, 6}, 4, 96);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0], (SubBox{{0, 0}, {4, 6}}));
}

TEST(SplitBoxTest, RowsAlongTheFirstDimension) {
  // 10 rows of 24 bytes, 50 bytes per piece: 2 rows each.
  const auto parts = SplitBox({10, 6}, 4, 50);
  ASSERT_EQ(parts.size(), 5u);
  for (size_t i = 0; i < parts.size(); ++i) {
    EXPECT_EQ(parts[i], (SubBox{{static_cast<int64_t>(2 * i), 0}, {2, 6}}));
  }
  ExpectPartition({10, 6}, 4, 50, parts);
  // A remainder: 7 rows, 3 per piece.
  EXPECT_EQ(SplitBox({7, 2}, 4, 24),
            (std::vector<SubBox>{
                {{0, 0}, {3, 2}}, {{3, 0}, {3, 2}}, {{6, 0}, {1, 2}}}));
}

TEST(SplitBoxTest, LeadingOnesAreSkipped) {
  const auto parts = SplitBox({1, 1, 8, 2}, 8, 32);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[1], (SubBox{{0, 0, 2, 0}, {1, 1, 2, 2}}));
  ExpectPartition({1, 1, 8, 2}, 8, 32, parts);
}

TEST(SplitBoxTest, RowTooLargeIsSplitAlongLaterDimensions) {
  // One row is 3 x 10 floats = 120 bytes > 48: each row is cut into runs of
  // its second dimension (10 floats = 40 bytes each, one per piece).
  const auto parts = SplitBox({2, 3, 10}, 4, 48);
  ASSERT_EQ(parts.size(), 6u);
  EXPECT_EQ(parts[0], (SubBox{{0, 0, 0}, {1, 1, 10}}));
  EXPECT_EQ(parts[5], (SubBox{{1, 2, 0}, {1, 1, 10}}));
  ExpectPartition({2, 3, 10}, 4, 48, parts);
  // Down to single elements.
  const auto tiny = SplitBox({3, 5}, 8, 8);
  EXPECT_EQ(tiny.size(), 15u);
  ExpectPartition({3, 5}, 8, 8, tiny);
}

TEST(SplitBoxTest, ScalarsAndEmptyBoxesAreOnePiece) {
  EXPECT_EQ(SplitBox({}, 8, 8), (std::vector<SubBox>{{{}, {}}}));
  EXPECT_EQ(SplitBox({0, 100}, 4, 64),
            (std::vector<SubBox>{{{0, 0}, {0, 100}}}));
  EXPECT_EQ(SplitBox({100, 0}, 4, 64),
            (std::vector<SubBox>{{{0, 0}, {100, 0}}}));
}

TEST(SplitBoxTest, RandomBoxesArePartitioned) {
  const uint64_t seed = ::ckptd::testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < 300; ++iter) {
    const size_t n = rng() % 4;
    std::vector<int64_t> sizes(n);
    for (auto& s : sizes) s = 1 + static_cast<int64_t>(rng() % 7);
    const size_t es = size_t{1} << (rng() % 4);
    const uint64_t limit = es * (1 + rng() % 40);
    const auto parts = SplitBox(sizes, es, limit);
    ExpectPartition(sizes, es, limit, parts);
    if (HasFailure()) {
      ADD_FAILURE() << "iteration " << iter << " seed " << seed;
      return;
    }
  }
}

TEST(PlanRestoreBatchesTest, SmallWantsAreOneAlignedBatch) {
  const std::vector<RestoreWant> wants = {Want({3}), Want({}), Want({0, 5}),
                                          Want({10})};
  const std::vector<uint64_t> caps = {5, 0};
  const std::vector<std::string> names = {"b1", "b2"};
  ASSERT_OK_AND_ASSIGN(auto batches,
                       PlanRestoreBatches(wants, caps, names, 1024));
  ASSERT_EQ(batches.size(), 1u);
  const RestoreBatch& b = batches[0];
  ASSERT_EQ(b.boxes.size(), 4u);
  EXPECT_EQ(b.boxes[0].arena_offset, 0u);
  EXPECT_EQ(b.boxes[0].nbytes, 12u);
  EXPECT_EQ(b.boxes[1].arena_offset, 64u);  // the 0-d tensor: one element
  EXPECT_EQ(b.boxes[1].nbytes, 4u);
  EXPECT_EQ(b.boxes[2].nbytes, 0u);  // empty: sent, no space
  EXPECT_EQ(b.boxes[2].arena_offset, 0u);
  EXPECT_EQ(b.boxes[3].arena_offset, 128u);
  ASSERT_EQ(b.bytes_items.size(), 2u);
  EXPECT_EQ(b.bytes_items[0], (RestoreBytesSlot{0, 5, 192}));
  EXPECT_EQ(b.bytes_items[1], (RestoreBytesSlot{1, 0, 0}));
  EXPECT_EQ(b.arena_end, 197u);
  EXPECT_EQ(b.bytes, 12u + 4 + 40 + 5);
}

TEST(PlanRestoreBatchesTest, NothingIsOneEmptyBatch) {
  ASSERT_OK_AND_ASSIGN(auto batches, PlanRestoreBatches({}, {}, {}, 1024));
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_TRUE(batches[0].boxes.empty());
  EXPECT_TRUE(batches[0].bytes_items.empty());
  EXPECT_EQ(RestoreArenaBytes(batches), kArenaGranule);
}

TEST(PlanRestoreBatchesTest, LargeBoxesAreSplitAcrossBatches) {
  // 1000 x 100 floats = 400 000 bytes through batches of 64 KiB.
  const uint64_t limit = 64 << 10;
  const std::vector<RestoreWant> wants = {Want({1000, 100}), Want({7})};
  ASSERT_OK_AND_ASSIGN(auto batches, PlanRestoreBatches(wants, {}, {}, limit));
  uint64_t total = 0;
  int64_t next_row = 0;
  for (const RestoreBatch& b : batches) {
    EXPECT_LE(b.arena_end, limit);
    EXPECT_FALSE(b.boxes.empty());
    uint64_t prev_end = 0;
    for (const RestorePiece& p : b.boxes) {
      EXPECT_EQ(p.arena_offset % kRestoreAlignment, 0u);
      EXPECT_GE(p.arena_offset, prev_end);
      prev_end = p.arena_offset + p.nbytes;
      total += p.nbytes;
      if (p.tensor == 0) {
        EXPECT_EQ(p.box.offsets[0], next_row);  // rows in order
        next_row += p.box.sizes[0];
        EXPECT_EQ(p.box.sizes[1], 100);
      }
    }
  }
  EXPECT_EQ(next_row, 1000);
  EXPECT_EQ(total, 400000u + 28);
  EXPECT_EQ(batches.size(), 7u);  // 163 rows (65 200 bytes) per batch
  EXPECT_EQ(RestoreArenaBytes(batches), kArenaGranule);
}

TEST(PlanRestoreBatchesTest, SameWantsGiveTheSameBatches) {
  // What every rank of a group computes on its own must agree.
  const std::vector<RestoreWant> wants = {Want({300, 70}), Want({5, 5, 5}, 8),
                                          Want({1 << 14})};
  const std::vector<uint64_t> caps = {100, 70000, 3};
  const std::vector<std::string> names = {"a", "b", "c"};
  ASSERT_OK_AND_ASSIGN(auto one,
                       PlanRestoreBatches(wants, caps, names, 32 << 10));
  ASSERT_OK_AND_ASSIGN(auto two,
                       PlanRestoreBatches(wants, caps, names, 32 << 10));
  EXPECT_EQ(one, two);
  EXPECT_GT(one.size(), 3u);
}

TEST(PlanRestoreBatchesTest, OversizedBytesItemGetsABatchOfItsOwn) {
  const std::vector<RestoreWant> wants = {Want({10})};
  const std::vector<uint64_t> caps = {10, 5000, 20};
  const std::vector<std::string> names = {"a", "big", "c"};
  ASSERT_OK_AND_ASSIGN(auto batches,
                       PlanRestoreBatches(wants, caps, names, 1024));
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0].boxes.size(), 1u);
  EXPECT_EQ(batches[0].bytes_items.size(), 1u);
  ASSERT_EQ(batches[1].bytes_items.size(), 1u);
  EXPECT_EQ(batches[1].bytes_items[0], (RestoreBytesSlot{1, 5000, 0}));
  EXPECT_EQ(batches[1].arena_end, 5000u);
  EXPECT_EQ(batches[2].bytes_items[0], (RestoreBytesSlot{2, 20, 0}));
}

TEST(PlanRestoreBatchesTest, RequestSizeClosesABatch) {
  std::vector<RestoreWant> wants;
  for (int i = 0; i < 10; ++i) wants.push_back(Want({1}, 4, "x"));
  // Each want's description is 65 bytes: 3 fit in 200.
  ASSERT_OK_AND_ASSIGN(
      auto batches,
      PlanRestoreBatches(wants, {}, {}, 1 << 20, kRestoreAlignment, 200));
  ASSERT_EQ(batches.size(), 4u);
  EXPECT_EQ(batches[0].boxes.size(), 3u);
  EXPECT_EQ(batches[3].boxes.size(), 1u);
}

TEST(PlanRestoreBatchesTest, Errors) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      PlanRestoreBatches({}, {}, {}, kMinRestoreBatchBytes - 1).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      PlanRestoreBatches({}, {}, {}, 1024, 3).status()));
  const std::vector<uint64_t> caps = {1};
  EXPECT_TRUE(
      absl::IsInvalidArgument(PlanRestoreBatches({}, caps, {}, 1024).status()));
}

TEST(ValidateRestoreTest, GoodAndBadDestinations) {
  float buf[12];
  RestoreTensor t;
  t.fqn = "m.w";
  t.dtype = "float";  // an alias
  t.offsets = {2, 0};
  t.sizes = {3, 4};
  t.data = buf;
  ASSERT_OK_AND_ASSIGN(auto wants,
                       ValidateRestoreTensors(std::vector<RestoreTensor>{t}));
  EXPECT_EQ(wants[0].dtype, "float32");
  EXPECT_EQ(wants[0].nbytes, 48u);
  EXPECT_EQ(wants[0].strides, (std::vector<int64_t>{4, 1}));

  auto expect_bad = [](RestoreTensor bad, const std::string& what) {
    auto r = ValidateRestoreTensors(std::vector<RestoreTensor>{bad});
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << what;
    EXPECT_TRUE(absl::StrContains(r.status().message(), what))
        << r.status() << " lacks " << what;
  };
  RestoreTensor bad = t;
  bad.fqn = "";
  expect_bad(bad, "empty fqn");
  bad = t;
  bad.dtype = "float33";
  expect_bad(bad, "tensor 0 ('m.w'): unknown dtype 'float33'");
  bad = t;
  bad.offsets = {0};
  expect_bad(bad, "same number of dimensions");
  bad = t;
  bad.sizes = {3, -4};
  expect_bad(bad, "negative value");
  bad = t;
  bad.strides = {1, -1};
  expect_bad(bad, "negative value");
  bad = t;
  bad.data = nullptr;
  expect_bad(bad, "data is null for 48 bytes");
  bad.sizes = {0, 4};  // no elements: null is fine
  EXPECT_OK(ValidateRestoreTensors(std::vector<RestoreTensor>{bad}));
  bad = t;
  bad.sizes = {int64_t{1} << 40, int64_t{1} << 40};
  expect_bad(bad, "overflow");

  std::vector<RestoreBytesItem> items(1);
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateRestoreBytes(items)));
  items[0].fqn = "step";
  EXPECT_OK(ValidateRestoreBytes(items));
}

// The global tensor's value at C-order index i.
float Value(uint64_t i) { return static_cast<float>(i) * 0.25f + 1.0f; }

// Fills the batch's boxes in `arena` the way the daemon would: each box C
// order, from the global tensor of `global` shape, box offsets relative to
// the destination at `dest_offsets`.
void FillLikeTheDaemon(const RestoreBatch& batch,
                       const std::vector<int64_t>& global,
                       const std::vector<int64_t>& dest_offsets, char* arena) {
  for (const RestorePiece& p : batch.boxes) {
    const size_t n = p.box.sizes.size();
    auto* out = reinterpret_cast<float*>(arena + p.arena_offset);
    for (uint64_t e = 0; e < Numel(p.box.sizes); ++e) {
      uint64_t rem = e, flat = 0, stride = 1;
      std::vector<int64_t> idx(n);
      for (size_t k = n; k-- > 0;) {
        idx[k] =
            static_cast<int64_t>(rem % static_cast<uint64_t>(p.box.sizes[k]));
        rem /= static_cast<uint64_t>(p.box.sizes[k]);
      }
      for (size_t k = n; k-- > 0;) {
        flat +=
            static_cast<uint64_t>(dest_offsets[k] + p.box.offsets[k] + idx[k]) *
            stride;
        stride *= static_cast<uint64_t>(global[k]);
      }
      out[e] = Value(flat);
    }
  }
}

// A transposed destination (strides {1, rows}) of box [off, off + sizes) of
// a global matrix, filled through many small batches, with 1 and 4 threads.
void CopyOutCase(int64_t rows, int64_t cols, uint64_t limit, int threads) {
  const std::vector<int64_t> global = {rows + 3, cols + 2};
  const std::vector<int64_t> off = {2, 1};
  std::vector<float> dest(static_cast<size_t>(rows * cols), -1.0f);
  RestoreTensor t;
  t.fqn = "w";
  t.dtype = "float32";
  t.offsets = off;
  t.sizes = {rows, cols};
  t.strides = {1, rows};  // column-major
  t.data = dest.data();
  const std::vector<RestoreTensor> tensors = {t};
  ASSERT_OK_AND_ASSIGN(auto wants, ValidateRestoreTensors(tensors));
  ASSERT_OK_AND_ASSIGN(auto batches, PlanRestoreBatches(wants, {}, {}, limit));
  std::vector<char> arena(RestoreArenaBytes(batches));
  for (const RestoreBatch& b : batches) {
    FillLikeTheDaemon(b, global, off, arena.data());
    CopyBatchOut(tensors, wants, b, arena.data(), threads);
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t flat =
          static_cast<uint64_t>((off[0] + r) * global[1] + off[1] + c);
      ASSERT_EQ(dest[static_cast<size_t>(r + c * rows)], Value(flat))
          << r << "," << c;
    }
  }
}

TEST(CopyBatchOutTest, StridedDestinationsThroughSmallBatches) {
  CopyOutCase(37, 11, 256, 1);  // rows split across batches
  CopyOutCase(5, 100, 128, 1);  // one row > a batch: split inside rows
}

TEST(CopyBatchOutTest, ThreadsSplitLargeBoxes) {
  CopyOutCase(1500, 1200, 8 * kMiB, 4);  // 7.2 MB: one batch, 4 threads
  CopyOutCase(1500, 1200, 3 * kMiB, 3);  // three batches
}

}  // namespace
}  // namespace ckptd::client::internal
