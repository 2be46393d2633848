// Copyright 2026 The ckptd Authors.
//
// shm/: arena names, the client's Arena and the daemon's Mapping (open
// checks, bounds, unlink, page dropping).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "shm/fd_passing.h"
#include "shm/mapping.h"
#include "tests/testing/test_util.h"

namespace ckptd::shm {
namespace {

using ::ckptd::testing::TempDir;

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();

// VmRSS of this process in KiB (-1 if unknown).
int64_t RssKiB() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// A directory fd closed at scope exit.
class DirFd {
 public:
  explicit DirFd(const std::string& dir)
      : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {}
  ~DirFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  const int fd_;
};

void WriteFile(const std::string& path, size_t n) {
  std::ofstream f(path, std::ios::binary);
  f << std::string(n, 'x');
}

TEST(ArenaNameTest, Valid) {
  EXPECT_TRUE(IsValidArenaName("a"));
  EXPECT_TRUE(IsValidArenaName("arena-1234-00ff"));
  EXPECT_TRUE(IsValidArenaName("A.b_c-9"));
  EXPECT_TRUE(IsValidArenaName("a.."));
  EXPECT_TRUE(IsValidArenaName(std::string(200, 'z')));
}

TEST(ArenaNameTest, Invalid) {
  EXPECT_FALSE(IsValidArenaName(""));
  EXPECT_FALSE(IsValidArenaName("."));
  EXPECT_FALSE(IsValidArenaName(".."));
  EXPECT_FALSE(IsValidArenaName(".hidden"));
  EXPECT_FALSE(IsValidArenaName("a/b"));
  EXPECT_FALSE(IsValidArenaName("../etc"));
  EXPECT_FALSE(IsValidArenaName("/abs"));
  EXPECT_FALSE(IsValidArenaName("sp ace"));
  EXPECT_FALSE(IsValidArenaName(std::string_view("nul\0x", 5)));
  EXPECT_FALSE(IsValidArenaName("ümlaut"));
  EXPECT_FALSE(IsValidArenaName("a\n"));
  EXPECT_FALSE(IsValidArenaName(std::string(201, 'z')));
}

TEST(ArenaTest, CreateSizesMapsAndRemoves) {
  TempDir dir;
  std::string path;
  {
    ASSERT_OK_AND_ASSIGN(auto arena, Arena::Create(dir.path(), 3 << 20, "t"));
    path = arena->path();
    EXPECT_EQ(arena->size(), uint64_t{3} << 20);
    EXPECT_EQ(path, dir.Join(arena->name()));
    EXPECT_TRUE(IsValidArenaName(arena->name()));
    EXPECT_EQ(arena->name().rfind("t-", 0), 0u) << arena->name();
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_TRUE(S_ISREG(st.st_mode));
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    EXPECT_EQ(static_cast<uint64_t>(st.st_size), arena->size());
    // Writable everywhere.
    std::memset(arena->data(), 0xab, arena->size());
    EXPECT_EQ(static_cast<unsigned char>(arena->data()[arena->size() - 1]),
              0xab);
  }
  EXPECT_FALSE(Exists(path)) << "the destructor unlinks the name";
}

TEST(ArenaTest, DistinctNames) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto a, Arena::Create(dir.path(), 4096));
  ASSERT_OK_AND_ASSIGN(auto b, Arena::Create(dir.path(), 4096));
  EXPECT_NE(a->name(), b->name());
}

TEST(ArenaTest, Errors) {
  TempDir dir;
  EXPECT_EQ(Arena::Create(dir.path(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Arena::Create(dir.path(), 4096, "bad/prefix").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Arena::Create(dir.path(), 4096, ".hidden").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Arena::Create(dir.path(), kMax).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto missing = Arena::Create(dir.Join("no/such/dir"), 4096);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no/such/dir"),
            absl::string_view::npos)
      << missing.status();
}

TEST(ArenaTest, DestructorToleratesUnlinkedName) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto arena, Arena::Create(dir.path(), 4096));
  ASSERT_EQ(::unlink(arena->path().c_str()), 0);
  arena.reset();  // ENOENT ignored
}

