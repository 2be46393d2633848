// Copyright 2026 The ckptd Authors.
//
// CheckpointManager in-process: real shared-memory arenas, the real writer
// and commit, storage through a FaultInjectionEnv (over the io_uring Env when
// the kernel allows, else POSIX). Covers the state machine, staging budget
// and streaming, dedup, cancel, faults at every storage step of a save
// (ENOSPC / EIO on write, fsync, rename, ...), power loss at every step
// (SimulateCrash), and start-up recovery.

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/synchronization/notification.h"
#include "common/fault_injection_env.h"
#include "common/tasks.h"
#include "common/uring_env.h"
#include "daemon/commit/state_record.h"
#include "daemon/save/checkpoint_manager.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/verify.h"
#include "format/pickle/py_value.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "tests/testing/manager_util.h"
#include "tests/testing/sanitizers.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;

// One rank's synthetic state: "w" float32 [4*world, 256] sharded on dim 0,
// "b" float32 [16] replicated, "meta.{r}" bytes.
struct RankData {
  std::unique_ptr<shm::Arena> arena;
  SaveBatch batch;
};

float Value(int64_t i, int seed) {
  return static_cast<float>((i * 31 + seed) % 251);
}

class ManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<UringEnv>> uring = UringEnv::Create(
        Env::Default(), dir_.path(), UringEnvOptions{.direct = true});
    base_ = Env::Default();
    if (uring.ok()) {
      uring_ = *std::move(uring);
      base_ = uring_.get();
    }
    fault_ = std::make_unique<FaultInjectionEnv>(base_);
    options_.checkpoint_roots = std::vector<std::string>{dir_.Join("ck")};
    options_.shm_dir = dir_.Join("shm");
    options_.state_dir = dir_.Join("state");
    options_.staging_budget = 64 << 20;
    options_.io_threads = 2;
    options_.env = fault_.get();
    ASSERT_OK(FinalizeOptions(&options_));
    Restart();
  }

  void Restart() {
    manager_.reset();
    ASSERT_OK_AND_ASSIGN(manager_, CheckpointManager::Create(options_));
  }

  // Builds rank r's batch (one batch holding everything unless
  // batch_bytes > 0, then only the index and no extents: see SaveStreamed).
  RankData MakeRank(const std::string& id, int rank, int world,
                    int64_t rows_per_rank = 4) {
    RankData rd;
    const int64_t cols = 256;
    const int64_t rows = rows_per_rank * world;
    const uint64_t w_bytes = rows_per_rank * cols * 4;
    const std::string meta = format::EncodeTorchSaveObject(
        format::PyValue::Str("meta of rank " + std::to_string(rank)));
    const uint64_t total = w_bytes + 16 * 4 + meta.size();
    auto arena = shm::Arena::Create(options_.shm_dir, total, "test");
    EXPECT_TRUE(arena.ok()) << arena.status();
    rd.arena = *std::move(arena);
    char* p = rd.arena->data();
    auto* w = reinterpret_cast<float*>(p);
    for (int64_t i = 0; i < rows_per_rank * cols; ++i)
      w[i] = Value(rank * rows_per_rank * cols + i, 1);
    auto* b = reinterpret_cast<float*>(p + w_bytes);
    for (int i = 0; i < 16; ++i) b[i] = Value(i, 2);
    std::memcpy(p + w_bytes + 64, meta.data(), meta.size());

    SaveBatch& sb = rd.batch;
    sb.checkpoint_id = id;
    sb.rank = rank;
    sb.world_size = world;
    format::ItemDesc wd;
    wd.fqn = "w";
    wd.global_shape = {rows, cols};
    wd.chunk_offsets = {rank * rows_per_rank, 0};
    wd.chunk_sizes = {rows_per_rank, cols};
    format::ItemDesc bd;
    bd.fqn = "b";
    bd.global_shape = bd.chunk_sizes = {16};
    bd.chunk_offsets = {0};
    format::ItemDesc md;
    md.fqn = "meta." + std::to_string(rank);
    md.type = format::ItemDesc::Type::kBytes;
    sb.items = {wd, bd, md};
    sb.item_nbytes = {w_bytes, 64, meta.size()};
    auto id_or =
        manager_->RegisterArena(rd.arena->name(), rd.arena->size(), "test");
    EXPECT_TRUE(id_or.ok()) << id_or.status();
    sb.arena_id = id_or.value_or(0);
    sb.extents = {{0, 0, 0, w_bytes},
                  {1, 0, w_bytes, 64},
                  {2, 0, w_bytes + 64, meta.size()}};
    sb.last = true;
    return rd;
  }

  absl::StatusOr<SaveReply> SaveSync(SaveBatch batch) {
    return ckptd::testing::SaveSync(*manager_, std::move(batch));
  }

  absl::StatusOr<CheckpointInfo> WaitFinal(const std::string& id) {
    return ckptd::testing::WaitFinal(*manager_, id);
  }

  // Saves a world-rank checkpoint and waits for its final state.
  absl::StatusOr<CheckpointInfo> SaveAll(const std::string& id, int world,
                                         bool overwrite = false) {
    std::vector<RankData> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(MakeRank(id, r, world));
    for (auto& rd : ranks) {
      rd.batch.overwrite = overwrite;
      absl::StatusOr<SaveReply> reply = SaveSync(rd.batch);
      if (!reply.ok()) {
        // The checkpoint failed while staging; report its final state.
        return WaitFinal(id);
      }
    }
    return WaitFinal(id);
  }

  // The data of checkpoint `dir` equals what MakeRank wrote.
  void ExpectContent(const std::string& dir, int world) {
    ASSERT_OK_AND_ASSIGN(format::VerifyReport report,
                         format::VerifyCheckpoint(dir));
    ASSERT_TRUE(report.ok()) << report.problems[0];
    ASSERT_OK_AND_ASSIGN(auto reader, format::CheckpointReader::Open(dir));
    const int64_t rows = 4 * world;
    std::vector<float> w(rows * 256), b(16);
    format::TensorRequest rw{"w",
                             {0, 0},
                             {format::DType::kFloat32,
                              {rows, 256},
                              {},
                              reinterpret_cast<char*>(w.data())}};
    format::TensorRequest rb{
        "b",
        {0},
        {format::DType::kFloat32, {16}, {}, reinterpret_cast<char*>(b.data())}};
    ASSERT_OK(reader->ReadTensors({rw, rb}));
    for (int64_t i = 0; i < rows * 256; ++i) ASSERT_EQ(w[i], Value(i, 1)) << i;
    for (int i = 0; i < 16; ++i) ASSERT_EQ(b[i], Value(i, 2));
    // "b" is replicated: stored once.
    int b_chunks = 0;
    for (const auto& [key, info] : reader->metadata().storage_data)
      b_chunks += key.fqn == "b";
    EXPECT_EQ(b_chunks, 1);
  }

  TempDir dir_;
  Env* base_ = nullptr;
  std::unique_ptr<UringEnv> uring_;
  std::unique_ptr<FaultInjectionEnv> fault_;
  DaemonOptions options_;
  std::unique_ptr<CheckpointManager> manager_;
};

