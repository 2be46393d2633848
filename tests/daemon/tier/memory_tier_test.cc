// Copyright 2026 The ckptd Authors.
//
// The memory tier (daemon/tier/memory_tier.h) alone, on real files in a
// temporary directory and a simulated clock: what a tee keeps is exactly
// what was written; a held file reads from memory only while the file on
// disk has its recorded identity; the budget (eviction order: not the
// job's newest first, then the oldest; captures that cannot fit are
// dropped); an evicted file read through an open reader falls back to
// storage. With a store (memory_tier_dir, on a tmpfs under /dev/shm): what
// a tier held is adopted by the next tier on that directory while the
// checkpoint on disk and the held bytes are unchanged, and removed
// otherwise.

#include "daemon/tier/memory_tier.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/crc32.h"
#include "common/env.h"
#include "daemon/tier/tier_store.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/huge_pages.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

// `field` (kB in /proc/self/smaps) of the mapping that starts at `start`, in
// bytes; 0 if there is none.
uint64_t SmapsField(const void* start, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const std::string head =
      fmt::format("{:x}-", reinterpret_cast<uintptr_t>(start));
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    if (line.find('-') != std::string::npos &&
        line.find(':') > line.find(' ')) {
      in = line.rfind(head, 0) == 0;  // a mapping's first line
    } else if (in && line.rfind(field + ":", 0) == 0) {
      return std::stoull(line.substr(field.size() + 1)) * 1024;
    }
  }
  return 0;
}

constexpr uint64_t kBlock = TierFileBytes::kBlockBytes;
constexpr uint64_t kFirst = TierFileBytes::kFirstBlockBytes;

// The memory a file of `n` bytes takes: blocks doubling from kFirst up to
// kBlock.
uint64_t Capacity(uint64_t n) {
  uint64_t cap = 0, block = kFirst;
  while (cap < n) {
    cap += block;
    block = std::min(kBlock, 2 * block);
  }
  return cap;
}

class MemoryTierTest : public ::testing::Test {
 protected:
  void MakeTier(uint64_t budget) {
    tier_ = std::make_unique<MemoryTier>(MemoryTierOptions{
        .budget = budget, .env = Env::Default(), .clock = &clock_});
  }
  // A tier whose held files live in `dir` (memory_tier_dir), opened.
  absl::Status OpenTier(uint64_t budget, const std::string& dir) {
    tier_.reset();  // the earlier tier's lock goes first
    tier_ =
        std::make_unique<MemoryTier>(MemoryTierOptions{.budget = budget,
                                                       .dir = dir,
                                                       .adopt_threads = 2,
                                                       .env = Env::Default(),
                                                       .clock = &clock_});
    return tier_->Open();
  }

  std::string Dir(const std::string& name) {
    const std::string d = tmp_.Join(name);
    ::mkdir(d.c_str(), 0755);
    return d;
  }

  // A "checkpoint" in `name`: one data file per entry of `sizes` (bytes
  // derived from `seed`), written through the tier's tee, and a .metadata;
  // committed to the tier. Returns the directory.
  std::string Save(const std::string& name, const std::string& job,
                   const std::vector<uint64_t>& sizes, int seed = 0) {
    const std::string dir = Dir(name);
    std::shared_ptr<TierCapture> capture = tier_->Begin(dir, job);
    for (size_t f = 0; f < sizes.size(); ++f) {
      const std::string rel = "__" + std::to_string(f) + "_0.distcp";
      auto file = Env::Default()->NewWritableFile(dir + "/" + rel);
      EXPECT_TRUE(file.ok()) << file.status();
      std::unique_ptr<WritableFile> w =
          capture ? capture->Tee(rel, *std::move(file)) : *std::move(file);
      const std::string bytes = Bytes(sizes[f], seed + static_cast<int>(f));
      // Pieces of odd sizes, and a gathered write, cross block boundaries.
      size_t at = 0;
      for (size_t piece = 1; at < bytes.size(); piece = piece * 3 + 7) {
        const size_t n = std::min(piece, bytes.size() - at);
        if (piece % 2 == 0) {
          const std::string_view v(bytes.data() + at, n);
          std::vector<std::string_view> parts = {v.substr(0, n / 2),
                                                 v.substr(n / 2)};
          EXPECT_TRUE(w->AppendV(parts).ok());
        } else {
          EXPECT_TRUE(w->Append(std::string_view(bytes.data() + at, n)).ok());
        }
        at += n;
      }
      EXPECT_TRUE(w->Sync().ok());
      EXPECT_TRUE(w->Close().ok());
    }
    WriteFile(dir + "/.metadata", "metadata of " + name);
    clock_.Advance(absl::Seconds(1));
    tier_->Commit(std::move(capture), dir);
    return dir;
  }

