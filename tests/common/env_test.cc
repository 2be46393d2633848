// Copyright 2026 The ckptd Authors.
//
// Tests for the POSIX Env (Env::Default()), WriteFileAtomic and
// ReadFileToString, and for FaultInjectionEnv: injected errors and the crash
// model documented in common/fault_injection_env.h.
#include "common/env.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/fault_injection_env.h"
#include "fmt/format.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd {
namespace {

using ::ckptd::testing::TempDir;
using ::ckptd::testing::TestSeed;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

bool Contains(const absl::Status& s, std::string_view needle) {
  return Msg(s).find(needle) != std::string::npos;
}

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

// Creates `path` with `data`; no fsync.
absl::Status WriteFile(Env* env, const std::string& path,
                       std::string_view data) {
  auto file = env->NewWritableFile(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = (*file)->Append(data); !s.ok()) return s;
  return (*file)->Close();
}

absl::StatusOr<std::string> ReadAll(Env* env, const std::string& path) {
  return ReadFileToString(env, path, uint64_t{1} << 30);
}

std::vector<std::string> SortedList(Env* env, const std::string& dir) {
  auto names = env->ListDir(dir);
  EXPECT_TRUE(names.ok()) << names.status();
  if (!names.ok()) return {};
  std::sort(names->begin(), names->end());
  return *names;
}

// ---------------------------------------------------------------------------
// POSIX Env
// ---------------------------------------------------------------------------

class PosixEnvTest : public ::testing::Test {
 protected:
  TempDir dir_;
  Env* env_ = Env::Default();
};

TEST_F(PosixEnvTest, WriteAppendAndReadExact) {
  const std::string path = dir_.Join("f.bin");
  ASSERT_OK_AND_ASSIGN(auto file, env_->NewWritableFile(path));
  EXPECT_EQ(file->path(), path);
  ASSERT_OK(file->Append("hello "));
  ASSERT_OK(file->Append(""));
  ASSERT_OK(file->Append("world"));
  EXPECT_EQ(file->Size(), 11u);
  ASSERT_OK(file->Sync());
  ASSERT_OK(file->Close());
  ASSERT_OK(file->Close());  // idempotent
  EXPECT_EQ(file->Append("x").code(), absl::StatusCode::kFailedPrecondition);

  ASSERT_OK_AND_ASSIGN(auto reader, env_->NewRandomAccessFile(path));
  EXPECT_EQ(reader->Size(), 11u);
  EXPECT_EQ(reader->path(), path);
  std::string buf(5, '\0');
  ASSERT_OK(reader->ReadExact(6, 5, buf.data()));
  EXPECT_EQ(buf, "world");
  ASSERT_OK(reader->ReadExact(0, 5, buf.data()));
  EXPECT_EQ(buf, "hello");
  ASSERT_OK(reader->ReadExact(11, 0, buf.data()));  // empty read at the end
  ASSERT_OK_AND_ASSIGN(uint64_t size, env_->GetFileSize(path));
  EXPECT_EQ(size, 11u);
}

TEST_F(PosixEnvTest, NewWritableFileTruncatesOrFailsWhenExclusive) {
  const std::string path = dir_.Join("f");
  ASSERT_OK(WriteFile(env_, path, "long old content"));
  ASSERT_OK(WriteFile(env_, path, "new"));
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, path));
  EXPECT_EQ(data, "new");

  auto excl = env_->NewWritableFile(path, {.exclusive = true});
  EXPECT_EQ(excl.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(Contains(excl.status(), path)) << excl.status();
  ASSERT_OK(env_->NewWritableFile(dir_.Join("g"), {.exclusive = true}));
}

TEST_F(PosixEnvTest, AppendVWithMorePartsThanIovMax) {
  static_assert(IOV_MAX == 1024);
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  // Small parts, empty parts and a few large ones: several writev batches.
  std::vector<std::string> storage;
  for (int i = 0; i < 3 * IOV_MAX + 17; ++i) {
    size_t n = rng() % 40;
    if (i % 97 == 0) n = 0;
    if (i % 1000 == 1) n = 1 << 20;
    storage.push_back(RandomBytes(rng, n));
  }
  std::vector<std::string_view> parts(storage.begin(), storage.end());
  std::string expected;
  for (const std::string& s : storage) expected += s;

  const std::string path = dir_.Join("v.bin");
  ASSERT_OK_AND_ASSIGN(auto file, env_->NewWritableFile(path));
  ASSERT_OK(file->Append("head"));
  ASSERT_OK(file->AppendV(parts));
  ASSERT_OK(file->AppendV({}));
  EXPECT_EQ(file->Size(), 4 + expected.size());
  ASSERT_OK(file->Close());
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, path));
  EXPECT_TRUE(data == "head" + expected) << "seed " << seed;
}

