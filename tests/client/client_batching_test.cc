// Copyright 2026 The ckptd Authors.
//
// libckptd_client's local steps before any call to the daemon
// (client/batching.h): validation of items and of a multi-node ClusterSpec,
// batch planning through the arena, the arena's size, and the arena copy
// (strided gathers at arbitrary byte ranges, on one thread or several).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/batching.h"
#include "client/ckptd_client.h"
#include "gtest/gtest.h"
#include "tests/testing/save_items.h"
#include "tests/testing/test_util.h"

namespace ckptd::client {
namespace {

using ::ckptd::testing::Bytes;
using ::ckptd::testing::COrderBytes;
using ::ckptd::testing::kMiB;
using ::ckptd::testing::Tensor;
using internal::Batch;
using internal::Extent;
using internal::PlanBatches;

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

absl::Status Validate(const std::vector<SaveItem>& items,
                      uint32_t max_items = 0) {
  return internal::ValidateItems(items, max_items).status();
}

void ExpectInvalid(const std::vector<SaveItem>& items,
                   std::string_view needle) {
  const absl::Status s = Validate(items);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(absl::string_view(needle.data(), needle.size())),
            absl::string_view::npos)
      << s;
}

TEST(ValidateItemsTest, SizesOfGoodItems) {
  float f[12] = {};
  double scalar = 1;
  std::vector<SaveItem> items = {Tensor("w", {3, 4}, f), Bytes("obj", "hello"),
                                 Tensor("s", {}, &scalar, "double"),
                                 Tensor("empty", {0, 5}, nullptr, "bfloat16")};
  items.push_back(Tensor("chunk", {10, 4}, f));
  items.back().chunk_offsets = {7, 0};
  items.back().chunk_sizes = {3, 4};
  ASSERT_OK_AND_ASSIGN(auto p, internal::ValidateItems(items, 0));
  ASSERT_EQ(p.size(), 5u);
  EXPECT_EQ(p[0].nbytes, 48u);
  EXPECT_EQ(p[0].dtype, "float32");
  EXPECT_TRUE(p[0].contiguous);
  EXPECT_EQ(p[1].nbytes, 5u);
  EXPECT_EQ(p[2].nbytes, 8u);
  EXPECT_EQ(p[2].dtype, "float64") << "aliases are normalized";
  EXPECT_EQ(p[3].nbytes, 0u);
  EXPECT_EQ(p[4].nbytes, 48u);
}

TEST(ValidateItemsTest, Contiguity) {
  float f[12] = {};
  std::vector<SaveItem> items = {Tensor("c", {3, 4}, f), Tensor("t", {4, 3}, f),
                                 Tensor("one", {1, 4}, f)};
  items[0].strides = {4, 1};
  items[1].strides = {1, 4};   // a transpose
  items[2].strides = {99, 1};  // size-1 dims may have any stride
  ASSERT_OK_AND_ASSIGN(auto p, internal::ValidateItems(items, 0));
  EXPECT_TRUE(p[0].contiguous);
  EXPECT_FALSE(p[1].contiguous);
  EXPECT_TRUE(p[2].contiguous);
}

TEST(ValidateItemsTest, Errors) {
  float f[16] = {};
  ExpectInvalid({Tensor("w", {4}, f, "floot32")}, "unknown dtype 'floot32'");
  ExpectInvalid({Tensor("w", {4}, nullptr)}, "data is null");
  ExpectInvalid({Tensor("", {4}, f)}, "empty fqn");
  ExpectInvalid({Tensor(std::string(4097, 'a'), {4}, f)}, "fqn of 4097 bytes");
  {
    auto it = Tensor("w", {4, 4}, f);
    it.chunk_sizes = {4};
    ExpectInvalid({it}, "same number of dimensions");
  }
  {
    auto it = Tensor("w", {4, 4}, f);
    it.strides = {1};
    ExpectInvalid({it}, "strides [1] have 1 dimensions");
  }
  {
    auto it = Tensor("w", {4, 4}, f);
    it.strides = {-4, 1};
    ExpectInvalid({it}, "negative stride");
  }
  {
    auto it = Tensor("w", {4, 4}, f);
    it.chunk_offsets = {2, 0};
    ExpectInvalid({it}, "outside global_shape [4, 4] in dimension 0");
  }
  {
    auto it = Tensor("w", {4, -1}, f);
    ExpectInvalid({it}, "negative value");
  }
  {
    auto it = Tensor("w", std::vector<int64_t>(65, 1), f);
    ExpectInvalid({it}, "65 dimensions");
  }
  {
    const int64_t big = int64_t{1} << 40;
    auto it = Tensor("w", {big, big}, f);
    ExpectInvalid({it}, "overflow");
  }
  {
    const int64_t big = int64_t{1} << 61;
    auto it = Tensor("w", {big}, f, "float64");  // 2^64 bytes
    ExpectInvalid({it}, "byte count overflows");
  }
  {
    auto it = Tensor("w", {4, 4}, f);
    it.strides = {int64_t{1} << 62, 1};
    ExpectInvalid({it}, "overflow the address range");
  }
  {
    auto it = Bytes("b", "xyz");
    it.global_shape = {3};
    ExpectInvalid({it}, "bytes item has no shape");
  }
  // The message names the index and fqn of the bad item.
  ExpectInvalid({Tensor("ok", {4}, f), Tensor("bad", {4}, f, "nope")},
                "item 1 ('bad')");
}

TEST(ValidateItemsTest, MaxItems) {
  float f[4] = {};
  std::vector<SaveItem> items(3, Tensor("w", {4}, f));
  EXPECT_OK(Validate(items, 3));
  EXPECT_OK(Validate(items, 0));
  EXPECT_EQ(Validate(items, 2).code(), absl::StatusCode::kResourceExhausted);
}

// The single-node default, and a valid multi-node spec for rank 2 of 8.
TEST(ValidateClusterTest, GoodSpecs) {
  EXPECT_OK(internal::ValidateCluster(ClusterSpec{}, 0, 1));
  EXPECT_TRUE(internal::IsSingleNode(ClusterSpec{}));
  const ClusterSpec two{
      .coordinator = "node0:7070", .local_ranks = {3, 2, 0, 1}, .num_nodes = 2};
  EXPECT_OK(internal::ValidateCluster(two, 2, 8));
  EXPECT_FALSE(internal::IsSingleNode(two));
  // One node that names its ranks (sent, though the daemon ignores it).
  const ClusterSpec one{.local_ranks = {0, 1}, .num_nodes = 1};
  EXPECT_OK(internal::ValidateCluster(one, 1, 2));
  EXPECT_FALSE(internal::IsSingleNode(one));
  EXPECT_TRUE(internal::IsSingleNode(ClusterSpec{.num_nodes = 0}));
}

void ExpectClusterInvalid(const ClusterSpec& cluster, int rank, int world,
                          std::string_view needle) {
  const absl::Status s = internal::ValidateCluster(cluster, rank, world);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(absl::string_view(needle.data(), needle.size())),
            absl::string_view::npos)
      << s;
}