  static std::string Bytes(uint64_t n, int seed) {
    std::string s(n, '\0');
    uint32_t x = 2463534242u + static_cast<uint32_t>(seed) * 7919u;
    for (char& c : s) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      c = static_cast<char>(x);
    }
    return s;
  }

  static void WriteFile(const std::string& path, const std::string& text) {
    auto f = Env::Default()->NewWritableFile(path);
    ASSERT_TRUE(f.ok());
    ASSERT_TRUE((*f)->Append(text).ok());
    ASSERT_TRUE((*f)->Close().ok());
  }

  std::shared_ptr<const TierCheckpoint> Held(const std::string& dir) {
    absl::StatusOr<std::string> id =
        StatIdentity(dir + "/.metadata", /*with_ctime=*/false);
    EXPECT_TRUE(id.ok());
    return tier_->Find(*id);
  }

  // Reads all of `dir`/`rel` through the tier's Env for `held`.
  std::string ReadThrough(std::shared_ptr<const TierCheckpoint> held,
                          const std::string& dir, const std::string& rel) {
    std::unique_ptr<Env> env =
        NewTierEnv(Env::Default(), tier_.get(), held, dir);
    auto f = env->NewRandomAccessFile(dir + "/" + rel);
    EXPECT_TRUE(f.ok()) << f.status();
    std::string out((*f)->Size(), '\0');
    EXPECT_TRUE((*f)->ReadExact(0, out.size(), out.data()).ok());
    return out;
  }

  testing::TempDir tmp_;
  SimulatedClock clock_;
  std::unique_ptr<MemoryTier> tier_;
};

TEST_F(MemoryTierTest, OffWhenTheBudgetIsZero) {
  MakeTier(0);
  EXPECT_FALSE(tier_->enabled());
  EXPECT_EQ(tier_->Begin(Dir("a"), "j"), nullptr);
}

TEST_F(MemoryTierTest, KeepsExactlyWhatWasWrittenAndServesItFromMemory) {
  MakeTier(64 * kBlock);
  const uint64_t big = 3 * kBlock + 12345;  // the last block partial
  const std::string dir = Save("a", "j", {big, 1000, 0}, 3);
  std::shared_ptr<const TierCheckpoint> held = Held(dir);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->dir, dir);
  EXPECT_EQ(held->job, "j");
  EXPECT_EQ(held->files.size(), 3u);
  const uint64_t cap = Capacity(big) + Capacity(1000);  // the empty file: 0
  EXPECT_EQ(held->bytes, cap);
  EXPECT_EQ(tier_->used(), cap);
  EXPECT_EQ(tier_->HeldBytes(dir), cap);
  EXPECT_EQ(ReadThrough(held, dir, "__0_0.distcp"), Bytes(big, 3));
  EXPECT_EQ(ReadThrough(held, dir, "__1_0.distcp"), Bytes(1000, 4));
  EXPECT_EQ(tier_->served(), big + 1000);
  // Ranges across block boundaries (the first two, and two 4 MiB ones).
  std::unique_ptr<Env> env = NewTierEnv(Env::Default(), tier_.get(), held, dir);
  auto f = env->NewRandomAccessFile(dir + "/__0_0.distcp");
  ASSERT_TRUE(f.ok());
  std::string mid(100, '\0');
  for (uint64_t at : {kFirst - 50, Capacity(kBlock + 1) - 50,
                      Capacity(kBlock + 1) + kBlock - 50}) {
    ASSERT_TRUE((*f)->ReadExact(at, 100, mid.data()).ok());
    EXPECT_EQ(mid, Bytes(big, 3).substr(at, 100)) << at;
  }
  std::string all(3 * kBlock, '\0');
  ASSERT_TRUE((*f)->ReadExact(7, all.size(), all.data()).ok());
  EXPECT_EQ(all, Bytes(big, 3).substr(7, all.size()));
  // Past the end: the file's own error.
  EXPECT_FALSE((*f)->ReadExact(big - 10, 20, mid.data()).ok());
  // .metadata is not a held file: read from disk.
  EXPECT_EQ(ReadThrough(held, dir, ".metadata"), "metadata of a");
  ASSERT_THAT(tier_->List(), ::testing::SizeIs(1));
  EXPECT_EQ(tier_->List()[0].bytes, cap);
}