TEST_F(PosixEnvTest, ReadPastEndIsOutOfRangeNamingThePath) {
  const std::string path = dir_.Join("short.bin");
  ASSERT_OK(WriteFile(env_, path, "0123456789"));
  ASSERT_OK_AND_ASSIGN(auto reader, env_->NewRandomAccessFile(path));
  std::string buf(16, '\0');
  absl::Status s = reader->ReadExact(8, 3, buf.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_TRUE(Contains(s, path)) << s;
  s = reader->ReadExact(11, 0, buf.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  s = reader->ReadExact(UINT64_MAX, 2, buf.data());  // no overflow
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  ASSERT_OK(reader->ReadExact(8, 2, buf.data()));
  EXPECT_EQ(buf.substr(0, 2), "89");
}

TEST_F(PosixEnvTest, OpenMissingOrDirectoryForRead) {
  const std::string missing = dir_.Join("missing");
  auto r = env_->NewRandomAccessFile(missing);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(r.status(), missing)) << r.status();
  r = env_->NewRandomAccessFile(dir_.path());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PosixEnvTest, CreateDirsNested) {
  const std::string nested = dir_.Join("a/b/c");
  ASSERT_OK(env_->CreateDirs(nested));
  ASSERT_OK(env_->FileExists(nested));
  ASSERT_OK(env_->CreateDirs(nested));  // already there
  ASSERT_OK(env_->CreateDirs(dir_.Join("a/b/d/")));
  ASSERT_OK(env_->FileExists(dir_.Join("a/b/d")));
  ASSERT_OK(WriteFile(env_, JoinPath(nested, "f"), "x"));
  EXPECT_EQ(env_->CreateDirs("").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(PosixEnvTest, CreateDirsOnFilePathFails) {
  const std::string file = dir_.Join("plain");
  ASSERT_OK(WriteFile(env_, file, "x"));
  absl::Status s = env_->CreateDirs(file);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Contains(s, file)) << s;
  s = env_->CreateDirs(file + "/sub");  // ENOTDIR
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Contains(s, file)) << s;
}

TEST_F(PosixEnvTest, ListDir) {
  EXPECT_TRUE(SortedList(env_, dir_.path()).empty());
  ASSERT_OK(WriteFile(env_, dir_.Join("b"), ""));
  ASSERT_OK(WriteFile(env_, dir_.Join("a"), "1"));
  ASSERT_OK(env_->CreateDirs(dir_.Join("sub")));
  ASSERT_OK(WriteFile(env_, dir_.Join("sub/inner"), "1"));
  EXPECT_EQ(SortedList(env_, dir_.path()),
            (std::vector<std::string>{"a", "b", "sub"}));
  auto missing = env_->ListDir(dir_.Join("nope"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(missing.status(), dir_.Join("nope")));
}

TEST_F(PosixEnvTest, RenameReplacesTarget) {
  const std::string from = dir_.Join("from"), to = dir_.Join("to");
  ASSERT_OK(WriteFile(env_, from, "new"));
  ASSERT_OK(WriteFile(env_, to, "old content"));
  ASSERT_OK(env_->RenameFile(from, to));
  EXPECT_EQ(env_->FileExists(from).code(), absl::StatusCode::kNotFound);
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, to));
  EXPECT_EQ(data, "new");
  absl::Status s = env_->RenameFile(from, to);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s, from)) << s;
}

TEST_F(PosixEnvTest, RemoveFileAndRemoveDir) {
  const std::string sub = dir_.Join("sub");
  const std::string file = JoinPath(sub, "f");
  ASSERT_OK(env_->CreateDirs(sub));
  ASSERT_OK(WriteFile(env_, file, "x"));
  absl::Status s = env_->RemoveDir(sub);  // not empty
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  ASSERT_OK(env_->RemoveFile(file));
  EXPECT_EQ(env_->FileExists(file).code(), absl::StatusCode::kNotFound);
  s = env_->RemoveFile(file);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s, file)) << s;
  ASSERT_OK(env_->RemoveDir(sub));
  EXPECT_EQ(env_->FileExists(sub).code(), absl::StatusCode::kNotFound);
}

TEST_F(PosixEnvTest, FileExists) {
  ASSERT_OK(env_->FileExists(dir_.path()));
  const std::string missing = dir_.Join("missing");
  absl::Status s = env_->FileExists(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Contains(s, missing)) << s;
  auto size = env_->GetFileSize(missing);
  EXPECT_EQ(size.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(PosixEnvTest, WriteFileAtomicLeavesNoTmp) {
  const std::string path = dir_.Join(".metadata");
  ASSERT_OK(WriteFileAtomic(env_, path, "first"));
  ASSERT_OK(WriteFileAtomic(env_, path, "second, longer"));
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, path));
  EXPECT_EQ(data, "second, longer");
  ASSERT_OK(WriteFileAtomic(env_, path, ""));
  ASSERT_OK_AND_ASSIGN(data, ReadAll(env_, path));
  EXPECT_EQ(data, "");
  EXPECT_EQ(SortedList(env_, dir_.path()),
            std::vector<std::string>{".metadata"});
}

TEST_F(PosixEnvTest, ReadFileToStringLimit) {
  const std::string path = dir_.Join("f");
  ASSERT_OK(WriteFile(env_, path, std::string(100, 'z')));
  ASSERT_OK_AND_ASSIGN(std::string data, ReadFileToString(env_, path, 100));
  EXPECT_EQ(data, std::string(100, 'z'));
  auto over = ReadFileToString(env_, path, 99);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Contains(over.status(), path)) << over.status();
  auto missing = ReadFileToString(env_, dir_.Join("no"), 100);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
}

