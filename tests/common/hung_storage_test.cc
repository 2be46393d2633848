// Copyright 2026 The ckptd Authors.
//
// Hung storage: the two writers the daemon uses give up on a write that
// makes no progress for write_timeout (common/uring_env.h "Hung storage",
// common/write_timeout_env.h), and what the kernel still owns is never
// reused.
//
// Two ways to hang a write for real:
//  * a FIFO whose reader stops reading (hermetic, any user): once the pipe
//    is full, a write to it blocks in the kernel exactly like a write to a
//    dead disk, and resumes when the reader drains it. This also shows that
//    the bytes a late write finally delivers are the ones handed to it (the
//    buffers were not reused while the kernel held them);
//  * a loop-mounted ext4 frozen with `fsfreeze -f` (needs root; skipped with
//    the reason otherwise), for each writer and O_DIRECT: the daemon's real
//    case. It is always thawed, also when an assertion fails.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/uring_env.h"
#include "common/write_timeout_env.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd {
namespace {

using ::ckptd::testing::RunCommand;
using ::ckptd::testing::TempDir;

constexpr size_t kBlock = size_t{64} << 10;  // = the default pipe capacity
constexpr absl::Duration kTimeout = absl::Milliseconds(400);
// How late a timeout may fire on a loaded 2-core VM.
constexpr absl::Duration kSlack = absl::Seconds(5);

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// Distinct bytes per stream and offset, so that a block written from the
// wrong buffer or at the wrong place shows.
std::string Pattern(char stream, size_t offset, size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    const uint64_t x = (offset + i) * 0x9E3779B97F4A7C15ull + stream;
    out[i] = static_cast<char>(x >> 56);
  }
  return out;
}

void ExpectNoProgressError(const absl::Status& s, std::string_view what) {
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(Msg(s).find(what), std::string::npos) << s;
  EXPECT_NE(Msg(s).find(fmt::format("made no progress for {} (write_timeout)",
                                    absl::FormatDuration(kTimeout))),
            std::string::npos)
      << s;
}

// A FIFO in a temp dir with its read end open (non-blocking), so that
// opening it for writing does not block and writes block once it is full.
class Fifo {
 public:
  explicit Fifo(const std::string& path) : path_(path) {
    if (::mkfifo(path.c_str(), 0600) == 0) {
      fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    }
  }
  ~Fifo() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }

  // Reads what the writers deliver until `n` bytes came or `limit` passed.
  std::string Drain(size_t n, absl::Duration limit) {
    std::string out;
    const absl::Time end = absl::Now() + limit;
    std::string buf(kBlock, '\0');  // whole pipe: a late write fits at once
    while (out.size() < n && absl::Now() < end) {
      const ssize_t r = ::read(fd_, buf.data(), buf.size());
      if (r > 0) {
        out.append(buf.data(), static_cast<size_t>(r));
      } else {
        absl::SleepFor(absl::Milliseconds(5));
      }
    }
    return out;
  }

 private:
  const std::string path_;
  int fd_ = -1;
};

// ---------------------------------------------------------------------------
// UringEnv
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<UringEnv>> MakeUring(const std::string& dir,
                                                    bool direct) {
  UringEnvOptions o;
  o.block_bytes = kBlock;
  o.pool_bytes = 4 * kBlock;
  o.queue_depth = 2;
  o.direct = direct;
  o.write_timeout = kTimeout;
  return UringEnv::Create(Env::Default(), dir, o);
}

