// Copyright 2026 The ckptd Authors.
//
// The ckptctl binary (cli/) against the fake daemon
// (tests/testing/fake_daemon.h): list, status, wait and cancel, their exit
// codes, table and JSON output, the socket option and environment variable,
// and the multi-node columns and lines. Skips when ckptctl is not built.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include "ckptd/v1/daemon.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/fake_daemon.h"
#include "tests/testing/test_util.h"

namespace ckptd::client {
namespace {

namespace pb = ::ckptd::v1;
using ::ckptd::testing::ClientTest;

class CkptctlTest : public ClientTest {
 protected:
  void SetUp() override {
    ClientTest::SetUp();
    // $CKPTD_BUILD_DIR, else the build directory holding this test binary
    // (build/tests/ckptctl_test).
    const char* env = std::getenv("CKPTD_BUILD_DIR");
    std::string build = env != nullptr && *env != '\0' ? env : "";
    if (build.empty()) {
      std::error_code ec;
      build = std::filesystem::canonical("/proc/self/exe", ec)
                  .parent_path()
                  .parent_path()
                  .string();
    }
    ckptctl_ = build + "/bin/ckptctl";
    if (::access(ckptctl_.c_str(), X_OK) != 0)
      GTEST_SKIP() << ckptctl_ << " not built";
  }
  int Run(const std::string& args, std::string* out) {
    out->clear();
    const int rc = ::ckptd::testing::RunCommand(ckptctl_ + " " + args, out);
    if (std::getenv("CKPTD_TEST_VERBOSE") != nullptr) {
      std::fprintf(stderr, "$ ckptctl %s  -> exit %d\n%s", args.c_str(), rc,
                   out->c_str());
    }
    return rc;
  }
  std::string ckptctl_;
};

TEST_F(CkptctlTest, ExitCodesAndOutput) {
  fake_->AddCheckpoint("/ckpt/job/step_1", "job", pb::COMMITTED, 3 << 20);
  fake_->AddCheckpoint("/ckpt/job/step_2", "job", pb::WRITING, 1 << 30);
  fake_->AddCheckpoint("/ckpt/other/step_9", "other", pb::STAGING, 1000);
  fake_->AddCheckpoint("/ckpt/job/step_3", "job", pb::WRITING, 100);
  fake_->FinishCheckpoint("/ckpt/job/step_3", pb::FAILED, "disk full");
  const std::string sock = "--socket " + socket_;
  std::string out;

  EXPECT_EQ(Run("list " + sock, &out), 0) << out;
  EXPECT_NE(out.find("ID"), std::string::npos) << out;
  EXPECT_NE(out.find("PROGRESS"), std::string::npos) << out;
  EXPECT_NE(out.find("/ckpt/job/step_2"), std::string::npos) << out;
  EXPECT_NE(out.find("WRITING"), std::string::npos) << out;
  EXPECT_NE(out.find("5m"), std::string::npos) << out;
  // The global option and the environment work as well.
  EXPECT_EQ(Run(sock + " list --job other --json", &out), 0) << out;
  auto lj = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(lj.is_array()) << out;
  ASSERT_EQ(lj.size(), 1u);
  EXPECT_EQ(lj[0]["checkpoint_id"], "/ckpt/other/step_9");
  EXPECT_EQ(::ckptd::testing::RunCommand(
                "CKPTD_SOCKET=" + socket_ + " " + ckptctl_ + " list", &out),
            0)
      << out;

  EXPECT_EQ(Run("status /ckpt/job/step_2 " + sock, &out), 0) << out;
  EXPECT_NE(out.find("WRITING"), std::string::npos) << out;
  EXPECT_NE(out.find("%"), std::string::npos) << out;
  EXPECT_NE(out.find("GiB"), std::string::npos) << out;
  EXPECT_EQ(Run("status /ckpt/job/step_2 --json " + sock, &out), 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out, nullptr, false)["total_bytes"], 1 << 30)
      << out;
  EXPECT_EQ(Run("status /ckpt/nope " + sock, &out), 4) << out;
  EXPECT_EQ(Run("status /ckpt/nope --json " + sock, &out), 4) << out;
  EXPECT_EQ(nlohmann::json::parse(out, nullptr, false)["code"], "NOT_FOUND")
      << out;

  EXPECT_EQ(Run("wait /ckpt/job/step_1 " + sock, &out), 0) << out;
  EXPECT_NE(out.find("COMMITTED"), std::string::npos) << out;
  EXPECT_EQ(Run("wait /ckpt/job/step_3 " + sock, &out), 1) << out;
  EXPECT_NE(out.find("disk full"), std::string::npos) << out;
  EXPECT_EQ(Run("wait /ckpt/job/step_2 --timeout 0.3 " + sock, &out), 5) << out;
  EXPECT_EQ(Run("wait /ckpt/nope --timeout 1 " + sock, &out), 4) << out;