TEST(PathTest, JoinPathAndDirName) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "/b"), "a/b");
  EXPECT_EQ(JoinPath("/", "b"), "/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(JoinPath("a", ""), "a");
  EXPECT_EQ(DirName("a/b/c"), "a/b");
  EXPECT_EQ(DirName("/c"), "/");
  EXPECT_EQ(DirName("c"), ".");
}

// ---------------------------------------------------------------------------
// FaultInjectionEnv: injected errors
// ---------------------------------------------------------------------------

class FaultEnvTest : public ::testing::Test {
 protected:
  FaultEnvTest() : fenv_(Env::Default()) {}
  TempDir dir_;
  FaultInjectionEnv fenv_;
  Env* env_ = &fenv_;  // NewWritableFile's default argument lives on Env
};

struct OpCase {
  const char* name;
  FaultOp op;
  int error_number;
  absl::StatusCode code;       // absl::ErrnoToStatus's mapping of error_number
  std::string message_prefix;  // "<op> <path>"
  // Runs the operation once; the fixture's dir holds "f" ("0123456789"),
  // "sub/" and nothing else.
  std::function<absl::Status(Env*, const TempDir&)> run;
  // Checks that a failed call had no effect.
  std::function<void(Env*, const TempDir&)> check_unchanged;
};

std::vector<OpCase> OpCases(const TempDir& d) {
  const std::string f = d.Join("f");
  auto open_append = [](Env* env, const std::string& path,
                        std::function<absl::Status(WritableFile&)> op) {
    auto file = env->NewWritableFile(path);
    if (!file.ok()) return file.status();
    return op(**file);
  };
  auto unchanged_f = [](Env* env, const TempDir& d) {
    ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env, d.Join("f")));
    EXPECT_EQ(data, "0123456789");
  };
  return {
      {"open_write", FaultOp::kOpenWrite, ENOSPC,
       absl::StatusCode::kResourceExhausted, "open for write " + d.Join("new"),
       [](Env* env, const TempDir& d) {
         return env->NewWritableFile(d.Join("new")).status();
       },
       [](Env* env, const TempDir& d) {
         EXPECT_EQ(env->FileExists(d.Join("new")).code(),
                   absl::StatusCode::kNotFound);
       }},
      {"append", FaultOp::kAppend, ENOSPC, absl::StatusCode::kResourceExhausted,
       "append " + d.Join("new"),
       [open_append](Env* env, const TempDir& d) {
         return open_append(env, d.Join("new"), [](WritableFile& w) {
           absl::Status s = w.Append("abc");
           EXPECT_EQ(w.Size(), s.ok() ? 3u : 0u);
           return s;
         });
       },
       [](Env* env, const TempDir& d) {
         ASSERT_OK_AND_ASSIGN(uint64_t size, env->GetFileSize(d.Join("new")));
         EXPECT_EQ(size, 0u);
       }},
      {"sync", FaultOp::kSync, EIO, absl::StatusCode::kUnknown,
       "sync " + d.Join("new"),
       [open_append](Env* env, const TempDir& d) {
         return open_append(env, d.Join("new"), [](WritableFile& w) {
           EXPECT_OK(w.Append("abc"));
           return w.Sync();
         });
       },
       nullptr},
      {"close", FaultOp::kClose, EIO, absl::StatusCode::kUnknown,
       "close " + d.Join("new"),
       [open_append](Env* env, const TempDir& d) {
         return open_append(env, d.Join("new"),
                            [](WritableFile& w) { return w.Close(); });
       },
       nullptr},
      {"open_read", FaultOp::kOpenRead, EACCES,
       absl::StatusCode::kPermissionDenied, "open " + f,
       [](Env* env, const TempDir& d) {
         return env->NewRandomAccessFile(d.Join("f")).status();
       },
       nullptr},
      {"read", FaultOp::kRead, EIO, absl::StatusCode::kUnknown, "read " + f,
       [](Env* env, const TempDir& d) {
         auto r = env->NewRandomAccessFile(d.Join("f"));
         if (!r.ok()) return r.status();
         char buf[4];
         return (*r)->ReadExact(0, 4, buf);
       },
       nullptr},
      {"rename", FaultOp::kRename, EXDEV, absl::StatusCode::kUnimplemented,
       fmt::format("rename {} to {}", f, d.Join("g")),
       [](Env* env, const TempDir& d) {
         return env->RenameFile(d.Join("f"), d.Join("g"));
       },
       [unchanged_f](Env* env, const TempDir& d) {
         unchanged_f(env, d);
         EXPECT_EQ(env->FileExists(d.Join("g")).code(),
                   absl::StatusCode::kNotFound);
       }},
      {"sync_dir", FaultOp::kSyncDir, EIO, absl::StatusCode::kUnknown,
       "sync dir " + d.Join("sub"),
       [](Env* env, const TempDir& d) { return env->SyncDir(d.Join("sub")); },
       nullptr},
      {"remove", FaultOp::kRemove, EACCES, absl::StatusCode::kPermissionDenied,
       "remove " + f,
       [](Env* env, const TempDir& d) { return env->RemoveFile(d.Join("f")); },
       unchanged_f},
      {"remove_dir", FaultOp::kRemove, EBUSY,
       absl::StatusCode::kFailedPrecondition, "remove " + d.Join("sub"),
       [](Env* env, const TempDir& d) { return env->RemoveDir(d.Join("sub")); },
       [](Env* env, const TempDir& d) {
         ASSERT_OK(env->FileExists(d.Join("sub")));
       }},
      {"create_dirs", FaultOp::kCreateDirs, EROFS,
       absl::StatusCode::kPermissionDenied, "create dirs " + d.Join("x/y"),
       [](Env* env, const TempDir& d) {
         return env->CreateDirs(d.Join("x/y"));
       },
       [](Env* env, const TempDir& d) {
         EXPECT_EQ(env->FileExists(d.Join("x")).code(),
                   absl::StatusCode::kNotFound);
       }},
      {"realpath", FaultOp::kRealPath, EIO, absl::StatusCode::kUnknown,
       "realpath " + d.Join("sub"),
       [](Env* env, const TempDir& d) {
         return env->RealPath(d.Join("sub")).status();
       },
       nullptr},
  };
}

