// Copyright 2026 The ckptd Authors.
//
// The arena socket against hostile clients: a real ArenaListener on a temp
// socket in front of a real CheckpointManager (and, for the name-based path,
// the real gRPC service). Covers: memfd arenas are sealed (ftruncate fails with
// EPERM, so the daemon cannot be SIGBUSed); unsealed memfds, plain files,
// pipes, short and write-only descriptors and malformed requests are refused;
// whatever a client does to its own arena (truncate attempt, hole punching,
// unmap, close, remap) at points of a save leaves the daemon alive and the save
// well-defined; another user's file cannot be registered by name over gRPC;
// per-uid quotas; a silent client blocks nobody.

#include "daemon/service/arena_listener.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "daemon/save/checkpoint_manager.h"
#include "daemon/service/service.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "shm/fd_passing.h"
#include "shm/mapping.h"
#include "tests/testing/manager_util.h"
#include "tests/testing/raw_grpc.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;
namespace pb = ::ckptd::v1;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

constexpr uint64_t kFloats = 64 << 10;  // 256 KiB of "w"
constexpr uint64_t kBytes = kFloats * 4;

float Value(uint64_t i) { return static_cast<float>(i % 251); }

// A memfd with `seals` added (0: none), `size` bytes, filled with Value().
shm::OwnedFd MakeMemfd(uint64_t size, int seals, bool allow_sealing = true) {
  shm::OwnedFd fd(::memfd_create(
      "test", MFD_CLOEXEC | (allow_sealing ? MFD_ALLOW_SEALING : 0)));
  EXPECT_TRUE(fd.valid()) << strerror(errno);
  EXPECT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  if (seals != 0) {
    EXPECT_EQ(::fcntl(fd.get(), F_ADD_SEALS, seals), 0);
  }
  return fd;
}

class ArenaListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_roots = std::vector<std::string>{dir_.Join("ck")};
    options_.shm_dir = dir_.Join("shm");
    options_.state_dir = dir_.Join("state");
    options_.staging_budget = 16 << 20;
    options_.fsync = false;
    options_.cuda = "off";
    options_.env = Env::Default();
    // In /tmp itself: the per-test directory is 0700, and the setuid child
    // of PerUidQuotas must reach the socket.
    static int counter = 0;
    socket_ = "/tmp/ckptd-alt-" + std::to_string(::getpid()) + "-" +
              std::to_string(counter++) + ".sock";
  }
  void TearDown() override {
    listener_.reset();
    server_.reset();
    manager_.reset();
  }

  // Start() plus the gRPC service on socket_ + ".grpc"; channel_ reaches it.
  void StartWithGrpc() {
    Start();
    ServerOptions so;
    so.socket_path = socket_ + ".grpc";
    ASSERT_OK_AND_ASSIGN(server_, Server::Start(so, manager_.get()));
    channel_ = grpc::CreateChannel("unix:" + so.socket_path,
                                   grpc::InsecureChannelCredentials());
  }

  void Start(absl::Duration request_timeout = absl::Seconds(5),
             int per_uid = 16,
             std::function<absl::StatusOr<shm::FetchedFd>(
                 const std::string&, const PeerCredentials&)>
                 fetch_buffer = nullptr) {
    options_.arena_socket = socket_;
    ASSERT_OK(FinalizeOptions(&options_));
    ASSERT_OK_AND_ASSIGN(manager_, CheckpointManager::Create(options_));
    ArenaListenerOptions ao;
    ao.socket_path = socket_;
    ao.socket_mode = 0666;  // the setuid child below must reach it
    ao.request_timeout = request_timeout;
    ao.max_connections_per_uid = per_uid;
    CheckpointManager* m = manager_.get();
    ao.handler = [m](ArenaRegistration reg) {
      return m->RegisterArenaFd(reg.fd.Release(), reg.size, reg.owner,
                                reg.peer);
    };
    ao.fetch_buffer = std::move(fetch_buffer);
    ASSERT_OK_AND_ASSIGN(listener_, ArenaListener::Start(std::move(ao)));
  }

  absl::StatusOr<uint64_t> Register(int fd, uint64_t size,
                                    std::string owner = "test") {
    return shm::RegisterArenaFd(socket_, fd, size, owner, absl::Seconds(10));
  }

  // One rank saving "w" (kFloats float32) from arena bytes [0, kBytes).
  SaveBatch Batch(const std::string& id, uint64_t arena_id) {
    SaveBatch sb;
    sb.checkpoint_id = id;
    sb.rank = 0;
    sb.world_size = 1;
    format::ItemDesc wd;
    wd.fqn = "w";
    wd.global_shape = wd.chunk_sizes = {static_cast<int64_t>(kFloats)};
    wd.chunk_offsets = {0};
    sb.items = {wd};
    sb.item_nbytes = {kBytes};
    sb.arena_id = arena_id;
    sb.extents = {{0, 0, 0, kBytes}};
    sb.last = true;
    return sb;
  }

  static void Fill(char* p) {
    auto* w = reinterpret_cast<float*>(p);
    for (uint64_t i = 0; i < kFloats; ++i) w[i] = Value(i);
  }

  // "w" of the committed checkpoint `id`.
  std::vector<float> ReadW(const std::string& id) {
    std::vector<float> w(kFloats, -1.0f);
    auto reader = format::CheckpointReader::Open(dir_.Join("ck/" + id));
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return w;
    format::TensorRequest rw{"w",
                             {0},
                             {format::DType::kFloat32,
                              {static_cast<int64_t>(kFloats)},
                              {},
                              reinterpret_cast<char*>(w.data())}};
    EXPECT_OK((*reader)->ReadTensors({rw}));
    return w;
  }

  // A save of checkpoint `id` still works (the daemon is alive and sane).
  void ExpectHealthy(const std::string& id) {
    ASSERT_OK_AND_ASSIGN(auto arena,
                         shm::Arena::CreateMemfd(kBytes, "healthy"));
    Fill(arena->data());
    ASSERT_OK_AND_ASSIGN(uint64_t aid, Register(arena->fd(), kBytes));
    ASSERT_OK(ckptd::testing::SaveSync(*manager_, Batch(id, aid)));
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info,
                         ckptd::testing::WaitFinal(*manager_, id));
    ASSERT_EQ(info.state, State::kCommitted) << info.error;
    EXPECT_EQ(ReadW(id)[kFloats - 1], Value(kFloats - 1));
  }

  TempDir dir_;
  DaemonOptions options_;
  std::string socket_;
  std::unique_ptr<CheckpointManager> manager_;
  std::unique_ptr<ArenaListener> listener_;
  std::unique_ptr<Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

// --- Wire format ----------------------------------------------------------

TEST(ArenaProtocolTest, RequestAndReplyRoundTrip) {
  ASSERT_OK_AND_ASSIGN(
      shm::ArenaRequest r,
      shm::DecodeArenaRequest(shm::EncodeArenaRequest(4096, "job/rank3")));
  EXPECT_EQ(r.size, 4096u);
  EXPECT_EQ(r.owner, "job/rank3");
  EXPECT_EQ(*shm::DecodeArenaReply(shm::EncodeArenaReply(absl::OkStatus(), 77)),
            77u);
  absl::StatusOr<uint64_t> e = shm::DecodeArenaReply(shm::EncodeArenaReply(
      absl::ResourceExhaustedError("uid 5 over quota"), 0));
  EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(Msg(e.status()), "uid 5 over quota");
  // Malformed requests.
  std::string good = shm::EncodeArenaRequest(4096, "x");
  EXPECT_THAT(Msg(shm::DecodeArenaRequest("CKA1").status()),
              HasSubstr("header"));
  EXPECT_THAT(Msg(shm::DecodeArenaRequest("XXXX" + good.substr(4)).status()),
              HasSubstr("magic"));
  EXPECT_THAT(Msg(shm::DecodeArenaRequest(good + "junk").status()),
              HasSubstr("header says"));
  EXPECT_THAT(
      Msg(shm::DecodeArenaRequest(shm::EncodeArenaRequest(0, "")).status()),
      HasSubstr("size must be positive"));
  std::string huge = good;
  huge[12] = huge[13] = huge[14] = huge[15] = '\xff';
  EXPECT_THAT(Msg(shm::DecodeArenaRequest(huge).status()),
              HasSubstr("exceeds"));
}

