// Copyright 2026 The ckptd Authors.
//
// libckptd_client's C ABI (client/ckptd_c.h) against the fake daemon
// (tests/testing/fake_daemon.h): connect, info, saves of strided, bytes and
// chunk items with their options and statistics, argument errors before any
// call, wait/status/list/cancel and their JSON; multi-node saves, and the
// ckptd_save_options of older and newer API versions (by struct size).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/ckptd_c.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_daemon.h"
#include "tests/testing/test_util.h"

namespace ckptd::client {
namespace {

namespace pb = ::ckptd::v1;
using ::ckptd::testing::ClientTest;

TEST_F(ClientTest, CApi) {
  EXPECT_EQ(ckptd_api_version(), CKPTD_C_API_VERSION);
  ckptd_client* c = nullptr;
  EXPECT_EQ(ckptd_connect(dir_.Join("missing.sock").c_str(), 2, &c),
            CKPTD_UNAVAILABLE);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(ckptd_last_error()).find("missing.sock"),
            std::string::npos);
  EXPECT_EQ(ckptd_connect(socket_.c_str(), 2, nullptr), CKPTD_INVALID_ARGUMENT);

  ASSERT_EQ(ckptd_connect_ex(socket_.c_str(), 2, "c-abi", 30, &c), CKPTD_OK)
      << ckptd_last_error();
  EXPECT_STREQ(ckptd_last_error(), "");
  char* info = nullptr;
  ASSERT_EQ(ckptd_info_json(c, &info), CKPTD_OK);
  auto ij = nlohmann::json::parse(info);
  EXPECT_EQ(ij["max_batch_bytes"], kMaxBatch);
  EXPECT_EQ(ij["shm_dir"], shm_dir_);
  ckptd_free_string(info);

  // A transposed 3x2 view of a 2x3 int16 matrix, a bytes item, a chunk.
  int16_t mat[6] = {0, 1, 2, 3, 4, 5};
  int64_t tshape[2] = {3, 2}, tstrides[2] = {1, 3};
  int64_t gshape[1] = {10}, coff[1] = {4}, csize[1] = {2};
  const char payload[] = "abc";
  ckptd_item items[3] = {};
  items[0].fqn = "t";
  items[0].dtype = "int16";
  items[0].ndim = 2;
  items[0].global_shape = tshape;
  items[0].strides = tstrides;
  items[0].data = mat;
  items[0].nbytes = 12;
  items[0].path_json = "[\"model\", 0, \"t\"]";
  items[1].fqn = "obj";
  items[1].is_bytes = 1;
  items[1].data = payload;
  items[1].nbytes = 3;
  items[2].fqn = "chunk";
  items[2].dtype = "int16";
  items[2].ndim = 1;
  items[2].global_shape = gshape;
  items[2].chunk_offsets = coff;
  items[2].chunk_sizes = csize;
  items[2].data = mat;