TEST_F(ManagerTest, CommitsOneTwoAndEightRanks) {
  for (int world : {1, 2, 8}) {
    const std::string id = "job/w" + std::to_string(world);
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveAll(id, world));
    ASSERT_EQ(info.state, State::kCommitted) << info.error;
    EXPECT_EQ(info.ranks_staged, world);
    ExpectContent(dir_.Join("ck/" + id), world);
  }
  EXPECT_EQ(manager_->staged_bytes_in_use(), 0u);
}

TEST_F(ManagerTest, StreamsThroughASmallBudget) {
  options_.staging_budget = 1 << 20;
  options_.max_batch = 0;
  ASSERT_OK(FinalizeOptions(&options_));
  Restart();
  // Each rank: 64 rows x 256 floats = 64 KiB of "w"... make it larger than
  // the budget: 2048 rows -> 2 MiB per rank, sent in 256 KiB batches.
  const int world = 2;
  const std::string id = "job/streamed";
  std::vector<RankData> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(MakeRank(id, r, world, 2048));
  std::vector<std::thread> threads;
  std::atomic<uint64_t> max_in_use{0};
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      SaveBatch all = ranks[r].batch;
      // Re-slice the extents into 256 KiB batches.
      std::vector<ExtentRef> pieces;
      for (const ExtentRef& e : all.extents) {
        for (uint64_t off = 0; off < e.length; off += 256 << 10) {
          const uint64_t n = std::min<uint64_t>(256 << 10, e.length - off);
          pieces.push_back(
              {e.item, e.item_offset + off, e.arena_offset + off, n});
        }
      }
      for (size_t i = 0; i < pieces.size(); ++i) {
        SaveBatch b;
        b.checkpoint_id = id;
        b.rank = r;
        b.world_size = world;
        b.sequence = i;
        if (i == 0) {
          b.items = all.items;
          b.item_nbytes = all.item_nbytes;
        }
        b.arena_id = all.arena_id;
        b.extents = {pieces[i]};
        b.last = i + 1 == pieces.size();
        absl::StatusOr<SaveReply> reply = SaveSync(b);
        ASSERT_TRUE(reply.ok()) << reply.status();
        uint64_t cur = manager_->staged_bytes_in_use();
        uint64_t prev = max_in_use.load();
        while (cur > prev && !max_in_use.compare_exchange_weak(prev, cur)) {
        }
        if (b.last) EXPECT_EQ(reply->state, State::kStaged);
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal(id));
  ASSERT_EQ(info.state, State::kCommitted) << info.error;
  EXPECT_LE(max_in_use.load(), options_.staging_budget);
  ExpectContent(dir_.Join("ck/" + id), world * 512);
}

