// Copyright 2026 The ckptd Authors.
//
// The committer alone (daemon/commit/committer.h): step 1 (the directory
// beneath its root, the stale marker), steps 3–6 from a WritePlan and the
// writers' results, and the cleanup of a failed attempt — on a real file
// system through a FaultInjectionEnv, without a daemon, threads or gRPC.
#include "daemon/commit/committer.h"

#include <string>
#include <vector>

#include "common/fault_injection_env.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/metadata/metadata.h"
#include "format/tensor/tensor_payload.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;

class CommitterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.env = &env_;
    options_.checkpoint_roots = {dir_.Join("ck")};
    ASSERT_OK(CreateDirsDurably(Env::Default(), dir_.Join("ck")));
  }

  // One rank writing "w" float32 [2, 2] into __0_0.distcp: the plan, the
  // index and the file, written directly (the writer's part, step 2).
  void WriteRank(const std::string& io_dir) {
    format::ItemDesc w;
    w.fqn = "w";
    w.global_shape = w.chunk_sizes = {2, 2};
    w.chunk_offsets = {0, 0};
    index_.items = {w};
    index_.nbytes = {16};
    ASSERT_OK_AND_ASSIGN(plan_.plan, format::PlanSave({index_.items}));
    plan_.ranks = {{{0}, "__0_0.distcp"}};
    const float data[4] = {1, 2, 3, 4};
    format::WriteItem item{
        w,
        format::TensorView{format::DType::kFloat32,
                           {2, 2},
                           {},
                           reinterpret_cast<const char*>(data)},
        {}};
    Env* env = &env_;
    ASSERT_OK_AND_ASSIGN(
        auto file, env->NewWritableFile(JoinPath(io_dir, "__0_0.distcp")));
    std::string scratch;
    ASSERT_OK_AND_ASSIGN(
        format::StorageInfo info,
        format::AppendItem(file.get(), "__0_0.distcp", item, &scratch));
    ASSERT_OK(file->Sync());
    ASSERT_OK(file->Close());
    infos_ = {info};
  }

  CommitResult CommitNow(const std::string& dir, const std::string& io_dir,
                         format::StepCheck check = nullptr) {
    const RankIndex* indexes[] = {&index_};
    return Commit(options_, dir, io_dir, plan_, plan_.plan.metadata, indexes,
                  infos_, check);
  }

  TempDir dir_;
  FaultInjectionEnv env_{Env::Default()};
  CommitterOptions options_;
  RankIndex index_;
  WritePlan plan_;
  std::vector<format::StorageInfo> infos_;
};

TEST_F(CommitterTest, PreparesPublishesAndTheResultDecodes) {
  const std::string dir = dir_.Join("ck/job/step1");
  ASSERT_OK_AND_ASSIGN(PreparedDirectory p,
                       PrepareDirectory(options_, dir, true, false, nullptr));
  EXPECT_TRUE(p.created);
  WriteRank(p.dir->io_path());
  CommitResult r = CommitNow(dir, p.dir->io_path());
  ASSERT_OK(r.status);
  EXPECT_GT(r.metadata_bytes, 0u);
  // Everything durable: a power cut now loses nothing.
  p.dir.reset();
  ASSERT_OK(env_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(
      std::string bytes,
      ReadFileToString(Env::Default(), dir + "/.metadata", 1 << 20));
  ASSERT_OK_AND_ASSIGN(format::Metadata md, format::DecodeMetadata(bytes));
  ASSERT_EQ(md.storage_data.size(), 1u);
  EXPECT_EQ(md.storage_data[0].first.fqn, "w");
  EXPECT_EQ(md.storage_data[0].second, infos_[0]);
  // The fd-anchored path the committer wrote through never leaks into it.
  EXPECT_EQ(bytes.find("/proc/self/fd"), std::string::npos);
}

TEST_F(CommitterTest, AStaleMarkerIsRefusedOrRemovedDurably) {
  const std::string dir = dir_.Join("ck/job/step1");
  ASSERT_OK(CreateDirsDurably(Env::Default(), dir));
  ASSERT_OK(WriteFileAtomic(Env::Default(), dir + "/.metadata", "old"));
  absl::StatusOr<PreparedDirectory> refused =
      PrepareDirectory(options_, dir, true, false, nullptr);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr(dir + " already holds a committed checkpoint"));
  // A cancelled attempt must not remove the marker it was to replace.
  absl::StatusOr<PreparedDirectory> vetoed =
      PrepareDirectory(options_, dir, true, true,
                       [] { return absl::CancelledError("cancelled"); });
  EXPECT_EQ(vetoed.status().code(), absl::StatusCode::kCancelled);
  EXPECT_OK(Env::Default()->FileExists(dir + "/.metadata"));
  ASSERT_OK(PrepareDirectory(options_, dir, true, true, nullptr).status());
  ASSERT_OK(env_.SimulateCrash());
  EXPECT_TRUE(absl::IsNotFound(Env::Default()->FileExists(dir + "/.metadata")));
  // A node of a multi-node checkpoint leaves the marker to its coordinator.
  ASSERT_OK(WriteFileAtomic(Env::Default(), dir + "/.metadata", "old"));
  ASSERT_OK(PrepareDirectory(options_, dir, false, false, nullptr).status());
  EXPECT_OK(Env::Default()->FileExists(dir + "/.metadata"));
}