  double copy_seconds = -1;
  ASSERT_EQ(ckptd_save(c, "capi", "job", 0, 1, items, 3, 0, &copy_seconds),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_GE(copy_seconds, 0);
  const int16_t transposed[6] = {0, 3, 1, 4, 2, 5};
  EXPECT_EQ(fake_->Data("/ckpt/capi", 0, "t"),
            std::string(reinterpret_cast<const char*>(transposed), 12));
  EXPECT_EQ(fake_->Data("/ckpt/capi", 0, "obj"), "abc");
  EXPECT_EQ(fake_->Data("/ckpt/capi", 0, "chunk"),
            std::string(reinterpret_cast<char*>(mat), 4));
  const auto index = fake_->Items("/ckpt/capi", 0);
  ASSERT_EQ(index.size(), 3u);
  EXPECT_EQ(index[0].path_size(), 3);
  EXPECT_EQ(index[0].path(1).index(), 0);
  EXPECT_EQ(index[2].chunk_offsets(0), 4);

  // Save with all options and outputs.
  ckptd_save_options opts = {1, 1};
  ckptd_save_stats stats = {};
  char* resolved = nullptr;
  ASSERT_EQ(ckptd_save_ex(c, "capi2", nullptr, 0, 1, items, 2, &opts, &stats,
                          &resolved),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_STREQ(resolved, "/ckpt/capi2");
  ckptd_free_string(resolved);
  EXPECT_EQ(stats.bytes, 15u);
  EXPECT_EQ(stats.batches, 1);
  EXPECT_TRUE(fake_->Options("/ckpt/capi2", 0).dedup_save_to_lowest_rank());

  // Errors: bad path JSON, wrong nbytes, unknown dtype, NULL fqn.
  const int saves = fake_->Calls("Save");
  ckptd_item bad = items[0];
  bad.path_json = "{\"not\": \"an array\"}";
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckptd_last_error()).find("path_json"),
            std::string::npos);
  bad = items[0];
  bad.path_json = "[1.5]";
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  bad = items[0];
  bad.nbytes = 13;
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckptd_last_error()).find("nbytes 13"),
            std::string::npos);
  bad = items[0];
  bad.dtype = "float128";
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckptd_last_error()).find("float128"),
            std::string::npos);
  bad = items[0];
  bad.fqn = nullptr;
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  bad = items[0];
  bad.ndim = 65;
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, &bad, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_save(c, "x", "j", 0, 1, nullptr, 1, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(fake_->Calls("Save"), saves);

  char state[32];
  ASSERT_EQ(ckptd_wait(c, "capi", 5000, state, sizeof state), CKPTD_OK)
      << ckptd_last_error();
  EXPECT_STREQ(state, "COMMITTED");
  char tiny[4];
  ASSERT_EQ(ckptd_wait(c, "capi", 5000, tiny, sizeof tiny), CKPTD_OK);
  EXPECT_STREQ(tiny, "COM");
  EXPECT_EQ(ckptd_wait(c, "capi", -1, nullptr, 0), CKPTD_OK);

  fake_->AddCheckpoint("/ckpt/bad", "job", pb::WRITING, 100);
  fake_->FinishCheckpoint("/ckpt/bad", pb::FAILED, "disk full");
  ASSERT_EQ(ckptd_wait(c, "/ckpt/bad", 1000, state, sizeof state), CKPTD_OK);
  EXPECT_STREQ(state, "FAILED");
  EXPECT_STREQ(ckptd_last_error(), "disk full");

  char* js = nullptr;
  ASSERT_EQ(ckptd_status_json(c, "capi", &js), CKPTD_OK);
  auto sj = nlohmann::json::parse(js);
  ckptd_free_string(js);
  EXPECT_EQ(sj["state"], "COMMITTED");
  EXPECT_EQ(sj["checkpoint_id"], "/ckpt/capi");
  EXPECT_EQ(sj["total_bytes"], 19);
  ASSERT_EQ(ckptd_wait_json(c, "capi", 1000, &js), CKPTD_OK);
  EXPECT_EQ(nlohmann::json::parse(js)["state"], "COMMITTED");
  ckptd_free_string(js);
  ASSERT_EQ(ckptd_list_json(c, nullptr, 0, &js), CKPTD_OK);
  auto lj = nlohmann::json::parse(js);
  ckptd_free_string(js);
  ASSERT_TRUE(lj.is_array());
  EXPECT_EQ(lj.size(), 3u);
  ASSERT_EQ(ckptd_list_json(c, "nojob", 1, &js), CKPTD_OK);
  EXPECT_STREQ(js, "[]");
  ckptd_free_string(js);

  EXPECT_EQ(ckptd_status_json(c, "nope", &js), CKPTD_NOT_FOUND);
  EXPECT_STREQ(ckptd_last_error(), "no checkpoint 'nope'");
  EXPECT_EQ(ckptd_cancel(c, "capi", nullptr), CKPTD_FAILED_PRECONDITION);
  EXPECT_EQ(ckptd_wait(c, "nope", 10, state, sizeof state), CKPTD_NOT_FOUND);
  ckptd_close(c);
  ckptd_close(nullptr);
  ckptd_free_string(nullptr);
  EXPECT_EQ(fake_->LiveArenas(), 0u);
}

// The API version 2 layout of ckptd_save_options, as a program built against
// that header passes it.
struct SaveOptionsV2 {
  int32_t overwrite;
  int32_t dedup_save_to_lowest_rank;
  int32_t keep_last_n;
};