TEST_F(MemoryTierTest, AFileChangedOnDiskIsReadFromDisk) {
  MakeTier(kBlock);
  const std::string dir = Save("a", "j", {5000});
  std::shared_ptr<const TierCheckpoint> held = Held(dir);
  ASSERT_NE(held, nullptr);
  // Rewritten in place with the same size and its mtime set back: the
  // ctime still differs.
  const std::string path = dir + "/__0_0.distcp";
  struct stat before;
  ASSERT_EQ(::stat(path.c_str(), &before), 0);
  ::usleep(20000);
  const std::string other(5000, 'x');
  int fd = ::open(path.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, other.data(), other.size(), 0), 5000);
  struct timespec times[2] = {before.st_atim, before.st_mtim};
  ASSERT_EQ(::futimens(fd, times), 0);
  ::close(fd);
  const uint64_t served = tier_->served();
  EXPECT_EQ(ReadThrough(held, dir, "__0_0.distcp"), other);
  EXPECT_EQ(tier_->served(), served);
}

TEST_F(MemoryTierTest, EvictsOtherThanEachJobsNewestFirstThenTheOldest) {
  MakeTier(3 * kFirst);  // three small checkpoints
  const std::string a1 = Save("a1", "A", {100});
  const std::string b1 = Save("b1", "B", {100});
  const std::string a2 = Save("a2", "A", {100});
  EXPECT_EQ(tier_->used(), 3 * kFirst);
  // Room for one more: a1 goes (A's a2 is newer), b1 stays (B's newest).
  const std::string b2 = Save("b2", "B", {100});
  EXPECT_EQ(Held(a1), nullptr);
  EXPECT_NE(Held(b1), nullptr);
  EXPECT_NE(Held(a2), nullptr);
  EXPECT_NE(Held(b2), nullptr);
  // Now b1 is not B's newest: it goes before any newest.
  const std::string c1 = Save("c1", "C", {100});
  EXPECT_EQ(Held(b1), nullptr);
  EXPECT_NE(Held(a2), nullptr);
  // Only newest ones left: the oldest of them (a2) goes.
  Save("d1", "D", {100});
  EXPECT_EQ(Held(a2), nullptr);
  EXPECT_NE(Held(b2), nullptr);
  EXPECT_NE(Held(c1), nullptr);
  EXPECT_EQ(tier_->used(), 3 * kFirst);
}

// A replica of node `node`'s share of `dir` (one file of `size` bytes),
// as the peer service takes it (cluster/shares.h).
absl::Status HoldReplicaOf(MemoryTier& tier, const std::string& dir,
                           const std::string& job, int node, uint64_t size) {
  std::shared_ptr<TierCapture> c = tier.BeginReplica(dir, job);
  std::shared_ptr<TierFileBytes> f =
      c->NewFile("__" + std::to_string(node) + "_0.distcp");
  f->identity = "1:2:3:4:5";
  if (!c->Append(*f, std::string(size, 'r')))
    return absl::ResourceExhaustedError("full");
  absl::StatusOr<std::string> md = StatIdentity(dir + "/.metadata", false);
  if (!md.ok()) return md.status();
  return tier.HoldReplica(c, {*md, node, "10.0.0.9:7070"});
}