TEST_F(CommitterTest, NothingOutsideTheRootsIsOpened) {
  ASSERT_OK(CreateDirsDurably(Env::Default(), dir_.Join("elsewhere")));
  absl::StatusOr<PreparedDirectory> p = PrepareDirectory(
      options_, dir_.Join("elsewhere/x"), true, false, nullptr);
  EXPECT_FALSE(p.ok());
}

TEST_F(CommitterTest, ACheckpointEndedBeforeItsCommitIsNotPublished) {
  const std::string dir = dir_.Join("ck/job/step1");
  ASSERT_OK_AND_ASSIGN(PreparedDirectory p,
                       PrepareDirectory(options_, dir, true, false, nullptr));
  WriteRank(p.dir->io_path());
  CommitResult r = CommitNow(dir, p.dir->io_path(),
                             [] { return absl::CancelledError("gone"); });
  EXPECT_EQ(r.status.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(absl::IsNotFound(Env::Default()->FileExists(dir + "/.metadata")));
}

TEST_F(CommitterTest, AFailureAtEachPublishingStepLeavesNoMarker) {
  int n = 0;
  for (FaultOp op : {FaultOp::kOpenWrite, FaultOp::kAppend, FaultOp::kSync,
                     FaultOp::kClose, FaultOp::kRename, FaultOp::kSyncDir}) {
    SCOPED_TRACE(static_cast<int>(op));
    const std::string dir = dir_.Join("ck/job/s" + std::to_string(n++));
    ASSERT_OK_AND_ASSIGN(PreparedDirectory p,
                         PrepareDirectory(options_, dir, true, false, nullptr));
    WriteRank(p.dir->io_path());
    env_.ClearRules();
    // SyncDir: the first one is step 3, the second step 6 (after the rename).
    env_.AddRule({op, "", EIO, op == FaultOp::kSyncDir ? 1 : 0, 1});
    CommitResult r = CommitNow(dir, p.dir->io_path());
    env_.ClearRules();
    EXPECT_FALSE(r.status.ok());
    EXPECT_FALSE(r.marker_may_remain);
    EXPECT_TRUE(
        absl::IsNotFound(Env::Default()->FileExists(dir + "/.metadata")));
    EXPECT_TRUE(
        absl::IsNotFound(Env::Default()->FileExists(dir + "/.metadata.tmp")));
  }
}

TEST_F(CommitterTest, AnUnpublishThatFailsKeepsTheFilesAndSaysSo) {
  const std::string dir = dir_.Join("ck/job/step1");
  ASSERT_OK_AND_ASSIGN(PreparedDirectory p,
                       PrepareDirectory(options_, dir, true, false, nullptr));
  WriteRank(p.dir->io_path());
  env_.AddRule(
      {FaultOp::kSyncDir, "", EIO, 1, -1});  // step 6 and the undo's fsync fail
  CommitResult r = CommitNow(dir, p.dir->io_path());
  env_.ClearRules();
  EXPECT_FALSE(r.status.ok());
  EXPECT_TRUE(r.marker_may_remain);
  EXPECT_THAT(r.status.message(),
              HasSubstr("un-publishing .metadata failed too"));
}

TEST_F(CommitterTest, RemoveAttemptFilesLeavesForeignFiles) {
  const std::string dir = dir_.Join("ck/job/step1");
  ASSERT_OK_AND_ASSIGN(PreparedDirectory p,
                       PrepareDirectory(options_, dir, true, false, nullptr));
  WriteRank(p.dir->io_path());
  ASSERT_OK(WriteFileAtomic(Env::Default(), dir + "/.metadata.tmp", "half"));
  RemoveAttemptFiles(options_, dir, p.dir.get(), p.created,
                     {JoinPath(p.dir->io_path(), "__0_0.distcp")});
  EXPECT_TRUE(absl::IsNotFound(
      Env::Default()->FileExists(dir)));  // made by it, now empty
  const std::string other = dir_.Join("ck/job/step2");
  ASSERT_OK_AND_ASSIGN(PreparedDirectory q,
                       PrepareDirectory(options_, other, true, false, nullptr));
  ASSERT_OK(WriteFileAtomic(Env::Default(), other + "/notes.txt", "keep"));
  RemoveAttemptFiles(options_, other, q.dir.get(), q.created, {});
  EXPECT_OK(Env::Default()->FileExists(other + "/notes.txt"));
}

}  // namespace
}  // namespace ckptd::daemon
