// Copyright 2026 The ckptd Authors.
//
// The Env contract (common/env.h), checked the same way against every Env
// implementation: one typed GoogleTest suite, instantiated for
//   posix            Env::Default()
//   uring_buffered   UringEnv over POSIX, page-cache writes
//   uring_direct     UringEnv over POSIX, O_DIRECT writes
//   fault_injection  FaultInjectionEnv over POSIX, no rule set
//   write_timeout    WriteTimeoutEnv over POSIX (the daemon's pwrite path)
// (the idea of tensorstore's one kvstore test suite run against every
// driver). A new Env gets a fixture below and runs every test here. What
// each Env adds (faults, the crash model, the block pool, hung storage) is
// tested in its own suite. io_uring variants skip, with the reason, where
// io_uring or O_DIRECT cannot be used.
//
// Groups: Write* (new/append/sync/close, sizes, truncation, exclusive
// create), Read*, Rename*, Remove*, List*, Dirs* (create, sync), Exists*,
// RealPath*, Errors* (NOT_FOUND for missing things, the errno mapping of
// ErrnoToEnvStatus, the path in every message), Helpers* (WriteFileAtomic,
// ReadFileToString, CreateDirsDurably over the Env), Threads*.
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/fault_injection_env.h"
#include "common/uring_env.h"
#include "common/write_timeout_env.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd {
namespace {

using ::ckptd::testing::TempDir;
using ::ckptd::testing::TestSeed;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// How many pages of `path` are in the page cache (mincore of a mapping).
size_t CachedPages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0 || st.st_size == 0) return 0;
  const size_t size = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return 0;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  size_t cached = 0;
  if (::mincore(p, size, vec.data()) == 0) {
    for (unsigned char v : vec) cached += v & 1;
  }
  ::munmap(p, size);
  return cached;
}

// ---------------------------------------------------------------------------
// One fixture per Env: Init() makes it (a non-OK status skips the tests with
// the reason), env() is the Env under test.
// ---------------------------------------------------------------------------

struct PosixFixture {
  static constexpr const char* kName = "posix";
  absl::Status Init(const std::string&) { return absl::OkStatus(); }
  Env* env() { return Env::Default(); }
};

// Small blocks and a small pool, so that the tests cross block boundaries
// and share the pool.
template <bool kDirect>
struct UringFixture {
  static constexpr const char* kName =
      kDirect ? "uring_direct" : "uring_buffered";
  absl::Status Init(const std::string& dir) {
    UringEnvOptions o;
    o.block_bytes = size_t{64} << 10;
    o.pool_bytes = size_t{512} << 10;
    o.queue_depth = 2;
    o.direct = kDirect;
    o.write_timeout = absl::Minutes(1);
    absl::StatusOr<std::unique_ptr<UringEnv>> e =
        UringEnv::Create(Env::Default(), dir, o);
    if (!e.ok()) return e.status();
    uring = *std::move(e);
    return absl::OkStatus();
  }
  Env* env() { return uring.get(); }
  std::unique_ptr<UringEnv> uring;
};

struct FaultInjectionFixture {
  static constexpr const char* kName = "fault_injection";
  absl::Status Init(const std::string&) { return absl::OkStatus(); }
  Env* env() { return &fault; }
  FaultInjectionEnv fault{Env::Default()};
};

struct WriteTimeoutFixture {
  static constexpr const char* kName = "write_timeout";
  absl::Status Init(const std::string&) {
    WriteTimeoutEnvOptions o;
    o.write_timeout = absl::Minutes(1);
    o.buffer_bytes = size_t{64} << 10;
    absl::StatusOr<std::unique_ptr<WriteTimeoutEnv>> e =
        WriteTimeoutEnv::Create(Env::Default(), o);
    if (!e.ok()) return e.status();
    timeout = *std::move(e);
    return absl::OkStatus();
  }
  Env* env() { return timeout.get(); }
  std::unique_ptr<WriteTimeoutEnv> timeout;
};

