// Copyright 2026 The ckptd Authors.
//
// Shared helpers for ckptd's GoogleTest suites: per-test temp dirs, logged
// random seeds, and status assertions (Abseil 20220623 has no matchers).
#ifndef CKPTD_TESTS_TESTING_TEST_UTIL_H_
#define CKPTD_TESTS_TESTING_TEST_UTIL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace ckptd::testing {

// A fresh directory under $TEST_TMPDIR or /tmp, removed recursively on
// destruction (unless CKPTD_KEEP_TEST_DIRS is set).
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(std::string_view name) const;

 private:
  std::string path_;
};

// A seed from $CKPTD_TEST_SEED if set, else random; printed to the test log
// so a failure can be replayed.
uint64_t TestSeed();

// Path of a helper tool built under tests/tools (build/tools/NAME).
std::string ToolPath(std::string_view name);
// Repository root (CKPTD_SOURCE_DIR, set by ctest).
std::string SourceDir();

// Runs a shell command, returns its exit code; stdout+stderr captured into
// *output when given.
int RunCommand(const std::string& cmd, std::string* output = nullptr);

}  // namespace ckptd::testing

#define ASSERT_OK(expr)                                   \
  do {                                                    \
    const ::absl::Status ckptd_s_ = ::ckptd::testing::ToStatus(expr); \
    ASSERT_TRUE(ckptd_s_.ok()) << ckptd_s_;               \
  } while (0)
#define EXPECT_OK(expr)                                   \
  do {                                                    \
    const ::absl::Status ckptd_s_ = ::ckptd::testing::ToStatus(expr); \
    EXPECT_TRUE(ckptd_s_.ok()) << ckptd_s_;               \
  } while (0)
// ASSERT_OK_AND_ASSIGN(auto x, StatusOr-expression)
#define ASSERT_OK_AND_ASSIGN(lhs, rexpr)                                     \
  CKPTD_ASSERT_OK_AND_ASSIGN_IMPL_(CKPTD_TEST_CONCAT_(ckptd_sor_, __LINE__), \
                                   lhs, rexpr)
#define CKPTD_TEST_CONCAT_INNER_(a, b) a##b
#define CKPTD_TEST_CONCAT_(a, b) CKPTD_TEST_CONCAT_INNER_(a, b)
#define CKPTD_ASSERT_OK_AND_ASSIGN_IMPL_(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                     \
  ASSERT_TRUE(tmp.ok()) << tmp.status();                  \
  lhs = std::move(tmp).value()

namespace ckptd::testing {
inline absl::Status ToStatus(const absl::Status& s) { return s; }
template <typename T>
absl::Status ToStatus(const absl::StatusOr<T>& s) {
  return s.status();
}
}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_TEST_UTIL_H_