TEST_F(ManagerTest, BadRequestsFailPreciselyAndTheNextSaveSucceeds) {
  struct Case {
    std::string name;
    std::function<void(SaveBatch&)> mutate;
    absl::StatusCode code;
    std::string substring;
  };
  const std::vector<Case> cases = {
      {"unknown arena", [](SaveBatch& b) { b.arena_id = 999; },
       absl::StatusCode::kInvalidArgument, "arena 999 is not registered"},
      {"extent beyond arena",
       [](SaveBatch& b) { b.extents[2].arena_offset = 1 << 30; },
       absl::StatusCode::kInvalidArgument, "outside shm segment"},
      {"overflowing extent",
       [](SaveBatch& b) { b.extents[2].arena_offset = ~uint64_t{0} - 2; },
       absl::StatusCode::kInvalidArgument, "outside shm segment"},
      {"nbytes disagree", [](SaveBatch& b) { b.item_nbytes[0] += 4; },
       absl::StatusCode::kInvalidArgument, "nbytes is"},
      {"chunk out of bounds",
       [](SaveBatch& b) { b.items[0].chunk_offsets[0] = 100; },
       absl::StatusCode::kInvalidArgument, "out of bounds"},
      {"extent order",
       [](SaveBatch& b) { std::swap(b.extents[0], b.extents[1]); },
       absl::StatusCode::kInvalidArgument, "out of order"},
      {"missing bytes", [](SaveBatch& b) { b.extents.pop_back(); },
       absl::StatusCode::kInvalidArgument, "has only 0 of"},
      {"escape", [](SaveBatch& b) { b.checkpoint_id = "../../etc"; },
       absl::StatusCode::kPermissionDenied, "contains '..'"},
      {"outside roots",
       [](SaveBatch& b) { b.checkpoint_id = "/tmp/elsewhere"; },
       absl::StatusCode::kPermissionDenied, "not below a checkpoint root"},
      {"bad rank", [](SaveBatch& b) { b.rank = 5; },
       absl::StatusCode::kInvalidArgument, "rank 5 is not in"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    RankData rd = MakeRank("job/bad", 0, 1);
    c.mutate(rd.batch);
    absl::StatusOr<SaveReply> reply = SaveSync(rd.batch);
    ASSERT_FALSE(reply.ok());
    EXPECT_EQ(reply.status().code(), c.code) << reply.status();
    EXPECT_THAT(std::string(reply.status().message()), HasSubstr(c.substring));
    EXPECT_EQ(manager_->staged_bytes_in_use(), 0u);
  }
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveAll("job/bad", 1));
  ASSERT_EQ(info.state, State::kCommitted) << info.error;
  ExpectContent(dir_.Join("ck/job/bad"), 1);
}

TEST_F(ManagerTest, OverlappingRanksFailTheCheckpoint) {
  RankData r0 = MakeRank("job/overlap", 0, 2);
  RankData r1 = MakeRank("job/overlap", 1, 2);
  r1.batch.items[0].chunk_offsets[0] = 2;  // rows 2..6 overlap rank 0's 0..4
  ASSERT_OK(SaveSync(r0.batch).status());
  (void)SaveSync(r1.batch);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal("job/overlap"));
  EXPECT_EQ(info.state, State::kFailed);
  EXPECT_EQ(info.error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(info.error.message()), HasSubstr("overlaps"));
  EXPECT_FALSE(
      Env::Default()->FileExists(dir_.Join("ck/job/overlap/.metadata")).ok());
}

TEST_F(ManagerTest, CancelDuringWriteRemovesEverything) {
  options_.write_rate_limit = 4 << 20;  // 4 MiB/s: the write takes a while
  Restart();
  std::vector<RankData> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(MakeRank("job/cancel", r, 2, 4096));  // 4 MiB each
  for (auto& rd : ranks) ASSERT_OK(SaveSync(rd.batch).status());
  // Staged; at 4 MiB/s the 8 MiB take two seconds to write.
  absl::SleepFor(absl::Milliseconds(100));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo during,
                       manager_->GetStatus("job/cancel"));
  EXPECT_EQ(during.state, State::kWriting);
  ASSERT_OK_AND_ASSIGN(State s, manager_->Cancel("job/cancel", "test"));
  EXPECT_EQ(s, State::kCancelled);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal("job/cancel"));
  EXPECT_EQ(info.state, State::kCancelled);
  // The writer holding the last extents stops at its next piece.
  for (int i = 0; i < 200 && manager_->staged_bytes_in_use() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(manager_->staged_bytes_in_use(), 0u);
  // Cleanup runs after the writers stop.
  const std::string dir = dir_.Join("ck/job/cancel");
  for (int i = 0; i < 500 && Env::Default()->FileExists(dir).ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(absl::IsNotFound(Env::Default()->FileExists(dir)));
  EXPECT_EQ(manager_->Cancel("job/cancel", "again").status().code(),
            absl::StatusCode::kFailedPrecondition);
  options_.write_rate_limit = 0;
  Restart();
  ASSERT_OK_AND_ASSIGN(info, SaveAll("job/cancel", 2));
  ASSERT_EQ(info.state, State::kCommitted) << info.error;
}

// ENOSPC and EIO at each storage step of a save: the checkpoint fails with
// an error naming the file, leaves no .metadata and no data files, the
// earlier checkpoint stays intact and the next save succeeds.
TEST_F(ManagerTest, StorageFaultsFailOneCheckpointOnly) {
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, SaveAll("job/base", 2));
  ASSERT_EQ(first.state, State::kCommitted);
  struct Fault {
    FaultOp op;
    std::string path;
  };
  const std::vector<Fault> faults = {
      {FaultOp::kOpenWrite, "__1_0.distcp"},
      {FaultOp::kAppend, "__0_0.distcp"},
      {FaultOp::kSync, "__1_0.distcp"},
      {FaultOp::kClose, "__0_0.distcp"},
      {FaultOp::kSyncDir, "job/f"},
      {FaultOp::kAppend, ".metadata.tmp"},
      {FaultOp::kSync, ".metadata.tmp"},
      {FaultOp::kRename, ".metadata"},
      {FaultOp::kCreateDirs, "job/f"},
      {FaultOp::kAppend, "journal"},
  };
  int n = 0;
  for (const Fault& f : faults) {
    for (int err : {ENOSPC, EIO}) {
      SCOPED_TRACE(::testing::Message() << "op " << static_cast<int>(f.op)
                                        << " " << f.path << " errno " << err);
      const std::string id = "job/f" + std::to_string(n++);
      fault_->ClearRules();
      fault_->AddRule({f.op, f.path, err, 0, 1});
      ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveAll(id, 2));
      fault_->ClearRules();
      ASSERT_EQ(info.state, State::kFailed);
      EXPECT_EQ(info.error.code(), err == ENOSPC
                                       ? absl::StatusCode::kResourceExhausted
                                       : absl::StatusCode::kUnknown)
          << info.error;
      const std::string dir = dir_.Join("ck/" + id);
      EXPECT_FALSE(Env::Default()->FileExists(dir + "/.metadata").ok());
      for (int i = 0; i < 500; ++i) {
        if (!Env::Default()->FileExists(dir + "/__0_0.distcp").ok() &&
            !Env::Default()->FileExists(dir + "/__1_0.distcp").ok()) {
          break;
        }
        absl::SleepFor(absl::Milliseconds(10));
      }
      EXPECT_FALSE(Env::Default()->FileExists(dir + "/__0_0.distcp").ok());
      EXPECT_FALSE(Env::Default()->FileExists(dir + "/__1_0.distcp").ok());
      // The other rank's writer may still hold the extents it took before the
      // failure (it stops at its next piece): the budget comes back then.
      // (Checked at once, this failed a run in ~15 with the other core busy:
      // the files were never created, so the loop above did not wait.)
      for (int i = 0; i < 500 && manager_->staged_bytes_in_use() != 0; ++i) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      EXPECT_EQ(manager_->staged_bytes_in_use(), 0u);
    }
  }
  ExpectContent(dir_.Join("ck/job/base"), 2);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo after, SaveAll("job/after", 2));
  ASSERT_EQ(after.state, State::kCommitted) << after.error;
  ExpectContent(dir_.Join("ck/job/after"), 2);
}

