// Copyright 2026 The ckptd Authors.
//
// libckptd_client: local validation, batch planning, the arena copy
// (strided gathers at arbitrary byte ranges), and the whole client — C++
// API, C ABI and ckptctl — against a fake daemon that implements the
// protocol's checks (arena mapping, sequence, extent order, batch limit).
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/batching.h"
#include "client/ckptd_c.h"
#include "client/ckptd_client.h"
#include "daemon/service/arena_listener.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "shm/mapping.h"
#include "tests/testing/test_util.h"

namespace ckptd::client {
namespace {

namespace pb = ::ckptd::v1;
using ::ckptd::testing::TempDir;
using internal::Batch;
using internal::Extent;
using internal::PlanBatches;

constexpr uint64_t kMiB = uint64_t{1} << 20;

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

SaveItem Tensor(std::string fqn, std::vector<int64_t> shape, const void* data,
                std::string dtype = "float32") {
  SaveItem it;
  it.fqn = std::move(fqn);
  it.dtype = std::move(dtype);
  it.global_shape = shape;
  it.chunk_offsets.assign(shape.size(), 0);
  it.chunk_sizes = shape;
  it.data = data;
  return it;
}

SaveItem Bytes(std::string fqn, std::string_view payload) {
  SaveItem it;
  it.fqn = std::move(fqn);
  it.is_bytes = true;
  it.bytes = payload;
  return it;
}

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

// The C-order bytes of a strided view, element by element.
std::string Reference(const SaveItem& it, size_t es) {
  const size_t n = it.chunk_sizes.size();
  int64_t numel = 1;
  for (int64_t s : it.chunk_sizes) numel *= s;
  std::string out;
  std::vector<int64_t> idx(n, 0);
  for (int64_t e = 0; e < numel; ++e) {
    int64_t off = 0;
    for (size_t k = 0; k < n; ++k) off += idx[k] * it.strides[k];
    out.append(
        static_cast<const char*>(it.data) + off * static_cast<int64_t>(es), es);
    for (size_t k = n; k-- > 0;) {
      if (++idx[k] < it.chunk_sizes[k]) break;
      idx[k] = 0;
    }
  }
  return out;
}

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
    const std::string want = Reference(it, p[0].elem_size);
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
  EXPECT_EQ(got[1], Reference(items[1], 4));
  EXPECT_EQ(got[2], payload);
}

// ---------------------------------------------------------------------------
// A fake daemon
// ---------------------------------------------------------------------------

// Implements the protocol's client-facing checks with in-memory state:
// arenas are mapped with shm::Mapping (so names are unlinked), Save checks
// sequence numbers, extent order and the batch limit and copies the bytes
// out of the arena; a checkpoint commits as soon as every rank is staged
// (unless hold_commit).
class FakeDaemon final : public pb::CheckpointDaemon::Service {
 public:
  FakeDaemon(std::string shm_dir, uint64_t max_batch_bytes)
      : shm_dir_(std::move(shm_dir)), max_batch_bytes_(max_batch_bytes) {
    dir_fd_ = ::open(shm_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  ~FakeDaemon() override { ::close(dir_fd_); }

  grpc::Status GetInfo(grpc::ServerContext*, const pb::GetInfoRequest*,
                       pb::GetInfoResponse* resp) override {
    Count("GetInfo");
    resp->set_version("0.0.0-fake");
    resp->set_shm_dir(shm_dir_);
    resp->set_staging_budget_bytes(0);
    resp->set_max_batch_bytes(max_batch_bytes_);
    resp->set_max_items(max_items_);
    resp->add_checkpoint_roots("/ckpt");
    resp->set_io_backend("pwrite");
    resp->set_pid(::getpid());
    absl::MutexLock lock(&mu_);
    resp->set_peer_address(peer_address_);
    resp->set_arena_socket(arena_socket_);
    return grpc::Status::OK;
  }

  // The daemon's arena socket (served by a real daemon::ArenaListener whose
  // handler is RegisterFd); empty: an older daemon that only takes arenas
  // by name.
  void SetArenaSocket(std::string path) {
    absl::MutexLock lock(&mu_);
    arena_socket_ = std::move(path);
  }

  // A registration over the arena socket (a sealed memfd). Counted as
  // "RegisterArena" like the name-based call: one registration each.
  absl::StatusOr<uint64_t> RegisterFd(daemon::ArenaRegistration reg) {
    Count("RegisterArena");
    {
      absl::MutexLock lock(&mu_);
      ++registrations_by_fd_;
    }
    auto m = shm::Mapping::FromFd(reg.fd.Release(), reg.size, "fake arena");
    if (!m.ok()) return m.status();
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_arena_++;
    arenas_[id] = *std::move(m);
    owners_.push_back(reg.owner);
    return id;
  }

  grpc::Status RegisterArena(grpc::ServerContext*,
                             const pb::RegisterArenaRequest* req,
                             pb::RegisterArenaResponse* resp) override {
    Count("RegisterArena");
    {
      absl::MutexLock lock(&mu_);
      ++registrations_by_name_;
    }
    auto m =
        shm::Mapping::Open(dir_fd_, shm_dir_, req->name(), req->size_bytes());
    if (!m.ok()) return ToGrpc(m.status());
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_arena_++;
    arenas_[id] = *std::move(m);
    owners_.push_back(req->owner());
    resp->set_arena_id(id);
    return grpc::Status::OK;
  }

  grpc::Status ReleaseArena(grpc::ServerContext*,
                            const pb::ReleaseArenaRequest* req,
                            pb::ReleaseArenaResponse*) override {
    Count("ReleaseArena");
    absl::MutexLock lock(&mu_);
    arenas_.erase(req->arena_id());
    return grpc::Status::OK;
  }

  grpc::Status WaitArenaIdle(grpc::ServerContext*,
                             const pb::WaitArenaIdleRequest* req,
                             pb::WaitArenaIdleResponse*) override {
    Count("WaitArenaIdle");
    absl::MutexLock lock(&mu_);
    if (!arenas_.contains(req->arena_id())) {
      return grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("arena ", req->arena_id(), " not found"));
    }
    return grpc::Status::OK;
  }

  grpc::Status Save(grpc::ServerContext*, const pb::SaveRequest* req,
                    pb::SaveResponse* resp) override {
    Count("Save");
    absl::MutexLock lock(&mu_);
    auto bad = [](std::string msg) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg);
    };
    auto arena_it = arenas_.find(req->arena_id());
    if (arena_it == arenas_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such arena");
    }
    const shm::Mapping& arena = *arena_it->second;
    const std::string id = req->checkpoint_id()[0] == '/'
                               ? req->checkpoint_id()
                               : "/ckpt/" + req->checkpoint_id();
    Ckpt& c = ckpts_[id];
    if (c.status.checkpoint_id().empty()) {
      if (req->sequence() != 0)
        return bad("unknown checkpoint after sequence 0");
      c.status.set_checkpoint_id(id);
      c.status.set_job(req->job());
      c.status.set_world_size(req->world_size());
      c.status.set_state(pb::PENDING);
      c.status.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
    }
    Rank& r = c.ranks[req->rank()];
    if (req->sequence() != r.next_seq) {
      return bad(absl::StrCat("rank ", req->rank(), ": sequence ",
                              req->sequence(), ", expected ", r.next_seq));
    }
    if (req->sequence() == 0) {
      r.items.assign(req->items().begin(), req->items().end());
      r.options = req->options();
      r.has_cluster = req->has_cluster();
      r.cluster = req->cluster();
      for (const auto& item : r.items) {
        r.data[item.fqn()].assign(item.nbytes(), '\0');
        c.status.set_total_bytes(c.status.total_bytes() + item.nbytes());
        c.status.set_items(c.status.items() + 1);
      }
    } else if (req->items_size() != 0) {
      return bad("items after sequence 0");
    } else if (req->has_cluster()) {
      return bad("cluster after sequence 0");
    }
    uint64_t batch_bytes = 0, prev_end = 0;
    for (const pb::Extent& e : req->extents()) {
      while (r.cur_item < r.items.size() &&
             r.cur_off == r.items[r.cur_item].nbytes()) {
        ++r.cur_item;
        r.cur_off = 0;
      }
      if (r.cur_item >= r.items.size() || e.item() != r.cur_item ||
          e.item_offset() != r.cur_off || e.length() == 0 ||
          e.length() > r.items[r.cur_item].nbytes() - r.cur_off) {
        return bad(absl::StrCat("extent (item ", e.item(), ", offset ",
                                e.item_offset(), ", length ", e.length(),
                                ") out of order; expected item ", r.cur_item,
                                " offset ", r.cur_off));
      }
      if (e.arena_offset() < prev_end)
        return bad("extents overlap in the arena");
      auto bytes = arena.Slice(e.arena_offset(), e.length());
      if (!bytes.ok()) return ToGrpc(bytes.status());
      std::memcpy(r.data[r.items[r.cur_item].fqn()].data() + r.cur_off,
                  bytes->data(), bytes->size());
      r.cur_off += e.length();
      prev_end = e.arena_offset() + e.length();
      batch_bytes += e.length();
      c.status.set_staged_bytes(c.status.staged_bytes() + e.length());
    }
    if (batch_bytes > max_batch_bytes_) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("batch of ", batch_bytes, " bytes"));
    }
    batch_bytes_.push_back(batch_bytes);
    ++r.next_seq;
    if (req->last()) {
      while (r.cur_item < r.items.size() &&
             r.cur_off == r.items[r.cur_item].nbytes()) {
        ++r.cur_item;
        r.cur_off = 0;
      }
      if (r.cur_item != r.items.size())
        return bad("last batch before all bytes");
      r.staged = true;
      c.status.set_ranks_staged(c.status.ranks_staged() + 1);
      if (c.status.ranks_staged() == c.status.world_size()) {
        c.status.set_state(hold_commit_ ? pb::WRITING : pb::COMMITTED);
        c.status.set_staged_unix_ms(absl::ToUnixMillis(absl::Now()));
        if (!hold_commit_) Finish(c, pb::COMMITTED);
      } else {
        c.status.set_state(pb::STAGING);
      }
    }
    resp->set_checkpoint_id(id);
    resp->set_state(c.status.state());
    resp->set_staged_bytes(c.status.staged_bytes());
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext*, const pb::GetStatusRequest* req,
                         pb::CheckpointStatus* resp) override {
    Count("GetStatus");
    absl::MutexLock lock(&mu_);
    const Ckpt* c = Find(req->checkpoint_id());
    if (c == nullptr) return NotFound(req->checkpoint_id());
    *resp = c->status;
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext*, const pb::ListRequest* req,
                    pb::ListResponse* resp) override {
    Count("List");
    absl::MutexLock lock(&mu_);
    for (const auto& [id, c] : ckpts_) {
      if (req->job().empty() || req->job() == c.status.job()) {
        *resp->add_checkpoints() = c.status;
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext*, const pb::CancelRequest* req,
                      pb::CancelResponse* resp) override {
    Count("Cancel");
    absl::MutexLock lock(&mu_);
    Ckpt* c = Find(req->checkpoint_id());
    if (c == nullptr) return NotFound(req->checkpoint_id());
    if (IsFinal(c->status.state())) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("checkpoint ", c->status.checkpoint_id(), " is already ",
                       pb::CheckpointState_Name(c->status.state())));
    }
    c->status.set_error(req->reason().empty() ? "cancelled" : req->reason());
    c->status.set_error_code(static_cast<int>(absl::StatusCode::kCancelled));
    Finish(*c, pb::CANCELLED);
    resp->set_state(pb::CANCELLED);
    return grpc::Status::OK;
  }

  grpc::Status Wait(grpc::ServerContext* ctx, const pb::WaitRequest* req,
                    pb::CheckpointStatus* resp) override {
    Count("Wait");
    // A daemon that stopped answering (SIGSTOP, a hung host).
    while (hang_waits_.load() && !ctx->IsCancelled())
      absl::SleepFor(absl::Milliseconds(10));
    if (hang_waits_.load()) return grpc::Status::CANCELLED;
    const absl::Time end = absl::Now() + absl::Milliseconds(req->timeout_ms());
    absl::MutexLock lock(&mu_);
    while (true) {
      const Ckpt* c = Find(req->checkpoint_id());
      if (c == nullptr) return NotFound(req->checkpoint_id());
      if (IsFinal(c->status.state())) {
        *resp = c->status;
        return grpc::Status::OK;
      }
      if (absl::Now() >= end) {
        return grpc::Status(
            grpc::StatusCode::DEADLINE_EXCEEDED,
            absl::StrCat("checkpoint ", c->status.checkpoint_id(), " is still ",
                         pb::CheckpointState_Name(c->status.state())));
      }
      cv_.WaitWithDeadline(&mu_, end);
    }
  }

  // Test hooks.
  int Calls(const std::string& method) {
    absl::MutexLock lock(&mu_);
    return calls_[method];
  }
  // Of Calls("RegisterArena"): over the arena socket / by name (gRPC).
  int RegistrationsByFd() {
    absl::MutexLock lock(&mu_);
    return registrations_by_fd_;
  }
  int RegistrationsByName() {
    absl::MutexLock lock(&mu_);
    return registrations_by_name_;
  }
  int TotalCalls() {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& [m, k] : calls_) n += k;
    return n;
  }
  std::string Data(const std::string& id, int rank, const std::string& fqn) {
    absl::MutexLock lock(&mu_);
    return ckpts_[id].ranks[rank].data[fqn];
  }
  std::vector<pb::Item> Items(const std::string& id, int rank) {
    absl::MutexLock lock(&mu_);
    return ckpts_[id].ranks[rank].items;
  }
  pb::SaveOptions Options(const std::string& id, int rank) {
    absl::MutexLock lock(&mu_);
    return ckpts_[id].ranks[rank].options;
  }
  // The ClusterSpec of the rank's sequence 0; nullopt when it had none.
  std::optional<pb::ClusterSpec> Cluster(const std::string& id, int rank) {
    absl::MutexLock lock(&mu_);
    const Rank& r = ckpts_[id].ranks[rank];
    if (!r.has_cluster) return std::nullopt;
    return r.cluster;
  }
  std::vector<uint64_t> BatchBytes() {
    absl::MutexLock lock(&mu_);
    return batch_bytes_;
  }
  std::vector<std::string> Owners() {
    absl::MutexLock lock(&mu_);
    return owners_;
  }
  size_t LiveArenas() {
    absl::MutexLock lock(&mu_);
    return arenas_.size();
  }
  uint64_t ArenaSize() {
    absl::MutexLock lock(&mu_);
    return arenas_.empty() ? 0 : arenas_.rbegin()->second->size();
  }
  void ForgetArenas() {  // the daemon's idle timeout
    absl::MutexLock lock(&mu_);
    arenas_.clear();
  }
  void set_hold_commit(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_commit_ = hold;
  }
  void set_max_items(uint32_t n) { max_items_ = n; }
  std::atomic<bool> hang_waits_{false};
  void set_peer_address(std::string address) {
    absl::MutexLock lock(&mu_);
    peer_address_ = std::move(address);
  }
  // Makes a known checkpoint a multi-node one as this node sees it.
  void SetMultiNode(const std::string& id, int num_nodes, int planned,
                    int prepared, const std::string& coordinator,
                    int local_ranks, uint64_t local_total,
                    uint64_t local_written) {
    absl::MutexLock lock(&mu_);
    Ckpt* c = Find(id);
    ASSERT_NE(c, nullptr);
    c->status.set_num_nodes(num_nodes);
    c->status.set_nodes_planned(planned);
    c->status.set_nodes_prepared(prepared);
    c->status.set_coordinator(coordinator);
    c->status.set_is_coordinator(coordinator.empty());
    c->status.set_local_ranks(local_ranks);
    c->status.set_local_total_bytes(local_total);
    c->status.set_local_written_bytes(local_written);
  }
  void FinishCheckpoint(const std::string& id, pb::CheckpointState state,
                        std::string error = "") {
    absl::MutexLock lock(&mu_);
    Ckpt* c = Find(id);
    ASSERT_NE(c, nullptr);
    c->status.set_error(error);
    if (!error.empty())
      c->status.set_error_code(static_cast<int>(absl::StatusCode::kDataLoss));
    Finish(*c, state);
  }
  // Adds a checkpoint as if found on disk.
  void AddCheckpoint(const std::string& id, const std::string& job,
                     pb::CheckpointState state, uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    Ckpt& c = ckpts_[id];
    c.status.set_checkpoint_id(id);
    c.status.set_job(job);
    c.status.set_state(state);
    c.status.set_world_size(2);
    c.status.set_ranks_staged(state == pb::STAGING ? 1 : 2);
    c.status.set_total_bytes(bytes);
    c.status.set_staged_bytes(state == pb::STAGING ? bytes / 2 : bytes);
    c.status.set_file_bytes(bytes + 4096);
    c.status.set_written_bytes(state == pb::COMMITTED ? bytes + 4096
                                                      : bytes / 4);
    c.status.set_created_unix_ms(
        absl::ToUnixMillis(absl::Now() - absl::Minutes(5)));
    if (IsFinal(state))
      c.status.set_finished_unix_ms(absl::ToUnixMillis(absl::Now()));
  }

 private:
  struct Rank {
    uint32_t next_seq = 0;
    std::vector<pb::Item> items;
    pb::SaveOptions options;
    bool has_cluster = false;
    pb::ClusterSpec cluster;
    std::map<std::string, std::string> data;
    uint32_t cur_item = 0;
    uint64_t cur_off = 0;
    bool staged = false;
  };
  struct Ckpt {
    pb::CheckpointStatus status;
    std::map<int, Rank> ranks;
  };

  static bool IsFinal(pb::CheckpointState s) {
    return s == pb::COMMITTED || s == pb::FAILED || s == pb::CANCELLED;
  }
  static grpc::Status ToGrpc(const absl::Status& s) {
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                        std::string(s.message()));
  }
  static grpc::Status NotFound(const std::string& id) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no checkpoint '", id, "'"));
  }
  Ckpt* Find(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = ckpts_.find(id);
    if (it == ckpts_.end()) it = ckpts_.find("/ckpt/" + id);
    return it == ckpts_.end() ? nullptr : &it->second;
  }
  void Finish(Ckpt& c, pb::CheckpointState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    c.status.set_state(state);
    c.status.set_finished_unix_ms(absl::ToUnixMillis(absl::Now()));
    if (state == pb::COMMITTED) {
      c.status.set_file_bytes(c.status.total_bytes() + 1024);
      c.status.set_written_bytes(c.status.file_bytes());
      c.status.set_files(static_cast<uint32_t>(c.ranks.size()));
    }
    cv_.SignalAll();
  }
  void Count(const std::string& method) {
    absl::MutexLock lock(&mu_);
    ++calls_[method];
  }

  const std::string shm_dir_;
  const uint64_t max_batch_bytes_;
  std::atomic<uint32_t> max_items_{100000};
  int dir_fd_ = -1;
  absl::Mutex mu_;
  absl::CondVar cv_;
  uint64_t next_arena_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::unique_ptr<shm::Mapping>> arenas_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, Ckpt> ckpts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> batch_bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> owners_ ABSL_GUARDED_BY(mu_);
  bool hold_commit_ ABSL_GUARDED_BY(mu_) = false;
  std::string peer_address_ ABSL_GUARDED_BY(mu_);
  std::string arena_socket_ ABSL_GUARDED_BY(mu_);
  int registrations_by_fd_ ABSL_GUARDED_BY(mu_) = 0;
  int registrations_by_name_ ABSL_GUARDED_BY(mu_) = 0;
};

class ClientTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kMaxBatch = 3 * kMiB;

  void SetUp() override {
    shm_dir_ = dir_.Join("shm");
    ASSERT_EQ(::mkdir(shm_dir_.c_str(), 0700), 0);
    socket_ = dir_.Join("ckptd.sock");
    fake_ = std::make_unique<FakeDaemon>(shm_dir_, kMaxBatch);
    if (!legacy_daemon_) {
      daemon::ArenaListenerOptions ao;
      ao.socket_path = socket_ + ".arena";
      FakeDaemon* fake = fake_.get();
      ao.handler = [fake](daemon::ArenaRegistration reg) {
        return fake->RegisterFd(std::move(reg));
      };
      auto listener = daemon::ArenaListener::Start(std::move(ao));
      ASSERT_TRUE(listener.ok()) << listener.status();
      arena_listener_ = *std::move(listener);
      fake_->SetArenaSocket(socket_ + ".arena");
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_,
                             grpc::InsecureServerCredentials());
    builder.RegisterService(fake_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_)
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(1));
    arena_listener_.reset();
  }

  std::unique_ptr<Client> Connect(ClientOptions options = {}) {
    options.socket_path = socket_;
    auto c = Client::Connect(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // Shm directory is empty: every arena name was unlinked.
  size_t ShmEntries() {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e :
         std::filesystem::directory_iterator(shm_dir_))
      ++n;
    return n;
  }

  TempDir dir_;
  std::string shm_dir_, socket_;
  // true (set before SetUp): a daemon without the arena socket.
  bool legacy_daemon_ = false;
  std::unique_ptr<FakeDaemon> fake_;
  std::unique_ptr<daemon::ArenaListener> arena_listener_;
  std::unique_ptr<grpc::Server> server_;
};

