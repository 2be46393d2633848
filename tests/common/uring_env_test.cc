// Copyright 2026 The ckptd Authors.
//
// Tests for UringEnv (common/uring_env.h): byte-exact content for random
// append patterns in buffered and O_DIRECT mode, Sync in the middle of a
// block, many files from several threads sharing a pool smaller than the
// number of files (the reclaim rule), real and injected write errors, and
// the forwarded Env operations. Every test is skipped, with the reason, when
// io_uring cannot be used here (UringEnv::Create returns UNAVAILABLE). Hung
// storage (write_timeout) is tested in hung_storage_test.cc, the Env contract
// in env_conformance_test.cc.
#include "common/uring_env.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/fault_injection_env.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd {
namespace {

using ::ckptd::testing::TempDir;
using ::ckptd::testing::TestSeed;

constexpr size_t kSmallBlock = size_t{64} << 10;

// Declares `var` (std::unique_ptr<UringEnv>) or skips the test if io_uring
// is unavailable on this machine.
#define CREATE_URING_ENV_OR_SKIP(var, probe_dir, options)                     \
  std::unique_ptr<UringEnv> var;                                              \
  do {                                                                        \
    auto created_ = UringEnv::Create(Env::Default(), (probe_dir), (options)); \
    if (absl::IsUnavailable(created_.status())) {                             \
      GTEST_SKIP() << "io_uring is not usable here: " << created_.status();   \
    }                                                                         \
    ASSERT_TRUE(created_.ok()) << created_.status();                          \
    var = std::move(created_).value();                                        \
  } while (0)

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

bool Contains(const absl::Status& s, std::string_view needle) {
  return Msg(s).find(needle) != std::string::npos;
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(out.data() + i, &v, 8);
  }
  for (; i < n; ++i) out[i] = static_cast<char>(rng());
  return out;
}

// 1 byte to 3 blocks, biased towards small appends (headers) as well.
size_t RandomAppendSize(std::mt19937_64& rng, size_t block) {
  switch (rng() % 4) {
    case 0:
      return 1 + rng() % 16;
    case 1:
      return 1 + rng() % 4096;
    case 2:
      return 1 + rng() % block;
    default:
      return 1 + rng() % (3 * block);
  }
}

absl::StatusOr<std::string> ReadAll(const std::string& path) {
  return ReadFileToString(Env::Default(), path, uint64_t{1} << 31);
}

// Compares without printing megabytes on failure.
void ExpectSameContent(const std::string& path, const std::string& expected) {
  auto actual = ReadAll(path);
  ASSERT_TRUE(actual.ok()) << actual.status();
  ASSERT_EQ(actual->size(), expected.size()) << path;
  if (*actual != expected) {
    size_t i = 0;
    while ((*actual)[i] == expected[i]) ++i;
    FAIL() << path << " differs first at byte " << i << " of "
           << expected.size();
  }
}

UringEnvOptions SmallOptions(bool direct, size_t blocks, int queue_depth) {
  UringEnvOptions o;
  o.direct = direct;
  o.block_bytes = kSmallBlock;
  o.pool_bytes = blocks * kSmallBlock;
  o.queue_depth = queue_depth;
  return o;
}

