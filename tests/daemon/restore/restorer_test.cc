// Copyright 2026 The ckptd Authors.
//
// The daemon's restore path (daemon/restore/) in-process: a real checkpoint
// written by the format library, real memfd arenas mapped the way the arena
// socket maps them, the Restorer serving group batches on its threads.
#include "daemon/restore/restorer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "daemon/arena/arena_registry.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "shm/mapping.h"
#include "tests/testing/read_hook_env.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using format::DType;
using format::ItemDesc;
using format::WriteItem;

// A client arena and the daemon's view of it.
struct TestArena {
  std::unique_ptr<shm::Arena> client;
  std::shared_ptr<Arena> daemon;
};

TestArena MakeArena(uint64_t size, uint64_t id, bool verified = true) {
  TestArena a;
  auto c = shm::Arena::CreateMemfd(size, "restorer-test");
  EXPECT_TRUE(c.ok()) << c.status();
  a.client = *std::move(c);
  auto m = shm::Mapping::FromFd(::dup(a.client->fd()), size, "test arena");
  EXPECT_TRUE(m.ok()) << m.status();
  a.daemon = std::make_shared<Arena>();
  a.daemon->id = id;
  a.daemon->map = *std::move(m);
  a.daemon->uid = ::getuid();
  a.daemon->verified_uid = verified;
  return a;
}

class RestorerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = tmp_.Join("ckpt");
    w_.resize(8 * 4);
    std::iota(w_.begin(), w_.end(), 1.0f);
    r_.resize(16);
    std::iota(r_.begin(), r_.end(), int64_t{100});
    std::vector<std::vector<WriteItem>> ranks(2);
    for (int rank = 0; rank < 2; ++rank) {
      WriteItem w;
      w.desc = {"w",    ItemDesc::Type::kTensor, DType::kFloat32,
                {8, 4}, {rank * 4, 0},           {4, 4},
                {}};
      w.tensor = {DType::kFloat32,
                  {4, 4},
                  {},
                  reinterpret_cast<const char*>(w_.data() + rank * 16)};
      ranks[rank].push_back(w);
    }
    WriteItem r;
    r.desc = {"r", ItemDesc::Type::kTensor, DType::kInt64, {16}, {0}, {16}, {}};
    r.tensor = {
        DType::kInt64, {16}, {}, reinterpret_cast<const char*>(r_.data())};
    ranks[0].push_back(r);
    WriteItem step;
    step.desc.fqn = "step";
    step.desc.type = ItemDesc::Type::kBytes;
    step.bytes = step_;
    ranks[1].push_back(step);
    format::CheckpointWriterOptions wo;
    wo.sync = false;
    auto wr = format::WriteCheckpoint(dir_, ranks, wo);
    ASSERT_TRUE(wr.ok()) << wr.status();
  }

  std::unique_ptr<Restorer> Make(absl::Duration gather = absl::Seconds(10),
                                 Clock* clock = Clock::Real(),
                                 bool housekeeping = true) {
    RestorerOptions o;
    o.checkpoint_roots = {tmp_.path()};
    o.clock = clock;
    o.gather_timeout = gather;
    o.housekeeping_thread = housekeeping;
    o.buffer_bytes = buffer_bytes_;
    if (env_ != nullptr) o.env = env_;
    o.read_threads = read_threads_;
    o.find_arena = [this](uint64_t id) -> std::shared_ptr<const Arena> {
      absl::MutexLock l(&mu_);
      for (const auto& a : arenas_) {
        if (a->id == id) return a;
      }
      return nullptr;
    };
    return std::make_unique<Restorer>(std::move(o));
  }

  TestArena AddArena(uint64_t size, bool verified = true) {
    absl::MutexLock l(&mu_);
    TestArena a = MakeArena(size, 1000 + arenas_.size(), verified);
    arenas_.push_back(a.daemon);
    return a;
  }

  std::vector<TestArena> AddArenas(int n) {
    std::vector<TestArena> out;
    for (int i = 0; i < n; ++i) out.push_back(AddArena(1 << 20));
    return out;
  }

  // Until a batch is gathering (a call's Restore runs on a restore thread).
  static void AwaitGathering(const Restorer& r) {
    for (int i = 0; i < 500 && r.gathering() == 0; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }

  // A batch wanting all of "w" at 0, all of "r" at 128 and "step" at 512.
  RestoreBatch FullBatch(const TestArena& a, const std::string& group = "",
                         int local_rank = 0, int lws = 1) {
    RestoreBatch b;
    b.checkpoint_id = dir_;
    b.group = group;
    b.local_rank = local_rank;
    b.local_world_size = lws;
    b.last = true;
    b.arena_id = a.daemon->id;
    b.boxes.push_back({"w", {0, 0}, {8, 4}, DType::kFloat32, 0, 128});
    b.boxes.push_back({"r", {0}, {16}, DType::kInt64, 128, 128});
    b.bytes_items.push_back({"step", 512, 256});
    return b;
  }

  void ExpectFull(const TestArena& a) {
    EXPECT_EQ(std::memcmp(a.client->data(), w_.data(), 128), 0);
    EXPECT_EQ(std::memcmp(a.client->data() + 128, r_.data(), 128), 0);
    EXPECT_EQ(std::string(a.client->data() + 512, step_.size()), step_);
  }

  // Starts a Restore; Wait() returns its result.
  struct Call {
    absl::Notification done;
    absl::StatusOr<RestoreReply> result = absl::UnknownError("not run");
    bool Wait(absl::Duration d = absl::Seconds(30)) {
      return done.WaitForNotificationWithTimeout(d);
    }
  };
  std::unique_ptr<Call> Start(Restorer& r, RestoreBatch b) {
    auto c = std::make_unique<Call>();
    Call* p = c.get();
    r.Restore(std::move(b), [p](absl::StatusOr<RestoreReply> reply) {
      p->result = std::move(reply);
      p->done.Notify();
    });
    return c;
  }

  uint64_t buffer_bytes_ = uint64_t{1} << 30;
  Env* env_ = nullptr;  // Env::Default()
  int read_threads_ = 4;
  TempDir tmp_;
  std::string dir_;
  std::vector<float> w_;
  std::vector<int64_t> r_;
  std::string step_ = "not a pickle, an opaque payload";
  absl::Mutex mu_;
  std::vector<std::shared_ptr<Arena>> arenas_ ABSL_GUARDED_BY(mu_);
};