TEST_F(MemoryTierTest, AReplicaOfAJobsNewestIsEvictedLast) {
  MakeTier(4 * kFirst);
  const std::string a = Save("a", "J", {100});
  ASSERT_OK(HoldReplicaOf(*tier_, a, "J", 3, 100));
  clock_.Advance(absl::Seconds(1));
  const std::string b = Save("b", "J", {100});
  ASSERT_OK(HoldReplicaOf(*tier_, b, "J", 3, 100));
  // A replica of the same node's share of the job replaced a's.
  auto replicas = [&] {
    std::vector<std::string> out;
    for (const TierHeld& h : tier_->List()) {
      if (!h.replica_of.empty()) out.push_back(h.dir);
    }
    return out;
  };
  EXPECT_EQ(replicas(), std::vector<std::string>{b});
  ASSERT_OK(HoldReplicaOf(*tier_, a, "J", 4, 100));  // another node's, of a
  EXPECT_EQ(tier_->used(), 4 * kFirst);
  // Each new capture evicts one: a's replica, a, b, then b's replica last.
  Save("c1", "K", {100});
  EXPECT_EQ(replicas(), std::vector<std::string>{b});
  EXPECT_NE(Held(a), nullptr);
  Save("c2", "L", {100});
  EXPECT_EQ(Held(a), nullptr);
  Save("c3", "M", {100});
  EXPECT_EQ(Held(b), nullptr);
  EXPECT_EQ(replicas(), std::vector<std::string>{b});
  // A replica's file is served for a file gone from storage; its share is
  // found by the portable identity of the .metadata.
  ASSERT_OK_AND_ASSIGN(std::string md, StatIdentity(b + "/.metadata", false));
  auto shares = tier_->FindShares(b, PortableIdentity(md));
  ASSERT_EQ(shares.size(), 1u);
  std::unique_ptr<Env> env = NewTierEnv(Env::Default(), tier_.get(), shares, b);
  ASSERT_OK_AND_ASSIGN(auto f, env->NewRandomAccessFile(b + "/__3_0.distcp"));
  std::string out(100, '\0');
  ASSERT_OK(f->ReadExact(0, 100, out.data()));
  EXPECT_EQ(out, std::string(100, 'r'));
  EXPECT_EQ(PortableIdentity("1:2:3:4:5"), "3:4:5");
  EXPECT_EQ(PortableIdentity("1:2:3:4"), "3:4");
  EXPECT_EQ(PortableIdentity("nonsense"), "");
}

TEST_F(MemoryTierTest, ACaptureThatCannotFitIsDroppedAndGivesItsRoomBack) {
  MakeTier(2 * kFirst);
  const std::string small = Save("small", "A", {100});
  const std::string big = Save("big", "B", {3 * kBlock});
  EXPECT_EQ(Held(big), nullptr);
  // It evicted `small` while it tried (a capture may evict held ones).
  EXPECT_EQ(Held(small), nullptr);
  EXPECT_EQ(tier_->used(), 0u);
  // A capture abandoned (its save failed) gives its room back too.
  {
    std::shared_ptr<TierCapture> c = tier_->Begin(Dir("failed"), "A");
    auto file =
        Env::Default()->NewWritableFile(tmp_.Join("failed/__0_0.distcp"));
    ASSERT_TRUE(file.ok());
    std::unique_ptr<WritableFile> w = c->Tee("__0_0.distcp", *std::move(file));
    ASSERT_TRUE(w->Append("x").ok());
    EXPECT_EQ(tier_->used(), kFirst);
  }
  EXPECT_EQ(tier_->used(), 0u);
}