  EXPECT_EQ(Run("cancel /ckpt/job/step_1 " + sock, &out), 1) << out;
  EXPECT_NE(out.find("already COMMITTED"), std::string::npos) << out;
  EXPECT_EQ(
      Run("cancel /ckpt/job/step_2 --reason 'operator said so' " + sock, &out),
      0)
      << out;
  EXPECT_EQ(Run("wait /ckpt/job/step_2 --json " + sock, &out), 1) << out;
  EXPECT_EQ(nlohmann::json::parse(out, nullptr, false)["error"],
            "operator said so")
      << out;
  EXPECT_EQ(Run("cancel /ckpt/nope " + sock, &out), 4) << out;

  EXPECT_EQ(Run("list --socket " + dir_.Join("none.sock"), &out), 3) << out;
  EXPECT_NE(out.find("none.sock"), std::string::npos) << out;
  EXPECT_EQ(Run("status", &out), 2) << out;
  EXPECT_EQ(Run("wait x --timeout abc " + sock, &out), 2) << out;
  EXPECT_EQ(Run("frobnicate", &out), 2) << out;
}

TEST_F(CkptctlTest, MultiNodeStatusAndList) {
  fake_->AddCheckpoint("/ckpt/job/step_1", "job", pb::COMMITTED, 3 << 20);
  fake_->AddCheckpoint("/ckpt/job/step_2", "job", pb::WRITING, 1 << 30);
  fake_->SetMultiNode("/ckpt/job/step_2", 3, 3, 2, "node0.example:7070", 4,
                      512 << 20, 128 << 20);
  fake_->AddCheckpoint("/ckpt/job/step_3", "job", pb::WRITING, 1 << 20);
  fake_->SetMultiNode("/ckpt/job/step_3", 2, 2, 0, "", 1, 1 << 19, 0);
  const std::string sock = "--socket " + socket_;
  std::string out;

  EXPECT_EQ(Run("status /ckpt/job/step_2 " + sock, &out), 0) << out;
  EXPECT_NE(out.find("3 (planned 3, prepared 2), coordinator "
                     "node0.example:7070"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("4 ranks, 128.0 MiB of 512.0 MiB written (25.0%)"),
            std::string::npos)
      << out;
  EXPECT_EQ(Run("status /ckpt/job/step_3 " + sock, &out), 0) << out;
  EXPECT_NE(out.find("2 (planned 2, prepared 0), coordinator (this node)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("1 rank, "), std::string::npos) << out;
  // A single-node checkpoint has no nodes line.
  EXPECT_EQ(Run("status /ckpt/job/step_1 " + sock, &out), 0) << out;
  EXPECT_EQ(out.find("nodes"), std::string::npos) << out;
  EXPECT_EQ(out.find("coordinator"), std::string::npos) << out;

  EXPECT_EQ(Run("status /ckpt/job/step_2 --json " + sock, &out), 0) << out;
  auto sj = nlohmann::json::parse(out, nullptr, false);
  EXPECT_EQ(sj["num_nodes"], 3) << out;
  EXPECT_EQ(sj["nodes_prepared"], 2) << out;
  EXPECT_EQ(sj["coordinator"], "node0.example:7070") << out;
  EXPECT_EQ(sj["local_written_bytes"], 128 << 20) << out;

  EXPECT_EQ(Run("list " + sock, &out), 0) << out;
  EXPECT_NE(out.find("NODES"), std::string::npos) << out;
  EXPECT_NE(out.find("2/3 prepared"), std::string::npos) << out;
  EXPECT_NE(out.find("0/2 prepared (coordinator)"), std::string::npos) << out;
  EXPECT_EQ(Run("list --json " + sock, &out), 0) << out;
  auto lj = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(lj.is_array()) << out;
  ASSERT_EQ(lj.size(), 3u) << out;
  EXPECT_EQ(lj[2]["is_coordinator"], true) << out;
  // Only single-node checkpoints: no NODES column.
  fake_->SetMultiNode("/ckpt/job/step_2", 1, 0, 0, "", 0, 0, 0);
  fake_->SetMultiNode("/ckpt/job/step_3", 1, 0, 0, "", 0, 0, 0);
  EXPECT_EQ(Run("list " + sock, &out), 0) << out;
  EXPECT_EQ(out.find("NODES"), std::string::npos) << out;
}

}  // namespace
}  // namespace ckptd::client
