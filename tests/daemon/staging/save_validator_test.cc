// Copyright 2026 The ckptd Authors.
//
// The save validator alone (daemon/staging/save_validator.h): pure
// functions, no daemon, no threads, no gRPC. Each check is driven to its
// error with the message a client sees, and the good paths hand on the
// structs the next stage takes (RankIndex, ValidatedBatch).
#include "daemon/staging/save_validator.h"

#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "shm/mapping.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::testing::HasSubstr;

format::ItemDesc Tensor(std::string fqn, std::vector<int64_t> shape,
                        std::vector<int64_t> off, std::vector<int64_t> sizes) {
  format::ItemDesc d;
  d.fqn = std::move(fqn);
  d.global_shape = std::move(shape);
  d.chunk_offsets = std::move(off);
  d.chunk_sizes = std::move(sizes);
  return d;
}

format::ItemDesc Bytes(std::string fqn) {
  format::ItemDesc d;
  d.fqn = std::move(fqn);
  d.type = format::ItemDesc::Type::kBytes;
  return d;
}

SaveBatch Batch(int rank, int world) {
  SaveBatch b;
  b.checkpoint_id = "job/step1";
  b.rank = rank;
  b.world_size = world;
  return b;
}

// A rank with a float32 [8, 4] chunk (128 bytes) and a 10-byte bytes item.
RankIndex TwoItems() {
  SaveBatch b = Batch(0, 1);
  b.items = {Tensor("w", {8, 4}, {0, 0}, {8, 4}), Bytes("extra")};
  b.item_nbytes = {128, 10};
  absl::StatusOr<RankIndex> index = ValidateIndex(b, {});
  EXPECT_TRUE(index.ok()) << index.status();
  return *std::move(index);
}

TEST(SaveValidatorTest, HeaderChecksWorldRankAndNames) {
  SaveValidatorOptions o;
  o.max_world_size = 8;
  EXPECT_OK(ValidateSaveHeader(Batch(3, 8), o));
  EXPECT_THAT(ValidateSaveHeader(Batch(0, 9), o).message(),
              HasSubstr("world_size 9 is not in"));
  EXPECT_THAT(ValidateSaveHeader(Batch(0, 0), o).message(),
              HasSubstr("world_size 0"));
  EXPECT_THAT(ValidateSaveHeader(Batch(8, 8), o).message(),
              HasSubstr("rank 8 is not in [0, 8)"));
  SaveBatch bad = Batch(0, 1);
  bad.job = "a\nb";
  EXPECT_EQ(ValidateSaveHeader(bad, o).code(),
            absl::StatusCode::kInvalidArgument);
  bad = Batch(0, 1);
  bad.checkpoint_id = std::string("x\0y", 3);
  EXPECT_EQ(ValidateSaveHeader(bad, o).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SaveValidatorTest, ClusterGivesTheLocalRanks) {
  ASSERT_OK_AND_ASSIGN(LocalRanks all, ValidateCluster({}, 3));
  EXPECT_FALSE(all.multi);
  EXPECT_EQ(all.ranks, (std::vector<int>{0, 1, 2}));
  ClusterSpec multi{"host:1", {5, 4}, 2};
  ASSERT_OK_AND_ASSIGN(LocalRanks node, ValidateCluster(multi, 8));
  EXPECT_TRUE(node.multi);
  EXPECT_EQ(node.ranks, (std::vector<int>{4, 5}));
  EXPECT_THAT(ValidateCluster({"h", {1, 1}, 2}, 4).status().message(),
              HasSubstr("distinct"));
  EXPECT_THAT(ValidateCluster({"h", {4}, 2}, 4).status().message(),
              HasSubstr("in [0, 4)"));
  EXPECT_THAT(ValidateCluster({"h", {0}, 5}, 4).status().message(),
              HasSubstr("num_nodes 5 exceeds world_size 4"));
  EXPECT_THAT(ValidateCluster({"", {0, 1}, 1}, 4).status().message(),
              HasSubstr("lists 2 of 4 ranks"));
}

TEST(SaveValidatorTest, IndexChecksEveryItem) {
  auto check = [](std::vector<format::ItemDesc> items,
                  std::vector<uint64_t> nbytes, SaveValidatorOptions o = {}) {
    SaveBatch b = Batch(1, 2);
    b.items = std::move(items);
    b.item_nbytes = std::move(nbytes);
    return ValidateIndex(b, o).status();
  };
  EXPECT_OK(check({Tensor("w", {4, 4}, {2, 0}, {2, 4})}, {32}));
  EXPECT_THAT(
      check({Tensor("w", {4, 4}, {3, 0}, {2, 4})}, {32}).message(),
      HasSubstr(
          "chunk [3:5, 0:4] is out of bounds of the global shape [0:4, 0:4]"));
  EXPECT_THAT(
      check({Tensor("w", {4, 4}, {0, 0}, {2, 4})}, {31}).message(),
      HasSubstr("nbytes is 31 but chunk [0:2, 0:4] of float32 holds 32 bytes"));
  EXPECT_THAT(check({Tensor("w", {4}, {0, 0}, {4})}, {16}).message(),
              HasSubstr("global_shape has 1 dimensions but chunk_offsets 2"));
  EXPECT_THAT(check({Bytes("b")}, {0}).message(),
              HasSubstr("an empty bytes item"));
  EXPECT_THAT(check({Tensor("", {1}, {0}, {1})}, {4}).message(),
              HasSubstr("empty fqn"));
  std::vector<int64_t> deep(65, 1), zero(65, 0);
  EXPECT_THAT(check({Tensor("d", deep, zero, deep)}, {4}).message(),
              HasSubstr("65 dimensions"));
  SaveValidatorOptions few;
  few.max_items = 1;
  absl::Status s = check({Bytes("a"), Bytes("b")}, {1, 1}, few);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(s.message(), HasSubstr("max_items"));
  // The index hands on its items and total.
  RankIndex index = TwoItems();
  EXPECT_EQ(index.total, 138u);
  EXPECT_EQ(index.items.size(), 2u);
}

class ExtentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(arena_, shm::Arena::CreateMemfd(4096, "validator"));
    std::memset(arena_->data(), 0x5a, 4096);
    ASSERT_OK_AND_ASSIGN(
        map_, shm::Mapping::FromFd(::dup(arena_->fd()), 4096, "arena t"));
    index_ = TwoItems();
  }
  std::unique_ptr<shm::Arena> arena_;
  std::unique_ptr<shm::Mapping> map_;
  RankIndex index_;
};