TEST_F(RestorerTest, OneRankRestoresBoxesAndBytesItems) {
  auto r = Make();
  TestArena a = AddArena(1 << 20);
  RestoreBatch b = FullBatch(a);
  // Rows 2..5 of "w" span both saved chunks.
  b.boxes.push_back({"w", {2, 1}, {4, 2}, DType::kFloat32, 1024, 32});
  auto c = Start(*r, std::move(b));
  ASSERT_TRUE(c->Wait());
  ASSERT_TRUE(c->result.ok()) << c->result.status();
  ExpectFull(a);
  const float* part = reinterpret_cast<const float*>(a.client->data() + 1024);
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 2; ++j)
      EXPECT_EQ(part[i * 2 + j], w_[(2 + i) * 4 + 1 + j]);
  }
  EXPECT_EQ(c->result->bytes_lengths, std::vector<uint64_t>{step_.size()});
  EXPECT_EQ(c->result->group_ranks, 1);
  EXPECT_GE(c->result->storage_bytes, 256u + step_.size());
  EXPECT_EQ(c->result->copied_bytes, 128u + 128u + 32u + step_.size());
}

TEST_F(RestorerTest, GroupOfFourReadsEachBoxOnce) {
  auto r = Make();
  // Alone first: what one read of these boxes costs.
  TestArena solo = AddArena(1 << 20);
  auto c0 = Start(*r, FullBatch(solo));
  ASSERT_TRUE(c0->Wait());
  ASSERT_TRUE(c0->result.ok()) << c0->result.status();
  const uint64_t once = c0->result->storage_bytes;
  std::vector<TestArena> arenas;
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 4; ++i) arenas.push_back(AddArena(1 << 20));
  for (int i = 0; i < 4; ++i) {
    calls.push_back(Start(*r, FullBatch(arenas[i], "g", i, 4)));
  }
  uint64_t total = 0;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(calls[i]->Wait());
    ASSERT_TRUE(calls[i]->result.ok()) << calls[i]->result.status();
    EXPECT_EQ(calls[i]->result->group_ranks, 4);
    total += calls[i]->result->storage_bytes;
    ExpectFull(arenas[i]);
  }
  EXPECT_EQ(total, once);  // not 4x
}