// A daemon older than the arena socket: arenas go by name in its shm_dir.
class LegacyDaemonClientTest : public ClientTest {
 protected:
  LegacyDaemonClientTest() { legacy_daemon_ = true; }
};

TEST(ConnectTest, MissingSocketIsUnavailable) {
  TempDir dir;
  const std::string sock = dir.Join("no-daemon.sock");
  ClientOptions options;
  options.socket_path = sock;
  auto c = Client::Connect(options);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_NE(c.status().message().find(sock), absl::string_view::npos)
      << c.status();
}

TEST(ConnectTest, DefaultSocketPath) {
  const char* old = std::getenv("CKPTD_SOCKET");
  const std::string saved = old ? old : "";
  ::setenv("CKPTD_SOCKET", "/x/y.sock", 1);
  EXPECT_EQ(DefaultSocketPath(), "/x/y.sock");
  ::setenv("CKPTD_SOCKET", "", 1);
  EXPECT_EQ(DefaultSocketPath(), "/run/ckptd/ckptd.sock");
  if (old) {
    ::setenv("CKPTD_SOCKET", saved.c_str(), 1);
  } else {
    ::unsetenv("CKPTD_SOCKET");
  }
}

TEST_F(ClientTest, ConnectFetchesInfo) {
  fake_->set_peer_address("node7.example:7070");
  ClientOptions options;
  options.socket_path = "unix:" + socket_;  // an explicit URI works too
  ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(options));
  EXPECT_EQ(c->info().version, "0.0.0-fake");
  EXPECT_EQ(c->info().shm_dir, shm_dir_);
  EXPECT_EQ(c->info().max_batch_bytes, kMaxBatch);
  EXPECT_EQ(c->info().checkpoint_roots, std::vector<std::string>{"/ckpt"});
  EXPECT_EQ(c->info().pid, ::getpid());
  EXPECT_EQ(c->info().peer_address, "node7.example:7070");
  fake_->set_peer_address("");
  ASSERT_OK_AND_ASSIGN(auto c2, Client::Connect(options));
  EXPECT_EQ(c2->info().peer_address, "") << "peer service off";
}

// A Wait without a timeout against a daemon that stopped answering ends
// (it looped forever: its own deadline looked like "not finished yet").
TEST_F(ClientTest, WaitEndsWhenTheDaemonStopsAnswering) {
  ClientOptions options;
  options.rpc_timeout = absl::Milliseconds(100);
  auto c = Connect(options);
  ASSERT_NE(c, nullptr);
  fake_->hang_waits_ = true;
  const absl::Time start = absl::Now();
  absl::StatusOr<CheckpointInfo> info =
      c->Wait("job/x", absl::InfiniteDuration());
  fake_->hang_waits_ = false;
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDeadlineExceeded)
      << info.status();
  EXPECT_TRUE(absl::StrContains(
      info.status().message(),
      absl::StrCat("the daemon at ", socket_,
                   " did not answer a Wait for checkpoint job/x within 10.1s")))
      << info.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // With a timeout too: the same message, not gRPC's bare "Deadline
  // Exceeded".
  fake_->hang_waits_ = true;
  info = c->Wait("job/x", absl::Seconds(30));
  fake_->hang_waits_ = false;
  EXPECT_TRUE(
      absl::StrContains(info.status().message(), "did not answer a Wait"))
      << info.status();
}