TEST(MappingTest, OpenSeesArenaDataAndUnlinks) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto arena, Arena::Create(dir.path(), 1 << 20));
  for (uint64_t i = 0; i < arena->size(); ++i) {
    arena->data()[i] = static_cast<char>(i * 7);
  }
  DirFd dfd(dir.path());
  ASSERT_GE(dfd.get(), 0);
  ASSERT_OK_AND_ASSIGN(
      auto m, Mapping::Open(dfd.get(), dir.path(), arena->name(), 1 << 20));
  EXPECT_EQ(m->size(), uint64_t{1} << 20);
  EXPECT_EQ(m->name(), arena->name());
  EXPECT_EQ(m->owner_uid(), ::getuid());
  EXPECT_FALSE(Exists(arena->path())) << "Open unlinks the name";
  ASSERT_OK_AND_ASSIGN(auto all, m->Slice(0, m->size()));
  ASSERT_EQ(all.size(), m->size());
  EXPECT_EQ(std::memcmp(all.data(), arena->data(), all.size()), 0);
  // Later writes by the client are visible (shared mapping).
  arena->data()[12345] = 'Q';
  ASSERT_OK_AND_ASSIGN(auto one, m->Slice(12345, 1));
  EXPECT_EQ(one[0], 'Q');
  // The mapping outlives the arena (client died).
  arena.reset();
  ASSERT_OK_AND_ASSIGN(auto again, m->Slice(12345, 1));
  EXPECT_EQ(again[0], 'Q');
}