TEST(ValidateClusterTest, Errors) {
  ExpectClusterInvalid({.num_nodes = 0}, 0, 4, "num_nodes 0 must be >= 1");
  ExpectClusterInvalid({.num_nodes = -3}, 0, 4, "num_nodes -3 must be >= 1");
  ExpectClusterInvalid(
      {.coordinator = "a:1", .local_ranks = {0}, .num_nodes = 5}, 0, 4,
      "num_nodes 5 exceeds world_size 4");
  ExpectClusterInvalid({.local_ranks = {0, 1}, .num_nodes = 2}, 0, 4,
                       "coordinator is empty with num_nodes 2");
  ExpectClusterInvalid({.coordinator = "a:1", .num_nodes = 2}, 0, 4,
                       "local_ranks is empty with num_nodes 2");
  ExpectClusterInvalid(
      {.coordinator = "a:1", .local_ranks = {0, 1, 1}, .num_nodes = 2}, 0, 4,
      "local rank 1 appears more than once");
  ExpectClusterInvalid(
      {.coordinator = "a:1", .local_ranks = {0, 4}, .num_nodes = 2}, 0, 4,
      "local rank 4 is not in [0, world_size) with world_size 4");
  ExpectClusterInvalid(
      {.coordinator = "a:1", .local_ranks = {-1, 0}, .num_nodes = 2}, 0, 4,
      "local rank -1 is not in [0, world_size)");
  ExpectClusterInvalid(
      {.coordinator = "a:1", .local_ranks = {2, 3}, .num_nodes = 2}, 1, 4,
      "local_ranks [2, 3] does not hold this rank (1)");
  // Single node with a list: the list is still checked.
  ExpectClusterInvalid({.local_ranks = {1}}, 0, 2, "does not hold this rank");
  // Every message names the field's struct.
  ExpectClusterInvalid({.num_nodes = 0}, 0, 1, "cluster: ");
}

// ---------------------------------------------------------------------------
// Batch planning
// ---------------------------------------------------------------------------