TEST_F(ClientTest, LocalValidationBeforeAnyRpc) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const int before = fake_->TotalCalls();
  float f[4] = {};
  std::vector<SaveItem> bad_dtype = {Tensor("w", {4}, f, "float33")};
  EXPECT_EQ(c->Save("a", "j", 0, 1, bad_dtype).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SaveItem> null_data = {Tensor("w", {4}, nullptr)};
  EXPECT_EQ(c->Save("a", "j", 0, 1, null_data).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SaveItem> mismatch = {Tensor("w", {2, 2}, f)};
  mismatch[0].strides = {2, 1, 1};
  EXPECT_EQ(c->Save("a", "j", 0, 1, mismatch).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SaveItem> shape = {Tensor("w", {2, 2}, f)};
  shape[0].chunk_sizes = {2};
  EXPECT_EQ(c->Save("a", "j", 0, 1, shape).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SaveItem> good = {Tensor("w", {4}, f)};
  EXPECT_EQ(c->Save("a", "j", 1, 1, good).status().code(),
            absl::StatusCode::kInvalidArgument);  // rank >= world_size
  EXPECT_EQ(c->Save("", "j", 0, 1, good).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Names that are not UTF-8 (the daemon refuses them too, naming the
  // field: ArenaListenerTest.UnparsableGrpcRequestsAreInvalidArgument) or
  // hold control characters.
  EXPECT_EQ(c->Save("a\xff\xfe", "j", 0, 1, good).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Save("a", "j\nk", 0, 1, good).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_->TotalCalls(), before)
      << "validation must not talk to the daemon";
  EXPECT_EQ(ShmEntries(), 0u);
}

TEST_F(ClientTest, ClusterValidationBeforeAnyRpc) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const int before = fake_->TotalCalls();
  float f[4] = {};
  const std::vector<SaveItem> items = {Tensor("w", {4}, f)};
  auto save = [&](ClusterSpec cluster, int rank = 1, int world = 4) {
    SaveOptions options;
    options.cluster = std::move(cluster);
    return c->Save("multi", "j", rank, world, items, options).status();
  };
  const std::vector<std::pair<ClusterSpec, std::string>> cases = {
      {{.num_nodes = 0}, "num_nodes 0 must be >= 1"},
      {{.coordinator = "n0:1", .local_ranks = {1}, .num_nodes = 9},
       "num_nodes 9 exceeds world_size 4"},
      {{.local_ranks = {0, 1}, .num_nodes = 2}, "coordinator is empty"},
      {{.coordinator = "n0:1", .num_nodes = 2}, "local_ranks is empty"},
      {{.coordinator = "n0:1", .local_ranks = {1, 1}, .num_nodes = 2},
       "local rank 1 appears more than once"},
      {{.coordinator = "n0:1", .local_ranks = {1, 7}, .num_nodes = 2},
       "local rank 7 is not in [0, world_size)"},
      {{.coordinator = "n0:1", .local_ranks = {2, 3}, .num_nodes = 2},
       "does not hold this rank (1)"},
  };
  for (const auto& [cluster, needle] : cases) {
    const absl::Status s = save(cluster);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s;
  }
  EXPECT_EQ(fake_->TotalCalls(), before)
      << "cluster validation must not talk to the daemon";
  EXPECT_EQ(ShmEntries(), 0u);
  EXPECT_EQ(fake_->LiveArenas(), 0u) << "no arena was registered";
}

TEST_F(ClientTest, MaxItemsFromDaemon) {
  fake_->set_max_items(2);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  float f[4] = {};
  std::vector<SaveItem> items(3, Tensor("w", {4}, f));
  EXPECT_EQ(c->Save("a", "j", 0, 1, items).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fake_->Calls("Save"), 0);
}

TEST_F(ClientTest, SmallSaveIsOneBatch) {
  ClientOptions options;
  options.owner = "job/rank0";
  auto c = Connect(options);
  ASSERT_NE(c, nullptr);
  std::vector<int32_t> a(1000);
  std::iota(a.begin(), a.end(), 0);
  double scalar = 3.5;
  std::vector<SaveItem> items = {Tensor("a", {1000}, a.data(), "int32"),
                                 Bytes("extra", "pickled-bytes"),
                                 Tensor("nothing", {0}, nullptr),
                                 Tensor("scalar", {}, &scalar, "float64")};
  items[0].path = {std::string("model"), int64_t{3}, std::string("a")};
  SaveStats stats;
  ASSERT_OK_AND_ASSIGN(std::string id, c->Save("small", "job", 0, 1, items,
                                               {.overwrite = true}, &stats));
  EXPECT_EQ(id, "/ckpt/small");
  EXPECT_EQ(stats.batches, 1);
  EXPECT_EQ(stats.bytes, 4000u + 13 + 8);
  EXPECT_GE(stats.total_seconds, stats.copy_seconds);
  EXPECT_EQ(fake_->Calls("Save"), 1);
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1);
  EXPECT_EQ(fake_->Calls("WaitArenaIdle"), 0) << "a new arena needs no wait";
  EXPECT_EQ(fake_->ArenaSize(), 2 * kMiB);
  EXPECT_EQ(fake_->Owners(), std::vector<std::string>{"job/rank0"});
  EXPECT_EQ(fake_->RegistrationsByFd(), 1) << "a memfd over the arena socket";
  EXPECT_EQ(fake_->RegistrationsByName(), 0);
  EXPECT_EQ(ShmEntries(), 0u) << "nothing was created in shm_dir";

  EXPECT_EQ(fake_->Data(id, 0, "a"),
            std::string(reinterpret_cast<char*>(a.data()), 4000));
  EXPECT_EQ(fake_->Data(id, 0, "extra"), "pickled-bytes");
  EXPECT_EQ(fake_->Data(id, 0, "nothing"), "");
  EXPECT_EQ(fake_->Data(id, 0, "scalar"),
            std::string(reinterpret_cast<char*>(&scalar), 8));
  const auto index = fake_->Items(id, 0);
  ASSERT_EQ(index.size(), 4u);
  EXPECT_EQ(index[0].type(), pb::ITEM_TYPE_TENSOR);
  EXPECT_EQ(index[0].dtype(), "int32");
  EXPECT_EQ(index[0].nbytes(), 4000u);
  ASSERT_EQ(index[0].path_size(), 3);
  EXPECT_EQ(index[0].path(0).key(), "model");
  EXPECT_EQ(index[0].path(1).index(), 3);
  EXPECT_EQ(index[1].type(), pb::ITEM_TYPE_BYTES);
  EXPECT_EQ(index[1].nbytes(), 13u);
  EXPECT_EQ(index[3].global_shape_size(), 0);
  EXPECT_TRUE(fake_->Options(id, 0).overwrite());
  EXPECT_FALSE(fake_->Options(id, 0).dedup_save_to_lowest_rank());

  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, c->Wait(id, absl::Seconds(5)));
  EXPECT_EQ(info.state, "COMMITTED");
  EXPECT_TRUE(info.is_final());
  EXPECT_EQ(info.total_bytes, 4021u);
}

TEST_F(ClientTest, LargeSaveStreamsThroughTheArena) {
  ClientOptions options;
  options.copy_threads = 3;
  auto c = Connect(options);
  ASSERT_NE(c, nullptr);
  // 4 MiB contiguous, a 2 MiB transposed view, a 1.5 MiB bytes item, zero
  // and scalar items: 7.5 MiB through a 3 MiB batch limit.
  std::vector<float> big(kMiB);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  const int64_t r = 512, k = 1024;
  std::vector<float> m(static_cast<size_t>(r * k));
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i);
  std::string payload(3 * kMiB / 2 + 7, '\0');
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<char>(i % 253);
  int64_t one = 42;
  std::vector<SaveItem> items = {
      Tensor("big", {static_cast<int64_t>(big.size())}, big.data()),
      Tensor("zero", {4, 0}, nullptr), Tensor("mt", {k, r}, m.data()),
      Bytes("payload", payload), Tensor("one", {1}, &one, "int64")};
  items[2].strides = {1, k};
  // A sharded chunk: rows [256, 512) of a [512, 1024] tensor.
  items.push_back(Tensor("shard", {r, k}, m.data() + 256 * k));
  items.back().chunk_offsets = {256, 0};
  items.back().chunk_sizes = {256, k};

  SaveStats stats;
  ASSERT_OK_AND_ASSIGN(std::string id,
                       c->Save("/ckpt/big", "", 0, 1, items, {}, &stats));
  EXPECT_EQ(id, "/ckpt/big");
  const uint64_t total = 4 * kMiB + 2 * kMiB + payload.size() + 8 + kMiB;
  EXPECT_EQ(stats.bytes, total);
  EXPECT_GE(stats.batches, 3);
  EXPECT_EQ(fake_->Calls("Save"), stats.batches);
  EXPECT_EQ(fake_->ArenaSize(), 4 * kMiB)
      << "3 MiB batch limit, rounded to 2 MiB";
  uint64_t sum = 0;
  for (uint64_t b : fake_->BatchBytes()) {
    EXPECT_LE(b, kMaxBatch);
    sum += b;
  }
  EXPECT_EQ(sum, total);

  EXPECT_EQ(fake_->Data(id, 0, "big"),
            std::string(reinterpret_cast<const char*>(big.data()), 4 * kMiB));
  EXPECT_EQ(fake_->Data(id, 0, "mt"), Reference(items[2], 4));
  EXPECT_EQ(fake_->Data(id, 0, "payload"), payload);
  EXPECT_EQ(fake_->Data(id, 0, "one"),
            std::string(reinterpret_cast<char*>(&one), 8));
  EXPECT_EQ(
      fake_->Data(id, 0, "shard"),
      std::string(reinterpret_cast<const char*>(m.data() + 256 * k), kMiB));
  EXPECT_EQ(fake_->Data(id, 0, "zero"), "");
}

TEST_F(ClientTest, ClusterIsSentWithTheFirstBatchOnly) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  // 5 MiB through the 3 MiB batch limit: several batches; the fake daemon
  // refuses a ClusterSpec after sequence 0.
  std::vector<float> big(5 * kMiB / 4, 1.0f);
  const std::vector<SaveItem> items = {
      Tensor("big", {static_cast<int64_t>(big.size())}, big.data())};
  SaveOptions options;
  options.cluster = {.coordinator = "node0.example:7070",
                     .local_ranks = {3, 2},
                     .num_nodes = 2};
  SaveStats stats;
  ASSERT_OK_AND_ASSIGN(std::string id,
                       c->Save("multi", "j", 2, 4, items, options, &stats));
  EXPECT_GE(stats.batches, 2);
  const std::optional<pb::ClusterSpec> sent = fake_->Cluster(id, 2);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->coordinator(), "node0.example:7070");
  EXPECT_EQ(
      std::vector<int>(sent->local_ranks().begin(), sent->local_ranks().end()),
      (std::vector<int>{3, 2}))
      << "sent as given";
  EXPECT_EQ(sent->num_nodes(), 2);

  // The default (single node) sends no ClusterSpec at all.
  ASSERT_OK_AND_ASSIGN(std::string single, c->Save("single", "j", 0, 1, items));
  EXPECT_FALSE(fake_->Cluster(single, 0).has_value());
}