TEST_F(RestorerTest, GatherDeadlineServesTheRanksThatCame) {
  SimulatedClock clock;
  auto r = Make(absl::Seconds(10), &clock, /*housekeeping=*/false);
  TestArena a = AddArena(1 << 20);
  auto c = Start(*r, FullBatch(a, "g", 0, 2));
  // Not served while rank 1 may still come.
  AwaitGathering(*r);
  EXPECT_EQ(r->gathering(), 1);
  EXPECT_FALSE(c->Wait(absl::Milliseconds(100)));
  clock.Advance(absl::Seconds(9));
  r->Tick(clock.Now());
  EXPECT_FALSE(c->Wait(absl::Milliseconds(100)));
  clock.Advance(absl::Seconds(2));
  r->Tick(clock.Now());
  ASSERT_TRUE(c->Wait());
  ASSERT_TRUE(c->result.ok()) << c->result.status();
  EXPECT_EQ(c->result->group_ranks, 1);
  ExpectFull(a);
}

TEST_F(RestorerTest, ARankThatMissedADeadlineIsNotWaitedForAgain) {
  SimulatedClock clock;
  auto r = Make(absl::Seconds(10), &clock, /*housekeeping=*/false);
  TestArena a = AddArena(1 << 20);
  RestoreBatch b = FullBatch(a, "g", 0, 2);
  b.last = false;
  auto c0 = Start(*r, b);
  AwaitGathering(*r);
  clock.Advance(absl::Seconds(11));
  r->Tick(clock.Now());
  ASSERT_TRUE(c0->Wait());
  ASSERT_TRUE(c0->result.ok()) << c0->result.status();
  // Rank 1 never came (a dead trainer): batch 1 is served at once.
  b.batch = 1;
  b.last = true;
  auto c1 = Start(*r, b);
  ASSERT_TRUE(c1->Wait(absl::Seconds(10)));
  ASSERT_TRUE(c1->result.ok()) << c1->result.status();
  EXPECT_EQ(c1->result->group_ranks, 1);
  ExpectFull(a);
}

TEST_F(RestorerTest, AMembersMistakeFailsOnlyThatMember) {
  auto r = Make();
  TestArena good = AddArena(1 << 20), bad = AddArena(4096);
  RestoreBatch b = FullBatch(bad, "g", 1, 2);
  b.boxes[0].arena_offset = 4090;  // past the arena's end
  auto cb = Start(*r, std::move(b));
  auto cg = Start(*r, FullBatch(good, "g", 0, 2));
  ASSERT_TRUE(cb->Wait());
  ASSERT_TRUE(cg->Wait());
  EXPECT_EQ(cb->result.status().code(), absl::StatusCode::kOutOfRange)
      << cb->result.status();
  ASSERT_TRUE(cg->result.ok()) << cg->result.status();
  ExpectFull(good);
}

