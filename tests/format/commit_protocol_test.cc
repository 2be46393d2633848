// Copyright 2026 The ckptd Authors.
//
// The one durability protocol (format/plan/commit_protocol.h,
// docs/durability.md) through each of its three callers, on a real file system
// behind a FaultInjectionEnv:
//
//   writer       format::WriteCheckpoint (in-process)
//   committer    the daemon's single-node path: PrepareDirectory →
//                RankWriter per rank → Commit (daemon/commit, daemon/write)
//   coordinator  the multi-node path: the Coordinator's plan round →
//                RankWriter per rank → Prepare → its commit
//
// Each caller overwrites a committed checkpoint (content A) with a new one
// (content B), and
//   - every storage operation of the save, in turn, fails once (EIO): the
//     save either succeeds with B, or fails leaving no `.metadata` (or A's
//     intact, when the failure came before the old marker was removed);
//   - the process dies before every operation in turn (that one and every
//     later one fail), then the power goes (SimulateCrash): whatever
//     `.metadata` survives verifies and names A's or B's data, never a torn
//     mix; a save that returned OK survives as B.
#include "format/plan/commit_protocol.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/fault_injection_env.h"
#include "common/status_macros.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/participant.h"
#include "daemon/commit/committer.h"
#include "daemon/plan/node_planner.h"
#include "daemon/write/rank_writer.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/checkpoint_writer.h"
#include "format/checkpoint/verify.h"
#include "format/pickle/py_value.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;

// An Env that counts every operation (files' included) and, as told, fails
// exactly one of them or every one from some point on (a process that died
// there). Forwards to a FaultInjectionEnv, which simulates the power cut.
class DyingEnv final : public EnvWrapper {
 public:
  explicit DyingEnv(Env* base) : EnvWrapper(base) {}

  void FailOnly(int64_t n) { fail_only_ = n; }
  void DieAt(int64_t n) { die_at_ = n; }
  int64_t ops() const { return ops_.load(); }

  // Counts one operation; its error if it is to fail.
  absl::Status Op(std::string_view what) {
    const int64_t n = ops_.fetch_add(1);
    if (n == fail_only_ || (die_at_ >= 0 && n >= die_at_)) {
      return absl::UnknownError(
          fmt::format("{}: injected failure of operation {}", what, n));
    }
    return absl::OkStatus();
  }

  class File final : public WritableFile {
   public:
    File(DyingEnv* env, std::unique_ptr<WritableFile> f)
        : env_(env), f_(std::move(f)) {}
    absl::Status Append(std::string_view d) override {
      if (absl::Status s = env_->Op("append"); !s.ok()) return s;
      return f_->Append(d);
    }
    absl::Status Sync() override {
      if (absl::Status s = env_->Op("sync"); !s.ok()) return s;
      return f_->Sync();
    }
    absl::Status Close() override {
      absl::Status s = env_->Op("close");
      absl::Status c = f_->Close();  // the descriptor goes either way
      return s.ok() ? c : s;
    }
    uint64_t Size() const override { return f_->Size(); }
    const std::string& path() const override { return f_->path(); }

   private:
    DyingEnv* const env_;
    std::unique_ptr<WritableFile> f_;
  };

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const WritableFileOptions& options) override {
    if (absl::Status s = Op("open " + path); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<WritableFile>> f =
        base()->NewWritableFile(path, options);
    if (!f.ok()) return f.status();
    return std::make_unique<File>(this, *std::move(f));
  }
#define CKPTD_DYING(call, what)                     \
  if (absl::Status s = Op(what); !s.ok()) return s; \
  return call
  absl::Status CreateDirs(const std::string& d) override {
    CKPTD_DYING(base()->CreateDirs(d), "mkdir " + d);
  }
  absl::Status RenameFile(const std::string& a, const std::string& b) override {
    CKPTD_DYING(base()->RenameFile(a, b), "rename " + a);
  }
  absl::Status SyncDir(const std::string& d) override {
    CKPTD_DYING(base()->SyncDir(d), "fsync dir " + d);
  }
  absl::Status RemoveFile(const std::string& p) override {
    CKPTD_DYING(base()->RemoveFile(p), "unlink " + p);
  }
  absl::Status FileExists(const std::string& p) override {
    CKPTD_DYING(base()->FileExists(p), "stat " + p);
  }
  absl::StatusOr<uint64_t> GetFileSize(const std::string& p) override {
    CKPTD_DYING(base()->GetFileSize(p), "stat " + p);
  }
#undef CKPTD_DYING

 private:
  std::atomic<int64_t> ops_{0};
  int64_t fail_only_ = -1;
  int64_t die_at_ = -1;
};

