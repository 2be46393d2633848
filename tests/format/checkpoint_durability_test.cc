// Copyright 2026 The ckptd Authors.
//
// The checkpoint writer's durability protocol under faults and power loss:
//  - a fault (ENOSPC, EIO) at every storage operation of a save fails the
//    save with a precise error, leaves no .metadata, keeps the earlier
//    checkpoint intact, and the next save succeeds;
//  - a power loss at every point of a save (operations fail from there on,
//    then everything not yet durable is dropped) leaves either no .metadata
//    or a complete checkpoint — never a torn one — and the earlier
//    checkpoint intact;
//  - a save that returned OK survives a power loss right after.
#include <cerrno>
#include <cstring>
#include <random>

#include "common/fault_injection_env.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/pickle/py_value.h"
#include "format/checkpoint/verify.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::format {
namespace {

using ::ckptd::testing::TempDir;

// A 3-rank save: a row-sharded tensor, a replicated one, a bytes item.
struct Sample {
  std::string w, b, step;
  std::vector<std::vector<WriteItem>> ranks;

  explicit Sample(uint8_t fill) {
    w.assign(6 * 1000 * 4, static_cast<char>(fill));
    for (size_t i = 0; i < w.size(); i += 7) w[i] = static_cast<char>(i + fill);
    b.assign(16 * 8, static_cast<char>(fill + 1));
    step = EncodeTorchSaveObject(PyValue::Int(fill));
    ranks.resize(3);
    for (int r = 0; r < 3; ++r) {
      WriteItem wi;
      wi.desc = {"model.w", ItemDesc::Type::kTensor, DType::kFloat32, {6, 1000}, {2 * r, 0},
                 {2, 1000}, {}};
      wi.tensor = {DType::kFloat32, {2, 1000}, {}, w.data() + r * 2 * 1000 * 4};
      ranks[r].push_back(wi);
      WriteItem bi;
      bi.desc = {"model.b", ItemDesc::Type::kTensor, DType::kFloat64, {16}, {0}, {16}, {}};
      bi.tensor = {DType::kFloat64, {16}, {}, b.data()};
      ranks[r].push_back(bi);
      WriteItem si;
      si.desc.fqn = "step";
      si.desc.type = ItemDesc::Type::kBytes;
      si.bytes = step;
      ranks[r].push_back(si);
    }
  }
};

// Checks that `dir` is a complete checkpoint holding `s`.
void ExpectCheckpoint(const std::string& dir, const Sample& s) {
  ASSERT_OK_AND_ASSIGN(VerifyReport report, VerifyCheckpoint(dir));
  ASSERT_TRUE(report.ok()) << dir << ": " << report.problems[0];
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(dir));
  std::string w(s.w.size(), '\0');
  TensorRequest req{"model.w", {0, 0}, {DType::kFloat32, {6, 1000}, {}, w.data()}};
  ASSERT_OK(reader->ReadTensors({&req, 1}));
  EXPECT_EQ(w, s.w);
}

bool HasMetadata(const std::string& dir) {
  return Env::Default()->FileExists(dir + "/.metadata").ok();
}

constexpr FaultOp kWriteOps[] = {FaultOp::kOpenWrite, FaultOp::kAppend, FaultOp::kSync,
                                 FaultOp::kClose,     FaultOp::kRename, FaultOp::kSyncDir,
                                 FaultOp::kCreateDirs};

const char* OpName(FaultOp op) {
  switch (op) {
    case FaultOp::kOpenWrite: return "open";
    case FaultOp::kAppend: return "append";
    case FaultOp::kSync: return "fsync";
    case FaultOp::kClose: return "close";
    case FaultOp::kRename: return "rename";
    case FaultOp::kSyncDir: return "syncdir";
    case FaultOp::kCreateDirs: return "mkdir";
    default: return "other";
  }
}

