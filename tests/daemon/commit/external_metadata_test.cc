// Copyright 2026 The ckptd Authors.
//
// DCP's StorageWriter through CheckpointManager (SaveOptions
// .external_metadata): the data files are written as usual, then the
// attempt awaits the `.metadata` DCP's coordinator hands over; the daemon
// publishes it byte for byte only if it describes exactly what was
// written, and gives up after metadata_timeout. Real arenas, the real
// writer and commit over the POSIX Env.

#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "absl/time/clock.h"
#include "common/env.h"
#include "daemon/save/checkpoint_manager.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/verify.h"
#include "format/metadata/metadata.h"
#include "format/pickle/py_value.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "tests/testing/manager_util.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;

constexpr int64_t kRows = 4, kCols = 64;

float Value(int64_t i) { return static_cast<float>((i * 7 + 3) % 101); }

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class ExternalMetadataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.checkpoint_roots = std::vector<std::string>{dir_.Join("ck")};
    options_.shm_dir = dir_.Join("shm");
    options_.state_dir = dir_.Join("state");
    options_.staging_budget = 16 << 20;
    options_.io_threads = 1;
    options_.env = Env::Default();
    ASSERT_OK(FinalizeOptions(&options_));
    ASSERT_OK_AND_ASSIGN(manager_, CheckpointManager::Create(options_));
  }

  // Rank r of `world`: "w" float32 [kRows*world, kCols] sharded on dim 0,
  // "b" float32 [8] replicated (written once), "step" a bytes item.
  SaveBatch Rank(const std::string& id, int r, int world, bool external) {
    const uint64_t w_bytes = kRows * kCols * 4;
    const std::string step =
        format::EncodeTorchSaveObject(format::PyValue::Int(r + 100));
    auto arena =
        shm::Arena::Create(options_.shm_dir, w_bytes + 32 + step.size(), "t");
    EXPECT_TRUE(arena.ok()) << arena.status();
    auto* w = reinterpret_cast<float*>((*arena)->data());
    for (int64_t i = 0; i < kRows * kCols; ++i)
      w[i] = Value(r * kRows * kCols + i);
    for (int i = 0; i < 8; ++i) w[kRows * kCols + i] = Value(i + 5);
    std::memcpy((*arena)->data() + w_bytes + 32, step.data(), step.size());
    SaveBatch b;
    b.checkpoint_id = id;
    b.rank = r;
    b.world_size = world;
    b.external_metadata = external;
    format::ItemDesc wd;
    wd.fqn = "w";
    wd.global_shape = {kRows * world, kCols};
    wd.chunk_offsets = {r * kRows, 0};
    wd.chunk_sizes = {kRows, kCols};
    format::ItemDesc bd;
    bd.fqn = "b";
    bd.global_shape = bd.chunk_sizes = {8};
    bd.chunk_offsets = {0};
    format::ItemDesc sd;
    sd.fqn = "step." + std::to_string(r);
    sd.type = format::ItemDesc::Type::kBytes;
    b.items = {wd, bd, sd};
    b.item_nbytes = {w_bytes, 32, step.size()};
    auto aid = manager_->RegisterArena((*arena)->name(), (*arena)->size(), "t");
    EXPECT_TRUE(aid.ok()) << aid.status();
    b.arena_id = arena_id_ = aid.value_or(0);
    b.extents = {{0, 0, 0, w_bytes},
                 {1, 0, w_bytes, 32},
                 {2, 0, w_bytes + 32, step.size()}};
    b.last = true;
    arenas_.push_back(*std::move(arena));
    return b;
  }

  // Saves every rank; returns the status once the data is durable.
  absl::StatusOr<CheckpointInfo> SaveData(const std::string& id, int world,
                                          bool external = true) {
    for (int r = 0; r < world; ++r) {
      absl::StatusOr<SaveReply> reply =
          ckptd::testing::SaveSync(*manager_, Rank(id, r, world, external));
      if (!reply.ok()) return reply.status();
    }
    return ckptd::testing::WaitFinal(*manager_, id, absl::Seconds(60),
                                     /*until_data_durable=*/true);
  }

  // What DCP's coordinator would hand over for `world` ranks: the items'
  // metadata, a planner_data and storage_meta of its own, storage_data
  // from the layout.
  format::Metadata DcpMetadata(int world, const Layout& layout) {
    format::Metadata m;
    format::TensorStorageMetadata w;
    w.size = {kRows * world, kCols};
    for (int r = 0; r < world; ++r)
      w.chunks.push_back({{r * kRows, 0}, {kRows, kCols}});
    format::TensorStorageMetadata b;
    b.size = {8};
    b.chunks.push_back({{0}, {8}});
    m.state_dict_metadata = {{"w", w}, {"b", b}};
    m.planner_data.emplace();
    for (int r = 0; r < world; ++r) {
      const std::string fqn = "step." + std::to_string(r);
      m.state_dict_metadata.push_back({fqn, format::BytesStorageMetadata{}});
      m.planner_data->push_back(
          {fqn, {std::string("step"), static_cast<int64_t>(r)}});
    }
    for (const LayoutEntry& e : layout.entries)
      m.storage_data.push_back({e.key, e.info});
    format::StorageMeta sm;
    sm.checkpoint_id = "as DCP names it";
    sm.save_id = "0123abcd";
    m.storage_meta = sm;
    m.BuildIndex();
    return m;
  }

  std::string Encode(const format::Metadata& m) {
    absl::StatusOr<std::string> bytes =
        format::EncodeMetadata(m, {.write_storage_meta = true});
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.value_or("");
  }

  TempDir dir_;
  DaemonOptions options_;
  std::unique_ptr<CheckpointManager> manager_;
  std::vector<std::unique_ptr<shm::Arena>> arenas_;
  uint64_t arena_id_ = 0;
};

