// Copyright 2026 The ckptd Authors.
//
// The client's share of the GPU path, without a GPU: CUDA items validated
// locally (contiguity, the chunk inside its allocation, a device), and the
// split of a rank mixing host and device items into Save batches (device
// bytes take no arena space but are capped by the daemon's pinned pool and
// max_batch; extents stay in index order).
#include <cstdint>
#include <vector>

#include "client/batching.h"
#include "client/ckptd_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::client::internal {
namespace {

using ::testing::HasSubstr;

SaveItem CudaItem(const CudaSource* src, std::vector<int64_t> shape) {
  SaveItem it;
  it.fqn = "w";
  it.dtype = "float32";
  it.global_shape = it.chunk_sizes = shape;
  it.chunk_offsets.assign(shape.size(), 0);
  it.cuda = src;
  return it;
}

TEST(ClientCudaTest, CudaItemsAreValidatedLocally) {
  CudaSource src;
  src.device = "0000:3b:00.0";
  src.offset = 512;
  src.allocation_size = 512 + 4 * 100;
  std::vector<SaveItem> items = {CudaItem(&src, {10, 10})};
  ASSERT_OK_AND_ASSIGN(std::vector<PreparedItem> p, ValidateItems(items, 0));
  EXPECT_TRUE(p[0].device);
  EXPECT_EQ(p[0].nbytes, 400u);  // no host data pointer needed

  src.allocation_size = 512 + 399;  // one byte short
  EXPECT_THAT(ValidateItems(items, 0).status().message(),
              HasSubstr("outside its allocation of 911 bytes"));
  src.allocation_size = 1 << 20;
  items[0].strides = {1, 10};  // a transpose: not C-contiguous
  EXPECT_THAT(ValidateItems(items, 0).status().message(), HasSubstr("C-contiguous"));
  items[0].strides = {10, 1};  // C-contiguous strides are fine
  EXPECT_TRUE(ValidateItems(items, 0).ok());
  src.device.clear();
  EXPECT_THAT(ValidateItems(items, 0).status().message(), HasSubstr("PCI bus id"));
}

TEST(ClientCudaTest, MixedBatchesKeepIndexOrderAndRespectEachCapacity) {
  // Items: host 100, device 1000, host 50, device 300.
  const std::vector<uint64_t> sizes = {100, 1000, 50, 300};
  const std::vector<uint8_t> dev = {0, 1, 0, 1};
  ASSERT_OK_AND_ASSIGN(std::vector<Batch> b,
                       PlanMixedBatches(sizes, dev, /*arena=*/128, /*device=*/600,
                                        /*max_batch=*/0, /*alignment=*/64));
  // Every byte once, in index order, per item increasing offsets.
  uint32_t item = 0;
  uint64_t off = 0;
  for (const Batch& batch : b) {
    uint64_t host = 0, device = 0, arena_end = 0;
    for (const Extent& e : batch.extents) {
      while (off == sizes[item]) {
        ++item;
        off = 0;
      }
      ASSERT_EQ(e.item, item);
      ASSERT_EQ(e.item_offset, off);
      ASSERT_EQ(e.device, dev[item] != 0);
      off += e.length;
      if (e.device) {
        device += e.length;
        EXPECT_EQ(e.arena_offset, 0u);
      } else {
        host += e.length;
        EXPECT_EQ(e.arena_offset % 64, 0u);
        arena_end = std::max(arena_end, e.arena_offset + e.length);
      }
    }
    EXPECT_LE(device, 600u);
    EXPECT_LE(arena_end, 128u);
    EXPECT_EQ(batch.device_bytes, device);
    EXPECT_EQ(batch.bytes, host + device);
  }
  EXPECT_EQ(item, 3u);
  EXPECT_EQ(off, 300u);
  // Batch 0: host 100 + device 600; batch 1: device 400, host 50 (fits the
  // arena again), then the last device item is cut at 600 - 400 = 200.
  ASSERT_GE(b.size(), 3u);
  EXPECT_EQ(b[0].bytes, 700u);
  EXPECT_EQ(b[1].device_bytes, 600u);

  // max_batch caps the sum of both kinds.
  ASSERT_OK_AND_ASSIGN(b, PlanMixedBatches(sizes, dev, 128, 600, /*max_batch=*/250, 64));
  for (const Batch& batch : b) EXPECT_LE(batch.bytes, 250u);

  // Without device items it is PlanBatches.
  const std::vector<uint8_t> none(4, 0);
  ASSERT_OK_AND_ASSIGN(std::vector<Batch> plain, PlanMixedBatches(sizes, none, 512, 0, 300, 64));
  ASSERT_OK_AND_ASSIGN(std::vector<Batch> ref, PlanBatches(sizes, 300, 64));
  ASSERT_EQ(plain.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_EQ(plain[i].extents, ref[i].extents);

  // A device item with no device capacity is an error, not a loop.
  EXPECT_FALSE(PlanMixedBatches(sizes, dev, 128, 0, 0, 64).ok());
}

}  // namespace
}  // namespace ckptd::client::internal