// Aborts the test binary if not destroyed within `limit` (a deadlock would
// otherwise hang the suite until ctest's timeout).
class Watchdog {
 public:
  Watchdog(absl::Duration limit, std::string what)
      : thread_([this, limit, what = std::move(what)] {
          absl::MutexLock lock(&mu_);
          if (!mu_.AwaitWithTimeout(absl::Condition(&done_), limit)) {
            std::fprintf(stderr, "watchdog: %s did not finish in %s\n",
                         what.c_str(), absl::FormatDuration(limit).c_str());
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Blocks until *step >= n; *step is guarded by *mu.
void WaitForStep(absl::Mutex* mu, const int* step, int n) {
  struct Arg {
    const int* step;
    int n;
  } arg{step, n};
  absl::MutexLock lock(mu);
  mu->Await(absl::Condition(
      +[](Arg* a) { return *a->step >= a->n; }, &arg));
}

// ---------------------------------------------------------------------------
// Create
// ---------------------------------------------------------------------------

TEST(UringEnvCreateTest, RejectsBadOptions) {
  TempDir dir;
  auto expect_invalid = [&](UringEnvOptions o, std::string_view field) {
    auto env = UringEnv::Create(Env::Default(), dir.path(), o);
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument)
        << env.status();
    EXPECT_TRUE(Contains(env.status(), field)) << env.status();
  };
  UringEnvOptions o;
  o.queue_depth = 0;
  expect_invalid(o, "queue_depth");
  o = {};
  o.block_bytes = 1000;
  expect_invalid(o, "block_bytes");
  o = {};
  o.block_bytes = 0;
  expect_invalid(o, "block_bytes");
  o = {};
  o.pool_bytes = o.block_bytes - 4096;
  expect_invalid(o, "pool_bytes");
  o = {};
  o.write_timeout = absl::Seconds(-1);
  expect_invalid(o, "write_timeout");
}

TEST(UringEnvCreateTest, MissingProbeDirIsAnErrorNotUnavailable) {
  TempDir dir;
  const std::string missing = dir.Join("missing");
  auto env = UringEnv::Create(Env::Default(), missing);
  if (absl::IsUnavailable(env.status())) {
    GTEST_SKIP() << "io_uring is not usable here: " << env.status();
  }
  EXPECT_EQ(env.status().code(), absl::StatusCode::kNotFound) << env.status();
  EXPECT_TRUE(Contains(env.status(), missing)) << env.status();
}

TEST(UringEnvCreateTest, ReportsOptionsAndPool) {
  TempDir dir;
  UringEnvOptions o = SmallOptions(false, 5, 3);
  o.pool_bytes += 100;  // rounded down to whole blocks
  CREATE_URING_ENV_OR_SKIP(env, dir.path(), o);
  EXPECT_EQ(env->options().queue_depth, 3);
  EXPECT_EQ(env->options().block_bytes, kSmallBlock);
  const UringEnvStats stats = env->stats();
  EXPECT_EQ(stats.pool_blocks, 5u);
  EXPECT_EQ(stats.free_blocks, 5u);
  EXPECT_EQ(stats.waits, 0u);
  EXPECT_EQ(stats.reclaims, 0u);
}

// ---------------------------------------------------------------------------
// Content, buffered and direct
// ---------------------------------------------------------------------------

class UringEnvModeTest : public ::testing::TestWithParam<bool> {
 protected:
  bool direct() const { return GetParam(); }
  TempDir dir_;
};

INSTANTIATE_TEST_SUITE_P(Modes, UringEnvModeTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Direct" : "Buffered";
                         });

TEST_P(UringEnvModeTest, RandomAppendsMatchByteForByte) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(direct(), 4, 3));
  std::mt19937_64 rng(TestSeed());
  for (int round = 0; round < 3; ++round) {
    const std::string path = dir_.Join(fmt::format("__{}_0.distcp", round));
    ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile(path, {}));
    EXPECT_EQ(file->path(), path);
    std::string expected;
    for (int i = 0; i < 150; ++i) {
      if (rng() % 5 == 0) {
        // A gathered append of a few parts, one of them possibly empty.
        std::vector<std::string> parts(1 + rng() % 4);
        for (std::string& p : parts) {
          p = RandomBytes(rng, RandomAppendSize(rng, kSmallBlock) - 1);
        }
        std::vector<std::string_view> views(parts.begin(), parts.end());
        ASSERT_OK(file->AppendV(views));
        for (const std::string& p : parts) expected += p;
      } else {
        std::string data = RandomBytes(rng, RandomAppendSize(rng, kSmallBlock));
        ASSERT_OK(file->Append(data));
        expected += data;
        data.assign(data.size(), 'X');  // the caller may reuse its memory
      }
      ASSERT_EQ(file->Size(), expected.size());
    }
    if (round == 1) ASSERT_OK(file->Sync());
    ASSERT_OK(file->Close());
    EXPECT_EQ(file->Size(), expected.size());
    ExpectSameContent(path, expected);
  }
  EXPECT_EQ(env->stats().free_blocks, env->stats().pool_blocks);
}