constexpr int kWorld = 2;

// Rank r's state of version `v` (A = 0, B = 1): "w" float32 [4, 4] sharded
// on dim 0, "b" float32 [4] replicated, "extra.r" a torch.save'd string.
struct RankState {
  RankIndex index;
  std::vector<float> w, b;
  std::string extra;
};

RankState MakeRank(int r, int v) {
  RankState s;
  s.w.resize(8);
  for (int i = 0; i < 8; ++i) s.w[i] = static_cast<float>(100 * v + 8 * r + i);
  s.b = {static_cast<float>(v), 1, 2, 3};
  s.extra = format::EncodeTorchSaveObject(
      format::PyValue::Str(fmt::format("v{} r{}", v, r)));
  format::ItemDesc w;
  w.fqn = "w";
  w.global_shape = {4, 4};
  w.chunk_offsets = {2 * r, 0};
  w.chunk_sizes = {2, 4};
  format::ItemDesc b;
  b.fqn = "b";
  b.global_shape = b.chunk_sizes = {4};
  b.chunk_offsets = {0};
  format::ItemDesc e;
  e.fqn = fmt::format("extra.{}", r);
  e.type = format::ItemDesc::Type::kBytes;
  s.index.items = {w, b, e};
  s.index.nbytes = {32, 16, s.extra.size()};
  s.index.total = 48 + s.extra.size();
  return s;
}

// Writes the local ranks' files with RankWriter (step 2) and returns where
// each plan item landed.
absl::StatusOr<std::vector<format::StorageInfo>> WriteRanks(
    Env* env, const std::string& io_dir, std::vector<RankState>& ranks,
    const WritePlan& plan) {
  std::vector<format::StorageInfo> infos(plan.plan.items.size());
  std::atomic<bool> aborted{false};
  std::atomic<uint64_t> progress{0};
  for (int r = 0; r < kWorld; ++r) {
    RankWriter w({env, true, nullptr}, r, &ranks[r].index, &plan.ranks[r],
                 io_dir);
    const char* data[] = {reinterpret_cast<const char*>(ranks[r].w.data()),
                          reinterpret_cast<const char*>(ranks[r].b.data()),
                          ranks[r].extra.data()};
    for (uint32_t i = 0; i < 3; ++i) {
      StagedExtent e{nullptr, data[i], 0,  ranks[r].index.nbytes[i],
                     i,       0,       {}, 0};
      if (absl::Status s = w.Consume(e, aborted, progress); !s.ok()) {
        (void)w.Abandon();
        return s;
      }
    }
    if (absl::Status s = w.Advance(); !s.ok()) {
      (void)w.Abandon();
      return s;
    }
    for (auto& [p, info] : w.TakeResult().items) infos[p] = std::move(info);
  }
  return infos;
}

std::vector<const RankIndex*> Indexes(const std::vector<RankState>& ranks) {
  std::vector<const RankIndex*> out;
  for (const RankState& r : ranks) out.push_back(&r.index);
  return out;
}

// A caller of the protocol: saves version `v` into `dir` through `env`.
using Caller = std::function<absl::Status(Env* env, const std::string& root,
                                          const std::string& dir, int v)>;

absl::Status SaveWithWriter(Env* env, const std::string& root,
                            const std::string& dir, int v) {
  std::vector<RankState> ranks = {MakeRank(0, v), MakeRank(1, v)};
  std::vector<std::vector<format::WriteItem>> items(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    const RankState& s = ranks[r];
    items[r] = {{s.index.items[0],
                 {format::DType::kFloat32, {2, 4}, {}, (const char*)s.w.data()},
                 {}},
                {s.index.items[1],
                 {format::DType::kFloat32, {4}, {}, (const char*)s.b.data()},
                 {}},
                {s.index.items[2], {}, s.extra}};
  }
  format::CheckpointWriterOptions o;
  o.env = env;
  o.overwrite = true;
  o.io_threads = 1;  // a deterministic operation order
  return format::WriteCheckpoint(dir, items, o).status();
}