// Checks the protocol's invariants of a plan and that it covers every byte.
void CheckPlan(const std::vector<uint64_t>& sizes, uint64_t capacity,
               uint64_t alignment, const std::vector<Batch>& batches) {
  ASSERT_FALSE(batches.empty());
  uint32_t item = 0;
  uint64_t off = 0;
  auto skip_empty = [&] {
    while (item < sizes.size() && off == sizes[item]) {
      ++item;
      off = 0;
    }
  };
  for (size_t b = 0; b < batches.size(); ++b) {
    const Batch& batch = batches[b];
    if (batches.size() > 1) {
      EXPECT_FALSE(batch.extents.empty()) << "batch " << b;
    }
    uint64_t bytes = 0, end = 0, prev_end = 0;
    for (size_t x = 0; x < batch.extents.size(); ++x) {
      const Extent& e = batch.extents[x];
      skip_empty();
      ASSERT_LT(item, sizes.size());
      EXPECT_EQ(e.item, item) << "batch " << b << " extent " << x;
      EXPECT_EQ(e.item_offset, off) << "batch " << b << " extent " << x;
      EXPECT_GT(e.length, 0u);
      EXPECT_LE(e.item_offset + e.length, sizes[e.item]);
      EXPECT_GE(e.arena_offset, prev_end) << "extents overlap in the arena";
      EXPECT_LE(e.arena_offset + e.length, capacity);
      if (e.item_offset == 0 || x > 0) {
        EXPECT_EQ(e.arena_offset % alignment, 0u);
      }
      off += e.length;
      prev_end = e.arena_offset + e.length;
      bytes += e.length;
      end = std::max(end, prev_end);
    }
    EXPECT_EQ(batch.bytes, bytes);
    EXPECT_EQ(batch.arena_end, end);
  }
  skip_empty();
  EXPECT_EQ(item, sizes.size()) << "not every byte was placed";
}

TEST(PlanBatchesTest, AllFitInOneBatch) {
  const std::vector<uint64_t> sizes = {10, 20, 30};
  ASSERT_OK_AND_ASSIGN(auto b, PlanBatches(sizes, 100));
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].extents, (std::vector<Extent>{
                              {0, 0, 0, 10}, {1, 0, 10, 20}, {2, 0, 30, 30}}));
  EXPECT_EQ(b[0].bytes, 60u);
  EXPECT_EQ(b[0].arena_end, 60u);
}

TEST(PlanBatchesTest, ExactFit) {
  const std::vector<uint64_t> sizes = {40, 60};
  ASSERT_OK_AND_ASSIGN(auto b, PlanBatches(sizes, 100));
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].arena_end, 100u);
  // Exactly two arenas' worth: no empty third batch.
  const std::vector<uint64_t> two = {100, 100};
  ASSERT_OK_AND_ASSIGN(auto b2, PlanBatches(two, 100));
  ASSERT_EQ(b2.size(), 2u);
  EXPECT_EQ(b2[0].extents, (std::vector<Extent>{{0, 0, 0, 100}}));
  EXPECT_EQ(b2[1].extents, (std::vector<Extent>{{1, 0, 0, 100}}));
  const std::vector<uint64_t> split = {150, 50};
  ASSERT_OK_AND_ASSIGN(auto b3, PlanBatches(split, 100));
  ASSERT_EQ(b3.size(), 2u);
  EXPECT_EQ(b3[0].extents, (std::vector<Extent>{{0, 0, 0, 100}}));
  EXPECT_EQ(b3[1].extents,
            (std::vector<Extent>{{0, 100, 0, 50}, {1, 0, 50, 50}}));
}

TEST(PlanBatchesTest, SplitsItemsAtTheArenaEnd) {
  const std::vector<uint64_t> sizes = {70, 70, 250};
  ASSERT_OK_AND_ASSIGN(auto b, PlanBatches(sizes, 100));
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0].extents, (std::vector<Extent>{{0, 0, 0, 70}, {1, 0, 70, 30}}));
  EXPECT_EQ(b[1].extents,
            (std::vector<Extent>{{1, 30, 0, 40}, {2, 0, 40, 60}}));
  EXPECT_EQ(b[2].extents, (std::vector<Extent>{{2, 60, 0, 100}}));
  EXPECT_EQ(b[3].extents, (std::vector<Extent>{{2, 160, 0, 90}}));
  CheckPlan(sizes, 100, 1, b);
}