TEST_F(MemoryTierTest, DropAndRecommitFreeTheDirectory) {
  MakeTier(kBlock);
  const std::string dir = Save("a", "j", {100}, 1);
  ASSERT_NE(Held(dir), nullptr);
  // The same directory saved again: the new checkpoint replaces the old.
  Save("a", "j", {200}, 2);
  std::shared_ptr<const TierCheckpoint> held = Held(dir);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(ReadThrough(held, dir, "__0_0.distcp"), Bytes(200, 2));
  EXPECT_EQ(tier_->used(), kFirst);
  tier_->Drop(dir);
  EXPECT_EQ(Held(dir), nullptr);
  EXPECT_EQ(tier_->used(), 0u);
}

TEST_F(MemoryTierTest, AnEvictedFileReadsFromDiskThroughAnOpenReader) {
  MakeTier(8 * kBlock);
  const std::string dir = Save("a", "j", {kBlock + 10}, 5);
  std::shared_ptr<const TierCheckpoint> held = Held(dir);
  ASSERT_NE(held, nullptr);
  std::unique_ptr<Env> env = NewTierEnv(Env::Default(), tier_.get(), held, dir);
  held.reset();  // the Env keeps no strong reference
  auto f = env->NewRandomAccessFile(dir + "/__0_0.distcp");
  ASSERT_TRUE(f.ok());
  tier_->Drop(dir);
  std::string out(kBlock + 10, '\0');
  const uint64_t served = tier_->served();
  ASSERT_TRUE((*f)->ReadExact(0, out.size(), out.data()).ok());
  EXPECT_EQ(out, Bytes(kBlock + 10, 5));
  EXPECT_EQ(tier_->served(), served);
}

TEST_F(MemoryTierTest, AHeldFileIsASealedMemfdThatCanBeLent) {
  MakeTier(8 * kBlock);
  const uint64_t n = kBlock + 77;
  const std::string dir = Save("a", "j", {n}, 6);
  std::shared_ptr<const TierCheckpoint> held = Held(dir);
  ASSERT_NE(held, nullptr);
  std::shared_ptr<const TierFileBytes> bytes = held->files.at("__0_0.distcp");
  ASSERT_TRUE(bytes->fd.valid());
  ASSERT_TRUE(bytes->sealed);
  std::string copied(n, '\0');
  ASSERT_TRUE(bytes->CopyOut(0, n, copied.data()).ok());
  EXPECT_EQ(copied, Bytes(n, 6));
  // Sealed: nobody (the daemon included) writes or resizes it any more.
  EXPECT_EQ(::pwrite(bytes->fd.get(), "x", 1, 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(bytes->fd.get(), 1), 0);
  const int seals = ::fcntl(bytes->fd.get(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW),
            F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW);
  // What a tier Env opened from memory says which bytes it is; a plain
  // file, or one evicted since, has none.
  std::unique_ptr<Env> env = NewTierEnv(Env::Default(), tier_.get(), held, dir);
  auto f = env->NewRandomAccessFile(dir + "/__0_0.distcp");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(HeldBytesOf(f->get()), bytes);
  auto plain = Env::Default()->NewRandomAccessFile(dir + "/__0_0.distcp");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(HeldBytesOf(plain->get()), nullptr);
  held.reset();
  bytes.reset();
  tier_->Drop(dir);
  EXPECT_EQ(HeldBytesOf(f->get()), nullptr);
}

// Every 2 MiB extent the writes fill is collapsed into a huge page (where
// the kernel can: Linux 6.1+), the bytes unchanged; the partial tail keeps
// small pages.
TEST_F(MemoryTierTest, FilledExtentsOfAHeldFileAreHugePages) {
  TierFileBytes f;
  f.name = "__0_0.distcp";
  std::string bytes(5 * TierFileBytes::kHugeBytes + 4321, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>((i * 131) >> 7);
  }
  for (size_t at = 0; at < bytes.size(); at += 300000) {  // in pieces
    ASSERT_TRUE(f.Write(std::string_view(bytes).substr(at, 300000)).ok());
  }
  ASSERT_TRUE(f.Seal().ok());
  std::string back(bytes.size(), '\0');
  ASSERT_TRUE(f.CopyOut(0, back.size(), back.data()).ok());
  EXPECT_TRUE(back == bytes);
  if (f.small_pages && f.huge_bytes == 0) {
    GTEST_SKIP() << "this kernel does not collapse tmpfs pages into huge "
                    "pages (MADV_COLLAPSE, Linux 6.1+); the file kept 4 KiB "
                    "pages, which is correct, only slower to map";
  }
  EXPECT_FALSE(f.small_pages);
  EXPECT_EQ(f.huge_bytes, 5 * TierFileBytes::kHugeBytes);
  // A mapping at the matching alignment maps them as huge pages.
  ASSERT_OK_AND_ASSIGN(const char* m,
                       shm::MapReadOnlyAligned(f.fd.get(), 0, bytes.size()));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m) % TierFileBytes::kHugeBytes, 0u);
  EXPECT_EQ(std::memcmp(m, bytes.data(), bytes.size()), 0);
  EXPECT_GE(SmapsField(m, "ShmemPmdMapped"), 5 * TierFileBytes::kHugeBytes);
  ::munmap(const_cast<char*>(m), bytes.size());
}