template <typename Fixture>
class EnvConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const absl::Status s = fixture_.Init(dir_.path());
    if (absl::IsUnavailable(s)) {
      GTEST_SKIP() << Fixture::kName << " cannot be used here: " << s;
    }
    ASSERT_TRUE(s.ok()) << s;
    env_ = fixture_.env();
  }

  std::string Path(std::string_view name) const { return dir_.Join(name); }

  // Creates `name` holding `data` through the Env under test.
  void Write(std::string_view name, std::string_view data) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f,
                         env_->NewWritableFile(Path(name)));
    ASSERT_OK(f->Append(data));
    ASSERT_OK(f->Close());
  }

  absl::StatusOr<std::string> Read(std::string_view name) {
    return ReadFileToString(env_, Path(name), uint64_t{1} << 30);
  }

  std::vector<std::string> List(std::string_view name) {
    absl::StatusOr<std::vector<std::string>> names = env_->ListDir(Path(name));
    EXPECT_TRUE(names.ok()) << names.status();
    if (!names.ok()) return {};
    std::sort(names->begin(), names->end());
    return *names;
  }

  TempDir dir_;
  Fixture fixture_;
  Env* env_ = nullptr;
};

struct FixtureNames {
  template <typename T>
  static std::string GetName(int) {
    return T::kName;
  }
};

using Fixtures =
    ::testing::Types<PosixFixture, UringFixture<false>, UringFixture<true>,
                     FaultInjectionFixture, WriteTimeoutFixture>;
TYPED_TEST_SUITE(EnvConformanceTest, Fixtures, FixtureNames);

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// ---------------------------------------------------------------------------
// Write
// ---------------------------------------------------------------------------

TYPED_TEST(EnvConformanceTest, WriteAppendsOfEverySizeReadBackExactly) {
  std::mt19937_64 rng(TestSeed());
  // Sizes around 4 KiB pages and 64 KiB blocks, empty appends, AppendV.
  const std::vector<size_t> sizes = {0,     1,     4095,  4096,          4097,
                                     65535, 65536, 65537, 3 * 65536 + 7, 0,
                                     13,    200000};
  std::string expected;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f,
                       this->env_->NewWritableFile(this->Path("data")));
  EXPECT_EQ(f->path(), this->Path("data"));
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string part = RandomBytes(rng, sizes[i]);
    if (i % 3 == 2) {
      const std::string_view parts[] = {
          std::string_view(part).substr(0, part.size() / 2), "",
          std::string_view(part).substr(part.size() / 2)};
      ASSERT_OK(f->AppendV(parts));
    } else {
      ASSERT_OK(f->Append(part));
    }
    expected += part;
    EXPECT_EQ(f->Size(), expected.size());
    if (i == 5) ASSERT_OK(f->Sync());  // Sync mid-block, then more appends
  }
  ASSERT_OK(f->Sync());
  ASSERT_OK(f->Close());
  EXPECT_EQ(f->Size(), expected.size());
  ASSERT_OK_AND_ASSIGN(uint64_t size,
                       this->env_->GetFileSize(this->Path("data")));
  EXPECT_EQ(size, expected.size());
  ASSERT_OK_AND_ASSIGN(std::string got, this->Read("data"));
  EXPECT_TRUE(got == expected) << "content differs";
}

TYPED_TEST(EnvConformanceTest, WriteEmptyFileAndDestructorCloses) {
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f,
                         this->env_->NewWritableFile(this->Path("empty")));
    ASSERT_OK(f->Close());
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f,
                         this->env_->NewWritableFile(this->Path("dropped")));
    ASSERT_OK(f->Append(std::string(70000, 'x')));
  }  // destroyed without Close: closes, keeps the bytes
  EXPECT_EQ(this->env_->GetFileSize(this->Path("empty")).value(), 0u);
  ASSERT_OK_AND_ASSIGN(std::string got, this->Read("dropped"));
  EXPECT_EQ(got, std::string(70000, 'x'));
}

TYPED_TEST(EnvConformanceTest, WriteTruncatesOrRefusesWhenExclusive) {
  this->Write("f", std::string(100000, 'a'));
  this->Write("f", "short");  // truncated
  ASSERT_OK_AND_ASSIGN(std::string got, this->Read("f"));
  EXPECT_EQ(got, "short");
  absl::StatusOr<std::unique_ptr<WritableFile>> ex =
      this->env_->NewWritableFile(this->Path("f"), {.exclusive = true});
  EXPECT_EQ(ex.status().code(), absl::StatusCode::kAlreadyExists)
      << ex.status();
  EXPECT_NE(Msg(ex.status()).find(this->Path("f")), std::string::npos);
  EXPECT_EQ(this->Read("f").value(), "short");  // untouched
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<WritableFile> fresh,
      this->env_->NewWritableFile(this->Path("g"), {.exclusive = true}));
  ASSERT_OK(fresh->Append("new"));
  ASSERT_OK(fresh->Close());
  EXPECT_EQ(this->Read("g").value(), "new");
}