TEST_F(ExtentTest, ExtentsInIndexOrderAcrossBatches) {
  // Batch 1: the first 100 bytes of "w".
  ASSERT_OK_AND_ASSIGN(
      ValidatedBatch b1,
      ValidateExtents(0, index_, {}, {{0, 0, 0, 100}}, map_.get(), {}, {}));
  EXPECT_EQ(b1.bytes, 100u);
  EXPECT_EQ(b1.arena_bytes, 100u);
  EXPECT_EQ(b1.extents[0].data, map_->Slice(0, 1)->data());
  EXPECT_EQ(b1.next.item, 0u);
  EXPECT_EQ(b1.next.offset, 100u);
  EXPECT_THAT(CheckComplete(0, index_, b1.next).message(),
              HasSubstr("item 'w' has only 100 of 128 bytes"));
  // Batch 2: the rest of "w" and all of "extra".
  ASSERT_OK_AND_ASSIGN(ValidatedBatch b2,
                       ValidateExtents(0, index_, b1.next,
                                       {{0, 100, 1000, 28}, {1, 0, 2000, 10}},
                                       map_.get(), {}, {}));
  EXPECT_EQ(b2.bytes, 38u);
  EXPECT_OK(CheckComplete(0, index_, b2.next));
}

TEST_F(ExtentTest, BadExtentsAreRefusedWithTheirPlace) {
  auto error = [&](std::vector<ExtentRef> e, SaveValidatorOptions o = {}) {
    return std::string(ValidateExtents(2, index_, {}, e, map_.get(), {}, o)
                           .status()
                           .message());
  };
  EXPECT_THAT(error({{1, 0, 0, 10}}),
              HasSubstr("extent (item 1, offset 0) out of order; "
                        "expected item 0 at offset 0"));
  EXPECT_THAT(error({{0, 0, 0, 0}}),
              HasSubstr("extent of item 0 has length 0"));
  EXPECT_THAT(error({{0, 0, 0, 129}}),
              HasSubstr("overruns item 'w' of 128 bytes"));
  EXPECT_THAT(
      error({{0, 0, 4000, 128}}),
      HasSubstr(
          "rank 2 item 'w': range [4000, 4000+128) is outside shm segment"));
  SaveValidatorOptions small;
  small.max_batch = 64;
  absl::StatusOr<ValidatedBatch> big =
      ValidateExtents(2, index_, {}, {{0, 0, 0, 128}}, map_.get(), {}, small);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("exceeds max_batch 64"));
}

TEST_F(ExtentTest, CudaExtentsAreCheckedAgainstTheirBuffers) {
  std::vector<CudaBufferDesc> buffers = {
      {std::string(64, 'h'), "0000:01:00.0", 100}};
  ASSERT_OK_AND_ASSIGN(
      ValidatedBatch b,
      ValidateExtents(0, index_, {}, {{0, 0, 0, 100, 1}, {0, 100, 0, 28}},
                      map_.get(), buffers, {}));
  EXPECT_EQ(b.device_bytes, 100u);
  EXPECT_EQ(b.arena_bytes, 28u);
  EXPECT_EQ(b.extents[0].data, nullptr);
  EXPECT_THAT(
      ValidateExtents(0, index_, {}, {{0, 0, 50, 100, 1}}, nullptr, buffers, {})
          .status()
          .message(),
      HasSubstr("range [50, 150) is outside CUDA buffer 1 of 100 bytes"));
  EXPECT_THAT(
      ValidateExtents(0, index_, {}, {{0, 0, 0, 10, 2}}, nullptr, buffers, {})
          .status()
          .message(),
      HasSubstr("extent names CUDA buffer 2 of 1"));
  auto known = [](std::string_view bus) -> absl::StatusOr<int> {
    if (bus == "0000:01:00.0") return 0;
    return absl::NotFoundError("no such device");
  };
  EXPECT_OK(ValidateCudaBuffers(0, buffers, known, {}));
  std::vector<CudaBufferDesc> short_handle = {{"h", "0000:01:00.0", 1}};
  EXPECT_THAT(ValidateCudaBuffers(0, short_handle, known, {}).message(),
              HasSubstr("1-byte IPC handle; expected 64"));
  std::vector<CudaBufferDesc> other = {
      {std::string(64, 'h'), "0000:02:00.0", 1}};
  EXPECT_THAT(ValidateCudaBuffers(0, other, known, {}).message(),
              HasSubstr("its own node's daemon"));
  std::vector<CudaBufferDesc> empty = {
      {std::string(64, 'h'), "0000:01:00.0", 0}};
  EXPECT_THAT(ValidateCudaBuffers(0, empty, known, {}).message(),
              HasSubstr("has size 0"));
}

}  // namespace
}  // namespace ckptd::daemon
