// Copyright 2026 The ckptd Authors.
#include "common/failpoint.h"

#include <unistd.h>

#include <atomic>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "spdlog/spdlog.h"
#include "tests/testing/test_util.h"

namespace ckptd::failpoint {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool Exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

void Touch(const std::string& path) { std::ofstream(path) << ""; }

bool WaitFor(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!Exists(path)) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

class FailpointTest : public ::testing::Test {
 protected:
  void TearDown() override { DisarmAll(); }
  testing::TempDir dir_;
};

TEST_F(FailpointTest, UnarmedPointsDoNothing) {
  DisarmAll();
  EXPECT_FALSE(Armed());
  CKPTD_FAILPOINT("test.point", "id");
  EXPECT_EQ(HitCount("test.point"), 0);
  EXPECT_FALSE(Exists(dir_.Join("test.point.hit")));
}

TEST_F(FailpointTest, MalformedSpecsAreRefusedAndArmNothing) {
  for (const char* spec :
       {"test.point", "=pause", "test.point=jump", "test.point=x*pause",
        "test.point=sleep(abc)", "test.point=sleep(5"}) {
    absl::Status s = Arm({spec, dir_.path()});
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << spec << ": " << s;
    EXPECT_FALSE(Armed()) << spec;
  }
  absl::Status s = Arm({"test.point=pause", ""});
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("CKPTD_FAILPOINT_DIR"));
}

TEST_F(FailpointTest, PauseBlocksUntilReleasedAndWritesTheHit) {
  ASSERT_OK(Arm({"test.point=pause,other.point=off", dir_.path()}));
  EXPECT_TRUE(Armed());
  std::atomic<bool> done{false};
  std::thread t([&] {
    CKPTD_FAILPOINT("test.point", "job/ckpt-7");
    done = true;
  });
  ASSERT_TRUE(WaitFor(dir_.Join("test.point.hit"), absl::Seconds(10)));
  EXPECT_EQ(ReadFile(dir_.Join("test.point.hit")),
            "pid=" + std::to_string(::getpid()) + " id=job/ckpt-7 hits=1\n");
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(done) << "the pause did not block";
  Touch(dir_.Join("test.point.release"));
  t.join();
  EXPECT_TRUE(done);
  // Released: later hits pass at once, and still record themselves.
  const absl::Time start = absl::Now();
  CKPTD_FAILPOINT("test.point", "job/ckpt-8");
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_THAT(ReadFile(dir_.Join("test.point.hit")), HasSubstr("hits=2"));
  EXPECT_EQ(HitCount("test.point"), 2);
  // An `off` point and an unnamed one count or do nothing.
  CKPTD_FAILPOINT("other.point", "x");
  CKPTD_FAILPOINT("unnamed.point", "x");
  EXPECT_EQ(HitCount("other.point"), 1);
  EXPECT_FALSE(Exists(dir_.Join("other.point.hit")));
}

TEST_F(FailpointTest, PauseGivesUpAfterItsTimeout) {
  ASSERT_OK(Arm({"test.point=pause", dir_.path(), absl::Milliseconds(100)}));
  const absl::Time start = absl::Now();
  CKPTD_FAILPOINT("test.point", "id");
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, absl::Milliseconds(100));
  EXPECT_LT(waited, absl::Seconds(5));
  EXPECT_TRUE(Exists(dir_.Join("test.point.hit")));
}

TEST_F(FailpointTest, CountLimitsTheHitsThatFire) {
  ASSERT_OK(Arm({"test.point=2*sleep(30)", dir_.path()}));
  for (int i = 0; i < 2; ++i) {
    const absl::Time start = absl::Now();
    CKPTD_FAILPOINT("test.point", "id");
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(30)) << i;
  }
  const absl::Time start = absl::Now();
  for (int i = 0; i < 10; ++i) CKPTD_FAILPOINT("test.point", "id");
  EXPECT_LT(absl::Now() - start, absl::Milliseconds(30));
  EXPECT_EQ(HitCount("test.point"), 12);
}

TEST_F(FailpointTest, ConcurrentHitsAllPauseAndAllRelease) {
  ASSERT_OK(Arm({"test.point=pause", dir_.path()}));
  // spdlog's registry is made on first use inside Debian's uninstrumented
  // libspdlog, whose static guard TSan cannot see: make it here, before
  // the threads (as the daemon does in main), so their first log lines do
  // not race its construction.
  spdlog::default_logger();
  std::atomic<int> passed{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      CKPTD_FAILPOINT("test.point", "id");
      ++passed;
    });
  }
  ASSERT_TRUE(WaitFor(dir_.Join("test.point.hit"), absl::Seconds(10)));
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(passed, 0);
  Touch(dir_.Join("test.point.release"));
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(passed, 4);
  EXPECT_EQ(HitCount("test.point"), 4);
}

TEST_F(FailpointTest, ArmFromEnvironment) {
  ASSERT_EQ(::setenv("CKPTD_FAILPOINTS", "test.point=1*pause", 1), 0);
  ASSERT_EQ(::setenv("CKPTD_FAILPOINT_DIR", dir_.path().c_str(), 1), 0);
  ASSERT_EQ(::setenv("CKPTD_FAILPOINT_TIMEOUT_MS", "50", 1), 0);
  ASSERT_OK(ArmFromEnvironment());
  EXPECT_TRUE(Armed());
  const absl::Time start = absl::Now();
  CKPTD_FAILPOINT("test.point", "id");  // times out after 50 ms
  CKPTD_FAILPOINT("test.point", "id");  // its one firing spent
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ASSERT_EQ(::setenv("CKPTD_FAILPOINT_TIMEOUT_MS", "soon", 1), 0);
  EXPECT_TRUE(absl::IsInvalidArgument(ArmFromEnvironment()));
  ::unsetenv("CKPTD_FAILPOINTS");
  ::unsetenv("CKPTD_FAILPOINT_DIR");
  ::unsetenv("CKPTD_FAILPOINT_TIMEOUT_MS");
  DisarmAll();
  ASSERT_OK(ArmFromEnvironment());  // unset: nothing armed
  EXPECT_FALSE(Armed());
}

}  // namespace
}  // namespace ckptd::failpoint