TEST_F(MemoryTierTest, CrcsOfHeldRangesCombineTheCrcsOfTheirPieces) {
  constexpr uint64_t kHuge = TierFileBytes::kHugeBytes;
  TierFileBytes f;
  f.name = "__0_0.distcp";
  std::mt19937_64 rng(3);
  std::string bytes(4 * kHuge + 999, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  for (size_t at = 0; at < bytes.size(); at += 1000000) {
    ASSERT_TRUE(f.Write(std::string_view(bytes).substr(at, 1000000)).ok());
  }
  ASSERT_TRUE(f.Seal().ok());
  constexpr uint64_t kPiece = TierFileBytes::kCrcPieceBytes;
  EXPECT_EQ(f.piece_crcs.size(), f.huge_bytes / kPiece);
  // Ranges: whole file, aligned extents, ends inside extents, within one
  // extent, across the last (partial, never collapsed) extent, empty.
  const std::vector<std::pair<uint64_t, uint64_t>> ranges = {
      {0, bytes.size()},      {0, 2 * kHuge},          {kHuge, kHuge},
      {17, 3 * kHuge},        {kHuge - 5, kHuge + 10}, {100, 1000},
      {3 * kHuge + 1, kHuge}, {2 * kHuge, 0},
  };
  for (const auto& [offset, n] : ranges) {
    ASSERT_OK_AND_ASSIGN(const uint32_t crc, f.Crc32(offset, n));
    EXPECT_EQ(crc, Crc32(0, bytes.data() + offset, n))
        << "[" << offset << ", +" << n << ")";
  }
  if (f.huge_bytes < 3 * kHuge) {
    GTEST_SKIP() << "this kernel does not collapse tmpfs pages into huge "
                    "pages (MADV_COLLAPSE, Linux 6.1+): no CRCs of pieces "
                    "to combine, every range was read";
  }
  // The pieces' CRCs are what a range of whole pieces is checked with: a
  // wrong one shows in every range that holds that piece whole, and in no
  // other.
  const uint64_t bad = kHuge / kPiece + 3;  // the 4th piece of extent 1
  f.piece_crcs[bad] ^= 1;
  ASSERT_OK_AND_ASSIGN(const uint32_t with, f.Crc32(17, 3 * kHuge));
  EXPECT_NE(with, Crc32(0, bytes.data() + 17, 3 * kHuge));
  ASSERT_OK_AND_ASSIGN(const uint32_t without,
                       f.Crc32(bad * kPiece + 1, kHuge));
  EXPECT_EQ(without, Crc32(0, bytes.data() + bad * kPiece + 1, kHuge));
}

TEST_F(MemoryTierTest, AFileOfAnotherSizeThanCapturedIsNotHeld) {
  MakeTier(kBlock);
  const std::string dir = Dir("a");
  std::shared_ptr<TierCapture> c = tier_->Begin(dir, "j");
  auto file = Env::Default()->NewWritableFile(dir + "/__0_0.distcp");
  ASSERT_TRUE(file.ok());
  std::unique_ptr<WritableFile> w = c->Tee("__0_0.distcp", *std::move(file));
  ASSERT_TRUE(w->Append("abc").ok());
  ASSERT_TRUE(w->Close().ok());
  WriteFile(dir + "/__0_0.distcp", "abcdef");  // replaced behind its back
  WriteFile(dir + "/.metadata", "m");
  tier_->Commit(std::move(c), dir);
  EXPECT_EQ(Held(dir), nullptr);
  EXPECT_EQ(tier_->used(), 0u);
}

// ---------------------------------------------------------------------------
// The store: held files that outlive the tier (memory_tier_dir)
// ---------------------------------------------------------------------------

class MemoryTierStoreTest : public MemoryTierTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/dev/shm/ckptd-tier-test.XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) GTEST_SKIP() << "no /dev/shm to test in";
    shm_ = tmpl;
    store_ = shm_ + "/tier";
    absl::Status s = OpenTier(64 * kBlock, store_);
    if (absl::IsFailedPrecondition(s)) GTEST_SKIP() << s;  // not tmpfs
    ASSERT_TRUE(s.ok()) << s;
  }
  void TearDown() override {
    tier_.reset();
    if (!shm_.empty()) std::filesystem::remove_all(shm_);
  }
  // The entries in the store (not its lock).
  std::vector<std::string> Entries() {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(store_)) {
      if (e.path().filename() != ".lock") out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
  }
  // The stored bytes of `dir`'s first data file.
  std::string StoredPath(const std::string& dir) {
    std::shared_ptr<const TierCheckpoint> held = Held(dir);
    EXPECT_NE(held, nullptr);
    return held == nullptr ? "" : held->entry + "/f0";
  }

  std::string shm_;
  std::string store_;
};

