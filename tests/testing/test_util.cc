// Copyright 2026 The ckptd Authors.
#include "tests/testing/test_util.h"

#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <random>

namespace ckptd::testing {

TempDir::TempDir() {
  const char* base = getenv("TEST_TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ckptd_test_XXXXXX";
  char* p = mkdtemp(tmpl.data());
  if (p == nullptr) {
    ADD_FAILURE() << "mkdtemp failed for " << tmpl;
    path_ = "/tmp";
    return;
  }
  path_ = p;
}

TempDir::~TempDir() {
  if (getenv("CKPTD_KEEP_TEST_DIRS") != nullptr || path_ == "/tmp") return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string TempDir::Join(std::string_view name) const {
  return path_ + "/" + std::string(name);
}

uint64_t TestSeed() {
  uint64_t seed;
  if (const char* s = getenv("CKPTD_TEST_SEED"); s && *s) {
    seed = std::strtoull(s, nullptr, 10);
  } else {
    seed = std::random_device{}();
    seed = (seed << 32) ^ std::random_device{}();
  }
  ::testing::Test::RecordProperty("seed", std::to_string(seed));
  std::fprintf(stderr, "[ seed ] CKPTD_TEST_SEED=%llu\n",
               static_cast<unsigned long long>(seed));
  return seed;
}

// The environment wins (ctest sets CKPTD_SOURCE_DIR); otherwise the
// directories this test was configured with.
std::string SourceDir() {
  const char* s = getenv("CKPTD_SOURCE_DIR");
  return s ? s : CKPTD_SOURCE_DIR_DEFAULT;
}

std::string ToolPath(std::string_view name) {
  const char* b = getenv("CKPTD_BUILD_DIR");
  return std::string(b ? b : CKPTD_BUILD_DIR_DEFAULT) + "/tools/" + std::string(name);
}

int RunCommand(const std::string& cmd, std::string* output) {
  FILE* f = popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return -1;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), f)) > 0) {
    if (output) output->append(buf.data(), n);
  }
  int rc = pclose(f);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128 + WTERMSIG(rc);
}

}  // namespace ckptd::testing
