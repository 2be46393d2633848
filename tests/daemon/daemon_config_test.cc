// Copyright 2026 The ckptd Authors.
//
// The daemon's configuration (file + flags) and checkpoint path resolution
// (roots, "..", symlink escapes).

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/fault_injection_env.h"
#include "daemon/cluster/peer_service.h"
#include "daemon/commit/paths.h"
#include "daemon/config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

TEST(ConfigTest, SizesAndDurations) {
  EXPECT_EQ(ParseSize("4G").value(), uint64_t{4} << 30);
  EXPECT_EQ(ParseSize("512M").value(), uint64_t{512} << 20);
  EXPECT_EQ(ParseSize("1.5K").value(), 1536u);
  EXPECT_EQ(ParseSize("2GiB").value(), uint64_t{2} << 30);
  EXPECT_EQ(ParseSize("123").value(), 123u);
  EXPECT_FALSE(ParseSize("-1G").ok());
  EXPECT_FALSE(ParseSize("lots").ok());
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_EQ(ParseDuration("90s").value(), absl::Seconds(90));
  EXPECT_EQ(ParseDuration("5m").value(), absl::Minutes(5));
  EXPECT_EQ(ParseDuration("250ms").value(), absl::Milliseconds(250));
  EXPECT_EQ(ParseDuration("2h").value(), absl::Hours(2));
  EXPECT_EQ(ParseDuration("7").value(), absl::Seconds(7));
  EXPECT_FALSE(ParseDuration("soon").ok());
}

TEST(ConfigTest, FileThenFlags) {
  TempDir dir;
  const std::string conf = dir.Join("ckptd.conf");
  ASSERT_OK(WriteFileAtomic(Env::Default(), conf,
                            "# comment\n"
                            "staging_budget = 1G   # trailing comment\n"
                            "\n"
                            "checkpoint_roots = /a, /b\n"
                            "keep_last_n = 3\n"
                            "direct_io = false\n"
                            "socket_mode = 0600\n"
                            "stage_timeout = 30s\n"));
  std::vector<std::string> args = {"ckptd",           "--config",     conf,
                                   "--keep_last_n=5", "--io-threads", "4"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  DaemonOptions o;
  bool help = false;
  ASSERT_OK(ParseCommandLine(argv.size(), argv.data(), &o, &help));
  EXPECT_FALSE(help);
  EXPECT_EQ(o.staging_budget, uint64_t{1} << 30);
  EXPECT_THAT(o.checkpoint_roots, ::testing::ElementsAre("/a", "/b"));
  EXPECT_EQ(o.keep_last_n, 5);  // the flag wins
  EXPECT_EQ(o.io_threads, 4);
  EXPECT_FALSE(o.direct_io);
  EXPECT_EQ(o.socket_mode, 0600u);
  EXPECT_EQ(o.stage_timeout, absl::Seconds(30));
  ASSERT_OK(FinalizeOptions(&o));
  EXPECT_EQ(o.max_batch, uint64_t{512} << 20);
  // Restore group buffers count within the staging budget.
  EXPECT_EQ(o.restore_buffer_bytes, uint64_t{1} << 30);
  o.staging_budget = uint64_t{64} << 20;
  o.max_batch = 0;
  ASSERT_OK(FinalizeOptions(&o));
  EXPECT_EQ(o.restore_buffer_bytes, uint64_t{64} << 20);
}

TEST(ConfigTest, ErrorsNameTheLineAndKey) {
  DaemonOptions o;
  absl::Status s =
      ApplyConfigText(&o, "keep_last_n = 2\nno_such_key = 1\n", "x.conf");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(s), HasSubstr("x.conf:2: unknown option 'no_such_key'"));
  s = ApplyConfigText(&o, "io_threads = many\n", "x.conf");
  EXPECT_THAT(Msg(s),
              HasSubstr("x.conf:1: option io_threads: invalid value 'many'"));
  s = ApplyConfigText(&o, "just words\n", "x.conf");
  EXPECT_THAT(Msg(s), HasSubstr("expected 'key = value'"));
  s = ApplyConfigText(&o, "checkpoint_roots = relative/path\n", "x.conf");
  EXPECT_THAT(Msg(s), HasSubstr("absolute"));
  o = DaemonOptions();
  o.max_batch = o.staging_budget + 1;
  EXPECT_THAT(Msg(FinalizeOptions(&o)), HasSubstr("max_batch"));
  o = DaemonOptions();
  o.io_backend = "carrier-pigeon";
  EXPECT_THAT(Msg(FinalizeOptions(&o)), HasSubstr("io_backend"));
  o = DaemonOptions();
  o.write_block = 1000;
  EXPECT_THAT(Msg(FinalizeOptions(&o)), HasSubstr("write_block"));
}