TEST(FaultEnvOpsTest, EachOpFailsWithConfiguredError) {
  for (int i = 0;; ++i) {
    TempDir d;
    const std::vector<OpCase> cases = OpCases(d);
    if (i == static_cast<int>(cases.size())) break;
    const OpCase& c = cases[i];
    SCOPED_TRACE(c.name);
    ASSERT_OK(WriteFile(Env::Default(), d.Join("f"), "0123456789"));
    ASSERT_OK(Env::Default()->CreateDirs(d.Join("sub")));

    FaultInjectionEnv env(Env::Default());
    // Same op on another path, and another op on any path: no effect.
    env.AddRule({.op = c.op, .path_substring = "no-such-name"});
    env.AddRule(
        {.op = c.op == FaultOp::kSync ? FaultOp::kClose : FaultOp::kSync});
    ASSERT_OK(c.run(&env, d));
    EXPECT_EQ(env.faults_injected(), 0);
    if (c.op == FaultOp::kRename) {
      ASSERT_OK(env.RenameFile(d.Join("g"), d.Join("f")));  // put it back
    }
    if (c.op == FaultOp::kRemove) {
      ASSERT_OK(WriteFile(Env::Default(), d.Join("f"), "0123456789"));
      ASSERT_OK(Env::Default()->CreateDirs(d.Join("sub")));
    }
    if (c.op == FaultOp::kOpenWrite || c.op == FaultOp::kAppend) {
      ASSERT_OK(env.RemoveFile(d.Join("new")));
    }
    if (c.op == FaultOp::kCreateDirs) {
      ASSERT_OK(env.RemoveDir(d.Join("x/y")));
      ASSERT_OK(env.RemoveDir(d.Join("x")));
    }
    env.ClearRules();

    env.AddRule({.op = c.op, .error_number = c.error_number});
    absl::Status s = c.run(&env, d);
    EXPECT_EQ(s.code(), c.code) << s;
    EXPECT_EQ(s.code(), absl::ErrnoToStatus(c.error_number, "").code());
    EXPECT_TRUE(Msg(s).starts_with(c.message_prefix + ": ")) << s;
    EXPECT_EQ(env.faults_injected(), 1);
    if (c.check_unchanged) c.check_unchanged(&env, d);
    // times = 1: the next call goes through.
    EXPECT_OK(c.run(&env, d));
    EXPECT_EQ(env.faults_injected(), 1);
  }
}

TEST_F(FaultEnvTest, SkipAndTimes) {
  fenv_.AddRule({.op = FaultOp::kAppend,
                 .path_substring = "data",
                 .error_number = ENOSPC,
                 .skip = 2,
                 .times = 2});
  ASSERT_OK_AND_ASSIGN(auto data, env_->NewWritableFile(dir_.Join("data.bin")));
  ASSERT_OK_AND_ASSIGN(auto other, env_->NewWritableFile(dir_.Join("other")));
  std::vector<absl::StatusCode> codes;
  for (int i = 0; i < 6; ++i) {
    codes.push_back(data->Append("x").code());
    ASSERT_OK(other->Append("x"));
  }
  using C = absl::StatusCode;
  EXPECT_EQ(codes, (std::vector<C>{C::kOk, C::kOk, C::kResourceExhausted,
                                   C::kResourceExhausted, C::kOk, C::kOk}));
  EXPECT_EQ(data->Size(), 4u);
  EXPECT_EQ(other->Size(), 6u);
  EXPECT_EQ(fenv_.faults_injected(), 2);
}

TEST_F(FaultEnvTest, TimesMinusOneFailsForeverUntilCleared) {
  fenv_.AddRule({.op = FaultOp::kSync, .skip = 1, .times = -1});
  ASSERT_OK_AND_ASSIGN(auto file, env_->NewWritableFile(dir_.Join("f")));
  ASSERT_OK(file->Sync());
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(file->Sync().code(), absl::StatusCode::kUnknown);
  }
  EXPECT_EQ(fenv_.faults_injected(), 10);
  fenv_.ClearRules();
  ASSERT_OK(file->Sync());
}