TEST_F(RestorerTest, BadRequestsGetPreciseErrors) {
  // No housekeeping thread: its tick forgets a finished group (see the end).
  SimulatedClock clock;
  auto r = Make(absl::Seconds(10), &clock, /*housekeeping=*/false);
  TestArena a = AddArena(1 << 20);
  auto run = [&](RestoreBatch b) {
    auto c = Start(*r, std::move(b));
    EXPECT_TRUE(c->Wait());
    return c->result.status();
  };
  RestoreBatch b = FullBatch(a);
  b.boxes[0].dtype = DType::kFloat64;
  b.boxes[0].nbytes = 256;
  EXPECT_EQ(run(b).code(), absl::StatusCode::kInvalidArgument);
  b = FullBatch(a);
  b.boxes[0].fqn = "nope";
  EXPECT_EQ(run(b).code(), absl::StatusCode::kNotFound);
  b = FullBatch(a);
  b.boxes[1].sizes = {17};
  b.boxes[1].nbytes = 136;
  EXPECT_FALSE(run(b).ok());
  b = FullBatch(a);
  b.bytes_items[0].capacity = 3;
  EXPECT_EQ(run(b).code(), absl::StatusCode::kInvalidArgument);
  b = FullBatch(a);
  b.identity = "1:2:3:4";
  EXPECT_EQ(run(b).code(), absl::StatusCode::kAborted);
  b = FullBatch(a);
  b.checkpoint_id = "/etc";
  EXPECT_EQ(run(b).code(), absl::StatusCode::kPermissionDenied);
  b = FullBatch(a);
  b.checkpoint_id = tmp_.Join("missing");
  EXPECT_EQ(run(b).code(), absl::StatusCode::kNotFound);
  b = FullBatch(a);
  b.arena_id = 7;
  EXPECT_EQ(run(b).code(), absl::StatusCode::kNotFound);
  TestArena named = AddArena(1 << 20, /*verified=*/false);
  EXPECT_EQ(run(FullBatch(named)).code(),
            absl::StatusCode::kFailedPrecondition);
  // A group rank that finished cannot send a later batch while its group
  // is known; a batch 0 again is a new load (RestartedJobStartsItsGroupAnew).
  EXPECT_TRUE(run(FullBatch(a, "once", 0, 1)).ok());
  RestoreBatch later = FullBatch(a, "once", 0, 1);
  later.batch = 1;
  EXPECT_EQ(run(later).code(), absl::StatusCode::kFailedPrecondition);
  // The refused batch left no restore behind (it was listed RUNNING, with
  // nothing to serve, until its idle timeout made it ABANDONED).
  for (const RestoreProgressInfo& p : r->ListRestores()) {
    EXPECT_NE(p.state, "RUNNING") << p.id << " of group '" << p.group << "'";
  }
  // The next tick forgets the finished group; the name is served again.
  r->Tick(clock.Now());
  EXPECT_TRUE(run(FullBatch(a, "once", 0, 1)).ok());
  // Still serving.
  EXPECT_TRUE(run(FullBatch(a)).ok());
}