TEST(ConfigTest, WriteTimeoutAndShutdownGrace) {
  DaemonOptions o;
  EXPECT_EQ(o.write_timeout, absl::Minutes(5));
  EXPECT_EQ(o.shutdown_grace, absl::Seconds(60));
  ASSERT_OK(ApplyConfigText(&o, "write_timeout = 90s\nshutdown_grace = 5s\n",
                            "x.conf"));
  EXPECT_EQ(o.write_timeout, absl::Seconds(90));
  EXPECT_EQ(o.shutdown_grace, absl::Seconds(5));
  ASSERT_OK(FinalizeOptions(&o));
  o.write_timeout = absl::ZeroDuration();  // off
  ASSERT_OK(FinalizeOptions(&o));
  o.write_timeout = absl::Milliseconds(500);
  EXPECT_THAT(Msg(FinalizeOptions(&o)), HasSubstr("write_timeout"));
  EXPECT_THAT(Msg(ApplyConfigText(&o, "write_timeout = -1s\n", "x.conf")),
              HasSubstr("option write_timeout"));
  const std::string help = OptionsHelp();
  EXPECT_THAT(help, HasSubstr("--write_timeout"));
  EXPECT_THAT(help, HasSubstr("(default: 5m)"));
  EXPECT_THAT(help, HasSubstr("--shutdown_grace"));
}

TEST(ConfigTest, HelpListsEveryOptionWithItsDefault) {
  const std::string help = OptionsHelp();
  for (const char* key :
       {"socket", "checkpoint_roots", "shm_dir", "state_dir", "staging_budget",
        "io_backend", "direct_io", "keep_last_n", "stage_timeout",
        "write_rate_limit", "max_items", "log_level"}) {
    EXPECT_THAT(help, HasSubstr(std::string("--") + key)) << key;
  }
  EXPECT_THAT(help, HasSubstr("(default: 4G)"));
}

TEST(ConfigTest, ExampleConfigParses) {
  const char* src = std::getenv("CKPTD_SOURCE_DIR");
  if (src == nullptr)
    GTEST_SKIP() << "CKPTD_SOURCE_DIR not set (run under ctest)";
  const std::string path = std::string(src) + "/daemon/ckptd.conf.example";
  ASSERT_OK_AND_ASSIGN(std::string text,
                       ReadFileToString(Env::Default(), path, 1 << 20));
  DaemonOptions o;
  ASSERT_OK(ApplyConfigText(&o, text, path));
  ASSERT_OK(FinalizeOptions(&o));
  EXPECT_EQ(o.staging_budget, uint64_t{32} << 30);
}

TEST(ConfigTest, PeerReplicaSettingsAreChecked) {
  DaemonOptions o;
  ASSERT_OK(ApplyConfigText(&o,
                            "peer_replicas = 1\nfailure_domain = rack-12\n"
                            "replica_rate_limit = 256M\n"
                            "restore_peers = a:7070, b.example:7070,\n",
                            "x.conf"));
  EXPECT_EQ(o.replica_rate_limit, uint64_t{256} << 20);
  EXPECT_THAT(o.restore_peers,
              ::testing::ElementsAre("a:7070", "b.example:7070"));
  // Replicas are copies of what the memory tier holds, pushed over the
  // peer service.
  EXPECT_THAT(Msg(FinalizeOptions(&o)), HasSubstr("needs memory_tier_bytes"));
  o.memory_tier_bytes = uint64_t{1} << 30;
  o.peer_listen = "0.0.0.0:7070";
  o.peer_token_file = "/etc/ckptd/token";
  EXPECT_OK(FinalizeOptions(&o));
  EXPECT_THAT(Msg(ApplyConfigText(&o, "peer_replicas = 3\n", "x.conf")),
              HasSubstr("peer_replicas"));
  EXPECT_THAT(Msg(ApplyConfigText(&o, "restore_peers = nohost\n", "x.conf")),
              HasSubstr("host:port"));
  o.peer_restore = "sometimes";
  EXPECT_THAT(Msg(FinalizeOptions(&o)),
              HasSubstr("not one of prefer, missing, off"));
  o.peer_restore = "missing";
  o.failure_domain = std::string(300, 'r');
  EXPECT_THAT(Msg(FinalizeOptions(&o)), HasSubstr("failure_domain"));
}