// --- The client's arena ---------------------------------------------------

TEST(MemfdArenaTest, IsSealedAgainstResizing) {
  ASSERT_OK_AND_ASSIGN(auto arena, shm::Arena::CreateMemfd(1 << 20, "t"));
  ASSERT_TRUE(arena->is_memfd());
  EXPECT_TRUE(arena->path().empty());
  const int seals = ::fcntl(arena->fd(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  errno = 0;
  EXPECT_EQ(::ftruncate(arena->fd(), 0), -1);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(::ftruncate(arena->fd(), 2 << 20), -1);
  EXPECT_EQ(errno, EPERM);
  // The seals cannot be removed or changed.
  EXPECT_EQ(::fcntl(arena->fd(), F_ADD_SEALS, F_SEAL_WRITE), -1);
  struct stat st;
  ASSERT_EQ(::fstat(arena->fd(), &st), 0);
  EXPECT_EQ(st.st_size, 1 << 20);
  arena->data()[(1 << 20) - 1] = 7;  // writable, pre-faulted
  EXPECT_EQ(shm::Arena::CreateMemfd(0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// --- The daemon side ------------------------------------------------------

TEST_F(ArenaListenerTest, TruncateAfterRegisteringFailsAndSaveCommits) {
  Start();
  ASSERT_OK_AND_ASSIGN(auto arena, shm::Arena::CreateMemfd(kBytes, "victim"));
  Fill(arena->data());
  ASSERT_OK_AND_ASSIGN(uint64_t aid, Register(arena->fd(), kBytes));
  // The truncation attack: shrink the registered arena, then save from it.
  // The seal makes the shrink fail, so the daemon's reads stay valid.
  errno = 0;
  EXPECT_EQ(::ftruncate(arena->fd(), 0), -1);
  EXPECT_EQ(errno, EPERM);
  ASSERT_OK(ckptd::testing::SaveSync(*manager_, Batch("job/trunc", aid)));
  // Again between "staged" and the write.
  EXPECT_EQ(::ftruncate(arena->fd(), 0), -1);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info,
                       ckptd::testing::WaitFinal(*manager_, "job/trunc"));
  ASSERT_EQ(info.state, State::kCommitted) << info.error;
  const std::vector<float> w = ReadW("job/trunc");
  for (uint64_t i = 0; i < kFloats; ++i) ASSERT_EQ(w[i], Value(i)) << i;
}

TEST_F(ArenaListenerTest, ClientMayWreckItsOwnArenaAtAnyPointOfASave) {
  Start();
  // Each case does something to the client's own arena at one point of a
  // save; the daemon must neither crash nor read outside what it mapped.
  enum Point { kAfterRegister, kAfterStaged };
  enum Act { kPunchHoles, kUnmapAndClose, kRemapFresh, kTryTruncate };
  int n = 0;
  for (Point point : {kAfterRegister, kAfterStaged}) {
    for (Act act : {kPunchHoles, kUnmapAndClose, kRemapFresh, kTryTruncate}) {
      SCOPED_TRACE(::testing::Message() << "point " << point << " act " << act);
      const std::string id = "job/wreck" + std::to_string(n++);
      // Built by hand so the test can unmap and close it.
      shm::OwnedFd fd = MakeMemfd(kBytes, F_SEAL_SHRINK | F_SEAL_GROW);
      char* p = static_cast<char*>(::mmap(
          nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0));
      ASSERT_NE(p, MAP_FAILED);
      Fill(p);
      ASSERT_OK_AND_ASSIGN(uint64_t aid, Register(fd.get(), kBytes));
      auto wreck = [&] {
        switch (act) {
          case kPunchHoles:  // allowed by the seals: reads as zeros
            EXPECT_EQ(::fallocate(fd.get(),
                                  FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                                  kBytes),
                      0)
                << strerror(errno);
            break;
          case kUnmapAndClose:
            ASSERT_EQ(::munmap(p, kBytes), 0);
            p = nullptr;
            fd.Reset();
            break;
          case kRemapFresh: {
            ASSERT_EQ(::munmap(p, kBytes), 0);
            p = static_cast<char*>(::mmap(nullptr, kBytes,
                                          PROT_READ | PROT_WRITE,
                                          MAP_SHARED | MAP_ANONYMOUS, -1, 0));
            ASSERT_NE(p, MAP_FAILED);
            break;
          }
          case kTryTruncate:
            EXPECT_EQ(::ftruncate(fd.get(), 0), -1);
            EXPECT_EQ(::ftruncate(fd.get(), 4096), -1);
            break;
        }
      };
      if (point == kAfterRegister) wreck();
      absl::StatusOr<SaveReply> reply =
          ckptd::testing::SaveSync(*manager_, Batch(id, aid));
      ASSERT_OK(reply);
      if (point == kAfterStaged) wreck();
      ASSERT_OK_AND_ASSIGN(CheckpointInfo info,
                           ckptd::testing::WaitFinal(*manager_, id));
      ASSERT_EQ(info.state, State::kCommitted) << info.error;
      const std::vector<float> w = ReadW(id);
      // Either the client's values or (holes punched before the write) zeros:
      // never anything else, and never a fault.
      for (uint64_t i = 0; i < kFloats; i += 997) {
        ASSERT_TRUE(w[i] == Value(i) || (act == kPunchHoles && w[i] == 0.0f))
            << i << " " << w[i];
      }
      if (act != kPunchHoles) {
        EXPECT_EQ(w[kFloats - 1], Value(kFloats - 1));
      }
      if (p != nullptr) ::munmap(p, kBytes);
      ASSERT_OK(manager_->ReleaseArena(aid));
    }
  }
  ExpectHealthy("job/after-wreck");
}

TEST_F(ArenaListenerTest, RefusesUnsealedAndNonMemfdDescriptors) {
  Start();
  struct Case {
    std::string what;
    shm::OwnedFd fd;
    uint64_t size;
    absl::StatusCode code;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({"unsealed memfd", MakeMemfd(kBytes, 0), kBytes,
                   absl::StatusCode::kInvalidArgument,
                   "not sealed against shrinking"});
  cases.push_back(
      {"memfd without MFD_ALLOW_SEALING", MakeMemfd(kBytes, 0, false), kBytes,
       absl::StatusCode::kInvalidArgument, "not sealed against shrinking"});
  cases.push_back({"grow-sealed only", MakeMemfd(kBytes, F_SEAL_GROW), kBytes,
                   absl::StatusCode::kInvalidArgument,
                   "not sealed against shrinking"});
  cases.push_back({"sealed but short", MakeMemfd(4096, F_SEAL_SHRINK), kBytes,
                   absl::StatusCode::kInvalidArgument,
                   "smaller than the claimed"});
  {
    // A plain file (wherever TEST_TMPDIR is: tmpfs or disk), never sealable.
    const std::string path = dir_.Join("plain");
    shm::OwnedFd f(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    ASSERT_EQ(::ftruncate(f.get(), kBytes), 0);
    cases.push_back({"plain file", std::move(f), kBytes,
                     absl::StatusCode::kInvalidArgument, "memfd"});
  }
  {
    // A tmpfs file made the legacy way (F_SEAL_SEAL set, no F_SEAL_SHRINK).
    ASSERT_OK_AND_ASSIGN(auto legacy,
                         shm::Arena::Create("/dev/shm", 4096, "ckptd-test"));
    shm::OwnedFd f(::open(legacy->path().c_str(), O_RDWR | O_CLOEXEC));
    ASSERT_TRUE(f.valid());
    cases.push_back({"legacy tmpfs file", std::move(f), 4096,
                     absl::StatusCode::kInvalidArgument,
                     "not sealed against shrinking"});
  }
  {
    int pipefd[2];
    ASSERT_EQ(::pipe2(pipefd, O_CLOEXEC), 0);
    ::close(pipefd[1]);
    cases.push_back({"pipe", shm::OwnedFd(pipefd[0]), 4096,
                     absl::StatusCode::kInvalidArgument, "not a regular file"});
  }
  {
    // A write-only descriptor of a sealed memfd: nothing to read with.
    shm::OwnedFd m = MakeMemfd(kBytes, F_SEAL_SHRINK);
    shm::OwnedFd wo(::open(("/proc/self/fd/" + std::to_string(m.get())).c_str(),
                           O_WRONLY | O_CLOEXEC));
    ASSERT_TRUE(wo.valid()) << strerror(errno);
    cases.push_back({"write-only fd", std::move(wo), kBytes,
                     absl::StatusCode::kPermissionDenied,
                     "not open for reading"});
  }
  for (Case& c : cases) {
    absl::StatusOr<uint64_t> id = Register(c.fd.get(), c.size);
    EXPECT_EQ(id.status().code(), c.code) << c.what << ": " << id.status();
    EXPECT_THAT(Msg(id.status()), HasSubstr(c.message)) << c.what;
  }
  EXPECT_EQ(manager_->arenas_registered(), 0);
  ExpectHealthy("job/after-refusals");
}

// Sends raw bytes (and fds) on a fresh connection; the reply.
absl::StatusOr<uint64_t> RawRequest(const std::string& path,
                                    const std::string& bytes,
                                    const std::vector<int>& fds) {
  shm::OwnedFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) !=
      0) {
    return absl::ErrnoToStatus(errno, "connect");
  }
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
  }
  if (::sendmsg(s.get(), &msg, MSG_NOSIGNAL) < 0)
    return absl::ErrnoToStatus(errno, "sendmsg");
  char buf[2048];
  const ssize_t n = ::recv(s.get(), buf, sizeof(buf), 0);
  if (n <= 0) return absl::UnavailableError("no reply");
  return shm::DecodeArenaReply(std::string_view(buf, static_cast<size_t>(n)));
}

TEST_F(ArenaListenerTest, RefusesMalformedRequests) {
  Start();
  shm::OwnedFd a = MakeMemfd(kBytes, F_SEAL_SHRINK);
  shm::OwnedFd b = MakeMemfd(kBytes, F_SEAL_SHRINK);
  const std::string good = shm::EncodeArenaRequest(kBytes, "raw");
  struct Case {
    std::string what, bytes;
    std::vector<int> fds;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"no fd", good, {}, "exactly one"},
      {"two fds", good, {a.get(), b.get()}, "exactly one"},
      {"bad magic", "XXXX" + good.substr(4), {a.get()}, "magic"},
      {"short", "CKA1", {a.get()}, "header"},
      {"too long", good + std::string(4096, 'x'), {a.get()}, "longer than"},
      {"size 0",
       shm::EncodeArenaRequest(0, "raw"),
       {a.get()},
       "size must be positive"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<uint64_t> r = RawRequest(socket_, c.bytes, c.fds);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << c.what << r.status();
    EXPECT_THAT(Msg(r.status()), HasSubstr(c.message)) << c.what;
  }
  EXPECT_EQ(manager_->arenas_registered(), 0);
  // The well-formed one.
  ASSERT_OK(RawRequest(socket_, good, {a.get()}));
  EXPECT_EQ(manager_->arenas_registered(), 1);
}

// "CKB1": a group buffer handed out over the same socket, with the
// connection's uid; malformed requests and unknown tokens refused.
TEST_F(ArenaListenerTest, HandsOutGroupBuffers) {
  shm::OwnedFd memfd = MakeMemfd(kBytes, F_SEAL_SHRINK);
  ASSERT_EQ(::pwrite(memfd.get(), "group data", 10, 0), 10);
  const std::string good(32, 'a');
  std::vector<uint32_t> uids;
  Start(absl::Seconds(5), 16,
        [&](const std::string& token,
            const PeerCredentials& peer) -> absl::StatusOr<shm::FetchedFd> {
          uids.push_back(peer.uid);
          if (token != good) return absl::NotFoundError("no group buffer");
          return shm::FetchedFd{shm::OwnedFd(::dup(memfd.get())), kBytes};
        });
  ASSERT_OK_AND_ASSIGN(shm::FetchedFd f,
                       shm::FetchGroupBuffer(socket_, good, absl::Seconds(10)));
  EXPECT_EQ(f.size, kBytes);
  char got[10];
  ASSERT_EQ(::pread(f.fd.get(), got, 10, 0), 10);
  EXPECT_EQ(std::string(got, 10), "group data");
  EXPECT_EQ(uids, std::vector<uint32_t>{::getuid()});
  EXPECT_EQ(
      shm::FetchGroupBuffer(socket_, std::string(32, 'b'), absl::Seconds(10))
          .status()
          .code(),
      absl::StatusCode::kNotFound);
  for (const std::string& bad :
       {std::string(31, 'a'), std::string(32, 'A'), std::string(32, 'g')}) {
    absl::StatusOr<shm::FetchedFd> r =
        shm::FetchGroupBuffer(socket_, bad, absl::Seconds(10));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  // A buffer request carrying a descriptor is refused.
  EXPECT_EQ(RawRequest(socket_, shm::EncodeBufferRequest(good), {memfd.get()})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(uids.size(), 2u);  // the malformed ones never reach the handler
}

TEST_F(ArenaListenerTest, WithoutAFetchHandlerBuffersAreUnimplemented) {
  Start();
  EXPECT_EQ(
      shm::FetchGroupBuffer(socket_, std::string(32, 'a'), absl::Seconds(10))
          .status()
          .code(),
      absl::StatusCode::kUnimplemented);
}

TEST_F(ArenaListenerTest, SilentClientsBlockNobody) {
  Start(/*request_timeout=*/absl::Seconds(2), /*per_uid=*/4);
  // Three clients connect and send nothing (one less than the per-uid cap).
  std::vector<shm::OwnedFd> silent;
  for (int i = 0; i < 3; ++i) {
    shm::OwnedFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(
        ::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
        0);
    silent.push_back(std::move(s));
  }
  ASSERT_OK_AND_ASSIGN(auto arena, shm::Arena::CreateMemfd(kBytes, "good"));
  const absl::Time start = absl::Now();
  ASSERT_OK(Register(arena->fd(), kBytes));
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(1500))
      << "served without waiting";
  // Over the per-uid connection cap: answered RESOURCE_EXHAUSTED at once.
  std::vector<shm::OwnedFd> more;
  for (int i = 0; i < 2; ++i) {
    shm::OwnedFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(
        ::connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)),
        0);
    more.push_back(std::move(s));
  }
  char buf[2048];
  const ssize_t n = ::recv(more[1].get(), buf, sizeof(buf), 0);
  ASSERT_GT(n, 0);
  absl::StatusOr<uint64_t> r = shm::DecodeArenaReply(std::string_view(buf, n));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted)
      << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("connections open already"));
  // The silent ones are answered DEADLINE_EXCEEDED and closed after the
  // timeout.
  const ssize_t m = ::recv(silent[0].get(), buf, sizeof(buf), 0);
  ASSERT_GT(m, 0);
  EXPECT_EQ(shm::DecodeArenaReply(std::string_view(buf, m)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(::recv(silent[0].get(), buf, sizeof(buf), 0), 0) << "closed";
  for (int i = 0; i < 200 && listener_->open_connections() > 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(listener_->open_connections(), 0);
  ASSERT_OK(Register(arena->fd(), kBytes));
}

TEST_F(ArenaListenerTest, PerUidQuotas) {
  options_.max_arenas_per_client = 2;
  options_.max_arena_bytes_per_client = 4 * kBytes;
  Start();
  std::vector<std::unique_ptr<shm::Arena>> arenas;
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(auto a, shm::Arena::CreateMemfd(kBytes, "q"));
    arenas.push_back(std::move(a));
  }
  const uint32_t me = ::getuid();
  ASSERT_OK(Register(arenas[0]->fd(), kBytes));
  ASSERT_OK(Register(arenas[1]->fd(), kBytes));
  absl::StatusOr<uint64_t> third = Register(arenas[2]->fd(), kBytes);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted)
      << third.status();
  EXPECT_THAT(Msg(third.status()),
              HasSubstr("uid " + std::to_string(me) + " has 2 arenas"));
  EXPECT_THAT(Msg(third.status()), HasSubstr("max_arenas_per_client = 2"));

  // Another uid still can (the manager API with an explicit peer).
  const uint32_t other = me == 4242 ? 4243 : 4242;
  shm::OwnedFd fd = MakeMemfd(kBytes, F_SEAL_SHRINK);
  ASSERT_OK(manager_->RegisterArenaFd(fd.Release(), kBytes, "other",
                                      {1, other, other}));
  // ... within its byte quota: 4 * kBytes in all.
  shm::OwnedFd big = MakeMemfd(4 * kBytes, F_SEAL_SHRINK);
  absl::StatusOr<uint64_t> r = manager_->RegisterArenaFd(
      big.Release(), 4 * kBytes, "other", {1, other, other});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(Msg(r.status()), HasSubstr("uid " + std::to_string(other)));
  EXPECT_THAT(Msg(r.status()), HasSubstr("max_arena_bytes_per_client"));

  // A real second user: a child that becomes uid 65534 registers over the
  // socket while uid `me` is at its quota.
  if (me != 0) GTEST_SKIP() << "not root: no real second uid";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    const int m = ::memfd_create("child", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (m < 0 || ::ftruncate(m, kBytes) != 0 ||
        ::fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK) != 0) {
      ::_exit(11);
    }
    absl::StatusOr<uint64_t> id =
        shm::RegisterArenaFd(socket_, m, kBytes, "child", absl::Seconds(10));
    ::_exit(id.ok() ? 0 : 12);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(manager_->arenas_registered(), 4);
}

// The confused deputy: by name, over gRPC, a client could have another
// user's 0600 arena file mapped into its checkpoint.
TEST_F(ArenaListenerTest, NamedRegistrationOverGrpcIsRefusedByDefault) {
  StartWithGrpc();
  auto channel = channel_;
  auto stub = pb::CheckpointDaemon::NewStub(channel);

  // "Another user's" arena file in shm_dir: 0600, owned by 65534 if we can.
  const std::string victim = options_.shm_dir + "/victim-arena";
  {
    shm::OwnedFd f(
        ::open(victim.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    ASSERT_TRUE(f.valid());
    ASSERT_EQ(::ftruncate(f.get(), 4096), 0);
    if (::getuid() == 0) {
      ASSERT_EQ(::fchown(f.get(), 65534, 65534), 0);
    }
  }
  grpc::ClientContext ctx;
  pb::RegisterArenaRequest req;
  req.set_name("victim-arena");
  req.set_size_bytes(4096);
  req.set_owner("attacker");
  pb::RegisterArenaResponse resp;
  grpc::Status s = stub->RegisterArena(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr("arena socket"));
  EXPECT_THAT(s.error_message(), HasSubstr(socket_));
  EXPECT_EQ(resp.arena_id(), 0u);
  EXPECT_EQ(manager_->arenas_registered(), 0);
  struct stat st;
  EXPECT_EQ(::stat(victim.c_str(), &st), 0) << "the victim's file is untouched";

  // GetInfo names the arena socket and says named arenas are off.
  grpc::ClientContext ictx;
  pb::GetInfoResponse info;
  ASSERT_TRUE(stub->GetInfo(&ictx, pb::GetInfoRequest(), &info).ok());
  EXPECT_EQ(info.arena_socket(), options_.arena_socket);
  EXPECT_FALSE(info.named_arenas());
  // In-process callers (tests, tools) may still register by name.
  ASSERT_OK(manager_->RegisterArena("victim-arena", 4096, "in-process"));
}

TEST_F(ArenaListenerTest, NamedRegistrationOverGrpcWithTheUnsafeOptIn) {
  options_.allow_named_arenas = true;
  StartWithGrpc();
  auto stub = pb::CheckpointDaemon::NewStub(channel_);
  ASSERT_OK_AND_ASSIGN(auto legacy,
                       shm::Arena::Create(options_.shm_dir, 4096, "legacy"));
  grpc::ClientContext ctx;
  pb::RegisterArenaRequest req;
  req.set_name(legacy->name());
  req.set_size_bytes(4096);
  pb::RegisterArenaResponse resp;
  grpc::Status s = stub->RegisterArena(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_NE(resp.arena_id(), 0u);
}

// Item 16: a request gRPC cannot parse (a string field that is not UTF-8,
// bytes that are no protobuf) used to get a bare UNIMPLEMENTED with no
// message. The service parses requests itself: INVALID_ARGUMENT naming the
// message and the field, and the daemon serves on.
TEST_F(ArenaListenerTest, UnparsableGrpcRequestsAreInvalidArgument) {
  StartWithGrpc();
  auto channel = channel_;
  auto call = [&](const std::string& method, const std::string& bytes) {
    return ckptd::testing::RawUnaryCall(
        channel, "/ckptd.v1.CheckpointDaemon/" + method, bytes);
  };
  using ckptd::testing::PoisonUtf8;
  pb::SaveRequest save;
  save.set_checkpoint_id(dir_.Join("ck/a"));
  save.set_job("j");
  save.set_world_size(1);
  save.add_items()->set_fqn("w");
  save.add_items()->set_fqn("x@@BAD@@");
  pb::CancelRequest cancel;
  cancel.set_checkpoint_id("@@BAD@@");
  pb::RestoreRequest restore;
  restore.set_checkpoint_id("/ck");
  restore.add_boxes()->set_fqn("@@BAD@@");
  pb::SaveRequest options;
  options.mutable_options()->set_compression("zs@@BAD@@");
  const struct {
    std::string method, bytes, message;
  } cases[] = {
      {"Save", PoisonUtf8(save),
       "ckptd.v1.SaveRequest: items[1].fqn (at byte 3) is not valid UTF-8"},
      {"Save", PoisonUtf8(options),
       "options.compression (at byte 4) is not valid UTF-8"},
      {"Cancel", PoisonUtf8(cancel),
       "ckptd.v1.CancelRequest: checkpoint_id (at byte 2) is not valid "
       "UTF-8"},
      {"Restore", PoisonUtf8(restore), "boxes[0].fqn (at byte 2)"},
      {"GetStatus", std::string("\xff\xff\xff\xff", 4),
       "the 4-byte request is not a valid ckptd.v1.GetStatusRequest"},
  };
  for (const auto& c : cases) {
    const grpc::Status s = call(c.method, c.bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.method << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message)) << c.method;
  }
  // The daemon serves on, through the typed stub too.
  auto stub = pb::CheckpointDaemon::NewStub(channel);
  grpc::ClientContext ictx;
  pb::GetInfoResponse info;
  const grpc::Status s = stub->GetInfo(&ictx, pb::GetInfoRequest(), &info);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(info.pid(), ::getpid());
  grpc::ClientContext sctx;
  pb::GetStatusRequest sreq;
  sreq.set_checkpoint_id(dir_.Join("ck/none"));
  pb::CheckpointStatus st;
  EXPECT_EQ(stub->GetStatus(&sctx, sreq, &st).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace ckptd::daemon