TYPED_TEST(EnvConformanceTest, WriteCallsAfterCloseFail) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f,
                       this->env_->NewWritableFile(this->Path("f")));
  ASSERT_OK(f->Append("abc"));
  ASSERT_OK(f->Close());
  EXPECT_OK(f->Close());  // a second Close is a no-op
  EXPECT_EQ(f->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(f->Sync().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(this->Read("f").value(), "abc");
}

// ---------------------------------------------------------------------------
// Read
// ---------------------------------------------------------------------------

TYPED_TEST(EnvConformanceTest, ReadExactRangesAndPastTheEnd) {
  std::mt19937_64 rng(TestSeed());
  const std::string data = RandomBytes(rng, 300000);
  this->Write("f", data);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RandomAccessFile> r,
                       this->env_->NewRandomAccessFile(this->Path("f")));
  EXPECT_EQ(r->Size(), data.size());
  EXPECT_EQ(r->path(), this->Path("f"));
  for (int i = 0; i < 50; ++i) {
    const uint64_t off = rng() % data.size();
    const size_t n = rng() % (data.size() - off + 1);
    std::string buf(n, '\0');
    ASSERT_OK(r->ReadExact(off, n, buf.data()));
    ASSERT_TRUE(buf == data.substr(off, n)) << off << "+" << n;
  }
  char c;
  EXPECT_OK(r->ReadExact(data.size(), 0, &c));
  const absl::Status past = r->ReadExact(data.size() - 1, 2, &c);
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;
  EXPECT_NE(Msg(past).find(this->Path("f")), std::string::npos) << past;
}