TEST_F(FaultEnvTest, FirstFiringRuleDecides) {
  fenv_.AddRule({.op = FaultOp::kSync,
                 .path_substring = "a.bin",
                 .error_number = EIO,
                 .times = -1});
  fenv_.AddRule({.op = FaultOp::kSync, .error_number = ENOSPC, .times = -1});
  ASSERT_OK_AND_ASSIGN(auto a, env_->NewWritableFile(dir_.Join("a.bin")));
  ASSERT_OK_AND_ASSIGN(auto b, env_->NewWritableFile(dir_.Join("b.bin")));
  EXPECT_EQ(a->Sync().code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(b->Sync().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(FaultEnvTest, RenameRuleMatchesEitherPath) {
  fenv_.AddRule({.op = FaultOp::kRename,
                 .path_substring = ".metadata",
                 .error_number = EXDEV,
                 .times = -1});
  ASSERT_OK(WriteFile(env_, dir_.Join("x.tmp"), "x"));
  absl::Status s = env_->RenameFile(dir_.Join("x.tmp"), dir_.Join(".metadata"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_TRUE(Contains(s, dir_.Join(".metadata"))) << s;
  ASSERT_OK(env_->RenameFile(dir_.Join("x.tmp"), dir_.Join("y")));
}

TEST_F(FaultEnvTest, AppendVPassesThroughAsOneOperation) {
  fenv_.AddRule({.op = FaultOp::kAppend, .skip = 1, .times = -1});
  std::vector<std::string> storage(2 * IOV_MAX + 3, "ab");
  std::vector<std::string_view> parts(storage.begin(), storage.end());
  ASSERT_OK_AND_ASSIGN(auto file, env_->NewWritableFile(dir_.Join("v")));
  ASSERT_OK(file->AppendV(parts));
  EXPECT_EQ(file->Size(), 2 * parts.size());
  EXPECT_FALSE(file->AppendV(parts).ok());
  EXPECT_EQ(file->Size(), 2 * parts.size());
}

// WriteFileAtomic's four steps, with an injected error in each of them: the
// call fails, the previous content stays (visible until step 3 succeeds,
// and after a crash in any case), and no .tmp is left behind.
TEST_F(FaultEnvTest, WriteFileAtomicKeepsOldContentOnFaultAtEachStep) {
  struct Step {
    int step;
    FaultOp op;
    int error_number;
  };
  const Step steps[] = {
      {1, FaultOp::kOpenWrite, EACCES}, {1, FaultOp::kAppend, ENOSPC},
      {2, FaultOp::kSync, EIO},         {2, FaultOp::kClose, EIO},
      {3, FaultOp::kRename, EXDEV},     {4, FaultOp::kSyncDir, EIO},
  };
  const std::string path = dir_.Join(".metadata");
  ASSERT_OK(WriteFileAtomic(Env::Default(), path, "old"));
  for (const Step& st : steps) {
    SCOPED_TRACE(
        fmt::format("step {} op {}", st.step, static_cast<int>(st.op)));
    fenv_.AddRule({.op = st.op, .error_number = st.error_number});
    absl::Status s = WriteFileAtomic(env_, path, "new content");
    fenv_.ClearRules();
    EXPECT_EQ(s.code(), absl::ErrnoToStatus(st.error_number, "").code()) << s;
    ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, path));
    // Step 4 fails after the rename: the new file is visible, not durable.
    EXPECT_EQ(data, st.step == 4 ? "new content" : "old");
    ASSERT_OK(fenv_.SimulateCrash());
    ASSERT_OK_AND_ASSIGN(data, ReadAll(env_, path));
    EXPECT_EQ(data, "old");
    EXPECT_EQ(SortedList(env_, dir_.path()),
              std::vector<std::string>{".metadata"});
  }
  ASSERT_OK(WriteFileAtomic(env_, path, "new content"));
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, path));
  EXPECT_EQ(data, "new content");
}

// ---------------------------------------------------------------------------
// FaultInjectionEnv: crash simulation
// ---------------------------------------------------------------------------

TEST_F(FaultEnvTest, CrashDropsUnsyncedTail) {
  const std::string path = dir_.Join("f");
  ASSERT_OK_AND_ASSIGN(auto file, env_->NewWritableFile(path));
  ASSERT_OK(env_->SyncDir(dir_.path()));
  ASSERT_OK(file->Append("abc"));
  ASSERT_OK(file->Sync());
  ASSERT_OK(file->Append("def"));
  ASSERT_OK(file->Close());
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, path));
  EXPECT_EQ(data, "abcdef");
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(data, ReadAll(env_, path));
  EXPECT_EQ(data, "abc");
  // Tracking was reset: the file now counts as durable.
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(data, ReadAll(env_, path));
  EXPECT_EQ(data, "abc");
}