// The disk dies (every later sync / rename fails) at each point of a save,
// then the power goes: after the crash and a restart (recovery) the
// directory holds either the complete checkpoint or none of its files.
TEST_F(ManagerTest, DiskDeathAndPowerLossLeaveNoTornCheckpoint) {
  options_.io_threads = 1;  // a deterministic operation order
  Restart();
  int n = 0;
  for (FaultOp op : {FaultOp::kSync, FaultOp::kSyncDir, FaultOp::kRename}) {
    for (int skip = 0; skip < 5; ++skip) {
      SCOPED_TRACE(::testing::Message()
                   << "op " << static_cast<int>(op) << " skip " << skip);
      const std::string id = "job/crash" + std::to_string(n++);
      const std::string dir = dir_.Join("ck/" + id);
      fault_->ClearRules();
      fault_->AddRule({op, "", EIO, skip, -1});
      absl::StatusOr<CheckpointInfo> info = SaveAll(id, 2);
      ASSERT_OK(info.status());
      manager_.reset();  // the daemon dies; its files are closed
      fault_->ClearRules();
      ASSERT_OK(fault_->SimulateCrash());
      Restart();  // recovery
      if (Env::Default()->FileExists(dir + "/.metadata").ok()) {
        EXPECT_EQ(info->state, State::kCommitted);
        ExpectContent(dir, 2);
      } else {
        EXPECT_FALSE(Env::Default()->FileExists(dir + "/__0_0.distcp").ok());
        EXPECT_FALSE(Env::Default()->FileExists(dir + "/__1_0.distcp").ok());
      }
    }
  }
}

TEST_F(ManagerTest, RecoveryRemovesUnfinishedCheckpoints) {
  manager_.reset();
  const std::string dir = dir_.Join("ck/job/unfinished");
  ASSERT_OK(Env::Default()->CreateDirs(dir));
  ASSERT_OK(WriteFileAtomic(Env::Default(), dir + "/__0_0.distcp", "partial"));
  ASSERT_OK(WriteFileAtomic(Env::Default(), dir + "/keep.txt", "not ours"));
  ASSERT_OK(WriteFileAtomic(
      Env::Default(), dir_.Join("state/journal/1-1-1.journal"), dir + "\n"));
  Restart();
  ASSERT_EQ(manager_->recovery().removed.size(), 1u);
  EXPECT_EQ(manager_->recovery().removed[0], dir);
  EXPECT_FALSE(Env::Default()->FileExists(dir + "/__0_0.distcp").ok());
  EXPECT_OK(Env::Default()->FileExists(dir + "/keep.txt"));
}

TEST_F(ManagerTest, RetentionKeepsTheLastN) {
  options_.keep_last_n = 2;
  Restart();
  for (int i = 0; i < 4; ++i) {
    std::vector<RankData> ranks;
    ranks.push_back(MakeRank("ret/step" + std::to_string(i), 0, 1));
    ranks[0].batch.job = "ret";
    ASSERT_OK(SaveSync(ranks[0].batch).status());
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info,
                         WaitFinal("ret/step" + std::to_string(i)));
    ASSERT_EQ(info.state, State::kCommitted);
  }
  // Retention runs after the commit reply.
  for (int i = 0;
       i < 1000 && Env::Default()->FileExists(dir_.Join("ck/ret/step1")).ok();
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(Env::Default()->FileExists(dir_.Join("ck/ret/step0")).ok());
  EXPECT_FALSE(Env::Default()->FileExists(dir_.Join("ck/ret/step1")).ok());
  ExpectContent(dir_.Join("ck/ret/step2"), 1);
  ExpectContent(dir_.Join("ck/ret/step3"), 1);
  // The history survives a restart.
  Restart();
  std::vector<CheckpointInfo> list = manager_->List("ret", true);
  ASSERT_EQ(list.size(), 2u);
}