TEST_F(ClientTest, MultiNodeStatus) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  fake_->AddCheckpoint("/ckpt/mn", "job", pb::WRITING, 4000);
  fake_->SetMultiNode("/ckpt/mn", 3, 3, 2, "node0.example:7070", 4, 1000, 250);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo st, c->GetStatus("/ckpt/mn"));
  EXPECT_EQ(st.num_nodes, 3);
  EXPECT_EQ(st.nodes_planned, 3);
  EXPECT_EQ(st.nodes_prepared, 2);
  EXPECT_EQ(st.coordinator, "node0.example:7070");
  EXPECT_FALSE(st.is_coordinator);
  EXPECT_EQ(st.local_ranks, 4);
  EXPECT_EQ(st.local_total_bytes, 1000u);
  EXPECT_EQ(st.local_written_bytes, 250u);
  fake_->SetMultiNode("/ckpt/mn", 3, 3, 3, "", 4, 1000, 1000);
  ASSERT_OK_AND_ASSIGN(auto list, c->List());
  ASSERT_EQ(list.size(), 1u);
  EXPECT_TRUE(list[0].is_coordinator);
  EXPECT_EQ(list[0].nodes_prepared, 3);
}

TEST_F(ClientTest, ArenaIsReusedGrownAndRecreated) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<float> small(1000), large(kMiB);  // 4 KB, then 4 MiB
  std::vector<SaveItem> s = {Tensor("w", {1000}, small.data())};
  std::vector<SaveItem> l = {
      Tensor("w", {static_cast<int64_t>(kMiB)}, large.data())};
  ASSERT_OK(c->Save("c1", "j", 0, 1, s));
  ASSERT_OK(c->Save("c2", "j", 0, 1, s));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1);
  EXPECT_EQ(fake_->Calls("WaitArenaIdle"), 1)
      << "reuse waits for the arena to be idle";
  // Larger: release the 2 MiB arena, register a 4 MiB one.
  ASSERT_OK(c->Save("c3", "j", 0, 1, l));
  EXPECT_EQ(fake_->Calls("ReleaseArena"), 1);
  EXPECT_EQ(fake_->Calls("RegisterArena"), 2);
  EXPECT_EQ(fake_->ArenaSize(), 4 * kMiB);
  EXPECT_EQ(fake_->LiveArenas(), 1u);
  // Smaller again: the big arena is kept.
  ASSERT_OK(c->Save("c4", "j", 0, 1, s));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 2);
  // The daemon dropped the idle arena: WaitArenaIdle is NOT_FOUND, and the
  // client registers a new one.
  fake_->ForgetArenas();
  ASSERT_OK(c->Save("c5", "j", 0, 1, s));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 3);
  EXPECT_EQ(ShmEntries(), 0u);
  c.reset();
  EXPECT_EQ(fake_->Calls("ReleaseArena"), 2)
      << "the destructor releases the arena";
  EXPECT_EQ(fake_->LiveArenas(), 0u);
}

TEST_F(LegacyDaemonClientTest, ArenasGoByNameWithoutAnArenaSocket) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->info().arena_socket, "");
  std::vector<float> small(1000);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<float>(i);
  std::vector<SaveItem> s = {Tensor("w", {1000}, small.data())};
  ASSERT_OK_AND_ASSIGN(std::string id, c->Save("old1", "j", 0, 1, s));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1);
  EXPECT_EQ(fake_->RegistrationsByName(), 1);
  EXPECT_EQ(fake_->RegistrationsByFd(), 0);
  EXPECT_EQ(ShmEntries(), 0u) << "the daemon unlinked the arena";
  EXPECT_EQ(fake_->Data(id, 0, "w"),
            std::string(reinterpret_cast<const char*>(small.data()), 4000));
}

TEST_F(ClientTest, ArenaSocketRegistrationErrorsKeepTheirCode) {
  // The arena socket is gone (daemon restarting): UNAVAILABLE naming it.
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->info().arena_socket, socket_ + ".arena");
  arena_listener_.reset();
  std::vector<float> small(1000);
  std::vector<SaveItem> s = {Tensor("w", {1000}, small.data())};
  absl::StatusOr<std::string> r = c->Save("gone", "j", 0, 1, s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find(socket_ + ".arena"),
            absl::string_view::npos)
      << r.status();
  EXPECT_EQ(fake_->Calls("RegisterArena"), 0);
  EXPECT_EQ(fake_->Calls("Save"), 0);
}

TEST_F(ClientTest, ReserveRegistersTheArenaBeforeTheFirstSave) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_OK(c->Reserve(0));
  EXPECT_EQ(fake_->TotalCalls(), 1) << "Reserve(0) is a no-op (GetInfo only)";
  EXPECT_EQ(ShmEntries(), 0u);
  // Sized as Save sizes it: 5 MiB capped at the 3 MiB batch limit, rounded
  // up to 2 MiB.
  ASSERT_OK(c->Reserve(5 * kMiB));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1);
  EXPECT_EQ(fake_->Calls("WaitArenaIdle"), 0);
  EXPECT_EQ(fake_->Calls("Save"), 0);
  EXPECT_EQ(fake_->LiveArenas(), 1u);
  EXPECT_EQ(fake_->ArenaSize(), 4 * kMiB);
  // A smaller reservation keeps the arena, without a call.
  const int calls = fake_->TotalCalls();
  ASSERT_OK(c->Reserve(kMiB));
  EXPECT_EQ(fake_->TotalCalls(), calls);
  // The first Save (4 MiB, streamed in batches) uses the reserved arena.
  std::vector<float> data(kMiB);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  std::vector<SaveItem> items = {
      Tensor("w", {static_cast<int64_t>(kMiB)}, data.data())};
  ASSERT_OK_AND_ASSIGN(std::string id, c->Save("r1", "j", 0, 1, items));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1) << "no second RegisterArena";
  EXPECT_EQ(fake_->Calls("ReleaseArena"), 0);
  EXPECT_EQ(fake_->LiveArenas(), 1u);
  EXPECT_EQ(fake_->Data(id, 0, "w"),
            std::string(reinterpret_cast<const char*>(data.data()), 4 * kMiB));
  c.reset();
  EXPECT_EQ(fake_->LiveArenas(), 0u);
  EXPECT_EQ(ShmEntries(), 0u);

  // The same through the C ABI: a 2 MiB arena for 1000 bytes, reused by the
  // first ckptd_save.
  ckptd_client* cc = nullptr;
  ASSERT_EQ(ckptd_connect(socket_.c_str(), 1, &cc), CKPTD_OK)
      << ckptd_last_error();
  ASSERT_EQ(ckptd_reserve(cc, 1000), CKPTD_OK) << ckptd_last_error();
  EXPECT_STREQ(ckptd_last_error(), "");
  EXPECT_EQ(fake_->Calls("RegisterArena"), 2);
  EXPECT_EQ(fake_->ArenaSize(), 2 * kMiB);
  EXPECT_EQ(ckptd_reserve(cc, 0), CKPTD_OK);
  int64_t shape[1] = {250};
  ckptd_item item = {};
  item.fqn = "w";
  item.ndim = 1;
  item.global_shape = shape;
  item.data = data.data();
  ASSERT_EQ(ckptd_save(cc, "r2", "j", 0, 1, &item, 1, 0, nullptr), CKPTD_OK)
      << ckptd_last_error();
  EXPECT_EQ(fake_->Calls("RegisterArena"), 2) << "no second RegisterArena";
  EXPECT_EQ(fake_->Data("/ckpt/r2", 0, "w"),
            std::string(reinterpret_cast<const char*>(data.data()), 1000));
  EXPECT_EQ(ckptd_reserve(nullptr, 1), CKPTD_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckptd_last_error()).find("client is NULL"),
            std::string::npos);
  ckptd_close(cc);
  EXPECT_EQ(fake_->LiveArenas(), 0u);
}