TEST_F(RestorerTest, RestartedJobStartsItsGroupAnew) {
  // A job crashed mid-load; its restarted ranks load under the same group
  // name before the daemon forgot the group (the Python client counts
  // "<dir>#<n>" from 0 in every process). Used to be INVALID_ARGUMENT
  // ("sent batch 0 after batch 1") until the group's idle timeout.
  SimulatedClock clock;
  // The calls outlive the restorer, which answers what it holds when it
  // stops (a failed ASSERT must not leave it answering freed calls).
  std::unique_ptr<Call> o0, o1, o0b, n0, n1, stale;
  auto r = Make(absl::Seconds(10), &clock, /*housekeeping=*/false);
  std::vector<TestArena> old_ranks = AddArenas(2), new_ranks = AddArenas(2);
  auto batch = [&](const TestArena& a, int rank, uint32_t k, bool last) {
    RestoreBatch b = FullBatch(a, "ckpt#0", rank, 2);
    b.batch = k;
    b.last = last;
    return b;
  };
  o0 = Start(*r, batch(old_ranks[0], 0, 0, false));
  o1 = Start(*r, batch(old_ranks[1], 1, 0, false));
  ASSERT_TRUE(o0->Wait() && o1->Wait());
  ASSERT_TRUE(o0->result.ok()) << o0->result.status();
  EXPECT_EQ(o0->result->group_ranks, 2);
  // Rank 0's batch 1 gathers; then the job dies.
  o0b = Start(*r, batch(old_ranks[0], 0, 1, true));
  AwaitGathering(*r);
  ASSERT_EQ(r->gathering(), 1);
  const std::string old_id = r->ListRestores().at(0).id;
  clock.Advance(absl::Seconds(5));
  // The restarted rank 0: the group starts over, and the old batch 1 is
  // served now (to its own arena) instead of at its deadline.
  n0 = Start(*r, batch(new_ranks[0], 0, 0, true));
  ASSERT_TRUE(o0b->Wait(absl::Seconds(10)));
  EXPECT_TRUE(o0b->result.ok()) << o0b->result.status();
  AwaitGathering(*r);
  EXPECT_EQ(r->gathering(), 1) << "the new batch 0 waits for its rank 1";
  n1 = Start(*r, batch(new_ranks[1], 1, 0, true));
  ASSERT_TRUE(n0->Wait() && n1->Wait());
  for (auto* c : {n0.get(), n1.get()}) {
    ASSERT_TRUE(c->result.ok()) << c->result.status();
    EXPECT_EQ(c->result->group_ranks, 2) << "gathered: read once";
  }
  ExpectFull(new_ranks[0]);
  ExpectFull(new_ranks[1]);
  // One restore for the name, a new one, done.
  const std::vector<RestoreProgressInfo> list = r->ListRestores();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_NE(list[0].id, old_id);
  EXPECT_EQ(list[0].state, "DONE");
  // A live rank's batch k > 0 of the finished load is still refused.
  stale = Start(*r, batch(new_ranks[1], 1, 1, true));
  ASSERT_TRUE(stale->Wait());
  EXPECT_EQ(stale->result.status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RestorerTest, CorruptPayloadIsDataLossForTheWholeGroup) {
  // Flip a byte in the middle of rank 0's data file ("w" rows 0..3).
  const std::string file = dir_ + "/__0_0.distcp";
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t size = ::lseek(fd, 0, SEEK_END);
  ASSERT_GT(size, 0);
  bool flipped = false;
  // The tensor bytes are 1.0f..16.0f: find 5.0f and change it.
  std::string data(size, '\0');
  ASSERT_EQ(::pread(fd, data.data(), size, 0), size);
  const float five = 5.0f;
  const size_t at =
      data.find(std::string(reinterpret_cast<const char*>(&five), 4));
  if (at != std::string::npos) {
    data[at] ^= 1;
    ASSERT_EQ(::pwrite(fd, data.data() + at, 1, at), 1);
    flipped = true;
  }
  ::close(fd);
  ASSERT_TRUE(flipped);
  auto r = Make();
  TestArena a0 = AddArena(1 << 20), a1 = AddArena(1 << 20);
  auto c0 = Start(*r, FullBatch(a0, "g", 0, 2));
  auto c1 = Start(*r, FullBatch(a1, "g", 1, 2));
  ASSERT_TRUE(c0->Wait());
  ASSERT_TRUE(c1->Wait());
  for (auto* c : {c0.get(), c1.get()}) {
    EXPECT_EQ(c->result.status().code(), absl::StatusCode::kDataLoss)
        << c->result.status();
    EXPECT_NE(c->result.status().message().find("__0_0.distcp"),
              std::string::npos)
        << c->result.status();
  }
}

TEST_F(RestorerTest, CrcIsSkippedOnlyIfEveryMemberAsks) {
  const std::string file = dir_ + "/__0_0.distcp";
  const int fd = ::open(file.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  std::string data(::lseek(fd, 0, SEEK_END), '\0');
  ASSERT_EQ(::pread(fd, data.data(), data.size(), 0),
            static_cast<ssize_t>(data.size()));
  const float five = 5.0f;
  const size_t at =
      data.find(std::string(reinterpret_cast<const char*>(&five), 4));
  ASSERT_NE(at, std::string::npos);
  data[at + 3] ^= 0x40;  // 5.0f -> another float
  ASSERT_EQ(::pwrite(fd, data.data() + at + 3, 1, at + 3), 1);
  ::close(fd);
  auto r = Make();
  TestArena a0 = AddArena(1 << 20), a1 = AddArena(1 << 20);
  RestoreBatch b0 = FullBatch(a0, "g", 0, 2), b1 = FullBatch(a1, "g", 1, 2);
  b0.verify_crc = false;
  auto c0 = Start(*r, std::move(b0));
  auto c1 = Start(*r, FullBatch(a1, "g", 1, 2));
  ASSERT_TRUE(c0->Wait());
  ASSERT_TRUE(c1->Wait());
  EXPECT_EQ(c0->result.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(c1->result.status().code(), absl::StatusCode::kDataLoss);
  b0 = FullBatch(a0, "h", 0, 2);
  b1 = FullBatch(a1, "h", 1, 2);
  b0.verify_crc = b1.verify_crc = false;
  c0 = Start(*r, std::move(b0));
  c1 = Start(*r, std::move(b1));
  ASSERT_TRUE(c0->Wait());
  ASSERT_TRUE(c1->Wait());
  ASSERT_TRUE(c0->result.ok()) << c0->result.status();
  ASSERT_TRUE(c1->result.ok()) << c1->result.status();
  // The damaged value comes back as it is on disk.
  const float* w = reinterpret_cast<const float*>(a1.client->data());
  EXPECT_NE(w[4], 5.0f);
  EXPECT_EQ(w[5], 6.0f);
}

TEST_F(RestorerTest, ShutdownAnswersWhatIsGathering) {
  auto r = Make();
  TestArena a = AddArena(1 << 20);
  auto c = Start(*r, FullBatch(a, "g", 0, 3));
  AwaitGathering(*r);
  ASSERT_EQ(r->gathering(), 1);
  r->Shutdown();
  ASSERT_TRUE(c->Wait());
  EXPECT_EQ(c->result.status().code(), absl::StatusCode::kUnavailable);
  // Later calls: UNAVAILABLE at once.
  auto late = Start(*r, FullBatch(a));
  ASSERT_TRUE(late->Wait());
  EXPECT_EQ(late->result.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(RestorerTest, ProgressOfAGroupRestoreIsListed) {
  auto r = Make();
  std::vector<TestArena> arenas = AddArenas(2);
  auto c0 = Start(*r, FullBatch(arenas[0], "g", 0, 2));
  AwaitGathering(*r);
  std::vector<RestoreProgressInfo> list = r->ListRestores();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].state, "RUNNING");
  EXPECT_EQ(list[0].group, "g");
  EXPECT_EQ(list[0].batches, 0u);
  auto c1 = Start(*r, FullBatch(arenas[1], "g", 1, 2));
  ASSERT_TRUE(c0->Wait() && c1->Wait());
  ASSERT_TRUE(c0->result.ok()) << c0->result.status();
  list = r->ListRestores();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].state, "DONE");
  EXPECT_EQ(list[0].dir, dir_);
  EXPECT_EQ(list[0].local_world_size, 2);
  EXPECT_EQ(list[0].ranks_done, 2);
  EXPECT_EQ(list[0].batches, 1u);
  EXPECT_EQ(list[0].copied_bytes,
            c0->result->copied_bytes + c1->result->copied_bytes);
  EXPECT_EQ(list[0].storage_bytes,
            c0->result->storage_bytes + c1->result->storage_bytes);
  EXPECT_TRUE(list[0].error.empty()) << list[0].error;
}

TEST_F(RestorerTest, CancelAnswersWhatIsGatheringAndEveryLaterBatch) {
  auto r = Make();
  std::vector<TestArena> arenas = AddArenas(2);
  auto c0 = Start(*r, FullBatch(arenas[0], "g", 0, 2));
  AwaitGathering(*r);
  ASSERT_EQ(r->gathering(), 1);
  const std::string id = r->ListRestores().at(0).id;
  EXPECT_EQ(r->CancelRestore("r999", "x").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(r->CancelRestore(id, "operator said so").ok());
  // Answered now, not at the gather deadline (10 s).
  ASSERT_TRUE(c0->Wait(absl::Seconds(5)));
  EXPECT_EQ(c0->result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_THAT(std::string(c0->result.status().message()),
              ::testing::HasSubstr("operator said so"));
  EXPECT_EQ(r->gathering(), 0);
  // A later batch of the cancelled load: CANCELLED too, nothing gathers.
  RestoreBatch next = FullBatch(arenas[0], "g", 0, 2);
  next.batch = 1;
  auto c1 = Start(*r, next);
  ASSERT_TRUE(c1->Wait(absl::Seconds(5)));
  EXPECT_EQ(c1->result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(r->gathering(), 0);
  const std::vector<RestoreProgressInfo> list = r->ListRestores();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].state, "CANCELLED");
  EXPECT_EQ(list[0].error, "operator said so");
  EXPECT_EQ(r->CancelRestore(id, "again").code(),
            absl::StatusCode::kFailedPrecondition);
  // The job restarts and loads under the same name: a new restore, served.
  auto n0 = Start(*r, FullBatch(arenas[0], "g", 0, 2));
  auto n1 = Start(*r, FullBatch(arenas[1], "g", 1, 2));
  ASSERT_TRUE(n0->Wait() && n1->Wait());
  EXPECT_TRUE(n0->result.ok()) << n0->result.status();
  EXPECT_TRUE(n1->result.ok()) << n1->result.status();
  EXPECT_EQ(r->ListRestores().at(0).state, "DONE");
  // A new load (another group) is served as usual.
  auto c2 = Start(*r, FullBatch(arenas[0], "g2", 0, 1));
  ASSERT_TRUE(c2->Wait());
  EXPECT_TRUE(c2->result.ok()) << c2->result.status();
  ExpectFull(arenas[0]);
}

// A cancel while the batch is being read: the read stops at its next chunk
// and the rank is answered CANCELLED; the checkpoint's other data file is
// never read (the chunks there, and the bytes item, are skipped).
TEST_F(RestorerTest, CancelStopsABatchBeingRead) {
  Restorer* restorer = nullptr;
  std::string first;  // the data file read first
  absl::Status cancelled = absl::UnknownError("no read");
  ::ckptd::testing::ReadHookEnv env(
      Env::Default(), ".distcp", [&](const std::string& path, int reads) {
        if (reads != 1) return;
        first = path;
        cancelled = restorer->CancelRestore(restorer->ListRestores().at(0).id,
                                            "operator said stop");
      });
  env_ = &env;
  read_threads_ = 1;  // one chunk at a time, in file order
  auto r = Make();
  restorer = r.get();
  TestArena a = AddArena(1 << 20);
  auto c = Start(*r, FullBatch(a));
  ASSERT_TRUE(c->Wait());
  ASSERT_TRUE(cancelled.ok()) << cancelled;
  EXPECT_EQ(c->result.status().code(), absl::StatusCode::kCancelled)
      << c->result.status();
  EXPECT_THAT(std::string(c->result.status().message()),
              ::testing::HasSubstr("operator said stop"));
  // The other data file, named as the reader names the first.
  const std::string name = "__0_0.distcp";
  ASSERT_GT(first.size(), name.size());
  const std::string base = first.substr(0, first.size() - name.size());
  const std::string other =
      absl::EndsWith(first, name) ? base + "__1_0.distcp" : base + name;
  ASSERT_TRUE(absl::EndsWith(first, name) ||
              absl::EndsWith(first, "__1_0.distcp"))
      << first;
  EXPECT_GT(env.reads(first), 0);
  EXPECT_EQ(env.reads(other), 0) << other << " was read after the cancel";
  const std::vector<RestoreProgressInfo> list = r->ListRestores();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_EQ(list[0].state, "CANCELLED");
  EXPECT_EQ(list[0].batches, 0u) << "a cancelled batch is not counted served";
}

// The group's boxes in one read-only group buffer, fetched by each rank.
TEST_F(RestorerTest, AGroupBatchComesInAGroupBufferEachRankFetches) {
  auto r = Make();
  std::vector<TestArena> arenas = AddArenas(3);
  std::vector<std::unique_ptr<Call>> calls;
  for (int i = 0; i < 3; ++i) {
    RestoreBatch b = FullBatch(arenas[i], "g", i, 3);
    b.accept_group_buffer = true;
    calls.push_back(Start(*r, std::move(b)));
  }
  std::string token;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(calls[i]->Wait());
    ASSERT_TRUE(calls[i]->result.ok()) << calls[i]->result.status();
    const RestoreReply& reply = *calls[i]->result;
    ASSERT_EQ(reply.group_buffer_token.size(), 32u);
    if (i > 0) {
      EXPECT_EQ(reply.group_buffer_token, token);
    }
    token = reply.group_buffer_token;
    ASSERT_EQ(reply.box_buffer_offsets.size(), 2u);
    EXPECT_EQ(reply.copied_bytes, 128u + 128u + step_.size());
    // The boxes are not in the arena; the bytes item is.
    EXPECT_EQ(std::string(arenas[i].client->data(), 4), std::string(4, '\0'));
    EXPECT_EQ(std::string(arenas[i].client->data() + 512, step_.size()), step_);
    absl::StatusOr<shm::FetchedFd> f =
        r->FetchGroupBuffer(reply.group_buffer_token, ::getuid());
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->size, reply.group_buffer_size);
    void* p = ::mmap(nullptr, f->size, PROT_READ, MAP_SHARED, f->fd.get(), 0);
    ASSERT_NE(p, MAP_FAILED);
    const char* buf = static_cast<const char*>(p);
    EXPECT_EQ(std::memcmp(buf + reply.box_buffer_offsets[0], w_.data(), 128),
              0);
    EXPECT_EQ(std::memcmp(buf + reply.box_buffer_offsets[1], r_.data(), 128),
              0);
    ::munmap(p, f->size);
  }
  // Fetched by each of the three (their final batch): gone.
  EXPECT_EQ(r->FetchGroupBuffer(token, ::getuid()).status().code(),
            absl::StatusCode::kNotFound);
}