TEST_F(ClientTest, CApiCluster) {
  EXPECT_GE(CKPTD_C_API_VERSION, 3);
  fake_->set_peer_address("node1.example:7070");
  ckptd_client* c = nullptr;
  ASSERT_EQ(ckptd_connect(socket_.c_str(), 1, &c), CKPTD_OK)
      << ckptd_last_error();
  char* js = nullptr;
  ASSERT_EQ(ckptd_info_json(c, &js), CKPTD_OK);
  EXPECT_EQ(nlohmann::json::parse(js)["peer_address"], "node1.example:7070");
  ckptd_free_string(js);

  float f[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  ckptd_item item = {};
  item.fqn = "w";
  item.ndim = 1;
  item.global_shape = shape;
  item.data = f;

  // A multi-node save: rank 1 of 4, ranks {0, 1} on this node.
  const int32_t ranks[2] = {0, 1};
  ckptd_save_options opts = {};
  opts.coordinator = "node0.example:7070";
  opts.local_ranks = ranks;
  opts.num_local_ranks = 2;
  opts.num_nodes = 2;
  ASSERT_EQ(ckptd_save_ex2(c, "cmulti", "j", 1, 4, &item, 1, &opts,
                           sizeof(opts), nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  std::optional<pb::ClusterSpec> sent = fake_->Cluster("/ckpt/cmulti", 1);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->coordinator(), "node0.example:7070");
  ASSERT_EQ(sent->local_ranks_size(), 2);
  EXPECT_EQ(sent->local_ranks(1), 1);
  EXPECT_EQ(sent->num_nodes(), 2);

  // Zero-initialized cluster fields (num_nodes 0 = 1): a single-node save,
  // no ClusterSpec sent; ckptd_save does the same.
  ckptd_save_options plain = {};
  ASSERT_EQ(ckptd_save_ex2(c, "cplain", nullptr, 0, 1, &item, 1, &plain,
                           sizeof(plain), nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_FALSE(fake_->Cluster("/ckpt/cplain", 0).has_value());
  ASSERT_EQ(ckptd_save(c, "cplain2", "j", 0, 1, &item, 1, 0, nullptr),
            CKPTD_OK);
  EXPECT_FALSE(fake_->Cluster("/ckpt/cplain2", 0).has_value());

  // API version 6: DCP's StorageWriter and keep_every reach the daemon.
  ckptd_save_options v6 = {};
  v6.external_metadata = 1;
  v6.metadata_timeout_ms = 2500;
  v6.keep_every = 100;
  v6.compression = "zstd:5";
  ASSERT_EQ(ckptd_save_ex2(c, "cv6", "j", 0, 1, &item, 1, &v6, sizeof(v6),
                           nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  const pb::SaveOptions sent6 = fake_->Options("/ckpt/cv6", 0);
  EXPECT_TRUE(sent6.external_metadata());
  EXPECT_EQ(sent6.metadata_timeout_ms(), 2500u);
  EXPECT_EQ(sent6.keep_every(), 100u);
  EXPECT_EQ(sent6.compression(), "zstd:5");
  v6.keep_every = -1;
  EXPECT_EQ(ckptd_save_ex2(c, "cv6b", "j", 0, 1, &item, 1, &v6, sizeof(v6),
                           nullptr, nullptr),
            CKPTD_INVALID_ARGUMENT);
  // A version-5 caller's struct ends before external_metadata: unset.
  v6.keep_every = 100;
  ASSERT_EQ(ckptd_save_ex2(c, "cv5", "j", 0, 1, &item, 1, &v6,
                           offsetof(ckptd_save_options, external_metadata),
                           nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_FALSE(fake_->Options("/ckpt/cv5", 0).external_metadata());
  EXPECT_EQ(fake_->Options("/ckpt/cv5", 0).keep_every(), 0u);
  EXPECT_EQ(fake_->Options("/ckpt/cv5", 0).compression(), "");

  // A program built against API version 2 calls ckptd_save_ex with the
  // smaller struct: only its three fields are read.
  SaveOptionsV2 v2 = {0, 1, 0};
  ASSERT_EQ(ckptd_save_ex(c, "cv2", "j", 0, 1, &item, 1,
                          reinterpret_cast<const ckptd_save_options*>(&v2),
                          nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_TRUE(fake_->Options("/ckpt/cv2", 0).dedup_save_to_lowest_rank());
  EXPECT_FALSE(fake_->Cluster("/ckpt/cv2", 0).has_value());
  // ... and ckptd_save_ex2 told the old size does the same.
  ASSERT_EQ(ckptd_save_ex2(c, "cv2b", "j", 0, 1, &item, 1,
                           reinterpret_cast<const ckptd_save_options*>(&v2),
                           sizeof(v2), nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_TRUE(fake_->Options("/ckpt/cv2b", 0).dedup_save_to_lowest_rank());

  // A newer header's larger struct: unknown trailing fields must be zero.
  struct {
    ckptd_save_options known;
    int64_t future;
  } larger = {};
  larger.known = opts;
  ASSERT_EQ(ckptd_save_ex2(c, "clarger", "j", 1, 4, &item, 1, &larger.known,
                           sizeof(larger), nullptr, nullptr),
            CKPTD_OK)
      << ckptd_last_error();
  EXPECT_TRUE(fake_->Cluster("/ckpt/clarger", 1).has_value());

  // Errors, all before any Save call.
  const int saves = fake_->Calls("Save");
  auto expect_invalid = [&](const ckptd_save_options& o, size_t size,
                            const std::string& needle) {
    EXPECT_EQ(ckptd_save_ex2(c, "cbad", "j", 1, 4, &item, 1, &o, size, nullptr,
                             nullptr),
              CKPTD_INVALID_ARGUMENT);
    EXPECT_NE(std::string(ckptd_last_error()).find(needle), std::string::npos)
        << ckptd_last_error();
  };
  expect_invalid(opts, 8, "smaller than ckptd_save_options of C API version 2");
  expect_invalid(opts, size_t{1} << 20, "not the size of a ckptd_save_options");
  larger.future = 1;
  expect_invalid(larger.known, sizeof(larger), "does not know");
  ckptd_save_options bad = opts;
  bad.coordinator = nullptr;
  expect_invalid(bad, sizeof(bad), "coordinator is empty");
  bad = opts;
  bad.num_local_ranks = 0;
  expect_invalid(bad, sizeof(bad), "local_ranks is empty");
  bad = opts;
  bad.local_ranks = nullptr;
  expect_invalid(bad, sizeof(bad), "local_ranks is NULL");
  bad = opts;
  bad.num_local_ranks = -1;
  expect_invalid(bad, sizeof(bad), "num_local_ranks -1 is negative");
  bad = opts;
  bad.num_nodes = -2;
  expect_invalid(bad, sizeof(bad), "num_nodes -2 must be >= 1");
  const int32_t dup[2] = {1, 1};
  bad = opts;
  bad.local_ranks = dup;
  expect_invalid(bad, sizeof(bad), "appears more than once");
  const int32_t others[2] = {2, 3};
  bad = opts;
  bad.local_ranks = others;
  expect_invalid(bad, sizeof(bad), "does not hold this rank (1)");
  EXPECT_EQ(fake_->Calls("Save"), saves);

  // The status JSON carries the multi-node fields.
  fake_->SetMultiNode("/ckpt/cmulti", 2, 2, 1, "node0.example:7070", 2, 32, 16);
  ASSERT_EQ(ckptd_status_json(c, "cmulti", &js), CKPTD_OK);
  auto sj = nlohmann::json::parse(js);
  ckptd_free_string(js);
  EXPECT_EQ(sj["num_nodes"], 2);
  EXPECT_EQ(sj["coordinator"], "node0.example:7070");
  EXPECT_EQ(sj["is_coordinator"], false);
  EXPECT_EQ(sj["nodes_planned"], 2);
  EXPECT_EQ(sj["nodes_prepared"], 1);
  EXPECT_EQ(sj["local_ranks"], 2);
  EXPECT_EQ(sj["local_total_bytes"], 32);
  EXPECT_EQ(sj["local_written_bytes"], 16);
  ckptd_close(c);
}

}  // namespace
}  // namespace ckptd::client
