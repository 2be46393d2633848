// Copyright 2026 The ckptd Authors.
//
// ckptctl subcommands. Exit codes (documented in docs/cli.md):
//   Format commands (inspect, verify, convert):
//     0 success; 1 the checkpoint is invalid or the operation failed;
//     2 usage error; 3 the checkpoint could not be read at all (no such
//     directory, I/O error).
//   Daemon commands (list, status, cancel, wait; cli/ckptctl_daemon.cc;
//   restores, cancel-restore: cli/ckptctl_restores.cc):
//     0 success (wait, status --follow: the checkpoint committed; cancel:
//     the checkpoint ended CANCELLED or FAILED); 1 the checkpoint failed or
//     was cancelled (wait), or the daemon refused the request (e.g. cancel
//     of a committed checkpoint), or a forwarded cancel ended COMMITTED;
//     2 usage error; 3 the daemon is unreachable; 4 no such checkpoint;
//     5 wait / status --follow / a forwarded cancel: the timeout passed
//     before the checkpoint finished; 6 status --follow: the checkpoint
//     ended FAILED or CANCELLED; 130 (128 + signal) interrupted.
#ifndef CKPTD_CLI_CKPTCTL_H_
#define CKPTD_CLI_CKPTCTL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace CLI {
class App;
}  // namespace CLI

namespace ckptd::client {
class Client;
}  // namespace ckptd::client

namespace ckptd::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitInvalid = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreadable = 3;
// Daemon commands.
inline constexpr int kExitFailed = 1;       // failed / cancelled / refused
inline constexpr int kExitUnreachable = 3;  // no daemon at the socket
inline constexpr int kExitNotFound = 4;     // unknown checkpoint
inline constexpr int kExitTimeout = 5;      // wait --timeout passed
// status --follow: the checkpoint ended FAILED or CANCELLED.
inline constexpr int kExitCheckpointFailed = 6;

struct InspectArgs {
  std::string dir;
  bool json = false;
  bool chunks = false;  // list every chunk (human output)
};
int Inspect(const InspectArgs& args);

struct VerifyArgs {
  std::string dir;
  bool json = false;
  bool no_crc = false;
  bool allow_unsafe_globals =
      false;  // unsafe pickle globals: notes, not errors
};
int Verify(const VerifyArgs& args);

struct ConvertArgs {
  std::string dir;
  std::string out;
  bool overwrite = false;
  bool no_verify_crc = false;
  bool allow_unsafe_globals = false;
  std::string format = "torch_save";  // or "safetensors"
  // --format safetensors only:
  std::string max_shard_size;     // "5GB"; empty: 5GB
  std::string dtype;              // "bf16", "fp16", "fp32"; empty: as saved
  std::vector<std::string> only;  // fqn prefixes to keep
  std::string strip;              // prefix removed from names
};
int Convert(const ConvertArgs& args);

struct ImportArgs {
  std::string file;
  std::string dir;
  bool overwrite = false;
  bool no_verify_crc = false;
};
int Import(const ImportArgs& args);

// Options every daemon command has.
struct DaemonArgs {
  // Unix socket of the daemon; empty: $CKPTD_SOCKET, else
  // /run/ckptd/ckptd.sock.
  std::string socket;
  bool json = false;
  // Deadline of each call to the daemon (--rpc-timeout); a daemon that
  // does not answer within it ends the command (exit 3), and `wait` asks
  // GetStatus once per this much time (docs/waits.md).
  double rpc_timeout_seconds = 30;
};

// ckptctl gc ROOT (cli/ckptctl_gc.cc).
struct GcArgs {
  std::string root;
  int keep_last = 0;   // 0: no retention, only unfinished directories
  int keep_every = 0;  // with keep_last: also keep steps divisible by it
  std::string min_age = "1h";  // unfinished directories untouched this long
  bool dry_run = false;
  DaemonArgs daemon;  // asked which checkpoints are in progress; json
};
int Gc(const GcArgs& args);

struct ListArgs {
  DaemonArgs daemon;
  std::string job;  // empty: all jobs
  bool include_disk = false;
};
int List(const ListArgs& args);

struct StatusArgs {
  DaemonArgs daemon;
  std::string id;
  // --follow: poll GetStatus every `interval_seconds` until the checkpoint
  // is final, showing live progress (a redrawn line with a bar on a
  // terminal; a plain line per change otherwise; a JSON object per poll
  // with --json).
  bool follow = false;
  double interval_seconds = 0.5;
  double timeout_seconds = -1;  // --follow: < 0: no limit
};
int Status(const StatusArgs& args);

struct CancelArgs {
  DaemonArgs daemon;
  std::string id;
  std::string reason;
  // A node that already prepared its part of a multi-node checkpoint
  // forwards the cancel to the coordinator, which decides: wait this long
  // for the final state.
  double timeout_seconds = 10;
};
int Cancel(const CancelArgs& args);

struct WaitArgs {
  DaemonArgs daemon;
  std::string id;
  double timeout_seconds = -1;  // < 0: no limit
};
int Wait(const WaitArgs& args);

// `ckptctl restores [ID]`: the restores the daemon serves with their
// progress (one in detail with ID); cli/ckptctl_restores.cc.
struct RestoresArgs {
  DaemonArgs daemon;
  std::string id;  // empty: all
};
int Restores(const RestoresArgs& args);

// `ckptctl cancel-restore ID`: its ranks' batches answered CANCELLED.
struct CancelRestoreArgs {
  DaemonArgs daemon;
  std::string id;
  std::string reason;
};
int CancelRestore(const CancelRestoreArgs& args);

// Shared by the daemon commands (cli/ckptctl_daemon.cc).
// "2026-11-26 20:15:33.123 UTC"; "-" for 0.
std::string Timestamp(int64_t unix_ms);
// A status code's name: "NOT_FOUND".
std::string CodeName(int code);
// Exit code of a daemon call that failed: 3 unreachable, 4 not found, else 1.
int ExitCodeFor(const absl::Status& s);
// Prints the error (a JSON object with --json) and returns `rc`.
int ReportError(const DaemonArgs& args, std::string_view what,
                const absl::Status& s, int rc);
absl::StatusOr<std::unique_ptr<client::Client>> Connect(const DaemonArgs& args);
// Rows of cells in aligned columns.
void PrintTable(const std::vector<std::vector<std::string>>& rows);

// Adds the daemon commands (list, status, cancel, wait) and a global
// --socket option to `app`. After app.parse(), the returned function runs
// the daemon command that was chosen and returns its exit code, or -1 if
// none was.
std::function<int()> AddDaemonCommands(CLI::App* app);

// The exit-code table, for --help.
inline constexpr const char* kExitCodeHelp =
    "Exit codes:\n"
    "  inspect, verify, convert:\n"
    "    0 ok; 1 invalid checkpoint or failure; 2 usage;\n"
    "    3 checkpoint unreadable\n"
    "  list, status, cancel, wait:\n"
    "    0 ok (wait, status --follow: committed; cancel: the checkpoint\n"
    "    ended CANCELLED or FAILED); 1 checkpoint failed or cancelled\n"
    "    (wait), or the daemon refused (e.g. cancel of a committed\n"
    "    checkpoint), or a forwarded cancel ended COMMITTED; 2 usage;\n"
    "    3 daemon unreachable; 4 no such checkpoint; 5 wait, status\n"
    "    --follow or a forwarded cancel timed out; 6 status --follow:\n"
    "    the checkpoint FAILED or was CANCELLED; 130 interrupted (Ctrl-C)\n";

}  // namespace ckptd::cli

#endif  // CKPTD_CLI_CKPTCTL_H_