TEST(UringHungStorageTest, StuckWriteTimesOutAndItsBuffersAreNotReused) {
  TempDir dir;
  auto created = MakeUring(dir.path(), /*direct=*/false);
  if (absl::IsUnavailable(created.status())) {
    GTEST_SKIP() << "io_uring is not usable here: " << created.status();
  }
  ASSERT_OK(created.status());
  UringEnv& env = **created;
  Fifo fifo(dir.Join("fifo"));
  ASSERT_TRUE(fifo.ok()) << std::strerror(errno);

  // Three blocks: the first fills the pipe, the next two (the queue depth)
  // stay in the kernel.
  const std::string a = Pattern('a', 0, 3 * kBlock);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> hung,
                       env.NewWritableFile(fifo.path(), {}));
  absl::Status s = hung->Append(a);
  const absl::Time start = absl::Now();
  if (s.ok()) s = hung->Sync();
  const absl::Duration waited = absl::Now() - start;
  ExpectNoProgressError(
      s, fmt::format("write of {} at offset {}", fifo.path(), kBlock));
  EXPECT_LT(waited, kTimeout + kSlack);
  // The same error from every later call, without waiting again.
  const absl::Time again = absl::Now();
  EXPECT_EQ(hung->Append("x"), s);
  EXPECT_EQ(hung->Sync(), s);
  EXPECT_EQ(hung->Close(), s);
  EXPECT_LT(absl::Now() - again, absl::Seconds(1));
  hung.reset();
  UringEnvStats st = env.stats();
  EXPECT_EQ(st.timeouts, 1u);
  EXPECT_EQ(st.abandoned_blocks, 2u);
  EXPECT_EQ(st.free_blocks, 2u);

  // The pool's other two blocks keep serving other files, many times over:
  // if an abandoned block were handed out, 'b' bytes would overwrite the
  // 'a' bytes the kernel still has to deliver.
  const std::string b = Pattern('b', 0, 40 * kBlock);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> other,
                       env.NewWritableFile(dir.Join("other"), {}));
  for (size_t off = 0; off < b.size(); off += 3000) {
    ASSERT_OK(other->Append(std::string_view(b).substr(off, 3000)));
  }
  ASSERT_OK(other->Sync());
  ASSERT_OK(other->Close());
  EXPECT_EQ(ReadFileToString(&env, dir.Join("other"), 1 << 30).value(), b);

  // The storage answers again: the late writes deliver the original bytes,
  // and their blocks come back to the pool.
  // (A pipe has no offsets: the two late blocks may arrive in either order.)
  const std::string got = fifo.Drain(a.size(), absl::Seconds(10));
  ASSERT_EQ(got.size(), a.size());
  auto block = [](const std::string& s, int i) {
    return s.substr(i * kBlock, kBlock);
  };
  EXPECT_TRUE(block(got, 0) == block(a, 0));
  EXPECT_TRUE((block(got, 1) == block(a, 1) && block(got, 2) == block(a, 2)) ||
              (block(got, 1) == block(a, 2) && block(got, 2) == block(a, 1)))
      << "a late write delivered bytes other than its own";
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (env.stats().abandoned_blocks > 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  st = env.stats();
  EXPECT_EQ(st.abandoned_blocks, 0u);
  EXPECT_EQ(st.free_blocks, 4u);
}

TEST(UringHungStorageTest, NoFreeBufferForWriteTimeoutFailsTheNextFile) {
  TempDir dir;
  auto created = MakeUring(dir.path(), /*direct=*/false);
  if (absl::IsUnavailable(created.status())) {
    GTEST_SKIP() << "io_uring is not usable here: " << created.status();
  }
  ASSERT_OK(created.status());
  UringEnv& env = **created;
  // Two hung FIFOs hold all four blocks of the pool.
  Fifo f1(dir.Join("f1")), f2(dir.Join("f2"));
  ASSERT_TRUE(f1.ok() && f2.ok());
  for (Fifo* f : {&f1, &f2}) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w,
                         env.NewWritableFile(f->path(), {}));
    const absl::Status s = w->Append(Pattern('c', 0, 3 * kBlock));
    ExpectNoProgressError(s.ok() ? w->Sync() : s, f->path());
  }
  EXPECT_EQ(env.stats().abandoned_blocks, 4u);
  // A healthy file now finds no buffer: it fails after write_timeout
  // instead of waiting for ever, naming the reason.
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> w,
                       env.NewWritableFile(dir.Join("healthy"), {}));
  const absl::Time start = absl::Now();
  const absl::Status s = w->Append("x");
  EXPECT_LT(absl::Now() - start, kTimeout + kSlack);
  ExpectNoProgressError(s, dir.Join("healthy"));
  EXPECT_NE(Msg(s).find("4 of 4 buffers are held by writes abandoned"),
            std::string::npos)
      << s;
  // Once the storage drains, the blocks come back and writing works again.
  (void)f1.Drain(2 * kBlock, absl::Seconds(10));
  (void)f2.Drain(2 * kBlock, absl::Seconds(10));
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (env.stats().abandoned_blocks > 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(env.stats().free_blocks, 4u);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> later,
                       env.NewWritableFile(dir.Join("later"), {}));
  ASSERT_OK(later->Append("fine"));
  ASSERT_OK(later->Close());
}

// ---------------------------------------------------------------------------
// WriteTimeoutEnv (the pwrite path)
// ---------------------------------------------------------------------------