TEST(PlanBatchesTest, ZeroByteItemsGetNoExtent) {
  const std::vector<uint64_t> sizes = {0, 5, 0, 0, 7, 0};
  ASSERT_OK_AND_ASSIGN(auto b, PlanBatches(sizes, 100));
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].extents, (std::vector<Extent>{{1, 0, 0, 5}, {4, 0, 5, 7}}));
  const std::vector<uint64_t> none = {0, 0};
  ASSERT_OK_AND_ASSIGN(auto e, PlanBatches(none, 100));
  ASSERT_EQ(e.size(), 1u) << "one (empty) batch carries the index";
  EXPECT_TRUE(e[0].extents.empty());
  ASSERT_OK_AND_ASSIGN(auto nothing, PlanBatches({}, 100));
  ASSERT_EQ(nothing.size(), 1u);
  EXPECT_TRUE(nothing[0].extents.empty());
  // No bytes: capacity 0 is fine.
  EXPECT_OK(PlanBatches(none, 0));
}

TEST(PlanBatchesTest, Alignment) {
  const std::vector<uint64_t> sizes = {1, 3, 64, 100};
  ASSERT_OK_AND_ASSIGN(auto b, PlanBatches(sizes, 256, 64));
  ASSERT_EQ(b.size(), 2u)
      << "the last item does not fit after alignment: split";
  EXPECT_EQ(
      b[0].extents,
      (std::vector<Extent>{
          {0, 0, 0, 1}, {1, 0, 64, 3}, {2, 0, 128, 64}, {3, 0, 192, 64}}));
  EXPECT_EQ(b[0].arena_end, 256u);
  EXPECT_EQ(b[0].bytes, 1u + 3 + 64 + 64);
  EXPECT_EQ(b[1].extents, (std::vector<Extent>{{3, 64, 0, 36}}));
  ASSERT_OK_AND_ASSIGN(auto b2, PlanBatches(sizes, 256, 64));
  CheckPlan(sizes, 256, 64, b2);
  // Aligned start beyond the capacity: the next item starts a new batch.
  const std::vector<uint64_t> tail = {250, 10};
  ASSERT_OK_AND_ASSIGN(auto b3, PlanBatches(tail, 256, 64));
  ASSERT_EQ(b3.size(), 2u);
  EXPECT_EQ(b3[1].extents, (std::vector<Extent>{{1, 0, 0, 10}}));
}