TEST(CheckpointDurabilityTest, FaultAtEveryStepFailsCleanly) {
  TempDir tmp;
  const Sample old_state(1), new_state(2);
  const std::string old_dir = tmp.Join("step_1"), new_dir = tmp.Join("step_2");
  ASSERT_OK(WriteCheckpoint(old_dir, old_state.ranks).status());
  int failures = 0;
  for (int err : {ENOSPC, EIO}) {
    for (FaultOp op : kWriteOps) {
      for (int skip = 0;; ++skip) {
        FaultInjectionEnv env(Env::Default());
        env.AddRule({op, "step_2", err, skip, 1});
        CheckpointWriterOptions opts;
        opts.env = &env;
        opts.io_threads = 1;
        auto result = WriteCheckpoint(new_dir, new_state.ranks, opts);
        if (env.faults_injected() == 0) {
          // Past the last such operation: the save went through.
          ASSERT_OK(result.status());
          ExpectCheckpoint(new_dir, new_state);
          ASSERT_OK(Env::Default()->RemoveFile(new_dir + "/.metadata"));
          break;
        }
        ++failures;
        ASSERT_FALSE(result.ok()) << OpName(op) << " fault #" << skip << " was ignored";
        EXPECT_NE(std::string(result.status().message()).find("step_2"), std::string::npos)
            << result.status();
        EXPECT_FALSE(HasMetadata(new_dir)) << OpName(op) << " #" << skip;
        ExpectCheckpoint(old_dir, old_state);
        // The next save (no faults) succeeds, and so does cleanup of the
        // successful one for the next iteration.
        CheckpointWriterOptions ok_opts;
        ok_opts.overwrite = true;
        ASSERT_OK(WriteCheckpoint(new_dir, new_state.ranks, ok_opts).status());
        ExpectCheckpoint(new_dir, new_state);
        ASSERT_OK(Env::Default()->RemoveFile(new_dir + "/.metadata"));
        ASSERT_LT(skip, 100);
      }
    }
  }
  EXPECT_GT(failures, 20);
}

TEST(CheckpointDurabilityTest, PowerLossAtEveryPointNeverTorn) {
  TempDir tmp;
  const Sample old_state(3), new_state(4);
  const std::string old_dir = tmp.Join("step_1");
  ASSERT_OK(WriteCheckpoint(old_dir, old_state.ranks).status());
  int crashes = 0, committed = 0;
  for (FaultOp op : kWriteOps) {
    for (int skip = 0;; ++skip) {
      const std::string new_dir = tmp.Join("crash_" + std::string(OpName(op)) + std::to_string(skip));
      FaultInjectionEnv env(Env::Default());
      // From this operation on the "machine is down": it and everything
      // after it fails, including the writer's cleanup.
      env.AddRule({op, "", EIO, skip, -1});
      env.AddRule({FaultOp::kRemove, "", EIO, 0, -1});
      CheckpointWriterOptions opts;
      opts.env = &env;
      opts.io_threads = 1;
      auto result = WriteCheckpoint(new_dir, new_state.ranks, opts);
      const bool fired = env.faults_injected() > 0;
      ASSERT_OK(env.SimulateCrash());
      ++crashes;
      if (HasMetadata(new_dir)) {
        ++committed;
        ExpectCheckpoint(new_dir, new_state);
      }
      if (result.ok()) {
        // A save that returned OK must survive the power loss.
        EXPECT_TRUE(HasMetadata(new_dir)) << "OK save lost after crash at " << OpName(op);
      }
      ExpectCheckpoint(old_dir, old_state);
      if (!fired) break;
      ASSERT_LT(skip, 100);
    }
  }
  EXPECT_GT(crashes, 10);
  EXPECT_GT(committed, 0);
}

TEST(CheckpointDurabilityTest, OverwriteRemovesOldMarkerFirst) {
  TempDir tmp;
  const Sample a(5), b(6);
  const std::string dir = tmp.Join("ckpt");
  ASSERT_OK(WriteCheckpoint(dir, a.ranks).status());
  // The overwrite fails while writing data: the old marker is already gone
  // (durably), so no crash can pair the old .metadata with new data files.
  FaultInjectionEnv env(Env::Default());
  env.AddRule({FaultOp::kAppend, "__1_0.distcp", ENOSPC, 0, 1});
  CheckpointWriterOptions opts;
  opts.env = &env;
  opts.overwrite = true;
  auto r = WriteCheckpoint(dir, b.ranks, opts);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  ASSERT_OK(env.SimulateCrash());
  EXPECT_FALSE(HasMetadata(dir));
}

}  // namespace
}  // namespace ckptd::format