// Without room for a buffer, or with a rank that does not take one, the
// values go into every arena as before.
TEST_F(RestorerTest, GroupBuffersFallBackToTheArenas) {
  for (const bool room : {false, true}) {
    buffer_bytes_ = room ? uint64_t{1} << 30 : 64;
    auto r = Make();
    std::vector<TestArena> arenas = AddArenas(2);
    std::vector<std::unique_ptr<Call>> calls;
    for (int i = 0; i < 2; ++i) {
      RestoreBatch b = FullBatch(arenas[i], "g", i, 2);
      b.accept_group_buffer = !room || i == 0;  // room: rank 1 does not
      calls.push_back(Start(*r, std::move(b)));
    }
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(calls[i]->Wait());
      ASSERT_TRUE(calls[i]->result.ok()) << calls[i]->result.status();
      EXPECT_TRUE(calls[i]->result->group_buffer_token.empty());
      EXPECT_TRUE(calls[i]->result->box_buffer_offsets.empty());
      ExpectFull(arenas[i]);
    }
  }
}

TEST_F(RestorerTest, IndexIsDecodedOnceAndServedWithBytesSizes) {
  auto r = Make();
  TestArena a = AddArena(4096);
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::Notification n;
    absl::StatusOr<RestoreIndex> got = absl::UnknownError("not run");
    r->GetIndex(dir_, a.daemon->id, [&](absl::StatusOr<RestoreIndex> idx) {
      got = std::move(idx);
      n.Notify();
    });
    ASSERT_TRUE(n.WaitForNotificationWithTimeout(absl::Seconds(30)));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NE(
        got->index_json->find("\"nbytes\":" + std::to_string(step_.size())),
        std::string::npos)
        << *got->index_json;
    EXPECT_EQ(got->index_json->find("\"chunks\""), std::string::npos);
    ids.push_back(got->identity);
  }
  EXPECT_EQ(ids[0], ids[1]);
  EXPECT_EQ(ids[1], ids[2]);
}