TEST(MappingTest, ClaimedSizeMayBeSmallerThanFile) {
  TempDir dir;
  WriteFile(dir.Join("seg"), 10000);
  DirFd dfd(dir.path());
  ASSERT_OK_AND_ASSIGN(auto m,
                       Mapping::Open(dfd.get(), dir.path(), "seg", 100));
  EXPECT_EQ(m->size(), 100u);
  EXPECT_EQ(m->Slice(0, 101).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(MappingTest, SliceBounds) {
  TempDir dir;
  WriteFile(dir.Join("seg"), 8192);
  DirFd dfd(dir.path());
  ASSERT_OK_AND_ASSIGN(auto m,
                       Mapping::Open(dfd.get(), dir.path(), "seg", 8192));
  EXPECT_OK(m->Slice(0, 0));
  EXPECT_OK(m->Slice(0, 8192));
  EXPECT_OK(m->Slice(8191, 1));
  EXPECT_OK(m->Slice(8192, 0));  // empty range at the end
  ASSERT_OK_AND_ASSIGN(auto s, m->Slice(100, 50));
  EXPECT_EQ(s.size(), 50u);
  EXPECT_EQ(s[0], 'x');

  auto out = m->Slice(8192, 1);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(
      out.status().message().find("outside shm segment 'seg' of 8192 bytes"),
      absl::string_view::npos)
      << out.status();
  EXPECT_EQ(m->Slice(8193, 0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m->Slice(0, 8193).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m->Slice(4096, 4097).status().code(),
            absl::StatusCode::kOutOfRange);
  // uint64 overflow of offset + length must not wrap into range.
  EXPECT_EQ(m->Slice(kMax, 1).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m->Slice(kMax, 0).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m->Slice(1, kMax).status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m->Slice(100, kMax - 50).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m->Slice(kMax, kMax).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(m->Slice(0, kMax).status().code(), absl::StatusCode::kOutOfRange);
}

TEST(MappingTest, SmallerThanClaimed) {
  TempDir dir;
  WriteFile(dir.Join("small"), 4096);
  DirFd dfd(dir.path());
  auto m = Mapping::Open(dfd.get(), dir.path(), "small", 1048576);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("shm segment 'small' is 4096 bytes, "
                                      "smaller than the claimed 1048576"),
            absl::string_view::npos)
      << m.status();
  EXPECT_TRUE(Exists(dir.Join("small"))) << "a refused file is not unlinked";
}

TEST(MappingTest, ZeroOrHugeClaimRefused) {
  TempDir dir;
  WriteFile(dir.Join("seg"), 4096);
  DirFd dfd(dir.path());
  EXPECT_EQ(Mapping::Open(dfd.get(), dir.path(), "seg", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mapping::Open(dfd.get(), dir.path(), "seg", kMax).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MappingTest, InvalidNamesRefused) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.Join("sub").c_str(), 0700), 0);
  WriteFile(dir.Join("sub/seg"), 4096);
  DirFd dfd(dir.path());
  for (const char* name : {"sub/seg", "../seg", ".", "..", "", ".hidden"}) {
    auto m = Mapping::Open(dfd.get(), dir.path(), name, 4096);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << name;
  }
  EXPECT_TRUE(Exists(dir.Join("sub/seg")));
}

TEST(MappingTest, MissingFile) {
  TempDir dir;
  DirFd dfd(dir.path());
  auto m = Mapping::Open(dfd.get(), dir.path(), "nope", 4096);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(m.status().message().find("'nope'"), absl::string_view::npos);
}

TEST(MappingTest, SymlinkRefused) {
  TempDir dir;
  WriteFile(dir.Join("target"), 8192);
  ASSERT_EQ(::symlink(dir.Join("target").c_str(), dir.Join("link").c_str()), 0);
  DirFd dfd(dir.path());
  auto m = Mapping::Open(dfd.get(), dir.path(), "link", 4096);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kPermissionDenied)
      << m.status();
  EXPECT_NE(m.status().message().find("symbolic link"), absl::string_view::npos)
      << m.status();
  EXPECT_TRUE(Exists(dir.Join("link")));
  EXPECT_TRUE(Exists(dir.Join("target")));
}

TEST(MappingTest, DirectoryRefused) {
  TempDir dir;
  ASSERT_EQ(::mkdir(dir.Join("d").c_str(), 0700), 0);
  DirFd dfd(dir.path());
  auto m = Mapping::Open(dfd.get(), dir.path(), "d", 4096);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("directory"), absl::string_view::npos)
      << m.status();
  EXPECT_TRUE(Exists(dir.Join("d")));
}

TEST(MappingTest, FifoRefusedWithoutBlocking) {
  TempDir dir;
  ASSERT_EQ(::mkfifo(dir.Join("fifo").c_str(), 0600), 0);
  DirFd dfd(dir.path());
  // O_NONBLOCK: opening a FIFO with no writer must not hang.
  auto m = Mapping::Open(dfd.get(), dir.path(), "fifo", 4096);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("FIFO"), absl::string_view::npos)
      << m.status();
  EXPECT_TRUE(Exists(dir.Join("fifo")));
}

TEST(MappingTest, DropPagesKeepsData) {
  TempDir dir;
  constexpr uint64_t kSize = 1 << 20;
  ASSERT_OK_AND_ASSIGN(auto arena, Arena::Create(dir.path(), kSize));
  for (uint64_t i = 0; i < kSize; ++i)
    arena->data()[i] = static_cast<char>(i % 251);
  DirFd dfd(dir.path());
  ASSERT_OK_AND_ASSIGN(
      auto m, Mapping::Open(dfd.get(), dir.path(), arena->name(), kSize));
  ASSERT_OK_AND_ASSIGN(auto all, m->Slice(0, kSize));
  // Fault everything in, then drop: unaligned, aligned, to the end, empty,
  // and invalid ranges (ignored).
  uint64_t sum = 0;
  for (char c : all) sum += static_cast<unsigned char>(c);
  EXPECT_GT(sum, 0u);
  m->DropPages(100, 10000);
  m->DropPages(4096, 8192);
  m->DropPages(kSize - 5000, 5000);
  m->DropPages(0, 0);
  m->DropPages(kSize, 0);
  m->DropPages(kMax, 2);
  m->DropPages(0, kSize + 1);
  m->DropPages(0, kSize);
  for (uint64_t i = 0; i < kSize; ++i) {
    ASSERT_EQ(all[i], static_cast<char>(i % 251)) << "byte " << i;
  }
  // The client's view is unaffected, too.
  EXPECT_EQ(arena->data()[777], static_cast<char>(777 % 251));
}