// Step 7 fails (the history file cannot be written): the commit stands, its
// journal entry stays. The job's next successful history write records that
// commit too (a record is the job's whole history) and retires the entry,
// instead of leaving it for the next start's recovery.
TEST_F(ManagerTest, AFailedHistoryWriteIsRetiredByTheJobsNextOne) {
  auto journal_entries = [&] {
    absl::StatusOr<std::vector<std::string>> names =
        Env::Default()->ListDir(dir_.Join("state/journal"));
    return names.ok() ? names->size() : size_t{0};
  };
  auto save = [&](const std::string& id) {
    RankData r = MakeRank(id, 0, 1);
    r.batch.job = "hist";
    ASSERT_OK(SaveSync(r.batch).status());
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal(id));
    ASSERT_EQ(info.state, State::kCommitted) << info.error;
  };
  fault_->AddRule({FaultOp::kRename, "state/history", ENOSPC, 0, 1});
  save("hist/a");
  for (int i = 0; i < 1000 && fault_->faults_injected() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(fault_->faults_injected(), 1) << "step 7 never wrote the history";
  EXPECT_EQ(journal_entries(), 1u) << "the failed step 7 keeps the entry";
  save("hist/b");
  for (int i = 0; i < 1000 && journal_entries() != 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(journal_entries(), 0u);
  // Nothing left for recovery; the history holds both commits.
  Restart();
  EXPECT_TRUE(manager_->recovery().completed.empty())
      << "recovery had to settle a commit";
  EXPECT_TRUE(manager_->recovery().removed.empty());
  EXPECT_EQ(manager_->List("hist", true).size(), 2u);
  ExpectContent(dir_.Join("ck/hist/a"), 1);
}

// ---------------------------------------------------------------------------
// Trust: attempts own their directory, retention prunes only its own, names
// cannot inject, bad bytes items are refused, new directories are durable,
// settled checkpoints are compact.
// ---------------------------------------------------------------------------

// Blocks the first FileExists of a path ending in `suffix` (or, with
// `open_substring`, the first file opened for writing whose path contains
// it) until released.
class GateEnv : public EnvWrapper {
 public:
  GateEnv(Env* base, std::string suffix, std::string open_substring = "")
      : EnvWrapper(base),
        suffix_(std::move(suffix)),
        open_(std::move(open_substring)) {}
  absl::Status FileExists(const std::string& path) override {
    if (open_.empty() && path.ends_with(suffix_)) Gate();
    return EnvWrapper::FileExists(path);
  }
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const WritableFileOptions& options) override {
    if (!open_.empty() && path.find(open_) != std::string::npos) Gate();
    return EnvWrapper::NewWritableFile(path, options);
  }
  void Gate() {
    if (!armed_.exchange(true)) {
      entered_.Notify();
      release_.WaitForNotification();
    }
  }
  absl::Notification entered_, release_;

 private:
  const std::string suffix_, open_;
  std::atomic<bool> armed_{false};
};

// Item 1: an attempt cancelled while its plan task runs must not touch the
// retry's files when it resumes (it removed the retry's .metadata).
TEST_F(ManagerTest, CancelledAttemptNeverTouchesTheRetrysFiles) {
  ASSERT_OK_AND_ASSIGN(CheckpointInfo first, SaveAll("job/retry", 2));
  ASSERT_EQ(first.state, State::kCommitted) << first.error;
  GateEnv gate(fault_.get(), "/.metadata");  // A's stale-marker check
  options_.env = &gate;
  Restart();
  std::vector<RankData> a;
  for (int r = 0; r < 2; ++r) a.push_back(MakeRank("job/retry", r, 2));
  for (auto& rd : a) {
    rd.batch.overwrite = true;
    ASSERT_OK(SaveSync(rd.batch).status());
  }
  // Attempt A's plan task is in step 0b.
  ASSERT_TRUE(gate.entered_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_OK(manager_->Cancel("job/retry", "test").status());
  // The retry, as CheckpointManager does it: same directory, overwrite.
  std::vector<RankData> b;
  for (int r = 0; r < 2; ++r) b.push_back(MakeRank("job/retry", r, 2));
  for (auto& rd : b) {
    rd.batch.overwrite = true;
    ASSERT_OK(SaveSync(rd.batch).status());
  }
  gate.release_.Notify();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal("job/retry"));
  ASSERT_EQ(info.state, State::kCommitted) << info.error;
  // Whatever attempt A still does afterwards, the retry's checkpoint stays.
  absl::SleepFor(absl::Milliseconds(300));
  manager_.reset();  // drains every task of A
  ExpectContent(dir_.Join("ck/job/retry"), 2);
  options_.env = fault_.get();
}