TEST_F(MemoryTierStoreTest, WhatATierHeldIsAdoptedByTheNextOne) {
  const uint64_t big = 2 * TierFileBytes::kHugeBytes + 4321;
  const std::string dir = Save("a", "j", {big, 1000}, 5);
  std::shared_ptr<const TierCheckpoint> before = Held(dir);
  ASSERT_NE(before, nullptr);
  EXPECT_THAT(Entries(), ::testing::ElementsAre(before->entry));
  const uint64_t bytes = before->bytes;
  before.reset();
  // A second tier cannot share the directory while the first has it.
  MemoryTier second(MemoryTierOptions{.budget = kBlock, .dir = store_});
  absl::Status refused = second.Open();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("in use by another process"));
  // The next tier (a restarted daemon) holds it again, served from memory.
  ASSERT_TRUE(OpenTier(64 * kBlock, store_).ok());
  std::shared_ptr<const TierCheckpoint> held = Held(dir);
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held->job, "j");
  EXPECT_EQ(held->bytes, bytes);
  EXPECT_EQ(tier_->used(), bytes);
  EXPECT_EQ(ReadThrough(held, dir, "__0_0.distcp"), Bytes(big, 5));
  EXPECT_EQ(ReadThrough(held, dir, "__1_0.distcp"), Bytes(1000, 6));
  EXPECT_EQ(tier_->served(), big + 1000);
  // Sealed for lending, and its piece CRCs made again: a range's CRC-32
  // agrees with one of the bytes.
  const TierFileBytes& f = *held->files.at("__0_0.distcp");
  EXPECT_TRUE(f.sealed && f.in_store);
  EXPECT_EQ(f.piece_crcs.size(),
            2 * TierFileBytes::kHugeBytes / TierFileBytes::kCrcPieceBytes);
  ASSERT_OK_AND_ASSIGN(const uint32_t crc, f.Crc32(99, big - 200));
  EXPECT_EQ(crc, Crc32(0, Bytes(big, 5).data() + 99, big - 200));
  // Dropped (retention, an overwrite): its entry goes too.
  tier_->Drop(dir);
  EXPECT_THAT(Entries(), ::testing::IsEmpty());
}