TEST_F(ExternalMetadataTest, PublishesTheHandedMetadataByteForByte) {
  const std::string id = "job/ext";
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveData(id, 2));
  ASSERT_EQ(info.state, State::kCommitting) << info.error;
  ASSERT_TRUE(info.awaiting_metadata);
  const std::string dir = dir_.Join("ck/" + id);
  EXPECT_FALSE(std::ifstream(dir + "/.metadata").good());

  ASSERT_OK_AND_ASSIGN(Layout layout, manager_->GetLayout(id, arena_id_));
  EXPECT_EQ(layout.checkpoint_id, dir);
  // w twice, b once (replicated: deduplicated), two bytes items.
  ASSERT_EQ(layout.entries.size(), 5u);
  const std::string bytes = Encode(DcpMetadata(2, layout));
  ASSERT_OK(manager_->CommitMetadata(id, arena_id_, bytes));
  ASSERT_OK_AND_ASSIGN(info, ckptd::testing::WaitFinal(*manager_, id));
  ASSERT_EQ(info.state, State::kCommitted) << info.error;
  EXPECT_FALSE(info.awaiting_metadata);

  EXPECT_EQ(ReadFile(dir + "/.metadata"), bytes);
  ASSERT_OK_AND_ASSIGN(format::VerifyReport report,
                       format::VerifyCheckpoint(dir));
  ASSERT_TRUE(report.ok()) << report.problems[0];
  ASSERT_OK_AND_ASSIGN(auto reader, format::CheckpointReader::Open(dir));
  std::vector<float> w(2 * kRows * kCols);
  ASSERT_OK(reader->ReadTensors({{"w",
                                  {0, 0},
                                  {format::DType::kFloat32,
                                   {2 * kRows, kCols},
                                   {},
                                   reinterpret_cast<char*>(w.data())}}}));
  for (size_t i = 0; i < w.size(); ++i) ASSERT_EQ(w[i], Value(i)) << i;
  EXPECT_EQ(reader->metadata().storage_meta->save_id, "0123abcd");
  // A second hand-over, and one for a committed checkpoint: refused.
  EXPECT_EQ(manager_->CommitMetadata(id, arena_id_, bytes).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ExternalMetadataTest, RefusesMetadataThatDoesNotDescribeTheWrite) {
  struct Case {
    std::string name;
    void (*damage)(format::Metadata&);
    std::string error;
  };
  const std::vector<Case> cases = {
      {"offset",
       [](format::Metadata& m) { m.storage_data[0].second.offset += 4; },
       "it was written to"},
      {"other_file",
       [](format::Metadata& m) {
         m.storage_data[0].second.relative_path = "../../etc/passwd";
       },
       "it was written to"},
      {"missing_entry", [](format::Metadata& m) { m.storage_data.pop_back(); },
       "storage_data lacks"},
      {"unknown_key",
       [](format::Metadata& m) { m.storage_data[0].first.fqn = "other"; },
       "did not write"},
      {"dtype",
       [](format::Metadata& m) {
         std::get<format::TensorStorageMetadata>(
             m.state_dict_metadata[0].second)
             .properties.dtype = format::DType::kFloat16;
       },
       "is described as float16"},
      {"extra_chunk",
       [](format::Metadata& m) {
         std::get<format::TensorStorageMetadata>(
             m.state_dict_metadata[0].second)
             .chunks.push_back({{0, 32}, {4, 32}});
       },
       "was not written"},
      {"bytes_as_tensor",
       [](format::Metadata& m) {
         m.state_dict_metadata.back().second = format::TensorStorageMetadata{};
       },
       "chunks and bytes items"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string id = "job/bad_" + c.name;
    ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveData(id, 2));
    ASSERT_TRUE(info.awaiting_metadata) << info.error;
    ASSERT_OK_AND_ASSIGN(Layout layout, manager_->GetLayout(id, arena_id_));
    format::Metadata m = DcpMetadata(2, layout);
    c.damage(m);
    ASSERT_OK(manager_->CommitMetadata(id, arena_id_, Encode(m)));
    ASSERT_OK_AND_ASSIGN(info, ckptd::testing::WaitFinal(*manager_, id));
    EXPECT_EQ(info.state, State::kFailed);
    EXPECT_EQ(info.error.code(), absl::StatusCode::kFailedPrecondition)
        << info.error;
    EXPECT_THAT(info.error.message(), HasSubstr(c.error));
    EXPECT_FALSE(std::ifstream(dir_.Join("ck/" + id + "/.metadata")).good());
  }
  // Bytes that are no Metadata pickle at all.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveData("job/garbage", 1));
  ASSERT_OK(manager_->CommitMetadata("job/garbage", arena_id_, "not a pickle"));
  ASSERT_OK_AND_ASSIGN(info,
                       ckptd::testing::WaitFinal(*manager_, "job/garbage"));
  EXPECT_EQ(info.state, State::kFailed);
  EXPECT_EQ(info.error.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(info.error.message(), HasSubstr("cannot be decoded"));
  // The daemon goes on serving: a good hand-over commits.
  ASSERT_OK_AND_ASSIGN(info, SaveData("job/after", 1));
  ASSERT_OK_AND_ASSIGN(Layout layout,
                       manager_->GetLayout("job/after", arena_id_));
  ASSERT_OK(manager_->CommitMetadata("job/after", arena_id_,
                                     Encode(DcpMetadata(1, layout))));
  ASSERT_OK_AND_ASSIGN(info, ckptd::testing::WaitFinal(*manager_, "job/after"));
  EXPECT_EQ(info.state, State::kCommitted) << info.error;
}

TEST_F(ExternalMetadataTest, GivesUpAfterMetadataTimeout) {
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveData("job/orphan", 1));
  ASSERT_TRUE(info.awaiting_metadata);
  manager_->TickForTest(absl::Now() + absl::Minutes(9));
  ASSERT_OK_AND_ASSIGN(info, manager_->GetStatus("job/orphan"));
  EXPECT_EQ(info.state, State::kCommitting);  // the default: 10 min
  manager_->TickForTest(absl::Now() + absl::Minutes(11));
  ASSERT_OK_AND_ASSIGN(info,
                       ckptd::testing::WaitFinal(*manager_, "job/orphan"));
  EXPECT_EQ(info.state, State::kFailed);
  EXPECT_EQ(info.error.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(info.error.message(), HasSubstr("metadata_timeout"));
  EXPECT_FALSE(info.awaiting_metadata);
  EXPECT_EQ(manager_->GetLayout("job/orphan", arena_id_).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(ExternalMetadataTest, AwaitingCheckpointCanBeCancelled) {
  // Data durable, .metadata not yet handed over: nothing is being
  // committed, so a cancel (a failed DCP save, ckptctl cancel) ends it.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveData("job/cancel", 2));
  ASSERT_TRUE(info.awaiting_metadata);
  ASSERT_OK_AND_ASSIGN(State s, manager_->Cancel("job/cancel", "DCP failed"));
  EXPECT_EQ(s, State::kCancelled);
  ASSERT_OK_AND_ASSIGN(info,
                       ckptd::testing::WaitFinal(*manager_, "job/cancel"));
  EXPECT_EQ(info.state, State::kCancelled);
  EXPECT_THAT(info.error.message(), HasSubstr("DCP failed"));
  EXPECT_EQ(manager_->CommitMetadata("job/cancel", arena_id_, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  // Once handed over, the commit is under way: no cancel.
  ASSERT_OK_AND_ASSIGN(info, SaveData("job/handed", 1));
  ASSERT_OK_AND_ASSIGN(Layout layout,
                       manager_->GetLayout("job/handed", arena_id_));
  ASSERT_OK(manager_->CommitMetadata("job/handed", arena_id_,
                                     Encode(DcpMetadata(1, layout))));
  ASSERT_OK_AND_ASSIGN(info,
                       ckptd::testing::WaitFinal(*manager_, "job/handed"));
  EXPECT_EQ(info.state, State::kCommitted) << info.error;
}

TEST_F(ExternalMetadataTest, LayoutAndCommitAreRefusedPrecisely) {
  // A checkpoint the daemon commits itself.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveData("job/own", 1, false));
  EXPECT_EQ(info.state, State::kCommitted);
  EXPECT_THAT(manager_->GetLayout("job/own", arena_id_).status().message(),
              HasSubstr("not saved with external_metadata"));
  EXPECT_EQ(manager_->CommitMetadata("job/own", arena_id_, "x").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(manager_->GetLayout("job/none", arena_id_).status().code(),
            absl::StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(info, SaveData("job/ext", 1));
  EXPECT_EQ(manager_->GetLayout("job/ext", 999999).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Options must agree across ranks.
  SaveBatch r0 = Rank("job/mixed", 0, 2, true);
  SaveBatch r1 = Rank("job/mixed", 1, 2, false);
  ASSERT_OK(ckptd::testing::SaveSync(*manager_, r0).status());
  EXPECT_THAT(ckptd::testing::SaveSync(*manager_, r1).status().message(),
              HasSubstr("save options differ"));
}

}  // namespace
}  // namespace ckptd::daemon