TEST_F(FaultEnvTest, CrashRemovesNewFileWithoutDirSync) {
  const std::string path = dir_.Join("f");
  ASSERT_OK_AND_ASSIGN(auto file, env_->NewWritableFile(path));
  ASSERT_OK(file->Append("abc"));
  ASSERT_OK(file->Sync());  // data synced, but not the directory entry
  ASSERT_OK(file->Close());
  // A SyncDir of another directory does not help.
  ASSERT_OK(env_->CreateDirs(dir_.Join("other")));
  ASSERT_OK(env_->SyncDir(dir_.Join("other")));
  ASSERT_OK(fenv_.SimulateCrash());
  EXPECT_EQ(env_->FileExists(path).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->FileExists(dir_.Join("other")).code(),
            absl::StatusCode::kNotFound);  // nor was "other"'s entry in dir_
  // (The crash model once kept new directories: a power cut could then
  // lose a checkpoint directory the daemon had acknowledged.)
}

TEST_F(FaultEnvTest, NewDirectoryIsDurableOnlyAfterItsParentsSyncDir) {
  ASSERT_OK(env_->CreateDirs(dir_.Join("p/q")));
  ASSERT_OK(WriteFile(Env::Default(), dir_.Join("p/q/keep"), "k"));
  ASSERT_OK(env_->SyncDir(dir_.Join("p")));  // q durable in p; p not in dir_
  ASSERT_OK(fenv_.SimulateCrash());
  EXPECT_EQ(env_->FileExists(dir_.Join("p")).code(),
            absl::StatusCode::kNotFound);
  // CreateDirsDurably syncs every new level's parent.
  ASSERT_OK(CreateDirsDurably(env_, dir_.Join("p/q")));
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK(env_->FileExists(dir_.Join("p/q")));
}

TEST_F(FaultEnvTest, DirSyncWithTrailingSlashCounts) {
  const std::string path = dir_.Join("f");
  ASSERT_OK(WriteFile(env_, path, "abc"));
  ASSERT_OK(env_->SyncDir(dir_.path() + "/"));
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, path));
  EXPECT_EQ(data, "");  // entry durable, data never synced
}

TEST_F(FaultEnvTest, CrashKeepsPreexistingFilesAndTruncationIsDurable) {
  ASSERT_OK(WriteFile(Env::Default(), dir_.Join("old"), "untouched"));
  ASSERT_OK(WriteFile(Env::Default(), dir_.Join("rewritten"), "old data"));
  FaultInjectionEnv env(Env::Default());
  ASSERT_OK(WriteFile(&env, dir_.Join("rewritten"), "unsynced"));
  ASSERT_OK(env.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(&env, dir_.Join("old")));
  EXPECT_EQ(data, "untouched");
  ASSERT_OK_AND_ASSIGN(data, ReadAll(&env, dir_.Join("rewritten")));
  EXPECT_EQ(data, "");
}

TEST_F(FaultEnvTest, CrashUndoesRenameWithoutDirSync) {
  const std::string target = dir_.Join("target"), tmp = dir_.Join("tmp");
  ASSERT_OK(WriteFile(Env::Default(), target, "old"));
  ASSERT_OK_AND_ASSIGN(auto file, env_->NewWritableFile(tmp));
  ASSERT_OK(file->Append("new"));
  ASSERT_OK(file->Sync());
  ASSERT_OK(file->Close());
  ASSERT_OK(env_->SyncDir(dir_.path()));  // tmp's entry is durable
  ASSERT_OK(env_->RenameFile(tmp, target));
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, target));
  EXPECT_EQ(data, "new");
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(data, ReadAll(env_, target));
  EXPECT_EQ(data, "old");
  ASSERT_OK_AND_ASSIGN(data, ReadAll(env_, tmp));
  EXPECT_EQ(data, "new");
}

TEST_F(FaultEnvTest, CrashUndoesRenameOfUndurableFileToNewName) {
  const std::string target = dir_.Join("target"), tmp = dir_.Join("tmp");
  ASSERT_OK_AND_ASSIGN(auto file, env_->NewWritableFile(tmp));
  ASSERT_OK(file->Append("new"));
  ASSERT_OK(file->Sync());
  ASSERT_OK(file->Close());
  ASSERT_OK(env_->RenameFile(tmp, target));
  ASSERT_OK(fenv_.SimulateCrash());
  EXPECT_TRUE(SortedList(env_, dir_.path()).empty());
}

TEST_F(FaultEnvTest, RenamePlusDirSyncSurvivesCrash) {
  const std::string target = dir_.Join("target"), tmp = dir_.Join("tmp");
  ASSERT_OK(WriteFile(Env::Default(), target, "old"));
  ASSERT_OK_AND_ASSIGN(auto file, env_->NewWritableFile(tmp));
  ASSERT_OK(file->Append("new"));
  ASSERT_OK(file->Sync());
  ASSERT_OK(file->Append(" unsynced"));
  ASSERT_OK(file->Close());
  ASSERT_OK(env_->RenameFile(tmp, target));
  ASSERT_OK(env_->SyncDir(dir_.path()));
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, target));
  EXPECT_EQ(data, "new");  // the rename survives, the unsynced tail does not
  EXPECT_EQ(SortedList(env_, dir_.path()), std::vector<std::string>{"target"});
}