TEST_P(UringEnvModeTest, DefaultOptionsLargeAppends) {
  UringEnvOptions o;
  o.direct = direct();
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), o);
  std::mt19937_64 rng(TestSeed());
  const std::string path = dir_.Join("__0_0.distcp");
  ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile(path, {}));
  std::string expected;
  while (expected.size() < (size_t{40} << 20)) {
    std::string data = RandomBytes(rng, RandomAppendSize(rng, o.block_bytes));
    ASSERT_OK(file->Append(data));
    expected += data;
  }
  ASSERT_OK(file->Sync());
  ASSERT_OK(file->Close());
  ExpectSameContent(path, expected);
}

TEST_P(UringEnvModeTest, SyncInTheMiddleThenMoreAppends) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(direct(), 4, 2));
  std::mt19937_64 rng(TestSeed());
  const std::string path = dir_.Join("f.bin");
  ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile(path, {}));
  std::string expected;
  // Each step ends inside a block (or exactly on a page / block boundary),
  // then syncs: the file must hold exactly the bytes so far, and the next
  // appends continue in the synced block.
  const size_t steps[] = {10000, 1,     70000, 4096 - 1, 1,     4096,
                          0,     65536, 3,     200000,   60000, 5};
  for (size_t n : steps) {
    std::string data = RandomBytes(rng, n);
    ASSERT_OK(file->Append(data));
    expected += data;
    ASSERT_OK(file->Sync());
    ExpectSameContent(path, expected);
  }
  ASSERT_OK(file->Sync());  // nothing new
  ExpectSameContent(path, expected);
  std::string last = RandomBytes(rng, 12345);
  ASSERT_OK(file->Append(last));
  expected += last;
  ASSERT_OK(file->Close());  // flushes without a Sync
  ExpectSameContent(path, expected);
  EXPECT_EQ(env->stats().free_blocks, env->stats().pool_blocks);
}

TEST_P(UringEnvModeTest, ExactBlockMultiplesAndEmptyFiles) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(direct(), 2, 1));
  std::mt19937_64 rng(TestSeed());
  const std::string empty = dir_.Join("empty");
  {
    ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile(empty, {}));
    ASSERT_OK(file->Sync());
    ASSERT_OK(file->Close());
  }
  ExpectSameContent(empty, "");
  const std::string path = dir_.Join("blocks");
  ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile(path, {}));
  const std::string data = RandomBytes(rng, 3 * kSmallBlock);
  ASSERT_OK(file->Append(data));
  ASSERT_OK(file->Close());
  ExpectSameContent(path, data);
}

TEST_P(UringEnvModeTest, DestructorClosesAndKeepsData) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(direct(), 2, 2));
  std::mt19937_64 rng(TestSeed());
  const std::string path = dir_.Join("f.bin");
  const std::string data = RandomBytes(rng, kSmallBlock + 777);
  {
    ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile(path, {}));
    ASSERT_OK(file->Append(data));
  }
  ExpectSameContent(path, data);
  EXPECT_EQ(env->stats().free_blocks, env->stats().pool_blocks);
}

// Rule 3 of uring_env.h, deterministically: one thread, three files, a pool
// of one block. Each file keeps a partial block between its appends, so the
// next file must reclaim it.
TEST_P(UringEnvModeTest, OneThreadInterleavesFilesOverOneBlock) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(direct(), 1, 4));
  Watchdog watchdog(absl::Seconds(60), "OneThreadInterleavesFilesOverOneBlock");
  std::mt19937_64 rng(TestSeed());
  constexpr int kFiles = 3;
  std::vector<std::unique_ptr<WritableFile>> files;
  std::vector<std::string> expected(kFiles);
  for (int i = 0; i < kFiles; ++i) {
    ASSERT_OK_AND_ASSIGN(
        auto file, env->NewWritableFile(dir_.Join(fmt::format("f{}", i)), {}));
    files.push_back(std::move(file));
  }
  for (int step = 0; step < 120; ++step) {
    const int i = step % kFiles;
    std::string data = RandomBytes(rng, RandomAppendSize(rng, kSmallBlock));
    ASSERT_OK(files[i]->Append(data));
    expected[i] += data;
    if (rng() % 8 == 0) ASSERT_OK(files[i]->Sync());
  }
  for (int i = 0; i < kFiles; ++i) {
    ASSERT_OK(files[i]->Sync());
    ASSERT_OK(files[i]->Close());
    ExpectSameContent(files[i]->path(), expected[i]);
  }
  const UringEnvStats stats = env->stats();
  EXPECT_GT(stats.reclaims, 0u);
  EXPECT_GT(stats.waits, 0u);
  EXPECT_EQ(stats.free_blocks, 1u);
}