// Item 7: with one I/O thread, a retry of a directory whose cancelled
// attempt is still writing deadlocked the pool (the retry's plan task waited
// on the only thread for a cleanup queued behind it).
TEST_F(ManagerTest, RetryWhileTheCancelledAttemptIsWritingDoesNotDeadlock) {
  options_.io_threads = 1;
  options_.write_rate_limit = 20 << 20;
  Restart();
  for (int round = 0; round < 3; ++round) {
    std::vector<RankData> ranks;
    for (int r = 0; r < 2; ++r) ranks.push_back(MakeRank("job/dl", r, 2, 4096));
    for (auto& rd : ranks) {
      rd.batch.overwrite = true;
      ASSERT_OK(SaveSync(rd.batch).status());
    }
    absl::SleepFor(absl::Milliseconds(50));
    ASSERT_OK(manager_->Cancel("job/dl", "test").status());
    std::vector<RankData> again;
    for (int r = 0; r < 2; ++r) again.push_back(MakeRank("job/dl", r, 2));
    for (auto& rd : again) {
      rd.batch.overwrite = true;
      ASSERT_OK(SaveSync(rd.batch).status());
    }
    absl::StatusOr<CheckpointInfo> info =
        ckptd::testing::WaitFinal(*manager_, "job/dl", absl::Seconds(30));
    ASSERT_TRUE(info.ok()) << "the retry never finished (deadlock): "
                           << info.status();
    ASSERT_EQ(info->state, State::kCommitted) << info->error;
  }
  options_.write_rate_limit = 0;
  Restart();
  ExpectContent(dir_.Join("ck/job/dl"), 2);
}

// Item 2: retention prunes only the same job's own checkpoints: same job
// name, same Unix user, same parent directory.
TEST_F(ManagerTest, RetentionNeverPrunesAnotherJobsCheckpoints) {
  auto save = [&](const std::string& id, const std::string& job, int keep,
                  uint32_t uid) -> CheckpointInfo {
    std::vector<RankData> ranks;
    ranks.push_back(MakeRank(id, 0, 1));
    if (uid != 0) {
      // Another user's arena: re-register one owned by `uid`.
      auto arena =
          shm::Arena::Create(options_.shm_dir, ranks[0].arena->size(), "other");
      EXPECT_TRUE(arena.ok());
      std::memcpy((*arena)->data(), ranks[0].arena->data(),
                  ranks[0].arena->size());
      EXPECT_EQ(::chown((*arena)->path().c_str(), uid, uid), 0);
      auto id_or =
          manager_->RegisterArena((*arena)->name(), (*arena)->size(), "other");
      EXPECT_TRUE(id_or.ok()) << id_or.status();
      ranks[0].batch.arena_id = id_or.value_or(0);
      ranks[0].arena = *std::move(arena);
    }
    ranks[0].batch.job = job;
    ranks[0].batch.keep_last_n = keep;
    EXPECT_TRUE(SaveSync(ranks[0].batch).ok());
    absl::StatusOr<CheckpointInfo> info = WaitFinal(id);
    EXPECT_TRUE(info.ok());
    return info.value_or(CheckpointInfo{});
  };
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(save("teamA/step" + std::to_string(i), "teamA", 10, 0).state,
              State::kCommitted);
  }
  // Another directory claiming the job name, keep_last_n=1.
  ASSERT_EQ(save("evil/x", "teamA", 1, 0).state, State::kCommitted);
  // Another user in the same directory, same job name.
  ASSERT_EQ(save("teamA/evil", "teamA", 1, 65534).state, State::kCommitted);
  absl::SleepFor(absl::Milliseconds(300));  // retention runs after the reply
  for (int i = 0; i < 3; ++i)
    ExpectContent(dir_.Join("ck/teamA/step" + std::to_string(i)), 1);
  // The job's own save in its own directory still prunes.
  ASSERT_EQ(save("teamA/step3", "teamA", 2, 0).state, State::kCommitted);
  for (int i = 0;
       i < 500 && Env::Default()->FileExists(dir_.Join("ck/teamA/step1")).ok();
       ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_FALSE(Env::Default()->FileExists(dir_.Join("ck/teamA/step0")).ok());
  EXPECT_FALSE(Env::Default()->FileExists(dir_.Join("ck/teamA/step1")).ok());
  ExpectContent(dir_.Join("ck/teamA/step2"), 1);
  ExpectContent(dir_.Join("ck/teamA/evil"), 1);
  ExpectContent(dir_.Join("ck/evil/x"), 1);
}

// Found by the kill -9 points on ext4: a retention deletion interrupted
// after .metadata went left the data files behind for good. It is journaled
// now, and recovery finishes it.
TEST_F(ManagerTest, InterruptedRetentionIsFinishedByRecovery) {
  options_.keep_last_n = 1;
  Restart();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo a, SaveAll("ret1/step0", 1));
  ASSERT_EQ(a.state, State::kCommitted);
  // The deletion of step0 fails after its marker is gone (EIO on a data file).
  fault_->AddRule({FaultOp::kRemove, "step0/__0_0.distcp", EIO, 0, 1});
  ASSERT_OK_AND_ASSIGN(CheckpointInfo b, SaveAll("ret1/step1", 1));
  ASSERT_EQ(b.state, State::kCommitted);
  const std::string old = dir_.Join("ck/ret1/step0");
  for (int i = 0; i < 500 && fault_->faults_injected() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(fault_->faults_injected(), 1);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(Env::Default()->FileExists(old + "/.metadata").ok());
  EXPECT_OK(Env::Default()->FileExists(old + "/__0_0.distcp"));  // left behind
  fault_->ClearRules();
  Restart();  // recovery finishes the deletion
  EXPECT_FALSE(Env::Default()->FileExists(old).ok());
  ASSERT_EQ(manager_->recovery().removed.size(), 1u);
  ExpectContent(dir_.Join("ck/ret1/step1"), 1);
}

