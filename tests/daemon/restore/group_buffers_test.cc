// Copyright 2026 The ckptd Authors.
//
// Tests of GroupBuffers (daemon/restore/group_buffers.h): a buffer is
// fetched read-only by the group's uid only, as often as published; a
// group alternates between two buffers (batch k+2 takes over batch k's);
// the final batch's last fetch drops the group's buffers; the memory bound
// and the ttl hold.
#include "daemon/restore/group_buffers.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "gtest/gtest.h"

namespace ckptd::daemon {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);
const RestoreKey kGroup{1000, "/ckpt/a", "/ckpt/a#0"};

GroupBuffersOptions Options(uint64_t max_bytes = 1 << 24) {
  return GroupBuffersOptions{max_bytes, absl::Seconds(60)};
}

std::string Publish(GroupBuffers& g, const std::string& text, int fetches,
                    bool final = false, const RestoreKey& key = kGroup,
                    absl::Time now = kT0) {
  absl::StatusOr<FilledBuffer> b = g.Create(1 << 16, key);
  EXPECT_TRUE(b.ok()) << b.status();
  std::memcpy(b->memory->data(), text.data(), text.size());
  return g.Publish(*std::move(b), key, fetches, final, now);
}

std::string Read(const shm::FetchedFd& f, size_t n) {
  void* p = ::mmap(nullptr, f.size, PROT_READ, MAP_SHARED, f.fd.get(), 0);
  EXPECT_NE(p, MAP_FAILED);
  std::string out(static_cast<const char*>(p), n);
  ::munmap(p, f.size);
  return out;
}