TEST(ConfigTest, PeerSettingsAreChecked) {
  DaemonOptions o;
  o.peer_listen = "0.0.0.0:7070";
  absl::Status s = FinalizeOptions(&o);
  EXPECT_THAT(Msg(s), HasSubstr("peer_token_file"));
  o.peer_token_file = "/etc/ckptd/token";
  EXPECT_OK(FinalizeOptions(&o));
  o.peer_tls_cert = "/etc/ckptd/node.pem";
  EXPECT_THAT(Msg(FinalizeOptions(&o)), HasSubstr("peer_tls_key"));
  o.peer_tls_key = "/etc/ckptd/node.key";
  EXPECT_OK(FinalizeOptions(&o));
  o.peer_heartbeat = absl::Seconds(20);
  EXPECT_THAT(Msg(FinalizeOptions(&o)), HasSubstr("peer_timeout"));
}

TEST(ConfigTest, TokenFileMustBePrivateAndLongEnough) {
  TempDir dir;
  const std::string path = dir.Join("token");
  ASSERT_OK(WriteFileAtomic(Env::Default(), path, "0123456789abcdef-token\n"));
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  absl::StatusOr<std::string> t = ReadTokenFile(path);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(Msg(t.status()), HasSubstr("chmod 600"));
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  ASSERT_OK_AND_ASSIGN(std::string token, ReadTokenFile(path));
  EXPECT_EQ(token, "0123456789abcdef-token");  // trailing newline stripped
  ASSERT_OK(WriteFileAtomic(Env::Default(), path, "short\n"));
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_THAT(Msg(ReadTokenFile(path).status()), HasSubstr("shorter than 16"));
  EXPECT_EQ(ReadTokenFile(dir.Join("missing")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(PathsTest, ResolvesUnderRoots) {
  TempDir dir;
  const std::string root = dir.Join("root");
  ASSERT_OK(Env::Default()->CreateDirs(root + "/job"));
  const std::vector<std::string> roots = {root};
  EXPECT_EQ(ResolveCheckpointDir(roots, "job/step1").value(),
            root + "/job/step1");
  EXPECT_EQ(ResolveCheckpointDir(roots, root + "//job/./step2/").value(),
            root + "/job/step2");
  EXPECT_EQ(ResolveCheckpointDir(roots, "new/deep/step").value(),
            root + "/new/deep/step");

  auto denied = [&](std::string_view id, std::string_view why) {
    absl::StatusOr<std::string> r = ResolveCheckpointDir(roots, id);
    ASSERT_FALSE(r.ok()) << id << " resolved to " << *r;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied)
        << r.status();
    EXPECT_THAT(Msg(r.status()), HasSubstr(why));
  };
  denied("../escape", "contains '..'");
  denied("job/../../escape", "contains '..'");
  denied("/etc/ckpt", "not below a checkpoint root");
  denied(root, "not below a checkpoint root");  // the root itself
  // A symlink inside the root that points outside it.
  ASSERT_EQ(::symlink(dir.path().c_str(), (root + "/link").c_str()), 0);
  denied("link/step", "not below a checkpoint root");
  // A symlink inside the root that stays inside is fine.
  ASSERT_EQ(::symlink((root + "/job").c_str(), (root + "/alias").c_str()), 0);
  EXPECT_EQ(ResolveCheckpointDir(roots, "alias/s").value(), root + "/job/s");
  // An existing file is not a directory.
  ASSERT_OK(WriteFileAtomic(Env::Default(), root + "/file", "x"));
  denied("file", "not a directory");

  EXPECT_EQ(ResolveCheckpointDir(roots, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveCheckpointDir(roots, std::string("a\0b", 3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveCheckpointDir(roots, std::string(5000, 'a')).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PathsTest, ResolvesThroughTheEnv) {
  TempDir dir;
  const std::string root = dir.Join("root");
  ASSERT_OK(Env::Default()->CreateDirs(root + "/job"));
  const std::vector<std::string> roots = {root};
  // realpath fails in the Env: the error comes back as it is, naming it.
  FaultInjectionEnv env(Env::Default());
  env.AddRule({.op = FaultOp::kRealPath, .path_substring = "/job"});
  absl::StatusOr<std::string> r = ResolveCheckpointDir(roots, "job/s", &env);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnknown) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("realpath " + root + "/job"));
  EXPECT_EQ(env.faults_injected(), 1);
  EXPECT_EQ(ResolveCheckpointDir(roots, "job/s", &env).value(),
            root + "/job/s");
  // A symlink loop is the caller's bad path, not an UNKNOWN failure.
  ASSERT_EQ(::symlink((root + "/l2").c_str(), (root + "/l1").c_str()), 0);
  ASSERT_EQ(::symlink((root + "/l1").c_str(), (root + "/l2").c_str()), 0);
  r = ResolveCheckpointDir(roots, "l1/s", &env);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument)
      << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("symbolic links"));
  // A file used as a directory: INVALID_ARGUMENT too.
  ASSERT_OK(WriteFileAtomic(Env::Default(), root + "/file", "x"));
  EXPECT_EQ(ResolveCheckpointDir(roots, "file/s").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckptd::daemon