// Item 3: names with control characters are refused; a journal entry naming
// a directory outside the roots (an injected line of an earlier version) is
// never acted on.
TEST_F(ManagerTest, NamesCannotInjectIntoTheStateFiles) {
  for (const std::string& job :
       {std::string("a\nb"), std::string("x\r"), std::string("\x7f"),
        std::string("\xff\xfe"), std::string(300, 'j')}) {
    RankData rd = MakeRank("job/inj", 0, 1);
    rd.batch.job = job;
    absl::StatusOr<SaveReply> r = SaveSync(rd.batch);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
        << absl::CHexEscape(job);
  }
  RankData rd = MakeRank("job/in\nj", 0, 1);
  EXPECT_EQ(SaveSync(rd.batch).status().code(),
            absl::StatusCode::kInvalidArgument);

  manager_.reset();
  const std::string outside = dir_.Join("outside");
  ASSERT_OK(Env::Default()->CreateDirs(outside));
  ASSERT_OK(
      WriteFileAtomic(Env::Default(), outside + "/__0_0.distcp", "precious"));
  // A legacy entry whose job line was injected, and a v1 entry outside.
  ASSERT_OK(WriteFileAtomic(Env::Default(),
                            dir_.Join("state/journal/1-1-1.journal"),
                            outside + "\njob\n"));
  ASSERT_OK(WriteFileAtomic(Env::Default(),
                            dir_.Join("state/journal/1-1-2.journal"),
                            EncodeJournal({outside, "job", 0, std::nullopt})));
  // A tampered v1 entry fails its checksum.
  std::string tampered =
      EncodeJournal({dir_.Join("ck/job/t"), "job", 0, std::nullopt});
  tampered[tampered.size() - 3] ^= 1;
  ASSERT_OK(WriteFileAtomic(
      Env::Default(), dir_.Join("state/journal/1-1-3.journal"), tampered));
  Restart();
  EXPECT_OK(Env::Default()->FileExists(outside + "/__0_0.distcp"));
  EXPECT_EQ(manager_->recovery().errors.size(), 3u);
  EXPECT_TRUE(manager_->recovery().removed.empty());
}