absl::Status SaveWithCommitter(Env* env, const std::string& root,
                               const std::string& dir, int v) {
  std::vector<RankState> ranks = {MakeRank(0, v), MakeRank(1, v)};
  const CommitterOptions co{env, {root}, true};
  ASSIGN_OR_RETURN(WritePlan plan,
                   PlanSingleNode(Indexes(ranks), {true, 1 << 20}));
  ASSIGN_OR_RETURN(PreparedDirectory p,
                   PrepareDirectory(co, dir, true, true, nullptr));
  absl::StatusOr<std::vector<format::StorageInfo>> infos =
      WriteRanks(env, p.dir->io_path(), ranks, plan);
  if (!infos.ok()) return infos.status();
  CommitResult r = Commit(co, dir, p.dir->io_path(), plan, plan.plan.metadata,
                          Indexes(ranks), *std::move(infos), nullptr);
  return r.status;
}

absl::Status SaveWithCoordinator(Env* env, const std::string& root,
                                 const std::string& dir, int v) {
  std::vector<RankState> ranks = {MakeRank(0, v), MakeRank(1, v)};
  CoordinatorOptions copts;
  copts.env = env;
  copts.checkpoint_roots = {root};
  ASSIGN_OR_RETURN(std::unique_ptr<Coordinator> coordinator,
                   Coordinator::Create(copts));
  const std::vector<int> local = {0, 1};
  NodeIndex index = MakeNodeIndex(local, Indexes(ranks));
  PeerCallId id{dir, "job", 0, 7, "test-node"};
  PlanCall call =
      MakePlanCall(id, {kWorld, 1, true, true, 0, absl::Now()}, index);
  call.index = std::make_shared<NodeIndex>(index);
  absl::Notification planned;
  absl::StatusOr<NodePlan> answer;
  coordinator->Plan(std::move(call), [&](absl::StatusOr<NodePlan> p) {
    answer = std::move(p);
    planned.Notify();
  });
  if (!planned.WaitForNotificationWithTimeout(absl::Seconds(30))) {
    return absl::DeadlineExceededError("no plan from the coordinator in 30 s");
  }
  RETURN_IF_ERROR(answer.status());
  ASSIGN_OR_RETURN(WritePlan plan,
                   PlanFromCoordinator(*answer, local, Indexes(ranks), kWorld));
  const CommitterOptions co{env, {root}, true};
  ASSIGN_OR_RETURN(PreparedDirectory p,
                   PrepareDirectory(co, dir, false, true, nullptr));
  auto abort = [&](absl::Status s) {
    absl::Notification n;
    coordinator->Abort(id, s, [&](absl::Status) { n.Notify(); });
    n.WaitForNotificationWithTimeout(absl::Seconds(30));
    return s;
  };
  absl::StatusOr<std::vector<format::StorageInfo>> infos =
      WriteRanks(env, p.dir->io_path(), ranks, plan);
  if (!infos.ok()) return abort(infos.status());
  if (absl::Status s =
          format::SyncDataFileEntries({env, true}, p.dir->io_path());
      !s.ok()) {
    return abort(s);
  }
  absl::Notification committed;
  absl::StatusOr<GlobalStatus> decision;
  coordinator->Prepare(MakePrepareCall(id, local, plan, *infos, {}),
                       [&](absl::StatusOr<GlobalStatus> g) {
                         decision = std::move(g);
                         committed.Notify();
                       });
  if (!committed.WaitForNotificationWithTimeout(absl::Seconds(30))) {
    return absl::DeadlineExceededError(
        "no decision from the coordinator in 30 s");
  }
  return decision.status();
}

struct CallerCase {
  std::string name;
  Caller save;
};
void PrintTo(const CallerCase& c, std::ostream* os) { *os << c.name; }

class CommitProtocolTest : public ::testing::TestWithParam<CallerCase> {
 protected:
  void SetUp() override {
    root_ = dir_.Join("ck");
    ASSERT_OK(CreateDirsDurably(Env::Default(), root_));
  }