// A thread parks the pool's only block in its idle file and then waits for
// another thread that needs a block: that thread reclaims it. First the
// block is parked as a full block in flight (reclaiming waits for the write),
// then as a partial block (reclaiming writes it early; direct mode rewrites
// the partial page with the parked file's next block).
TEST_P(UringEnvModeTest, BlockParkedByAWaitingThreadIsReclaimed) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(direct(), 1, 4));
  Watchdog watchdog(absl::Seconds(60),
                    "BlockParkedByAWaitingThreadIsReclaimed");
  std::mt19937_64 rng(TestSeed());
  const std::string parked_path = dir_.Join("parked");
  const std::string parked[3] = {RandomBytes(rng, kSmallBlock),
                                 RandomBytes(rng, 5000),
                                 RandomBytes(rng, 2 * kSmallBlock + 1)};
  const std::string other[2] = {RandomBytes(rng, 3 * kSmallBlock + 3),
                                RandomBytes(rng, 100)};
  // The threads take turns: the parker runs at even steps, the other at odd.
  absl::Mutex mu;
  int step = 0;
  auto next_step = [&] {
    absl::MutexLock lock(&mu);
    ++step;
  };
  absl::Status parker_status, other_status;
  std::thread parker([&] {
    auto run = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(auto file, env->NewWritableFile(parked_path, {}));
      for (int i = 0; i < 3; ++i) {
        RETURN_IF_ERROR(file->Append(parked[i]));
        if (i < 2) {
          next_step();  // 2i+1: the other thread's turn
          WaitForStep(&mu, &step, 2 * i + 2);
        }
      }
      RETURN_IF_ERROR(file->Sync());
      return file->Close();
    };
    parker_status = run();
    if (!parker_status.ok()) {
      absl::MutexLock lock(&mu);
      step = 1000;  // release the other thread
    }
  });
  std::thread writer([&] {
    auto run = [&]() -> absl::Status {
      for (int i = 0; i < 2; ++i) {
        WaitForStep(&mu, &step, 2 * i + 1);
        const std::string path = dir_.Join(fmt::format("other{}", i));
        ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path, {}));
        RETURN_IF_ERROR(file->Append(other[i]));
        RETURN_IF_ERROR(file->Sync());
        RETURN_IF_ERROR(file->Close());
        next_step();
      }
      return absl::OkStatus();
    };
    other_status = run();
    if (!other_status.ok()) {
      absl::MutexLock lock(&mu);
      step = 1000;  // release the parker
    }
  });
  parker.join();
  writer.join();
  ASSERT_OK(parker_status);
  ASSERT_OK(other_status);
  ExpectSameContent(parked_path, parked[0] + parked[1] + parked[2]);
  ExpectSameContent(dir_.Join("other0"), other[0]);
  ExpectSameContent(dir_.Join("other1"), other[1]);
  const UringEnvStats stats = env->stats();
  EXPECT_EQ(stats.reclaims, 2u);
  EXPECT_EQ(stats.free_blocks, 1u);
}