TEST(PlanBatchesTest, Errors) {
  const std::vector<uint64_t> sizes = {1};
  EXPECT_EQ(PlanBatches(sizes, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanBatches(sizes, 10, 3).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanBatches(sizes, 10, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const uint64_t big = uint64_t{1} << 63;
  const std::vector<uint64_t> overflow = {big, big};
  EXPECT_EQ(PlanBatches(overflow, 10).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlanBatchesTest, RandomPlansKeepInvariants) {
  std::mt19937_64 rng(::ckptd::testing::TestSeed());
  for (int round = 0; round < 300; ++round) {
    std::vector<uint64_t> sizes(rng() % 20);
    for (auto& s : sizes) {
      const int kind = static_cast<int>(rng() % 4);
      s = kind == 0 ? 0 : kind == 1 ? rng() % 16 : rng() % 5000;
    }
    const uint64_t alignment = uint64_t{1} << (rng() % 8);
    const uint64_t capacity = alignment + rng() % 3000;
    ASSERT_OK_AND_ASSIGN(auto b, PlanBatches(sizes, capacity, alignment));
    SCOPED_TRACE(absl::StrCat("round ", round, " capacity ", capacity,
                              " alignment ", alignment));
    CheckPlan(sizes, capacity, alignment, b);
    // Every batch but the last is worth filling: the next batch's first
    // extent could not have started in the previous one.
    for (size_t k = 0; k + 1 < b.size(); ++k) {
      const uint64_t end = b[k].arena_end;
      const uint64_t next_start = (end + alignment - 1) / alignment * alignment;
      const Extent& first = b[k + 1].extents.front();
      EXPECT_TRUE(first.item_offset != 0 || next_start >= capacity)
          << "batch " << k << " ended at " << end << " but item " << first.item
          << " started a new batch";
    }
  }
}

TEST(ArenaSizeTest, RoundsAndCaps) {
  using internal::ArenaSizeFor;
  EXPECT_EQ(ArenaSizeFor(0, 0, 0), 2 * kMiB);
  EXPECT_EQ(ArenaSizeFor(1, 0, 0), 2 * kMiB);
  EXPECT_EQ(ArenaSizeFor(2 * kMiB, 0, 0), 2 * kMiB);
  EXPECT_EQ(ArenaSizeFor(2 * kMiB + 1, 0, 0), 4 * kMiB);
  EXPECT_EQ(ArenaSizeFor(100 * kMiB, 3 * kMiB, 0), 4 * kMiB);
  EXPECT_EQ(ArenaSizeFor(100 * kMiB, 64 * kMiB, 16 * kMiB), 16 * kMiB);
  EXPECT_EQ(ArenaSizeFor(5 * kMiB, 64 * kMiB, 0), 6 * kMiB);
  EXPECT_EQ(internal::SpanBytes(std::vector<uint64_t>{1, 0, 64, 65}, 64),
            64u + 64 + 128);
  EXPECT_EQ(internal::SpanBytes(std::vector<uint64_t>{~uint64_t{0}}, 64),
            ~uint64_t{0});
}

// ---------------------------------------------------------------------------
// Copying (gather of strided tensors at arbitrary byte ranges)
// ---------------------------------------------------------------------------

TEST(CopyTest, StridedRangesMatchReference) {
  std::mt19937_64 rng(::ckptd::testing::TestSeed());
  std::vector<char> base(1 << 16);
  for (auto& c : base) c = static_cast<char>(rng());
  const std::vector<std::string> dtypes = {"uint8", "float16", "float32",
                                           "float64", "complex128"};
  for (int round = 0; round < 200; ++round) {
    const std::string dtype = dtypes[rng() % dtypes.size()];
    const size_t n = rng() % 5;
    SaveItem it;
    it.fqn = "t";
    it.dtype = dtype;
    std::vector<int64_t> sizes(n);
    for (auto& s : sizes) s = 1 + static_cast<int64_t>(rng() % 6);
    // A permuted/padded layout: strides of a bigger buffer, permuted.
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int64_t> strides(n);
    int64_t s = 1;
    for (size_t k = 0; k < n; ++k) {
      strides[static_cast<size_t>(order[k])] = s;
      s *= sizes[static_cast<size_t>(order[k])] +
           static_cast<int64_t>(rng() % 2);
    }
    if (n > 0 && rng() % 5 == 0) strides[rng() % n] = 0;  // broadcast dim
    it.global_shape = sizes;
    it.chunk_offsets.assign(n, 0);
    it.chunk_sizes = sizes;
    it.strides = strides;
    it.data = base.data();
    std::vector<SaveItem> items = {it};
    ASSERT_OK_AND_ASSIGN(auto p, internal::ValidateItems(items, 0));
    const std::string want = COrderBytes(it, p[0].elem_size);
    ASSERT_EQ(want.size(), p[0].nbytes);
    for (int r = 0; r < 10; ++r) {
      uint64_t a = rng() % (want.size() + 1), b = rng() % (want.size() + 1);
      if (a > b) std::swap(a, b);
      std::string got(b - a, '\0');
      internal::CopyItemRange(it, p[0], a, b, got.data());
      ASSERT_EQ(got, want.substr(a, b - a))
          << "dtype " << dtype << " sizes " << ::testing::PrintToString(sizes)
          << " strides " << ::testing::PrintToString(strides) << " range [" << a
          << ", " << b << ")";
    }
  }
}

TEST(CopyTest, CopyBatchWithThreads) {
  // Big enough to use several threads; a transposed tensor split across
  // two batches at an odd byte offset.
  const int64_t rows = 1024, cols = 1536;
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i);
  std::string payload(3 * kMiB + 17, 'p');
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<char>(i * 31);
  std::vector<SaveItem> items = {Tensor("m", {rows, cols}, m.data()),
                                 Tensor("mt", {cols, rows}, m.data()),
                                 Bytes("b", payload)};
  items[1].strides = {1, cols};
  ASSERT_OK_AND_ASSIGN(auto p, internal::ValidateItems(items, 0));
  std::vector<uint64_t> sizes = {p[0].nbytes, p[1].nbytes, p[2].nbytes};
  const uint64_t capacity = 5 * kMiB + 3;
  ASSERT_OK_AND_ASSIGN(auto batches, PlanBatches(sizes, capacity, 64));
  ASSERT_GE(batches.size(), 2u);
  std::vector<std::string> got(3);
  for (size_t i = 0; i < 3; ++i) got[i].resize(sizes[i]);
  std::string arena(capacity, '\0');
  for (const Batch& b : batches) {
    internal::CopyBatch(items, p, b, arena.data(), 3);
    for (const Extent& e : b.extents) {
      std::memcpy(got[e.item].data() + e.item_offset,
                  arena.data() + e.arena_offset, e.length);
    }
  }
  EXPECT_TRUE(std::memcmp(got[0].data(), m.data(), sizes[0]) == 0);
  EXPECT_EQ(got[1], COrderBytes(items[1], 4));
  EXPECT_EQ(got[2], payload);
}

}  // namespace
}  // namespace ckptd::client