TEST_F(FaultEnvTest, CrashUndoesChainedRenamesAndCommitsInOrder) {
  // a -> b -> sub/c; syncing sub commits both renames (journal order).
  ASSERT_OK(CreateDirsDurably(env_, dir_.Join("sub")));
  ASSERT_OK(WriteFile(Env::Default(), dir_.Join("a"), "A"));
  ASSERT_OK(WriteFile(Env::Default(), dir_.Join("b"), "B"));
  ASSERT_OK(env_->RenameFile(dir_.Join("a"), dir_.Join("b")));
  ASSERT_OK(env_->RenameFile(dir_.Join("b"), dir_.Join("sub/c")));
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, dir_.Join("a")));
  EXPECT_EQ(data, "A");
  ASSERT_OK_AND_ASSIGN(data, ReadAll(env_, dir_.Join("b")));
  EXPECT_EQ(data, "B");
  EXPECT_EQ(env_->FileExists(dir_.Join("sub/c")).code(),
            absl::StatusCode::kNotFound);

  ASSERT_OK(env_->RenameFile(dir_.Join("a"), dir_.Join("b")));
  ASSERT_OK(env_->RenameFile(dir_.Join("b"), dir_.Join("sub/c")));
  ASSERT_OK(env_->SyncDir(dir_.Join("sub")));
  ASSERT_OK(fenv_.SimulateCrash());
  EXPECT_EQ(SortedList(env_, dir_.path()), std::vector<std::string>{"sub"});
  ASSERT_OK_AND_ASSIGN(data, ReadAll(env_, dir_.Join("sub/c")));
  EXPECT_EQ(data, "A");
}

TEST_F(FaultEnvTest, SourceReusedWhileRenamePending) {
  // tmp -> x, tmp (again) -> y, one SyncDir: both survive; without it,
  // neither does and no tmp is left.
  const std::string tmp = dir_.Join("tmp");
  for (bool sync : {false, true}) {
    SCOPED_TRACE(sync);
    for (const char* name : {"x", "y"}) {
      ASSERT_OK_AND_ASSIGN(auto f, env_->NewWritableFile(tmp));
      ASSERT_OK(f->Append(name));
      ASSERT_OK(f->Sync());
      ASSERT_OK(f->Close());
      ASSERT_OK(env_->RenameFile(tmp, dir_.Join(name)));
    }
    if (sync) ASSERT_OK(env_->SyncDir(dir_.path()));
    ASSERT_OK(fenv_.SimulateCrash());
    EXPECT_EQ(SortedList(env_, dir_.path()),
              sync ? (std::vector<std::string>{"x", "y"})
                   : std::vector<std::string>{});
  }
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, dir_.Join("y")));
  EXPECT_EQ(data, "y");
}

TEST_F(FaultEnvTest, RemoveIsDurableAtOnce) {
  ASSERT_OK(WriteFile(Env::Default(), dir_.Join("old"), "x"));
  ASSERT_OK(env_->RemoveFile(dir_.Join("old")));
  // Removing a rename's target commits that rename first.
  ASSERT_OK(WriteFile(Env::Default(), dir_.Join("a"), "A"));
  ASSERT_OK(env_->RenameFile(dir_.Join("a"), dir_.Join("b")));
  ASSERT_OK(env_->RemoveFile(dir_.Join("b")));
  ASSERT_OK(fenv_.SimulateCrash());
  EXPECT_TRUE(SortedList(env_, dir_.path()).empty());
}

TEST_F(FaultEnvTest, DirectoryRenameIsDurableAndCarriesTracking) {
  ASSERT_OK(env_->CreateDirs(dir_.Join("staging")));
  ASSERT_OK_AND_ASSIGN(auto f, env_->NewWritableFile(dir_.Join("staging/f")));
  ASSERT_OK(f->Append("abc"));
  ASSERT_OK(f->Sync());
  ASSERT_OK(f->Append("def"));
  ASSERT_OK(f->Close());
  ASSERT_OK(env_->SyncDir(dir_.Join("staging")));
  ASSERT_OK(env_->RenameFile(dir_.Join("staging"), dir_.Join("final")));
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, dir_.Join("final/f")));
  EXPECT_EQ(data, "abc");
}

// A writer that forgets to fsync before the rename publishes an empty file
// after a crash: the env catches the missing Sync.
TEST_F(FaultEnvTest, MissingFsyncBeforeRenameIsCaught) {
  const std::string path = dir_.Join(".metadata");
  ASSERT_OK(WriteFile(Env::Default(), path, "old"));
  ASSERT_OK(WriteFile(env_, path + ".tmp", "new"));  // no Sync
  ASSERT_OK(env_->RenameFile(path + ".tmp", path));
  ASSERT_OK(env_->SyncDir(dir_.path()));
  ASSERT_OK(fenv_.SimulateCrash());
  ASSERT_OK_AND_ASSIGN(std::string data, ReadAll(env_, path));
  EXPECT_EQ(data, "");  // torn: neither old nor new
}