TEST(MayReadTest, OwnerGroupOtherAndRoot) {
  CachedCheckpoint c;
  c.files.push_back({"/r/ckpt", 1000, 100, 0750});
  c.files.push_back({"/r/ckpt/.metadata", 1000, 100, 0640});
  c.files.push_back({"/r/ckpt/__0_0.distcp", 1000, 100, 0600});
  EXPECT_TRUE(MayRead(c, 1000, {100}).ok());
  EXPECT_TRUE(MayRead(c, 0, {}).ok());
  // Group members may read the directory and .metadata but not the data.
  const absl::Status g = MayRead(c, 1001, {100});
  EXPECT_EQ(g.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(g.message().find("__0_0.distcp"), std::string::npos) << g;
  c.files[2].mode = 0640;
  EXPECT_TRUE(MayRead(c, 1001, {100}).ok());
  // Others: nothing readable by others.
  EXPECT_EQ(MayRead(c, 1002, {200}).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(MayRead(c, 0xFFFFFFFFu, {}).code(),
            absl::StatusCode::kPermissionDenied);
  for (auto& f : c.files) f.mode |= 0005;
  EXPECT_TRUE(MayRead(c, 1002, {200}).ok());
}

TEST_F(RestorerTest, SymlinkedDataFileIsRefused) {
  // A data file replaced by a link to a file the caller may not read
  // itself must not be served through the daemon.
  const std::string file = dir_ + "/__1_0.distcp";
  ASSERT_EQ(::rename(file.c_str(), (file + ".real").c_str()), 0);
  ASSERT_EQ(::symlink((file + ".real").c_str(), file.c_str()), 0);
  auto r = Make();
  TestArena a = AddArena(1 << 20);
  auto c = Start(*r, FullBatch(a));
  ASSERT_TRUE(c->Wait());
  EXPECT_EQ(c->result.status().code(), absl::StatusCode::kPermissionDenied)
      << c->result.status();
  EXPECT_NE(c->result.status().message().find("symbolic link"),
            std::string::npos);
}

}  // namespace
}  // namespace ckptd::daemon