TEST_F(MemoryTierStoreTest, AChangedCheckpointOrHeldFileIsNotAdopted) {
  const std::string a = Save("a", "j", {70000}, 1);
  const std::string b = Save("b", "k", {70000}, 2);
  const std::string c = Save("c", "l", {70000}, 3);
  const std::string d = Save("d", "m", {70000}, 4);
  const std::string stored_b = StoredPath(b);
  ASSERT_EQ(Entries().size(), 4u);
  tier_.reset();  // the daemon stops
  // While it is down: a's data file is rewritten (a byte longer: its
  // identity changes whatever the clock's granularity); a byte of b's held
  // bytes flips; c's .metadata is replaced; d is left.
  WriteFile(a + "/__0_0.distcp", Bytes(70001, 1));
  {
    std::fstream f(stored_b, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12345);
    f.put('\x5a' ^ Bytes(70000, 2)[12345]);
  }
  WriteFile(c + "/.metadata", "metadata of c, again");
  ASSERT_TRUE(OpenTier(64 * kBlock, store_).ok());
  EXPECT_EQ(Held(a), nullptr);
  EXPECT_EQ(Held(b), nullptr);
  EXPECT_EQ(Held(c), nullptr);
  ASSERT_NE(Held(d), nullptr);
  EXPECT_EQ(ReadThrough(Held(d), d, "__0_0.distcp"), Bytes(70000, 4));
  EXPECT_EQ(tier_->used(), Held(d)->bytes);
  EXPECT_THAT(Entries(), ::testing::ElementsAre(Held(d)->entry));
}

TEST_F(MemoryTierStoreTest, LeftoversAndTornManifestsAreRemoved) {
  const std::string a = Save("a", "j", {5000});
  const std::string entry = Held(a)->entry;
  tier_.reset();
  // A crash between naming the files and writing the manifest; a stray
  // file; a torn manifest.
  std::filesystem::create_directory(store_ + "/h-1-2-3");
  WriteFile(store_ + "/h-1-2-3/f0", "bytes");
  WriteFile(store_ + "/stray", "x");
  std::filesystem::resize_file(entry + "/manifest", 40);
  ASSERT_TRUE(OpenTier(64 * kBlock, store_).ok());
  EXPECT_EQ(Held(a), nullptr);
  EXPECT_THAT(Entries(), ::testing::IsEmpty());
}

TEST_F(MemoryTierStoreTest, ASmallerBudgetAdoptsEachJobsNewestFirst) {
  const std::string a1 = Save("a1", "A", {100000});
  const std::string b1 = Save("b1", "B", {100000});
  const std::string a2 = Save("a2", "A", {100000});
  const uint64_t one = Held(a1)->bytes;
  // What does not fit the next tier's budget is removed.
  ASSERT_TRUE(OpenTier(2 * one, store_).ok());
  EXPECT_NE(Held(a2), nullptr);
  EXPECT_NE(Held(b1), nullptr);
  EXPECT_EQ(Held(a1), nullptr);  // not A's newest
  EXPECT_EQ(Entries().size(), 2u);
  ASSERT_TRUE(OpenTier(one, store_).ok());
  EXPECT_NE(Held(a2), nullptr);  // B's newest is older
  EXPECT_EQ(Held(b1), nullptr);
  EXPECT_EQ(Entries().size(), 1u);
  // With the tier off, the store is emptied.
  ASSERT_TRUE(OpenTier(0, store_).ok());
  EXPECT_THAT(Entries(), ::testing::IsEmpty());
}

TEST_F(MemoryTierStoreTest, ADirectoryOffTmpfsIsRefused) {
  tier_.reset();
  MemoryTier tier(MemoryTierOptions{.budget = kBlock, .dir = Dir("disk")});
  struct statfs fs;
  ASSERT_EQ(::statfs(tmp_.path().c_str(), &fs), 0);
  if (static_cast<uint64_t>(fs.f_type) == TMPFS_MAGIC) {
    GTEST_SKIP() << tmp_.path() << " is on tmpfs here";
  }
  absl::Status s = tier.Open();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("not on tmpfs"));
}

}  // namespace
}  // namespace ckptd::daemon