TEST(GroupBuffersTest, FetchedReadOnlyByTheGroupsUserAsOftenAsPublished) {
  GroupBuffers g(Options());
  const std::string token = Publish(g, "batch zero", 2);
  EXPECT_EQ(token.size(), 32u);
  EXPECT_EQ(g.Fetch(token, 2000).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<shm::FetchedFd> a = g.Fetch(token, 1000);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size, 1u << 16);
  EXPECT_EQ(Read(*a, 10), "batch zero");
  // Read-only: no writable shared mapping, no write, no resize.
  EXPECT_EQ(::mmap(nullptr, a->size, PROT_READ | PROT_WRITE, MAP_SHARED,
                   a->fd.get(), 0),
            MAP_FAILED);
  EXPECT_EQ(::write(a->fd.get(), "x", 1), -1);
  EXPECT_NE(::ftruncate(a->fd.get(), 0), 0);
  ASSERT_TRUE(g.Fetch(token, 0).ok());  // root may fetch any
  EXPECT_EQ(g.Fetch(token, 1000).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(g.Fetch("0123456789abcdef0123456789abcdef", 1000).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(GroupBuffersTest, BatchKPlusTwoTakesOverBatchKsBuffer) {
  GroupBuffers g(Options());
  const std::string t0 = Publish(g, "batch 0", 1);
  const std::string t1 = Publish(g, "batch 1", 1);
  EXPECT_EQ(g.bytes_alive(), 2u << 16);
  ASSERT_TRUE(g.Fetch(t0, 1000).ok());
  const std::string t2 = Publish(g, "batch 2", 1);
  EXPECT_EQ(g.bytes_alive(), 2u << 16);  // batch 0's memory, read into again
  EXPECT_EQ(g.published(), 2u);
  // Batch 1's buffer is still there for a rank that has not fetched it.
  absl::StatusOr<shm::FetchedFd> b1 = g.Fetch(t1, 1000);
  ASSERT_TRUE(b1.ok()) << b1.status();
  EXPECT_EQ(Read(*b1, 7), "batch 1");
  absl::StatusOr<shm::FetchedFd> b2 = g.Fetch(t2, 1000);
  ASSERT_TRUE(b2.ok()) << b2.status();
  EXPECT_EQ(Read(*b2, 7), "batch 2");
  // Another group never takes this group's buffers.
  const RestoreKey other{1000, "/ckpt/a", "/ckpt/a#1"};
  Publish(g, "other", 1, false, other);
  EXPECT_EQ(g.bytes_alive(), 3u << 16);
}

TEST(GroupBuffersTest, TheFinalBatchsLastFetchDropsTheGroup) {
  GroupBuffers g(Options());
  const std::string t0 = Publish(g, "batch 0", 2);
  const std::string t1 = Publish(g, "batch 1", 2, /*final=*/true);
  ASSERT_TRUE(g.Fetch(t1, 1000).ok());
  EXPECT_EQ(g.published(), 2u);
  ASSERT_TRUE(g.Fetch(t1, 1000).ok());
  EXPECT_EQ(g.published(), 0u);
  EXPECT_EQ(g.bytes_alive(), 0u);
  EXPECT_EQ(g.Fetch(t0, 1000).status().code(), absl::StatusCode::kNotFound);
}

TEST(GroupBuffersTest, MemoryIsBoundedAndUnfetchedBuffersExpire) {
  GroupBuffers g(Options(3 << 16));
  const RestoreKey a{1000, "/a", "g"}, b{1000, "/b", "g"};
  Publish(g, "a0", 1, false, a);
  Publish(g, "a1", 1, false, a);
  Publish(g, "b0", 1, false, b, kT0 + absl::Seconds(30));
  absl::StatusOr<FilledBuffer> full = g.Create(1 << 16, b);
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  g.Expire(kT0 + absl::Seconds(59));
  EXPECT_EQ(g.published(), 3u);
  g.Expire(kT0 + absl::Seconds(60));  // a's two, not b's
  EXPECT_EQ(g.published(), 1u);
  EXPECT_EQ(g.bytes_alive(), 1u << 16);
  absl::StatusOr<FilledBuffer> room = g.Create(1 << 16, b);
  ASSERT_TRUE(room.ok()) << room.status();
  g.Discard(*std::move(room));
  EXPECT_EQ(g.bytes_alive(), 1u << 16);
}

TEST(GroupBuffersTest, LentMemoryIsFetchedReadOnlyNeitherTakenOverNorCounted) {
  GroupBuffers g(Options(1 << 17));  // two group buffers, and the loan
  // Another owner's memfd (the memory tier's held file), kept alive by
  // `owner` while lent.
  auto owner = std::make_shared<shm::OwnedFd>(::memfd_create("lent", 0));
  ASSERT_TRUE(owner->valid());
  ASSERT_EQ(::pwrite(owner->get(), "held bytes", 10, 0), 10);
  const int fd = owner->get();
  const std::string token = g.Lend(LentMemory{fd, 10, owner}, kGroup, 2, kT0);
  owner.reset();  // the lender lets go: the loan keeps it
  EXPECT_EQ(g.bytes_alive(), 0u);
  EXPECT_EQ(g.Fetch(token, 2000).status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<shm::FetchedFd> a = g.Fetch(token, 1000);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->size, 10u);
  EXPECT_EQ(Read(*a, 10), "held bytes");
  EXPECT_EQ(::write(a->fd.get(), "x", 1), -1);
  // Two group batches later the loan is still there (never taken over).
  Publish(g, "b0", 1);
  Publish(g, "b1", 1);
  Publish(g, "b2", 1);
  ASSERT_TRUE(g.Fetch(token, 0).ok());  // the second fetch, by root
  EXPECT_EQ(g.Fetch(token, 1000).status().code(), absl::StatusCode::kNotFound);
  // An unfetched loan goes at the ttl.
  const std::string late =
      g.Lend(LentMemory{a->fd.get(), 10, nullptr}, kGroup, 1, kT0);
  g.Expire(kT0 + absl::Seconds(61));
  EXPECT_EQ(g.Fetch(late, 1000).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace ckptd::daemon