TEST(StateRecordTest, RoundTripsAnyNameAndRejectsDamage) {
  JournalRecord j{"/ck/a\nb", "job\n/evil", 1000, std::vector<int>{3, 1}};
  ASSERT_OK_AND_ASSIGN(JournalRecord back,
                       DecodeJournal(EncodeJournal(j), "t"));
  EXPECT_EQ(back.dir, j.dir);
  EXPECT_EQ(back.job, j.job);
  EXPECT_EQ(back.uid, 1000);
  EXPECT_EQ(back.ranks, j.ranks);
  HistoryRecord h{"j\n", 7, {"/ck/x", "/ck/y\n/z"}};
  const std::string enc = EncodeHistory(h);
  ASSERT_OK_AND_ASSIGN(HistoryRecord hb, DecodeHistory(enc, "t"));
  EXPECT_EQ(hb.dirs, h.dirs);
  for (size_t cut : {enc.size() - 1, enc.size() / 2, size_t{20}}) {
    EXPECT_EQ(DecodeHistory(enc.substr(0, cut), "t").status().code(),
              absl::StatusCode::kDataLoss);
  }
  std::string flipped = enc;
  flipped[enc.size() - 5] ^= 0x20;
  EXPECT_EQ(DecodeHistory(flipped, "t").status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_OK(ValidateName("job", "ok-name_1.é", 64));
  EXPECT_FALSE(ValidateName("job", "tab\there", 64).ok());
  EXPECT_FALSE(ValidateName("job", "\xc0\xaf", 64).ok());      // overlong '/'
  EXPECT_FALSE(ValidateName("job", "\xed\xa0\x80", 64).ok());  // surrogate
}

// Item 4: a parent swapped for a symlink after the save was accepted cannot
// redirect it outside the roots: the directory is opened beneath the root
// without following symlinks, once, and used through its fd.
TEST_F(ManagerTest, ParentSwappedForASymlinkCannotRedirectTheSave) {
  const std::string outside = dir_.Join("outside");
  ASSERT_OK(Env::Default()->CreateDirs(outside));
  ASSERT_OK(Env::Default()->CreateDirs(dir_.Join("ck/jobx")));
  GateEnv gate(fault_.get(), "", "/journal/");  // the plan task's step 0a
  options_.env = &gate;
  Restart();
  std::vector<RankData> ranks;
  for (int r = 0; r < 2; ++r) ranks.push_back(MakeRank("jobx/step1", r, 2));
  for (auto& rd : ranks)
    ASSERT_OK(SaveSync(rd.batch).status());  // resolved, checked
  ASSERT_TRUE(gate.entered_.WaitForNotificationWithTimeout(absl::Seconds(30)));
  // The swap: jobx becomes a symlink to a directory outside the roots.
  ASSERT_EQ(
      ::rename(dir_.Join("ck/jobx").c_str(), dir_.Join("ck/jobx.old").c_str()),
      0);
  ASSERT_EQ(::symlink(outside.c_str(), dir_.Join("ck/jobx").c_str()), 0);
  gate.release_.Notify();
  absl::StatusOr<CheckpointInfo> info_or;
  for (int i = 0; i < 1000; ++i) {  // (the id no longer resolves: list)
    std::vector<CheckpointInfo> all = manager_->List("", false);
    if (!all.empty() && IsFinal(all.back().state)) {
      info_or = all.back();
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, info_or);
  EXPECT_EQ(info.state, State::kFailed);
  EXPECT_EQ(info.error.code(), absl::StatusCode::kPermissionDenied)
      << info.error;
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> names,
                       Env::Default()->ListDir(outside));
  EXPECT_TRUE(names.empty()) << "wrote outside the roots: " << names[0];
  // Retention and recovery never follow it either: a journal entry naming
  // the (now symlinked) path removes nothing outside.
  ASSERT_OK(
      WriteFileAtomic(Env::Default(), outside + "/__0_0.distcp", "precious"));
  manager_.reset();
  options_.env = fault_.get();
  ASSERT_OK(WriteFileAtomic(
      Env::Default(), dir_.Join("state/journal/9-9-9.journal"),
      EncodeJournal({dir_.Join("ck/jobx/step1"), "j", 0, std::nullopt})));
  Restart();
  EXPECT_OK(Env::Default()->FileExists(outside + "/__0_0.distcp"));
}

// Item 5: what verify would reject is refused before it can be committed.
TEST_F(ManagerTest, BytesItemsThatAreNotArchivesAreRefused) {
  // An empty bytes item.
  {
    RankData rd = MakeRank("job/empty", 0, 1);
    rd.batch.item_nbytes[2] = 0;
    rd.batch.extents.pop_back();
    EXPECT_EQ(SaveSync(rd.batch).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // A bytes payload that is not a torch.save archive.
  {
    RankData rd = MakeRank("job/notzip", 0, 1);
    char* meta = rd.arena->data() + rd.batch.extents[2].arena_offset;
    std::memset(meta, 'x', rd.batch.extents[2].length);
    (void)SaveSync(rd.batch);
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal("job/notzip"));
    EXPECT_EQ(info.state, State::kFailed);
    EXPECT_EQ(info.error.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(info.error.message(), HasSubstr("meta.0"));
    EXPECT_FALSE(
        Env::Default()->FileExists(dir_.Join("ck/job/notzip/.metadata")).ok());
  }
  // One flipped byte inside the archive's pickle (CRC mismatch).
  {
    RankData rd = MakeRank("job/flip", 0, 1);
    char* meta = rd.arena->data() + rd.batch.extents[2].arena_offset;
    const std::string_view view(meta, rd.batch.extents[2].length);
    const size_t at = view.find("meta of rank");
    ASSERT_NE(at, std::string_view::npos);
    meta[at + 2] ^= 0x10;  // inside data.pkl: its CRC no longer matches
    (void)SaveSync(rd.batch);
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal("job/flip"));
    EXPECT_EQ(info.state, State::kFailed);
  }
  ASSERT_OK_AND_ASSIGN(CheckpointInfo ok, SaveAll("job/fine", 1));
  EXPECT_EQ(ok.state, State::kCommitted);
}

// Item 6: a checkpoint directory created under new parents is durable once
// the commit is acknowledged (power loss right after the reply).
TEST_F(ManagerTest, NewCheckpointDirectoryIsDurableAtCommit) {
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveAll("newjob/deep/step1", 2));
  ASSERT_EQ(info.state, State::kCommitted) << info.error;
  manager_.reset();
  ASSERT_OK(fault_->SimulateCrash());
  ExpectContent(dir_.Join("ck/newjob/deep/step1"), 2);
  Restart();
}

// Item 10: settled checkpoints cost a few hundred bytes whatever their
// world size (96 failed saves of world_size 65,536 took 6 GiB: ~1 KiB per
// rank, so 12 of them ~750 MiB before the fix).
TEST_F(ManagerTest, SettledCheckpointsAreCompact) {
  options_.stage_timeout = absl::Milliseconds(200);
  options_.max_world_size = 1 << 17;
  Restart();
  auto rss = []() -> uint64_t {
    std::ifstream in("/proc/self/status");
    for (std::string line; std::getline(in, line);) {
      if (line.starts_with("VmRSS:")) return std::stoull(line.substr(6)) << 10;
    }
    return 0;
  };
  const uint64_t before = rss();
  for (int i = 0; i < 12; ++i) {
    const std::string id = "big/w" + std::to_string(i);
    RankData rd = MakeRank(id, 0, 1);
    rd.batch.world_size = 1 << 16;
    rd.batch.items.resize(1);
    rd.batch.item_nbytes.resize(1);
    rd.batch.items[0].global_shape = {4 << 16, 256};
    rd.batch.extents.resize(1);
    ASSERT_OK(SaveSync(rd.batch).status());
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info, WaitFinal(id));
    ASSERT_EQ(info.state, State::kFailed);
    EXPECT_THAT(info.error.message(), HasSubstr("stage_timeout"));
  }
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(manager_->List("", false).size(), 12u);
  if (ckptd::testing::kAddressSanitizer) {
    GTEST_SKIP() << "RSS is not meaningful under ASan (freed memory stays in "
                    "its quarantine)";
  }
  const uint64_t after = rss();
  EXPECT_LT(after, before + (uint64_t{128} << 20))
      << "RSS grew from " << before << " to " << after;
}

TEST(ThreadPoolTest, JoinRunsWhatTasksSubmitAndLaterCallersSeeAValidPool) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  for (int i = 0; i < 50; ++i) {
    pool.Submit([&] {
      ++ran;
      pool.Submit([&] { ++ran; });  // submitted during the drain
    });
  }
  pool.Join();
  EXPECT_EQ(ran.load(), 100);
  EXPECT_FALSE(pool.Submit([&] { ++ran; }));
  pool.SubmitOrRun([&] { ++ran; });  // runs here
  EXPECT_EQ(ran.load(), 101);
}

}  // namespace
}  // namespace ckptd::daemon