TEST_F(ClientTest, StatusListCancelWait) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  fake_->set_hold_commit(true);
  float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<SaveItem> items = {Tensor("w", {8}, f)};
  ASSERT_OK_AND_ASSIGN(std::string id, c->Save("held", "jobA", 0, 1, items));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo st, c->GetStatus(id));
  EXPECT_EQ(st.state, "WRITING");
  EXPECT_EQ(st.job, "jobA");
  EXPECT_EQ(st.total_bytes, 32u);
  EXPECT_EQ(st.ranks_staged, 1);
  EXPECT_FALSE(st.is_final());

  // Wait times out, in several slices when rpc_timeout is short.
  ClientOptions fast;
  fast.rpc_timeout = absl::Milliseconds(100);
  auto c2 = Connect(fast);
  ASSERT_NE(c2, nullptr);
  const int waits = fake_->Calls("Wait");
  const absl::Time t0 = absl::Now();
  auto w = c2->Wait(id, absl::Milliseconds(450));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDeadlineExceeded)
      << w.status();
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(400));
  // Several slices (fewer than 450/100 when calls are slow, e.g. under ASan).
  EXPECT_GE(fake_->Calls("Wait") - waits, 2);

  // Wait returns when another thread finishes it.
  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(100));
    fake_->FinishCheckpoint(id, pb::COMMITTED);
  });
  ASSERT_OK_AND_ASSIGN(CheckpointInfo done, c->Wait(id));
  finisher.join();
  EXPECT_EQ(done.state, "COMMITTED");

  // Cancel of a committed checkpoint: the daemon's code and message as is.
  const absl::Status cancel = c->Cancel(id, "operator");
  EXPECT_EQ(cancel.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cancel.message(), "checkpoint /ckpt/held is already COMMITTED");

  fake_->AddCheckpoint("/ckpt/other", "jobB", pb::STAGING, 1000);
  ASSERT_OK(c->Cancel("/ckpt/other", "operator"));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo cancelled,
                       c->Wait("/ckpt/other", absl::Seconds(1)));
  EXPECT_EQ(cancelled.state, "CANCELLED");
  EXPECT_EQ(cancelled.error, "operator");

  ASSERT_OK_AND_ASSIGN(auto all, c->List());
  ASSERT_EQ(all.size(), 2u);
  ASSERT_OK_AND_ASSIGN(auto only_b, c->List("jobB"));
  ASSERT_EQ(only_b.size(), 1u);
  EXPECT_EQ(only_b[0].checkpoint_id, "/ckpt/other");

  auto missing = c->GetStatus("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "no checkpoint 'nope'");
  EXPECT_EQ(c->Wait("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->Cancel("nope").code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, ConcurrentStatusDuringSave) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<float> data(2 * kMiB);
  std::vector<SaveItem> items = {
      Tensor("w", {static_cast<int64_t>(data.size())}, data.data())};
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop) (void)c->List();
  });
  for (int i = 0; i < 3; ++i)
    ASSERT_OK(c->Save(absl::StrCat("cc", i), "j", 0, 1, items));
  stop = true;
  poller.join();
}

// ---------------------------------------------------------------------------
// The C ABI
// ---------------------------------------------------------------------------

TEST_F(ClientTest, CApi) {
  EXPECT_EQ(ckptd_api_version(), CKPTD_C_API_VERSION);
  ckptd_client* c = nullptr;
  EXPECT_EQ(ckptd_connect(dir_.Join("missing.sock").c_str(), 2, &c),
            CKPTD_UNAVAILABLE);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(ckptd_last_error()).find("missing.sock"),
            std::string::npos);
  EXPECT_EQ(ckptd_connect(socket_.c_str(), 2, nullptr), CKPTD_INVALID_ARGUMENT);

  ASSERT_EQ(ckptd_connect_ex(socket_.c_str(), 2, "c-abi", 30, &c), CKPTD_OK)
      << ckptd_last_error();
  EXPECT_STREQ(ckptd_last_error(), "");
  char* info = nullptr;
  ASSERT_EQ(ckptd_info_json(c, &info), CKPTD_OK);
  auto ij = nlohmann::json::parse(info);
  EXPECT_EQ(ij["max_batch_bytes"], kMaxBatch);
  EXPECT_EQ(ij["shm_dir"], shm_dir_);
  ckptd_free_string(info);

  // A transposed 3x2 view of a 2x3 int16 matrix, a bytes item, a chunk.
  int16_t mat[6] = {0, 1, 2, 3, 4, 5};
  int64_t tshape[2] = {3, 2}, tstrides[2] = {1, 3};
  int64_t gshape[1] = {10}, coff[1] = {4}, csize[1] = {2};
  const char payload[] = "abc";
  ckptd_item items[3] = {};
  items[0].fqn = "t";
  items[0].dtype = "int16";
  items[0].ndim = 2;
  items[0].global_shape = tshape;
  items[0].strides = tstrides;
  items[0].data = mat;
  items[0].nbytes = 12;
  items[0].path_json = "[\"model\", 0, \"t\"]";
  items[1].fqn = "obj";
  items[1].is_bytes = 1;
  items[1].data = payload;
  items[1].nbytes = 3;
  items[2].fqn = "chunk";
  items[2].dtype = "int16";
  items[2].ndim = 1;
  items[2].global_shape = gshape;
  items[2].chunk_offsets = coff;
  items[2].chunk_sizes = csize;
  items[2].data = mat;

  double copy_seconds = -1;
  ASSERT_EQ(ckptd_save(c, "capi", "job", 0, 1, items, 3, 0, &copy_seconds),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_GE(copy_seconds, 0);
  const int16_t transposed[6] = {0, 3, 1, 4, 2, 5};
  EXPECT_EQ(fake_->Data("/ckpt/capi", 0, "t"),
            std::string(reinterpret_cast<const char*>(transposed), 12));
  EXPECT_EQ(fake_->Data("/ckpt/capi", 0, "obj"), "abc");
  EXPECT_EQ(fake_->Data("/ckpt/capi", 0, "chunk"),
            std::string(reinterpret_cast<char*>(mat), 4));
  const auto index = fake_->Items("/ckpt/capi", 0);
  ASSERT_EQ(index.size(), 3u);
  EXPECT_EQ(index[0].path_size(), 3);
  EXPECT_EQ(index[0].path(1).index(), 0);
  EXPECT_EQ(index[2].chunk_offsets(0), 4);

  // Save with all options and outputs.
  ckptd_save_options opts = {1, 1};
  ckptd_save_stats stats = {};
  char* resolved = nullptr;
  ASSERT_EQ(ckptd_save_ex(c, "capi2", nullptr, 0, 1, items, 2, &opts, &stats,
                          &resolved),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_STREQ(resolved, "/ckpt/capi2");
  ckptd_free_string(resolved);
  EXPECT_EQ(stats.bytes, 15u);
  EXPECT_EQ(stats.batches, 1);
  EXPECT_TRUE(fake_->Options("/ckpt/capi2", 0).dedup_save_to_lowest_rank());

  // Errors: bad path JSON, wrong nbytes, unknown dtype, NULL fqn.
  const int saves = fake_->Calls("Save");
  ckptd_item bad = items[0];
  bad.path_json = "{\"not\": \"an array\"}";
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckptd_last_error()).find("path_json"),
            std::string::npos);
  bad = items[0];
  bad.path_json = "[1.5]";
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  bad = items[0];
  bad.nbytes = 13;
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckptd_last_error()).find("nbytes 13"),
            std::string::npos);
  bad = items[0];
  bad.dtype = "float128";
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckptd_last_error()).find("float128"),
            std::string::npos);
  bad = items[0];
  bad.fqn = nullptr;
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  bad = items[0];
  bad.ndim = 65;
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, nullptr, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(fake_->Calls("Save"), saves);

  char state[32];
  ASSERT_EQ(ckptd_wait(c, "capi", 5000, state, sizeof state), CKPTD_OK)
      << ckptd_last_error();
  EXPECT_STREQ(state, "COMMITTED");
  char tiny[4];
  ASSERT_EQ(ckptd_wait(c, "capi", 5000, tiny, sizeof tiny), CKPTD_OK);
  EXPECT_STREQ(tiny, "COM");
  EXPECT_EQ(ckptd_wait(c, "capi", -1, nullptr, 0), CKPTD_OK);

  fake_->AddCheckpoint("/ckpt/bad", "job", pb::WRITING, 100);
  fake_->FinishCheckpoint("/ckpt/bad", pb::FAILED, "disk full");
  ASSERT_EQ(ckptd_wait(c, "/ckpt/bad", 1000, state, sizeof state), CKPTD_OK);
  EXPECT_STREQ(state, "FAILED");
  EXPECT_STREQ(ckptd_last_error(), "disk full");

  char* js = nullptr;
  ASSERT_EQ(ckptd_status_json(c, "capi", &js), CKPTD_OK);
  auto sj = nlohmann::json::parse(js);
  ckptd_free_string(js);
  EXPECT_EQ(sj["state"], "COMMITTED");
  EXPECT_EQ(sj["checkpoint_id"], "/ckpt/capi");
  EXPECT_EQ(sj["total_bytes"], 19);
  ASSERT_EQ(ckptd_wait_json(c, "capi", 1000, &js), CKPTD_OK);
  EXPECT_EQ(nlohmann::json::parse(js)["state"], "COMMITTED");
  ckptd_free_string(js);
  ASSERT_EQ(ckptd_list_json(c, nullptr, 0, &js), CKPTD_OK);
  auto lj = nlohmann::json::parse(js);
  ckptd_free_string(js);
  ASSERT_TRUE(lj.is_array());
  EXPECT_EQ(lj.size(), 3u);
  ASSERT_EQ(ckptd_list_json(c, "nojob", 1, &js), CKPTD_OK);
  EXPECT_STREQ(js, "[]");
  ckptd_free_string(js);

  EXPECT_EQ(ckptd_status_json(c, "nope", &js), CKPTD_NOT_FOUND);
  EXPECT_STREQ(ckptd_last_error(), "no checkpoint 'nope'");
  EXPECT_EQ(ckptd_cancel(c, "capi", nullptr), CKPTD_FAILED_PRECONDITION);
  EXPECT_EQ(ckptd_wait(c, "nope", 10, state, sizeof state), CKPTD_NOT_FOUND);
  ckptd_close(c);
  ckptd_close(nullptr);
  ckptd_free_string(nullptr);
  EXPECT_EQ(fake_->LiveArenas(), 0u);
}