TEST(WriteTimeoutHungStorageTest, StuckWriteTimesOutAndTheThreadIsAbandoned) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<WriteTimeoutEnv> env,
      WriteTimeoutEnv::Create(
          Env::Default(), {.write_timeout = kTimeout, .buffer_bytes = kBlock}));
  Fifo fifo(dir.Join("fifo"));
  ASSERT_TRUE(fifo.ok()) << std::strerror(errno);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> hung,
                       env->NewWritableFile(fifo.path(), {}));
  absl::Status s;
  const absl::Time start = absl::Now();
  {
    // The caller's bytes are freed right after the call: the writer thread
    // must not depend on them.
    const std::string a = Pattern('a', 0, 3 * kBlock);
    s = hung->Append(a);
    if (s.ok()) s = hung->Sync();
  }
  EXPECT_LT(absl::Now() - start, kTimeout + kSlack);
  ExpectNoProgressError(
      s, fmt::format("write of {} at offset {}", fifo.path(), kBlock));
  const absl::Time again = absl::Now();
  EXPECT_EQ(hung->Append("x"), s);
  EXPECT_EQ(hung->Close(), s);
  hung.reset();  // does not wait for the stuck thread
  EXPECT_LT(absl::Now() - again, absl::Seconds(1));
  EXPECT_EQ(env->stats().timeouts, 1u);
  EXPECT_EQ(env->stats().stuck_threads, 1);

  // Other files are not affected.
  ASSERT_OK(WriteFileAtomic(env.get(), dir.Join("other"), "fine"));

  // The storage answers: the stuck write delivers its own bytes (the second
  // block; the third never reached the writer thread), and the thread ends.
  const std::string got = fifo.Drain(2 * kBlock, absl::Seconds(10));
  EXPECT_EQ(got.size(), 2 * kBlock);
  EXPECT_TRUE(got == Pattern('a', 0, 2 * kBlock).substr(0, got.size()))
      << "the late write delivered bytes other than its own";
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (env->stats().stuck_threads > 0 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(env->stats().stuck_threads, 0);
}