// Six files written by three threads (two interleaved files each) through a
// pool of two blocks: no deadlock, exact content.
TEST_P(UringEnvModeTest, ManyFilesFromThreadsShareASmallPool) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(direct(), 2, 2));
  Watchdog watchdog(absl::Seconds(120), "ManyFilesFromThreadsShareASmallPool");
  const uint64_t seed = TestSeed();
  constexpr int kThreads = 3;
  constexpr int kFilesPerThread = 2;
  std::vector<absl::Status> results(kThreads);
  std::vector<std::vector<std::string>> expected(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      std::vector<std::unique_ptr<WritableFile>> files;
      expected[t].resize(kFilesPerThread);
      auto run = [&]() -> absl::Status {
        for (int i = 0; i < kFilesPerThread; ++i) {
          auto file = env->NewWritableFile(
              dir_.Join(fmt::format("__{}_{}.distcp", t, i)), {});
          if (!file.ok()) return file.status();
          files.push_back(std::move(file).value());
        }
        for (int step = 0; step < 80; ++step) {
          const int i = static_cast<int>(rng() % kFilesPerThread);
          std::string data =
              RandomBytes(rng, RandomAppendSize(rng, kSmallBlock));
          if (absl::Status s = files[i]->Append(data); !s.ok()) return s;
          expected[t][i] += data;
          if (rng() % 10 == 0) {
            if (absl::Status s = files[i]->Sync(); !s.ok()) return s;
          }
        }
        for (auto& file : files) {
          if (absl::Status s = file->Sync(); !s.ok()) return s;
          if (absl::Status s = file->Close(); !s.ok()) return s;
        }
        return absl::OkStatus();
      };
      results[t] = run();
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_OK(results[t]);
    for (int i = 0; i < kFilesPerThread; ++i) {
      ExpectSameContent(dir_.Join(fmt::format("__{}_{}.distcp", t, i)),
                        expected[t][i]);
    }
  }
  const UringEnvStats stats = env->stats();
  EXPECT_EQ(stats.free_blocks, 2u);
  std::fprintf(stderr, "pool waits %llu, reclaims %llu\n",
               static_cast<unsigned long long>(stats.waits),
               static_cast<unsigned long long>(stats.reclaims));
}

// ---------------------------------------------------------------------------
// Opening, closing, errors
// ---------------------------------------------------------------------------

class UringEnvTest : public ::testing::Test {
 protected:
  TempDir dir_;
};

TEST_F(UringEnvTest, ExclusiveCreateAndTruncate) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(false, 2, 2));
  const std::string path = dir_.Join("f");
  WritableFileOptions exclusive;
  exclusive.exclusive = true;
  {
    ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile(path, exclusive));
    ASSERT_OK(file->Append("a long first version"));
    ASSERT_OK(file->Close());
  }
  auto again = env->NewWritableFile(path, exclusive);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists)
      << again.status();
  EXPECT_TRUE(Contains(again.status(), path)) << again.status();
  ExpectSameContent(path, "a long first version");
  {
    ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile(path, {}));
    ASSERT_OK(file->Append("short"));
    ASSERT_OK(file->Close());
  }
  ExpectSameContent(path, "short");
}

TEST_F(UringEnvTest, OpenErrorNamesThePath) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(false, 2, 2));
  const std::string path = dir_.Join("missing/f");
  auto file = env->NewWritableFile(path, {});
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound) << file.status();
  EXPECT_TRUE(Contains(file.status(), "open for write " + path))
      << file.status();
}

TEST_F(UringEnvTest, CallsAfterCloseFail) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(false, 2, 2));
  const std::string path = dir_.Join("f");
  ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile(path, {}));
  ASSERT_OK(file->Append("abc"));
  ASSERT_OK(file->Close());
  EXPECT_OK(file->Close());  // idempotent
  absl::Status s = file->Append("d");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Contains(s, path)) << s;
  s = file->Sync();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(file->Size(), 3u);
  ExpectSameContent(path, "abc");
}

// /dev/full fails every write with ENOSPC: a real write error through
// io_uring. Full blocks fail while in flight (the error surfaces on a later
// call); a partial block fails in Close.
TEST_F(UringEnvTest, RealEnospcFromDevFull) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(false, 2, 2));
  if (::access("/dev/full", W_OK) != 0) {
    GTEST_SKIP() << "/dev/full is not writable here";
  }
  {
    ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile("/dev/full", {}));
    const std::string block(kSmallBlock, 'x');
    absl::Status first;
    for (int i = 0; i < 4 && first.ok(); ++i) first = file->Append(block);
    if (first.ok()) first = file->Sync();
    ASSERT_FALSE(first.ok());
    EXPECT_EQ(first.code(), absl::StatusCode::kResourceExhausted) << first;
    EXPECT_TRUE(Contains(first, "write /dev/full at offset ")) << first;
    EXPECT_TRUE(Contains(first, "No space left on device")) << first;
    // Remembered: every later call returns it, Close included.
    EXPECT_EQ(file->Append("more"), first);
    EXPECT_EQ(file->Sync(), first);
    EXPECT_EQ(file->Close(), first);
    EXPECT_EQ(file->Close(), first);
  }
  {
    ASSERT_OK_AND_ASSIGN(auto file, env->NewWritableFile("/dev/full", {}));
    ASSERT_OK(file->Append("a partial block"));
    absl::Status s = file->Close();
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_EQ(Msg(s), "write /dev/full at offset 0: No space left on device");
  }
  EXPECT_EQ(env->stats().free_blocks, 2u);
}