// Crashes WriteFileAtomic before each of its operations (and after the last)
// with random old/new content: afterwards the file holds exactly the old
// content (or is absent if there was none) until the directory sync has
// happened, then exactly the new content; never a torn mix, never a .tmp.
TEST(FaultEnvCrashTest, WriteFileAtomicSurvivesCrashAtEveryStep) {
  const uint64_t seed = TestSeed();
  std::mt19937_64 rng(seed);
  // WriteFileAtomic's operations, in order.
  const FaultOp ops[] = {FaultOp::kOpenWrite, FaultOp::kAppend,
                         FaultOp::kSync,      FaultOp::kClose,
                         FaultOp::kRename,    FaultOp::kSyncDir};
  const int kNumOps = static_cast<int>(std::size(ops));
  for (int round = 0; round < 12; ++round) {
    auto size = [&rng] {
      switch (rng() % 4) {
        case 0:
          return size_t{0};
        case 1:
          return size_t(rng() % 16);
        default:
          return size_t(rng() % (256 << 10));
      }
    };
    const bool had_old = rng() % 4 != 0;
    const std::string old_data = RandomBytes(rng, size());
    const std::string new_data = RandomBytes(rng, size());
    const bool stale_tmp = rng() % 3 == 0;
    for (int crash_before = 0; crash_before <= kNumOps; ++crash_before) {
      SCOPED_TRACE(fmt::format("seed {} round {} crash before op {}", seed,
                               round, crash_before));
      TempDir d;
      const std::string path = d.Join("__0_0.distcp");
      if (had_old) ASSERT_OK(WriteFileAtomic(Env::Default(), path, old_data));
      if (stale_tmp) {
        ASSERT_OK(WriteFile(Env::Default(), path + ".tmp", "stale"));
      }
      FaultInjectionEnv env(Env::Default());
      // The process dies before ops[crash_before]: it and everything after
      // it (including WriteFileAtomic's cleanup) fail.
      for (int i = crash_before; i < kNumOps; ++i) {
        env.AddRule({.op = ops[i], .times = -1});
      }
      env.AddRule({.op = FaultOp::kRemove, .times = -1});
      absl::Status s = WriteFileAtomic(&env, path, new_data);
      EXPECT_EQ(s.ok(), crash_before == kNumOps) << s;
      // Steps after a successful open clean up the .tmp: a second fault.
      const bool cleanup = crash_before >= 1 && crash_before <= 4;
      EXPECT_EQ(env.faults_injected(),
                crash_before == kNumOps ? 0 : (cleanup ? 2 : 1));
      ASSERT_OK(env.SimulateCrash());
      env.ClearRules();

      std::vector<std::string> expected_names;
      if (stale_tmp) expected_names.push_back("__0_0.distcp.tmp");
      auto data = ReadAll(&env, path);
      if (crash_before == kNumOps) {
        ASSERT_OK(data);
        EXPECT_TRUE(*data == new_data);
        expected_names.push_back("__0_0.distcp");
      } else if (had_old) {
        ASSERT_OK(data);
        EXPECT_TRUE(*data == old_data);
        expected_names.push_back("__0_0.distcp");
      } else {
        EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
      }
      if (stale_tmp && crash_before == kNumOps) {
        expected_names.erase(expected_names.begin());  // renamed, durably
      } else if (stale_tmp) {
        // A stale .tmp has a durable entry: it survives, truncated in place
        // by the open, then holding the new data once synced (also when the
        // rename onto `path` is undone).
        ASSERT_OK_AND_ASSIGN(std::string tmp, ReadAll(&env, path + ".tmp"));
        EXPECT_TRUE(tmp == (crash_before == 0   ? "stale"
                            : crash_before >= 3 ? new_data
                                                : ""));
      }
      std::sort(expected_names.begin(), expected_names.end());
      EXPECT_EQ(SortedList(&env, d.path()), expected_names);
    }
  }
}

TEST(FaultEnvThreadTest, ConcurrentWritersAndCrash) {
  TempDir d;
  FaultInjectionEnv env(Env::Default());
  // The whole path: "t0" alone also matched a temp dir whose random suffix
  // held "t0" (about 1 run in 770), failing every thread's syncs.
  env.AddRule(
      {.op = FaultOp::kSync, .path_substring = d.Join("t0"), .times = -1});
  constexpr int kThreads = 4, kRounds = 50;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&env, &d, t] {
      const std::string path = d.Join(fmt::format("t{}", t));
      auto file = env.NewWritableFile(path, {});
      ASSERT_OK(file);
      ASSERT_OK(env.SyncDir(d.path()));
      for (int i = 0; i < kRounds; ++i) {
        std::string_view parts[] = {"ab", "", "cd"};
        ASSERT_OK((*file)->AppendV(parts));
        absl::Status s = (*file)->Sync();
        EXPECT_EQ(s.ok(), t != 0) << s;
      }
      ASSERT_OK((*file)->Append("tail"));
      ASSERT_OK((*file)->Close());
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(env.faults_injected(), kRounds);
  ASSERT_OK(env.SimulateCrash());
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_OK_AND_ASSIGN(uint64_t size,
                         env.GetFileSize(d.Join(fmt::format("t{}", t))));
    EXPECT_EQ(size, t == 0 ? 0u : 4u * kRounds);
  }
}

}  // namespace
}  // namespace ckptd