TEST(WriteTimeoutEnvTest, RejectsBadOptions) {
  EXPECT_EQ(WriteTimeoutEnv::Create(Env::Default(),
                                    {.write_timeout = absl::ZeroDuration()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteTimeoutEnv::Create(Env::Default(), {.buffer_bytes = 100})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// A frozen ext4 (root)
// ---------------------------------------------------------------------------

// A small ext4 image on a loop device, mounted under `dir`; thawed,
// unmounted and detached by the destructor.
class LoopExt4 {
 public:
  // Empty if it was made, else why not (the test skips with it).
  std::string Make(const std::string& dir) {
    if (::geteuid() != 0) {
      return fmt::format("needs root (losetup, mount, fsfreeze); uid {}",
                         ::geteuid());
    }
    for (const char* tool : {"mkfs.ext4", "losetup", "mount", "fsfreeze"}) {
      if (RunCommand(fmt::format("command -v {} || test -x /usr/sbin/{}", tool,
                                 tool)) != 0) {
        return fmt::format("{} is not installed", tool);
      }
    }
    image_ = dir + "/ext4.img";
    mnt_ = dir + "/mnt";
    std::string out;
    const std::string cmd = fmt::format(
        "PATH=$PATH:/usr/sbin:/sbin; set -e; mkdir -p {1}; truncate -s 64M {0};"
        " mkfs.ext4 -q -F -m 0 -b 4096 -E "
        "lazy_itable_init=0,lazy_journal_init=0"
        " {0}; losetup --find --show {0}",
        image_, mnt_);
    if (RunCommand(cmd, &out) != 0) return "cannot make the image: " + out;
    dev_ = out.substr(0, out.find('\n'));
    out.clear();
    if (RunCommand(
            fmt::format("PATH=$PATH:/usr/sbin:/sbin; mount -t ext4 {} {}", dev_,
                        mnt_),
            &out) != 0) {
      return "mount: " + out;
    }
    mounted_ = true;
    return "";
  }
  ~LoopExt4() {
    const std::string p = "PATH=$PATH:/usr/sbin:/sbin; ";
    if (mounted_) {
      (void)RunCommand(p + "fsfreeze -u " + mnt_);
      for (int i = 0; i < 100 && RunCommand(p + "umount " + mnt_) != 0; ++i) {
        absl::SleepFor(absl::Milliseconds(100));
      }
    }
    if (!dev_.empty()) (void)RunCommand(p + "losetup -d " + dev_);
  }
  absl::Status Freeze() { return Run("fsfreeze -f " + mnt_); }
  absl::Status Thaw() { return Run("fsfreeze -u " + mnt_); }
  const std::string& mnt() const { return mnt_; }

 private:
  absl::Status Run(const std::string& cmd) {
    std::string out;
    if (RunCommand("PATH=$PATH:/usr/sbin:/sbin; " + cmd, &out) != 0) {
      return absl::InternalError(cmd + ": " + out);
    }
    return absl::OkStatus();
  }

  std::string image_, mnt_, dev_;
  bool mounted_ = false;
};

// Thaws on scope exit, whatever happens in between.
class ThawGuard {
 public:
  explicit ThawGuard(LoopExt4* fs) : fs_(fs) {}
  ~ThawGuard() { (void)fs_->Thaw(); }

 private:
  LoopExt4* const fs_;
};

enum class Writer { kUringBuffered, kUringDirect, kPwrite };

class FrozenFsTest : public ::testing::TestWithParam<Writer> {};

TEST_P(FrozenFsTest,
       WriteOnFrozenFsFailsWithinWriteTimeoutAndRecoversAfterThaw) {
  TempDir dir;
  LoopExt4 fs;
  if (std::string why = fs.Make(dir.path()); !why.empty()) {
    GTEST_SKIP() << "no loop-mounted ext4: " << why;
  }
  std::unique_ptr<UringEnv> uring;
  std::unique_ptr<WriteTimeoutEnv> timeout_env;
  Env* env = nullptr;
  if (GetParam() == Writer::kPwrite) {
    ASSERT_OK_AND_ASSIGN(
        timeout_env,
        WriteTimeoutEnv::Create(Env::Default(), {.write_timeout = kTimeout,
                                                 .buffer_bytes = kBlock}));
    env = timeout_env.get();
  } else {
    auto created = MakeUring(fs.mnt(), GetParam() == Writer::kUringDirect);
    if (absl::IsUnavailable(created.status())) {
      GTEST_SKIP() << "io_uring is not usable here: " << created.status();
    }
    ASSERT_OK(created.status());
    uring = *std::move(created);
    env = uring.get();
  }
  const std::string path = fs.mnt() + "/__0_0.distcp";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f,
                       env->NewWritableFile(path, {}));
  ASSERT_OK(f->Append(Pattern('d', 0, 8 * kBlock)));
  ASSERT_OK(f->Sync());
  {
    ThawGuard thaw(&fs);
    ASSERT_OK(fs.Freeze());
    const absl::Time start = absl::Now();
    absl::Status s = f->Append(Pattern('d', 8 * kBlock, 8 * kBlock));
    if (s.ok()) s = f->Sync();
    const absl::Duration waited = absl::Now() - start;
    ExpectNoProgressError(s, path);
    EXPECT_GE(waited, kTimeout - absl::Milliseconds(50));
    EXPECT_LT(waited, kTimeout + kSlack);
    EXPECT_EQ(f->Close(), s);
    f.reset();
    ASSERT_OK(fs.Thaw());
  }
  // After the thaw the abandoned writes finish and give their resources
  // back; the file system takes new files.
  const absl::Time end = absl::Now() + absl::Seconds(20);
  auto settled = [&] {
    return uring ? uring->stats().abandoned_blocks == 0
                 : timeout_env->stats().stuck_threads == 0;
  };
  while (!settled() && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(settled());
  if (uring) {
    EXPECT_EQ(uring->stats().free_blocks, 4u);
  }
  ASSERT_OK(WriteFileAtomic(env, fs.mnt() + "/after", "thawed"));
  EXPECT_EQ(ReadFileToString(env, fs.mnt() + "/after", 100).value(), "thawed");
}

INSTANTIATE_TEST_SUITE_P(Writers, FrozenFsTest,
                         ::testing::Values(Writer::kUringBuffered,
                                           Writer::kUringDirect,
                                           Writer::kPwrite),
                         [](const auto& info) -> std::string {
                           switch (info.param) {
                             case Writer::kUringBuffered:
                               return "uring_buffered";
                             case Writer::kUringDirect:
                               return "uring_direct";
                             case Writer::kPwrite:
                               return "pwrite";
                           }
                           return "unknown";
                         });

}  // namespace
}  // namespace ckptd