// The API version 2 layout of ckptd_save_options, as a program built against
// that header passes it.
struct SaveOptionsV2 {
  int32_t overwrite;
  int32_t dedup_save_to_lowest_rank;
  int32_t keep_last_n;
};

TEST_F(ClientTest, CApiCluster) {
  EXPECT_GE(CKPTD_C_API_VERSION, 3);
  fake_->set_peer_address("node1.example:7070");
  ckptd_client* c = nullptr;
  ASSERT_EQ(ckptd_connect(socket_.c_str(), 1, &c), CKPTD_OK)
      << ckptd_last_error();
  char* js = nullptr;
  ASSERT_EQ(ckptd_info_json(c, &js), CKPTD_OK);
  EXPECT_EQ(nlohmann::json::parse(js)["peer_address"], "node1.example:7070");
  ckptd_free_string(js);

  float f[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  ckptd_item item = {};
  item.fqn = "w";
  item.ndim = 1;
  item.global_shape = shape;
  item.data = f;

  // A multi-node save: rank 1 of 4, ranks {0, 1} on this node.
  const int32_t ranks[2] = {0, 1};
  ckptd_save_options opts = {};
  opts.coordinator = "node0.example:7070";
  opts.local_ranks = ranks;
  opts.num_local_ranks = 2;
  opts.num_nodes = 2;
  ASSERT_EQ(ckptd_save_ex2(c, "cmulti", "j", 1, 4, &item, 1, &opts,
                           sizeof(opts), nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  std::optional<pb::ClusterSpec> sent = fake_->Cluster("/ckpt/cmulti", 1);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->coordinator(), "node0.example:7070");
  ASSERT_EQ(sent->local_ranks_size(), 2);
  EXPECT_EQ(sent->local_ranks(1), 1);
  EXPECT_EQ(sent->num_nodes(), 2);

  // Zero-initialized cluster fields (num_nodes 0 = 1): a single-node save,
  // no ClusterSpec sent; ckptd_save does the same.
  ckptd_save_options plain = {};
  ASSERT_EQ(ckptd_save_ex2(c, "cplain", nullptr, 0, 1, &item, 1, &plain,
                           sizeof(plain), nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_FALSE(fake_->Cluster("/ckpt/cplain", 0).has_value());
  ASSERT_EQ(ckptd_save(c, "cplain2", "j", 0, 1, &item, 1, 0, nullptr),
            CKPTD_OK);
  EXPECT_FALSE(fake_->Cluster("/ckpt/cplain2", 0).has_value());

  // API version 6: DCP's StorageWriter and keep_every reach the daemon.
  ckptd_save_options v6 = {};
  v6.external_metadata = 1;
  v6.metadata_timeout_ms = 2500;
  v6.keep_every = 100;
  v6.compression = "zstd:5";
  ASSERT_EQ(ckptd_save_ex2(c, "cv6", "j", 0, 1, &item, 1, &v6, sizeof(v6),
                           nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  const pb::SaveOptions sent6 = fake_->Options("/ckpt/cv6", 0);
  EXPECT_TRUE(sent6.external_metadata());
  EXPECT_EQ(sent6.metadata_timeout_ms(), 2500u);
  EXPECT_EQ(sent6.keep_every(), 100u);
  EXPECT_EQ(sent6.compression(), "zstd:5");
  v6.keep_every = -1;
  EXPECT_EQ(ckptd_save_ex2(c, "cv6b", "j", 0, 1, &item, 1, &v6, sizeof(v6),
                           nullptr, nullptr),
            CKPTD_INVALID_ARGUMENT);
  // A version-5 caller's struct ends before external_metadata: unset.
  v6.keep_every = 100;
  ASSERT_EQ(ckptd_save_ex2(c, "cv5", "j", 0, 1, &item, 1, &v6,
                           offsetof(ckptd_save_options, external_metadata),
                           nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_FALSE(fake_->Options("/ckpt/cv5", 0).external_metadata());
  EXPECT_EQ(fake_->Options("/ckpt/cv5", 0).keep_every(), 0u);
  EXPECT_EQ(fake_->Options("/ckpt/cv5", 0).compression(), "");

  // A program built against API version 2 calls ckptd_save_ex with the
  // smaller struct: only its three fields are read.
  SaveOptionsV2 v2 = {0, 1, 0};
  ASSERT_EQ(ckptd_save_ex(c, "cv2", "j", 0, 1, &item, 1,
                          reinterpret_cast<const ckptd_save_options*>(&v2),
                          nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_TRUE(fake_->Options("/ckpt/cv2", 0).dedup_save_to_lowest_rank());
  EXPECT_FALSE(fake_->Cluster("/ckpt/cv2", 0).has_value());
  // ... and ckptd_save_ex2 told the old size does the same.
  ASSERT_EQ(ckptd_save_ex2(c, "cv2b", "j", 0, 1, &item, 1,
                           reinterpret_cast<const ckptd_save_options*>(&v2),
                           sizeof(v2), nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_TRUE(fake_->Options("/ckpt/cv2b", 0).dedup_save_to_lowest_rank());

  // A newer header's larger struct: unknown trailing fields must be zero.
  struct {
    ckptd_save_options known;
    int64_t future;
  } larger = {};
  larger.known = opts;
  ASSERT_EQ(ckptd_save_ex2(c, "clarger", "j", 1, 4, &item, 1, &larger.known,
                           sizeof(larger), nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_TRUE(fake_->Cluster("/ckpt/clarger", 1).has_value());

  // Errors, all before any Save call.
  const int saves = fake_->Calls("Save");
  auto expect_invalid = [&](const ckptd_save_options& o, size_t size,
                            const std::string& needle) {
    EXPECT_EQ(ckptd_save_ex2(c, "cbad", "j", 1, 4, &item, 1, &o, size, nullptr,
                             nullptr),
              CKPTD_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ckptd_last_error()).find(needle), std::string::npos)
        << ckptd_last_error();
  };
  expect_invalid(opts, 8, "smaller than ckptd_save_options of C API version 2");
  expect_invalid(opts, size_t{1} << 20, "not the size of a ckptd_save_options");
  larger.future = 1;
  expect_invalid(larger.known, sizeof(larger), "does not know");
  ckptd_save_options bad = opts;
  bad.coordinator = nullptr;
  expect_invalid(bad, sizeof(bad), "coordinator is empty");
  bad = opts;
  bad.num_local_ranks = 0;
  expect_invalid(bad, sizeof(bad), "local_ranks is empty");
  bad = opts;
  bad.local_ranks = nullptr;
  expect_invalid(bad, sizeof(bad), "local_ranks is NULL");
  bad = opts;
  bad.num_local_ranks = -1;
  expect_invalid(bad, sizeof(bad), "num_local_ranks -1 is negative");
  bad = opts;
  bad.num_nodes = -2;
  expect_invalid(bad, sizeof(bad), "num_nodes -2 must be >= 1");
  const int32_t dup[2] = {1, 1};
  bad = opts;
  bad.local_ranks = dup;
  expect_invalid(bad, sizeof(bad), "appears more than once");
  const int32_t others[2] = {2, 3};
  bad = opts;
  bad.local_ranks = others;
  expect_invalid(bad, sizeof(bad), "does not hold this rank (1)");
  EXPECT_EQ(fake_->Calls("Save"), saves);

  // The status JSON carries the multi-node fields.
  fake_->SetMultiNode("/ckpt/cmulti", 2, 2, 1, "node0.example:7070", 2, 32, 16);
  ASSERT_EQ(ckptd_status_json(c, "cmulti", &js), CKPTD_OK);
  auto sj = nlohmann::json::parse(js);
  ckptd_free_string(js);
  EXPECT_EQ(sj["num_nodes"], 2);
  EXPECT_EQ(sj["coordinator"], "node0.example:7070");
  EXPECT_EQ(sj["is_coordinator"], false);
  EXPECT_EQ(sj["nodes_planned"], 2);
  EXPECT_EQ(sj["nodes_prepared"], 1);
  EXPECT_EQ(sj["local_ranks"], 2);
  EXPECT_EQ(sj["local_total_bytes"], 32);
  EXPECT_EQ(sj["local_written_bytes"], 16);
  ckptd_close(c);
}

// ---------------------------------------------------------------------------
// ckptctl against the fake daemon
// ---------------------------------------------------------------------------

class CkptctlTest : public ClientTest {
 protected:
  void SetUp() override {
    ClientTest::SetUp();
    // $CKPTD_BUILD_DIR, else the build directory holding this test binary
    // (build/tests/client_test).
    const char* env = std::getenv("CKPTD_BUILD_DIR");
    std::string build = env != nullptr && *env != '\0' ? env : "";
    if (build.empty()) {
      std::error_code ec;
      build = std::filesystem::canonical("/proc/self/exe", ec)
                  .parent_path()
                  .parent_path()
                  .string();
    }
    ckptctl_ = build + "/bin/ckptctl";
    if (::access(ckptctl_.c_str(), X_OK) != 0)
      GTEST_SKIP() << ckptctl_ << " not built";
  }
  int Run(const std::string& args, std::string* out) {
    out->clear();
    const int rc = ::ckptd::testing::RunCommand(ckptctl_ + " " + args, out);
    if (std::getenv("CKPTD_TEST_VERBOSE") != nullptr) {
      std::fprintf(stderr, "$ ckptctl %s  -> exit %d\n%s", args.c_str(), rc,
                   out->c_str());
    }
    return rc;
  }
  std::string ckptctl_;
};

TEST_F(CkptctlTest, ExitCodesAndOutput) {
  fake_->AddCheckpoint("/ckpt/job/step_1", "job", pb::COMMITTED, 3 << 20);
  fake_->AddCheckpoint("/ckpt/job/step_2", "job", pb::WRITING, 1 << 30);
  fake_->AddCheckpoint("/ckpt/other/step_9", "other", pb::STAGING, 1000);
  fake_->AddCheckpoint("/ckpt/job/step_3", "job", pb::WRITING, 100);
  fake_->FinishCheckpoint("/ckpt/job/step_3", pb::FAILED, "disk full");
  const std::string sock = "--socket " + socket_;
  std::string out;

  EXPECT_EQ(Run("list " + sock, &out), 0) << out;
  EXPECT_NE(out.find("ID"), std::string::npos) << out;
  EXPECT_NE(out.find("PROGRESS"), std::string::npos) << out;
  EXPECT_NE(out.find("/ckpt/job/step_2"), std::string::npos) << out;
  EXPECT_NE(out.find("WRITING"), std::string::npos) << out;
  EXPECT_NE(out.find("5m"), std::string::npos) << out;
  // The global option and the environment work as well.
  EXPECT_EQ(Run(sock + " list --job other --json", &out), 0) << out;
  auto lj = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(lj.is_array()) << out;
  ASSERT_EQ(lj.size(), 1u);
  EXPECT_EQ(lj[0]["checkpoint_id"], "/ckpt/other/step_9");
  EXPECT_EQ(::ckptd::testing::RunCommand(
                "CKPTD_SOCKET=" + socket_ + " " + ckptctl_ + " list", &out),
            0)
      << out;

  EXPECT_EQ(Run("status /ckpt/job/step_2 " + sock, &out), 0) << out;
  EXPECT_NE(out.find("WRITING"), std::string::npos) << out;
  EXPECT_NE(out.find("%"), std::string::npos) << out;
  EXPECT_NE(out.find("GiB"), std::string::npos) << out;
  EXPECT_EQ(Run("status /ckpt/job/step_2 --json " + sock, &out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out, nullptr, false)["total_bytes"], 1 << 30)
      << out;
  EXPECT_EQ(Run("status /ckpt/nope " + sock, &out), 4) << out;
  EXPECT_EQ(Run("status /ckpt/nope --json " + sock, &out), 4) << out;
  EXPECT_EQ(nlohmann::json::parse(out, nullptr, false)["code"], "NOT_FOUND")
      << out;

  EXPECT_EQ(Run("wait /ckpt/job/step_1 " + sock, &out), 0) << out;
  EXPECT_NE(out.find("COMMITTED"), std::string::npos) << out;
  EXPECT_EQ(Run("wait /ckpt/job/step_3 " + sock, &out), 1) << out;
  EXPECT_NE(out.find("disk full"), std::string::npos) << out;
  EXPECT_EQ(Run("wait /ckpt/job/step_2 --timeout 0.3 " + sock, &out), 5) << out;
  EXPECT_EQ(Run("wait /ckpt/nope --timeout 1 " + sock, &out), 4) << out;

  EXPECT_EQ(Run("cancel /ckpt/job/step_1 " + sock, &out), 1) << out;
  EXPECT_NE(out.find("already COMMITTED"), std::string::npos) << out;
  EXPECT_EQ(
      Run("cancel /ckpt/job/step_2 --reason 'operator said so' " + sock, &out),
      0)
      << out;
  EXPECT_EQ(Run("wait /ckpt/job/step_2 --json " + sock, &out), 1) << out;
  EXPECT_EQ(nlohmann::json::parse(out, nullptr, false)["error"],
            "operator said so")
      << out;
  EXPECT_EQ(Run("cancel /ckpt/nope " + sock, &out), 4) << out;

  EXPECT_EQ(Run("list --socket " + dir_.Join("none.sock"), &out), 3) << out;
  EXPECT_NE(out.find("none.sock"), std::string::npos) << out;
  EXPECT_EQ(Run("status", &out), 2) << out;
  EXPECT_EQ(Run("wait x --timeout abc " + sock, &out), 2) << out;
  EXPECT_EQ(Run("frobnicate", &out), 2) << out;
}

TEST_F(CkptctlTest, MultiNodeStatusAndList) {
  fake_->AddCheckpoint("/ckpt/job/step_1", "job", pb::COMMITTED, 3 << 20);
  fake_->AddCheckpoint("/ckpt/job/step_2", "job", pb::WRITING, 1 << 30);
  fake_->SetMultiNode("/ckpt/job/step_2", 3, 3, 2, "node0.example:7070", 4,
                      512 << 20, 128 << 20);
  fake_->AddCheckpoint("/ckpt/job/step_3", "job", pb::WRITING, 1 << 20);
  fake_->SetMultiNode("/ckpt/job/step_3", 2, 2, 0, "", 1, 1 << 19, 0);
  const std::string sock = "--socket " + socket_;
  std::string out;

  EXPECT_EQ(Run("status /ckpt/job/step_2 " + sock, &out), 0) << out;
  EXPECT_NE(out.find("3 (planned 3, prepared 2), coordinator "
                     "node0.example:7070"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("4 ranks, 128.0 MiB of 512.0 MiB written (25.0%)"),
            std::string::npos)
      << out;
  EXPECT_EQ(Run("status /ckpt/job/step_3 " + sock, &out), 0) << out;
  EXPECT_NE(out.find("2 (planned 2, prepared 0), coordinator (this node)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("1 rank, "), std::string::npos) << out;
  // A single-node checkpoint has no nodes line.
  EXPECT_EQ(Run("status /ckpt/job/step_1 " + sock, &out), 0) << out;
  EXPECT_EQ(out.find("nodes"), std::string::npos) << out;
  EXPECT_EQ(out.find("coordinator"), std::string::npos) << out;

  EXPECT_EQ(Run("status /ckpt/job/step_2 --json " + sock, &out), 0) << out;
  auto sj = nlohmann::json::parse(out, nullptr, false);
  EXPECT_EQ(sj["num_nodes"], 3) << out;
  EXPECT_EQ(sj["nodes_prepared"], 2) << out;
  EXPECT_EQ(sj["coordinator"], "node0.example:7070") << out;
  EXPECT_EQ(sj["local_written_bytes"], 128 << 20) << out;

  EXPECT_EQ(Run("list " + sock, &out), 0) << out;
  EXPECT_NE(out.find("NODES"), std::string::npos) << out;
  EXPECT_NE(out.find("2/3 prepared"), std::string::npos) << out;
  EXPECT_NE(out.find("0/2 prepared (coordinator)"), std::string::npos) << out;
  EXPECT_EQ(Run("list --json " + sock, &out), 0) << out;
  auto lj = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(lj.is_array()) << out;
  ASSERT_EQ(lj.size(), 3u) << out;
  EXPECT_EQ(lj[2]["is_coordinator"], true) << out;
  // Only single-node checkpoints: no NODES column.
  fake_->SetMultiNode("/ckpt/job/step_2", 1, 0, 0, "", 0, 0, 0);
  fake_->SetMultiNode("/ckpt/job/step_3", 1, 0, 0, "", 0, 0, 0);
  EXPECT_EQ(Run("list " + sock, &out), 0) << out;
  EXPECT_EQ(out.find("NODES"), std::string::npos) << out;
}

}  // namespace
}  // namespace ckptd::client