TEST_F(UringEnvTest, InjectedFaultsThroughFaultInjectionEnv) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(false, 2, 2));
  FaultInjectionEnv fault(env.get());
  const std::string path = dir_.Join("__0_0.distcp");
  fault.AddRule({FaultOp::kAppend, "__0_0.distcp", ENOSPC, /*skip=*/1,
                 /*times=*/1});
  fault.AddRule({FaultOp::kSync, "__0_0.distcp", EIO, 0, 1});
  ASSERT_OK_AND_ASSIGN(auto file, fault.NewWritableFile(path, {}));
  ASSERT_OK(file->Append("first "));
  absl::Status s = file->Append("lost");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(Msg(s), "append " + path + ": No space left on device");
  ASSERT_OK(file->Append("third"));
  s = file->Sync();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s, absl::ErrnoToStatus(EIO, "sync " + path));
  ASSERT_OK(file->Sync());
  ASSERT_OK(file->Close());
  EXPECT_EQ(fault.faults_injected(), 2);
  ExpectSameContent(path, "first third");
}

// The crash model of FaultInjectionEnv works over UringEnv files: bytes
// appended after the last Sync are lost.
TEST_F(UringEnvTest, SimulatedCrashDropsUnsyncedBytes) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(true, 2, 2));
  std::mt19937_64 rng(TestSeed());
  FaultInjectionEnv fault(env.get());
  const std::string path = dir_.Join("__1_0.distcp");
  const std::string synced = RandomBytes(rng, kSmallBlock + 100);
  {
    ASSERT_OK_AND_ASSIGN(auto file, fault.NewWritableFile(path, {}));
    ASSERT_OK(file->Append(synced));
    ASSERT_OK(file->Sync());
    ASSERT_OK(file->Append(RandomBytes(rng, 3 * kSmallBlock)));
    ASSERT_OK(file->Close());
  }
  ASSERT_OK(fault.SyncDir(dir_.path()));
  ASSERT_OK(fault.SimulateCrash());
  ExpectSameContent(path, synced);
}

TEST_F(UringEnvTest, ForwardsOtherOperationsToBase) {
  CREATE_URING_ENV_OR_SKIP(env, dir_.path(), SmallOptions(false, 2, 2));
  const std::string sub = dir_.Join("a/b");
  ASSERT_OK(env->CreateDirs(sub));
  const std::string path = JoinPath(sub, ".metadata");
  ASSERT_OK(WriteFileAtomic(env.get(), path, "metadata bytes"));
  ASSERT_OK_AND_ASSIGN(std::string read,
                       ReadFileToString(env.get(), path, 1 << 20));
  EXPECT_EQ(read, "metadata bytes");
  ASSERT_OK_AND_ASSIGN(uint64_t size, env->GetFileSize(path));
  EXPECT_EQ(size, 14u);
  ASSERT_OK_AND_ASSIGN(auto names, env->ListDir(sub));
  EXPECT_EQ(names, std::vector<std::string>{".metadata"});
  ASSERT_OK(env->RenameFile(path, path + ".old"));
  EXPECT_TRUE(absl::IsNotFound(env->FileExists(path)));
  ASSERT_OK(env->FileExists(path + ".old"));
  ASSERT_OK(env->RemoveFile(path + ".old"));
  ASSERT_OK(env->SyncDir(sub));
  ASSERT_OK(env->RemoveDir(sub));
  EXPECT_TRUE(absl::IsNotFound(env->FileExists(sub)));
}

}  // namespace
}  // namespace ckptd