// Direct reads (O_DIRECT): where the file allows them, aligned ranges read
// the file's bytes and leave none of them in the page cache; misaligned
// ranges and addresses are INVALID_ARGUMENT, a range past the end
// OUT_OF_RANGE; where it does not (alignment 0), UNIMPLEMENTED.
TYPED_TEST(EnvConformanceTest, ReadDirectAlignedRangesBypassTheCache) {
  std::mt19937_64 rng(TestSeed());
  const std::string data = RandomBytes(rng, 1 << 20);
  this->Write("f", data);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<RandomAccessFile> r,
                       this->env_->NewRandomAccessFile(this->Path("f")));
  const uint64_t a = r->DirectAlignment();
  std::unique_ptr<char, decltype(&std::free)> buf(
      static_cast<char*>(std::aligned_alloc(4096, data.size() + 4096)),
      &std::free);
  if (a == 0) {
    const absl::Status s = r->ReadDirect(0, 4096, buf.get());
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(Msg(s).find(this->Path("f")), std::string::npos) << s;
    GTEST_SKIP() << "no O_DIRECT reads on the file system of "
                 << this->Path("f");
  }
  ASSERT_EQ(a & (a - 1), 0u) << a;
  ASSERT_LE(a, 4096u);
  // The file's pages out of the cache first (written and synced: clean).
  {
    const int fd = ::open(this->Path("f").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
  for (int i = 0; i < 20; ++i) {
    const uint64_t off = rng() % (data.size() / a) * a;
    const size_t n = rng() % ((data.size() - off) / a + 1) * a;
    std::memset(buf.get(), 0, n);
    ASSERT_OK(r->ReadDirect(off, n, buf.get()));
    ASSERT_TRUE(std::string_view(buf.get(), n) ==
                std::string_view(data).substr(off, n))
        << off << "+" << n;
  }
  struct statfs fs;
  ASSERT_EQ(::statfs(this->Path("f").c_str(), &fs), 0);
  if (fs.f_type != TMPFS_MAGIC) {  // tmpfs pages are always "cached"
    EXPECT_EQ(CachedPages(this->Path("f")), 0u)
        << "direct reads left pages of " << this->Path("f") << " cached";
  }
  const std::pair<uint64_t, size_t> misaligned[] = {{1, a}, {0, a + 1}};
  for (const auto& [off, n] : misaligned) {
    const absl::Status s = r->ReadDirect(off, n, buf.get());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << off << "+" << n;
  }
  EXPECT_EQ(r->ReadDirect(0, a, buf.get() + 1).code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status past = r->ReadDirect(data.size() - a, 2 * a, buf.get());
  EXPECT_EQ(past.code(), absl::StatusCode::kOutOfRange) << past;
  EXPECT_NE(Msg(past).find(this->Path("f")), std::string::npos) << past;
}

// ---------------------------------------------------------------------------
// Rename, Remove, List, Dirs, Exists
// ---------------------------------------------------------------------------

TYPED_TEST(EnvConformanceTest, RenameReplacesAnExistingFile) {
  this->Write("a", "new content");
  this->Write("b", "old content that is longer");
  ASSERT_OK(this->env_->RenameFile(this->Path("a"), this->Path("b")));
  EXPECT_EQ(this->Read("b").value(), "new content");
  EXPECT_EQ(this->env_->FileExists(this->Path("a")).code(),
            absl::StatusCode::kNotFound);
  const absl::Status missing =
      this->env_->RenameFile(this->Path("a"), this->Path("c"));
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(Msg(missing).find(this->Path("a")), std::string::npos) << missing;
  EXPECT_EQ(this->List(""), (std::vector<std::string>{"b"}));
}

TYPED_TEST(EnvConformanceTest, RemoveFilesAndDirectories) {
  this->Write("f", "x");
  ASSERT_OK(this->env_->CreateDirs(this->Path("d")));
  this->Write("d/g", "y");
  const absl::Status not_empty = this->env_->RemoveDir(this->Path("d"));
  EXPECT_EQ(not_empty.code(), absl::StatusCode::kFailedPrecondition)
      << not_empty;  // ENOTEMPTY
  ASSERT_OK(this->env_->RemoveFile(this->Path("d/g")));
  ASSERT_OK(this->env_->RemoveDir(this->Path("d")));
  ASSERT_OK(this->env_->RemoveFile(this->Path("f")));
  const absl::Status again = this->env_->RemoveFile(this->Path("f"));
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
  EXPECT_NE(Msg(again).find(this->Path("f")), std::string::npos) << again;
  EXPECT_EQ(this->env_->RemoveDir(this->Path("d")).code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(this->List("").empty());
}

TYPED_TEST(EnvConformanceTest, ListDirNamesEntriesOnly) {
  this->Write("b", "");
  this->Write("a", "1");
  ASSERT_OK(this->env_->CreateDirs(this->Path("sub/deeper")));
  EXPECT_EQ(this->List(""), (std::vector<std::string>{"a", "b", "sub"}));
  EXPECT_EQ(this->List("sub"), (std::vector<std::string>{"deeper"}));
  EXPECT_TRUE(this->List("sub/deeper").empty());
  const auto missing = this->env_->ListDir(this->Path("nope"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Msg(missing.status()).find(this->Path("nope")), std::string::npos);
  EXPECT_EQ(this->env_->ListDir(this->Path("a")).status().code(),
            absl::StatusCode::kFailedPrecondition);  // ENOTDIR
}

TYPED_TEST(EnvConformanceTest, DirsCreateNestedIdempotentAndSync) {
  ASSERT_OK(this->env_->CreateDirs(this->Path("x/y/z")));
  ASSERT_OK(this->env_->CreateDirs(this->Path("x/y/z")));  // exists: OK
  ASSERT_OK(this->env_->CreateDirs(this->Path("x/y")));
  ASSERT_OK(this->env_->SyncDir(this->Path("x/y")));
  ASSERT_OK(this->env_->SyncDir(this->Path("x/y/z/")));
  this->Write("x/y/z/f", "data");
  EXPECT_EQ(this->Read("x/y/z/f").value(), "data");
  // A file in the way: FAILED_PRECONDITION, naming it.
  this->Write("file", "x");
  const absl::Status on_file = this->env_->CreateDirs(this->Path("file"));
  EXPECT_EQ(on_file.code(), absl::StatusCode::kFailedPrecondition) << on_file;
  const absl::Status below_file =
      this->env_->CreateDirs(this->Path("file/sub"));
  EXPECT_EQ(below_file.code(), absl::StatusCode::kFailedPrecondition)
      << below_file;  // ENOTDIR
  EXPECT_NE(Msg(below_file).find(this->Path("file")), std::string::npos);
  EXPECT_EQ(this->env_->SyncDir(this->Path("missing")).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(this->env_->CreateDirs("").code(),
            absl::StatusCode::kInvalidArgument);
}

TYPED_TEST(EnvConformanceTest, ExistsAndSizes) {
  this->Write("f", std::string(12345, 'q'));
  ASSERT_OK(this->env_->CreateDirs(this->Path("d")));
  EXPECT_OK(this->env_->FileExists(this->Path("f")));
  EXPECT_OK(this->env_->FileExists(this->Path("d")));
  EXPECT_EQ(this->env_->FileExists(this->Path("g")).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(this->env_->GetFileSize(this->Path("f")).value(), 12345u);
  const auto missing = this->env_->GetFileSize(this->Path("g"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Msg(missing.status()).find(this->Path("g")), std::string::npos);
  EXPECT_EQ(this->env_->FileExists(this->Path("f/below")).code(),
            absl::StatusCode::kFailedPrecondition);  // ENOTDIR
}

// ---------------------------------------------------------------------------
// RealPath
// ---------------------------------------------------------------------------

TYPED_TEST(EnvConformanceTest, RealPathResolvesSymlinksDotsAndSlashes) {
  ASSERT_OK_AND_ASSIGN(const std::string root,
                       this->env_->RealPath(this->dir_.path()));
  ASSERT_OK(this->env_->CreateDirs(this->Path("a/b")));
  this->Write("a/b/f", "x");
  ASSERT_EQ(::symlink(this->Path("a/b").c_str(), this->Path("link").c_str()),
            0);
  ASSERT_EQ(::symlink("b/f", this->Path("a/rel").c_str()), 0);
  EXPECT_EQ(this->env_->RealPath(this->Path("a//b/./f")).value(),
            root + "/a/b/f");
  EXPECT_EQ(this->env_->RealPath(this->Path("a/b/../b/f")).value(),
            root + "/a/b/f");
  EXPECT_EQ(this->env_->RealPath(this->Path("link/f")).value(),
            root + "/a/b/f");
  EXPECT_EQ(this->env_->RealPath(this->Path("a/rel")).value(), root + "/a/b/f");
  EXPECT_EQ(this->env_->RealPath(this->Path("link")).value(), root + "/a/b");
  EXPECT_EQ(this->env_->RealPath("/").value(), "/");
}

TYPED_TEST(EnvConformanceTest, RealPathErrors) {
  this->Write("f", "x");
  const auto missing = this->env_->RealPath(this->Path("no/such"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(Msg(missing.status()).find(this->Path("no/such")),
            std::string::npos)
      << missing.status();
  // A dangling symlink does not resolve.
  ASSERT_EQ(
      ::symlink(this->Path("gone").c_str(), this->Path("dangling").c_str()), 0);
  EXPECT_EQ(this->env_->RealPath(this->Path("dangling")).status().code(),
            absl::StatusCode::kNotFound);
  // A symlink loop: ELOOP is the caller's bad path (INVALID_ARGUMENT), not
  // UNKNOWN like EIO.
  ASSERT_EQ(::symlink(this->Path("loop2").c_str(), this->Path("loop1").c_str()),
            0);
  ASSERT_EQ(::symlink(this->Path("loop1").c_str(), this->Path("loop2").c_str()),
            0);
  const auto loop = this->env_->RealPath(this->Path("loop1/x"));
  EXPECT_EQ(loop.status().code(), absl::StatusCode::kInvalidArgument)
      << loop.status();
  EXPECT_NE(Msg(loop.status()).find("symbolic links"), std::string::npos)
      << loop.status();
  EXPECT_EQ(this->env_->RealPath(this->Path("f/x")).status().code(),
            absl::StatusCode::kFailedPrecondition);  // ENOTDIR
  EXPECT_EQ(this->env_->RealPath("").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// Errors: NOT_FOUND for missing things, the errno mapping, paths in messages
// ---------------------------------------------------------------------------

TYPED_TEST(EnvConformanceTest, ErrorsMissingThingsAreNotFoundNamingThePath) {
  const std::string in_missing_dir = this->Path("no/dir/f");
  const auto w = this->env_->NewWritableFile(in_missing_dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound) << w.status();
  EXPECT_NE(Msg(w.status()).find(in_missing_dir), std::string::npos);
  const auto r = this->env_->NewRandomAccessFile(this->Path("missing"));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_NE(Msg(r.status()).find(this->Path("missing")), std::string::npos);
  const auto text = ReadFileToString(this->env_, this->Path("missing"), 10);
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
}

TYPED_TEST(EnvConformanceTest, ErrorsWrongKindOfFile) {
  ASSERT_OK(this->env_->CreateDirs(this->Path("d")));
  // Reading a directory: INVALID_ARGUMENT (not a regular file).
  EXPECT_EQ(this->env_->NewRandomAccessFile(this->Path("d")).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Writing over a directory: EISDIR → FAILED_PRECONDITION.
  const auto w = this->env_->NewWritableFile(this->Path("d"));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition)
      << w.status();
  // Removing a directory as a file: EISDIR → FAILED_PRECONDITION.
  EXPECT_EQ(this->env_->RemoveFile(this->Path("d")).code(),
            absl::StatusCode::kFailedPrecondition);
}

TYPED_TEST(EnvConformanceTest, ErrorsNoSpaceIsResourceExhaustedByClose) {
  // /dev/full fails every write with ENOSPC. An Env may report it at the
  // Append or later (buffered writers), but by Close at the latest, and the
  // same error from then on.
  if (::access("/dev/full", W_OK) != 0) {
    GTEST_SKIP() << "/dev/full is not writable here";
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<WritableFile> f,
                       this->env_->NewWritableFile("/dev/full"));
  absl::Status s = f->Append(std::string(200000, 'z'));
  if (s.ok()) s = f->Sync();
  if (s.ok()) s = f->Close();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(Msg(s).find("/dev/full"), std::string::npos) << s;
  EXPECT_NE(Msg(s).find("No space left on device"), std::string::npos) << s;
  EXPECT_FALSE(f->Close().ok());
}

TYPED_TEST(EnvConformanceTest, ErrorsPermissionDenied) {
  if (::geteuid() == 0) {
    GTEST_SKIP() << "running as root: permission bits do not apply";
  }
  ASSERT_OK(this->env_->CreateDirs(this->Path("ro")));
  this->Write("ro/f", "x");
  ASSERT_EQ(::chmod(this->Path("ro").c_str(), 0500), 0);
  const auto w = this->env_->NewWritableFile(this->Path("ro/g"));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(this->env_->RemoveFile(this->Path("ro/f")).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(this->env_->RenameFile(this->Path("ro/f"), this->Path("g")).code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_EQ(::chmod(this->Path("ro").c_str(), 0755), 0);
}

// ---------------------------------------------------------------------------
// Helpers over the Env, and threads
// ---------------------------------------------------------------------------

TYPED_TEST(EnvConformanceTest, HelpersWriteFileAtomicAndCreateDirsDurably) {
  bool created = false;
  ASSERT_OK(CreateDirsDurably(this->env_, this->Path("p/q"), &created));
  EXPECT_TRUE(created);
  ASSERT_OK(CreateDirsDurably(this->env_, this->Path("p/q"), &created));
  EXPECT_FALSE(created);
  ASSERT_OK(WriteFileAtomic(this->env_, this->Path("p/q/m"), "first"));
  ASSERT_OK(WriteFileAtomic(this->env_, this->Path("p/q/m"), "second"));
  EXPECT_EQ(this->Read("p/q/m").value(), "second");
  EXPECT_EQ(this->List("p/q"), (std::vector<std::string>{"m"}));  // no .tmp
  EXPECT_EQ(
      ReadFileToString(this->env_, this->Path("p/q/m"), 3).status().code(),
      absl::StatusCode::kResourceExhausted);
}

TYPED_TEST(EnvConformanceTest, ThreadsWriteFilesConcurrently) {
  constexpr int kThreads = 4;
  std::vector<std::string> expected(kThreads);
  std::mt19937_64 rng(TestSeed());
  for (std::string& e : expected) e = RandomBytes(rng, 150000 + rng() % 100000);
  std::vector<absl::Status> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto f = this->env_->NewWritableFile(this->Path(fmt::format("t{}", t)));
      if (!f.ok()) {
        results[t] = f.status();
        return;
      }
      std::string_view rest = expected[t];
      while (!rest.empty() && results[t].ok()) {
        const size_t n = std::min<size_t>(rest.size(), 1 + (t * 7919) % 40000);
        results[t] = (*f)->Append(rest.substr(0, n));
        rest.remove_prefix(n);
      }
      if (results[t].ok()) results[t] = (*f)->Sync();
      if (results[t].ok()) results[t] = (*f)->Close();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_OK(results[t]);
    ASSERT_OK_AND_ASSIGN(std::string got, this->Read(fmt::format("t{}", t)));
    EXPECT_TRUE(got == expected[t]) << "file t" << t << " differs";
  }
}

}  // namespace
}  // namespace ckptd