  // The "w" of the committed checkpoint in `dir`: its version (0 = A,
  // 1 = B), or -1 without .metadata. Fails the test on a torn checkpoint.
  int CommittedVersion(const std::string& dir) {
    if (!Env::Default()->FileExists(dir + "/.metadata").ok()) return -1;
    absl::StatusOr<format::VerifyReport> report = format::VerifyCheckpoint(dir);
    EXPECT_TRUE(report.ok()) << report.status();
    if (!report.ok()) return -2;
    EXPECT_TRUE(report->ok()) << "torn checkpoint: " << report->problems[0];
    if (!report->ok()) return -2;
    absl::StatusOr<std::unique_ptr<format::CheckpointReader>> reader =
        format::CheckpointReader::Open(dir);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) return -2;
    std::vector<float> w(16);
    format::TensorRequest req{"w",
                              {0, 0},
                              {format::DType::kFloat32,
                               {4, 4},
                               {},
                               reinterpret_cast<char*>(w.data())}};
    EXPECT_OK((*reader)->ReadTensors({req}));
    const int v = static_cast<int>(w[0]) / 100;
    for (int i = 0; i < 16; ++i)
      EXPECT_EQ(w[i], 100 * v + i) << "mixed data at " << i;
    return v;
  }

  // A committed A in a fresh directory; returns the directory.
  std::string Prepared(int n) {
    const std::string dir = fmt::format("{}/job/s{}", root_, n);
    absl::Status s = GetParam().save(Env::Default(), root_, dir, 0);
    EXPECT_OK(s);
    EXPECT_EQ(CommittedVersion(dir), 0);
    return dir;
  }

  TempDir dir_;
  std::string root_;
};

TEST_P(CommitProtocolTest, AFaultAtEveryOperationLeavesOldOrNewNeverTorn) {
  // How many operations a healthy overwrite takes.
  int64_t total = 0;
  {
    const std::string dir = Prepared(0);
    FaultInjectionEnv fault(Env::Default());
    DyingEnv env(&fault);
    ASSERT_OK(GetParam().save(&env, root_, dir, 1));
    total = env.ops();
    EXPECT_EQ(CommittedVersion(dir), 1);
  }
  ASSERT_GT(total, 10);
  for (int64_t k = 0; k < total; ++k) {
    SCOPED_TRACE(
        fmt::format("{}: operation {} of {} fails", GetParam().name, k, total));
    const std::string dir = Prepared(static_cast<int>(k) + 1);
    FaultInjectionEnv fault(Env::Default());
    DyingEnv env(&fault);
    env.FailOnly(k);
    const absl::Status s = GetParam().save(&env, root_, dir, 1);
    const int v = CommittedVersion(dir);
    if (s.ok()) {
      EXPECT_EQ(v, 1);
    } else {
      EXPECT_NE(v, 1) << "a failed save left its .metadata: " << s;
    }
  }
}

TEST_P(CommitProtocolTest,
       PowerLossBeforeEveryOperationLeavesOldOrNewNeverTorn) {
  int64_t total = 0;
  {
    const std::string dir = Prepared(0);
    FaultInjectionEnv fault(Env::Default());
    DyingEnv env(&fault);
    ASSERT_OK(GetParam().save(&env, root_, dir, 1));
    total = env.ops();
  }
  for (int64_t k = 0; k <= total; ++k) {
    SCOPED_TRACE(fmt::format("{}: power lost before operation {} of {}",
                             GetParam().name, k, total));
    const std::string dir = Prepared(static_cast<int>(k) + 1);
    FaultInjectionEnv fault(Env::Default());
    DyingEnv env(&fault);
    env.DieAt(k);
    const absl::Status s = GetParam().save(&env, root_, dir, 1);
    EXPECT_EQ(s.ok(), k == total) << s;
    ASSERT_OK(fault.SimulateCrash());
    const int v = CommittedVersion(dir);
    if (k == total)
      EXPECT_EQ(v, 1) << "an acknowledged commit did not survive the power cut";
    EXPECT_GE(v, -1);
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllCallers, CommitProtocolTest,
    ::testing::Values(CallerCase{"writer", SaveWithWriter},
                      CallerCase{"committer", SaveWithCommitter},
                      CallerCase{"coordinator", SaveWithCoordinator}),
    [](const ::testing::TestParamInfo<CallerCase>& info) {
      return info.param.name;
    });

}  // namespace
}  // namespace ckptd::daemon