TEST(MappingTest, DropPagesLowersRss) {
  TempDir dir;
  constexpr uint64_t kSize = 32 << 20;
  ASSERT_OK_AND_ASSIGN(auto arena, Arena::Create(dir.path(), kSize));
  std::memset(arena->data(), 1, kSize);
  DirFd dfd(dir.path());
  ASSERT_OK_AND_ASSIGN(
      auto m, Mapping::Open(dfd.get(), dir.path(), arena->name(), kSize));
  ASSERT_OK_AND_ASSIGN(auto all, m->Slice(0, kSize));
  if (RssKiB() < 0) GTEST_SKIP() << "no VmRSS in /proc/self/status";
  uint64_t sum = 0;
  for (uint64_t i = 0; i < kSize; i += 4096)
    sum += static_cast<unsigned char>(all[i]);
  EXPECT_EQ(sum, kSize / 4096);
  const int64_t before = RssKiB();
  m->DropPages(0, kSize);
  const int64_t after = RssKiB();
  EXPECT_GE(before - after, static_cast<int64_t>(kSize / 1024) * 9 / 10)
      << "VmRSS before " << before << " KiB, after " << after << " KiB";
  EXPECT_EQ(all[kSize - 1], 1);  // faults back in from the file
}

TEST(MappingTest, SecondOpenOfUnlinkedNameIsNotFound) {
  TempDir dir;
  ASSERT_OK_AND_ASSIGN(auto arena, Arena::Create(dir.path(), 4096));
  DirFd dfd(dir.path());
  ASSERT_OK(Mapping::Open(dfd.get(), dir.path(), arena->name(), 4096));
  EXPECT_EQ(
      Mapping::Open(dfd.get(), dir.path(), arena->name(), 4096).status().code(),
      absl::StatusCode::kNotFound);
}

// --- memfd arenas (the arena socket's path) ---------------------------------

TEST(MemfdMappingTest, SealedMemfdIsMappedAndSeesTheClientsBytes) {
  ASSERT_OK_AND_ASSIGN(auto arena, Arena::CreateMemfd(1 << 20, "m"));
  std::memset(arena->data(), 7, 1 << 20);
  ASSERT_OK_AND_ASSIGN(auto m,
                       Mapping::FromFd(::dup(arena->fd()), 1 << 20, "arena t"));
  ASSERT_OK_AND_ASSIGN(absl::Span<const char> all, m->Slice(0, 1 << 20));
  EXPECT_EQ(all[(1 << 20) - 1], 7);
  arena->data()[5] = 9;  // shared: the daemon sees later writes
  EXPECT_EQ(all[5], 9);
  // A shorter claim maps fewer bytes; bounds follow the claim.
  ASSERT_OK_AND_ASSIGN(auto part,
                       Mapping::FromFd(::dup(arena->fd()), 4096, "arena t"));
  EXPECT_EQ(part->Slice(0, 4097).status().code(),
            absl::StatusCode::kOutOfRange);
  // The client dropping everything leaves the daemon's mapping intact.
  arena.reset();
  EXPECT_EQ(all[(1 << 20) - 1], 7);
}

TEST(MemfdMappingTest, RefusesWhatCouldShrinkUnderTheDaemon) {
  const int unsealed = ::memfd_create("u", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(::ftruncate(unsealed, 4096), 0);
  auto m = Mapping::FromFd(unsealed, 4096, "arena u");  // takes the fd
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(
      m.status().message().find("arena u is not sealed against shrinking"),
      absl::string_view::npos)
      << m.status();
  ASSERT_OK_AND_ASSIGN(auto arena, Arena::CreateMemfd(4096, "m"));
  EXPECT_EQ(Mapping::FromFd(::dup(arena->fd()), 0, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mapping::FromFd(::dup(arena->fd()), kMax, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mapping::FromFd(::dup(arena->fd()), 8192, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Mapping::FromFd(-1, 4096, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
  TempDir dir;
  const int dfd =
      ::open(dir.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dfd, 0);
  auto d = Mapping::FromFd(dfd, 4096, "x");
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("a directory"), absl::string_view::npos);
}

// A SOCK_SEQPACKET listener at `path` that never accepts by itself.
OwnedFd Listen(const std::string& path) {
  OwnedFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (!listener.valid() || path.size() >= sizeof(addr.sun_path)) return {};
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr),
             sizeof(addr)) != 0 ||
      ::listen(listener.get(), 8) != 0) {
    return {};
  }
  return listener;
}

// The client side of the arena socket never waits past its timeout, and
// says what it waited for (docs/waits.md): a daemon that accepts and never
// answers, one that closes without a reply, and none at all.
TEST(FdPassingTest, ArenaSocketClientsEndAtTheirDeadlineNamingTheSocket) {
  TempDir dir;
  OwnedFd arena(::memfd_create("fd-passing-test", MFD_CLOEXEC));
  ASSERT_TRUE(arena.valid());
  ASSERT_EQ(::ftruncate(arena.get(), 4096), 0);

  // Connected (the backlog takes it) but never answered.
  const std::string silent = dir.Join("silent.sock");
  OwnedFd silent_listener = Listen(silent);
  ASSERT_TRUE(silent_listener.valid()) << strerror(errno);
  const absl::Duration timeout = absl::Milliseconds(300);
  absl::Time start = absl::Now();
  absl::StatusOr<uint64_t> id =
      RegisterArenaFd(silent, arena.get(), 4096, "test", timeout);
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(id.status().code(), absl::StatusCode::kDeadlineExceeded)
      << id.status();
  EXPECT_THAT(std::string(id.status().message()),
              ::testing::HasSubstr("no reply from the ckptd arena socket " +
                                   silent + " within 300ms"));
  EXPECT_GE(took, timeout - absl::Milliseconds(10));  // poll(2) takes ms
  EXPECT_LT(took, absl::Seconds(10));
  start = absl::Now();
  absl::StatusOr<FetchedFd> buffer = FetchGroupBuffer(silent, "token", timeout);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kDeadlineExceeded)
      << buffer.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));

  // Accepted, the request read, closed without a reply.
  const std::string closing = dir.Join("closing.sock");
  OwnedFd closing_listener = Listen(closing);
  ASSERT_TRUE(closing_listener.valid()) << strerror(errno);
  std::thread server([&] {
    OwnedFd c(
        ::accept4(closing_listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
    char buf[4096];
    if (c.valid()) (void)::recv(c.get(), buf, sizeof(buf), 0);
  });
  id = RegisterArenaFd(closing, arena.get(), 4096, "test", absl::Seconds(30));
  server.join();
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable) << id.status();
  EXPECT_THAT(std::string(id.status().message()),
              ::testing::HasSubstr("the ckptd arena socket " + closing +
                                   " closed without a reply"));

  // Nothing listens: UNAVAILABLE at once, naming the path.
  const std::string none = dir.Join("none.sock");
  start = absl::Now();
  id = RegisterArenaFd(none, arena.get(), 4096, "test", absl::Seconds(30));
  EXPECT_EQ(id.status().code(), absl::StatusCode::kUnavailable) << id.status();
  EXPECT_THAT(
      std::string(id.status().message()),
      ::testing::HasSubstr("cannot connect to the ckptd arena socket " + none));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}
}  // namespace
}  // namespace ckptd::shm
