// Copyright 2026 The ckptd Authors.
//
// ckptctl list / status / cancel / wait: the operator commands that talk to
// a running daemon over its Unix socket (through libckptd_client). The
// progress formatting of `status` lives in cli/progress.h.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/ckptctl.h"
#include "cli/progress.h"
#include "client/ckptd_client.h"
#include "client/info_json.h"
#include "common/absl_fmt.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ckptd::cli {

using client::CheckpointInfo;
using client::Client;
using json = nlohmann::ordered_json;

// --- shared by the daemon commands (cli/ckptctl.h) -------------------------

std::string Timestamp(int64_t unix_ms) {
  if (unix_ms == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%E3S %Z",
                          absl::FromUnixMillis(unix_ms), absl::LocalTimeZone());
}

// Code name as absl prints it: "NOT_FOUND".
std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// Exit code of a daemon call that failed.
int ExitCodeFor(const absl::Status& s) {
  if (absl::IsUnavailable(s)) return kExitUnreachable;
  if (absl::IsNotFound(s)) return kExitNotFound;
  return kExitFailed;
}

int ReportError(const DaemonArgs& args, std::string_view what,
                const absl::Status& s, int rc) {
  if (args.json) {
    json j = {{"ok", false},
              {"code", CodeName(static_cast<int>(s.code()))},
              {"error", std::string(s.message())}};
    std::printf("%s\n", client::DumpJson(j, 2).c_str());
  } else {
    std::fprintf(stderr, "ckptctl: %.*s: %s\n", static_cast<int>(what.size()),
                 what.data(), std::string(s.message()).c_str());
  }
  return rc;
}

absl::StatusOr<std::unique_ptr<Client>> Connect(const DaemonArgs& args) {
  client::ClientOptions options;
  options.socket_path = args.socket;  // empty: DefaultSocketPath()
  options.owner = "ckptctl";
  options.control_timeout = absl::Seconds(args.rpc_timeout_seconds);
  return Client::Connect(options);
}

void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t k = 0; k < row.size(); ++k) {
      width[k] = std::max(width[k], row[k].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t k = 0; k < row.size(); ++k) {
      line += row[k];
      if (k + 1 < row.size()) line.append(width[k] - row[k].size() + 2, ' ');
    }
    std::printf("%s\n", line.c_str());
  }
}

namespace {

// "1.0 GiB/2.0 GiB written (50.0%)" (cli/progress.h: ProgressOf).
// "held at node 4 (10.0.0.3:7070) held; holds node 2 (10.0.0.1:7070)":
// where this node's share is held, and whose shares it holds.
std::string ReplicasText(const CheckpointInfo& c) {
  std::vector<std::string> parts;
  if (!c.replica_holders.empty()) {
    parts.push_back("at " +
                    fmt::format("{}", fmt::join(c.replica_holders, ", ")));
  }
  if (!c.replicas_held.empty()) {
    parts.push_back("holds " +
                    fmt::format("{}", fmt::join(c.replicas_held, ", ")));
  }
  return parts.empty() ? "-" : fmt::format("{}", fmt::join(parts, "; "));
}

std::string ProgressText(const CheckpointInfo& c) {
  const PhaseProgress p = ProgressOf(c);
  if (c.state == "COMMITTED") return HumanBytes(p.total);
  if (p.total == 0) return "-";
  const char* what = p.phase == Phase::kStaging ? "staged" : "written";
  return fmt::format("{}/{} {} ({})", HumanBytes(p.done), HumanBytes(p.total),
                     what, Percent(p.done, p.total));
}

// Multi-node checkpoints: "3 (planned 3, prepared 2), coordinator HOST:PORT"
// or "..., coordinator (this node)".
std::string NodesText(const CheckpointInfo& c) {
  std::string coordinator = c.is_coordinator
                                ? "(this node)"
                                : (c.coordinator.empty() ? "-" : c.coordinator);
  return fmt::format("{} (planned {}, prepared {}), coordinator {}",
                     c.num_nodes, c.nodes_planned, c.nodes_prepared,
                     coordinator);
}

// This node's part of a multi-node checkpoint: "2 ranks, 1.0 GiB of 2.0 GiB
// written (50.0%)".
std::string LocalText(const CheckpointInfo& c) {
  return fmt::format("{} rank{}, {} of {} written ({})", c.local_ranks,
                     c.local_ranks == 1 ? "" : "s",
                     HumanBytes(c.local_written_bytes),
                     HumanBytes(c.local_total_bytes),
                     Percent(c.local_written_bytes, c.local_total_bytes));
}

void PrintStatus(const CheckpointInfo& c) {
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"checkpoint", c.checkpoint_id});
  rows.push_back({"job", c.job.empty() ? "-" : c.job});
  rows.push_back({"state", c.state});
  rows.push_back(
      {"ranks", fmt::format("{}/{} staged", c.ranks_staged, c.world_size)});
  if (c.num_nodes > 1) rows.push_back({"nodes", NodesText(c)});
  rows.push_back(
      {"staged", fmt::format("{} of {} ({})", HumanBytes(c.staged_bytes),
                             HumanBytes(c.total_bytes),
                             Percent(c.staged_bytes, c.total_bytes))});
  const uint64_t file_total = c.file_bytes != 0 ? c.file_bytes : c.total_bytes;
  rows.push_back(
      {"written", fmt::format("{} of {} ({})", HumanBytes(c.written_bytes),
                              HumanBytes(file_total),
                              Percent(c.written_bytes, file_total))});
  if (c.num_nodes > 1) rows.push_back({"local", LocalText(c)});
  // Rate and ETA of a checkpoint that is moving: the phase's average so far
  // (`status --follow` shows the rate over the last seconds).
  const ProgressView v = MakeProgressView(c, std::nullopt, now);
  if (v.rate.has_value()) {
    rows.push_back({"rate", fmt::format("{} ({} average)", HumanRate(v.rate),
                                        PhaseName(v.progress.phase))});
    rows.push_back({"eta", FormatEta(v.eta_seconds)});
  }
  rows.push_back({"items", fmt::format("{}", c.items)});
  rows.push_back({"files", fmt::format("{}", c.files)});
  std::string created = Timestamp(c.created_unix_ms);
  if (c.created_unix_ms != 0) {
    created += fmt::format(
        " ({} ago)",
        HumanDuration(now - absl::FromUnixMillis(c.created_unix_ms)));
  }
  rows.push_back({"created", created});
  auto since_created = [&](int64_t ms) {
    std::string s = Timestamp(ms);
    if (ms != 0 && c.created_unix_ms != 0) {
      s += fmt::format(" (+{:.3f}s)", (ms - c.created_unix_ms) / 1000.0);
    }
    return s;
  };
  rows.push_back({"staged at", since_created(c.staged_unix_ms)});
  rows.push_back({"finished", since_created(c.finished_unix_ms)});
  if (!c.error.empty() || c.error_code != 0) {
    rows.push_back(
        {"error", fmt::format("{} ({})", c.error.empty() ? "-" : c.error,
                              CodeName(c.error_code))});
  }
  PrintTable(rows);
}

}  // namespace

int List(const ListArgs& args) {
  auto client = Connect(args.daemon);
  if (!client.ok())
    return ReportError(args.daemon, "list", client.status(), kExitUnreachable);
  auto list = (*client)->List(args.job, args.include_disk);
  if (!list.ok()) {
    return ReportError(args.daemon, "list", list.status(),
                       ExitCodeFor(list.status()));
  }
  if (args.daemon.json) {
    json j = json::array();
    for (const auto& c : *list) j.push_back(client::ToJson(c));
    std::printf("%s\n", client::DumpJson(j, 2).c_str());
    return kExitOk;
  }
  if (list->empty()) {
    std::printf(
        "no checkpoints%s\n",
        args.job.empty() ? "" : fmt::format(" of job {}", args.job).c_str());
    return kExitOk;
  }
  const absl::Time now = absl::Now();
  // A NODES column ("prepared/nodes") only when some checkpoint spans
  // several nodes.
  const bool multi_node =
      std::any_of(list->begin(), list->end(),
                  [](const CheckpointInfo& c) { return c.num_nodes > 1; });
  // An IN MEMORY column only when the memory tier holds some checkpoint.
  const bool tier = std::any_of(
      list->begin(), list->end(),
      [](const CheckpointInfo& c) { return c.memory_tier_bytes > 0; });
  // A REPLICAS column only when some checkpoint has peer replicas.
  const bool replicas =
      std::any_of(list->begin(), list->end(), [](const CheckpointInfo& c) {
        return !c.replica_holders.empty() || !c.replicas_held.empty();
      });
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"ID", "JOB", "STATE", "PROGRESS", "AGE"});
  if (multi_node) rows.back().push_back("NODES");
  if (tier) rows.back().push_back("IN MEMORY");
  if (replicas) rows.back().push_back("REPLICAS");
  for (const auto& c : *list) {
    rows.push_back(
        {c.checkpoint_id, c.job.empty() ? "-" : c.job, c.state, ProgressText(c),
         c.created_unix_ms == 0
             ? "-"
             : HumanDuration(now - absl::FromUnixMillis(c.created_unix_ms))});
    if (multi_node) {
      rows.back().push_back(
          c.num_nodes > 1
              ? fmt::format("{}/{} prepared{}", c.nodes_prepared, c.num_nodes,
                            c.is_coordinator ? " (coordinator)" : "")
              : "-");
    }
    if (tier) {
      rows.back().push_back(
          c.memory_tier_bytes > 0 ? HumanBytes(c.memory_tier_bytes) : "-");
    }
    if (replicas) rows.back().push_back(ReplicasText(c));
  }
  PrintTable(rows);
  return kExitOk;
}

namespace {

// --- status --follow ------------------------------------------------------

// What the SIGINT/SIGTERM handler needs to restore the terminal: a progress
// line is drawn without its newline.
volatile sig_atomic_t g_line_open = 0;

extern "C" void OnInterrupt(int sig) {
  // Only async-signal-safe calls: end the open line, then exit.
  if (g_line_open != 0) {
    const ssize_t n = ::write(STDOUT_FILENO, "\n", 1);
    (void)n;
  }
  ::_exit(128 + sig);
}

// Blocks SIGINT and SIGTERM while it lives, so that the handler never cuts
// a line in half.
class ScopedBlockInterrupts {
 public:
  ScopedBlockInterrupts() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    ::sigprocmask(SIG_BLOCK, &set, &old_);
  }
  ~ScopedBlockInterrupts() { ::sigprocmask(SIG_SETMASK, &old_, nullptr); }
  ScopedBlockInterrupts(const ScopedBlockInterrupts&) = delete;
  ScopedBlockInterrupts& operator=(const ScopedBlockInterrupts&) = delete;

 private:
  sigset_t old_;
};

void InstallInterruptHandlers() {
  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

enum class FollowMode { kTerminal, kPlain, kJson };

// Draws one observation. Returns nothing; remembers what the plain mode
// printed last so that it prints only changes.
class FollowPrinter {
 public:
  explicit FollowPrinter(FollowMode mode) : mode_(mode) {}

  void Show(const ProgressView& v) {
    ScopedBlockInterrupts block;
    switch (mode_) {
      case FollowMode::kTerminal: {
        const std::string line =
            FormatTerminalLine(v, TerminalColumns(STDOUT_FILENO));
        // Carriage return, the line, clear to the end of the line.
        std::printf("\r%s\x1b[K", line.c_str());
        g_line_open = 1;
        break;
      }
      case FollowMode::kPlain: {
        const std::string key = ChangeKey(v.info);
        if (key == last_key_) return;
        last_key_ = key;
        std::printf("%s\n", FormatProgressLine(v).c_str());
        break;
      }
      case FollowMode::kJson:
        std::printf("%s\n", client::DumpJson(ProgressJson(v), -1).c_str());
        break;
    }
    std::fflush(stdout);
  }

  // Ends the terminal's open line (before any other output).
  void EndLine() {
    ScopedBlockInterrupts block;
    if (g_line_open != 0) {
      std::printf("\n");
      std::fflush(stdout);
      g_line_open = 0;
    }
  }

 private:
  // What makes the plain mode print a new line: the state and the counters
  // (not the rate and ETA, which move on every poll).
  static std::string ChangeKey(const CheckpointInfo& c) {
    return fmt::format("{} {} {} {} {} {} {} {} {}", c.state, c.staged_bytes,
                       c.written_bytes, c.file_bytes, c.total_bytes,
                       c.ranks_staged, c.world_size, c.nodes_planned,
                       c.nodes_prepared);
  }

  FollowMode mode_;
  std::string last_key_;
};

int Follow(Client& client, const StatusArgs& args, CheckpointInfo info) {
  const FollowMode mode = args.daemon.json               ? FollowMode::kJson
                          : ::isatty(STDOUT_FILENO) != 0 ? FollowMode::kTerminal
                                                         : FollowMode::kPlain;
  InstallInterruptHandlers();
  FollowPrinter printer(mode);
  RateWindow window(absl::Seconds(5));
  const absl::Duration interval = absl::Seconds(args.interval_seconds);
  const absl::Time start = absl::Now();
  const absl::Time deadline = args.timeout_seconds < 0
                                  ? absl::InfiniteFuture()
                                  : start + absl::Seconds(args.timeout_seconds);
  while (true) {
    const absl::Time now = absl::Now();
    const PhaseProgress p = ProgressOf(info);
    window.Add(now, p.phase, p.done);
    const std::optional<double> rate =
        window.size() >= 2 ? window.Rate() : std::nullopt;
    printer.Show(MakeProgressView(info, rate, now));
    if (info.is_final()) break;
    if (now >= deadline) {
      printer.EndLine();
      std::fprintf(stderr,
                   "ckptctl: status %s: still %s after %gs (--timeout)\n",
                   args.id.c_str(), info.state.c_str(), args.timeout_seconds);
      return kExitTimeout;
    }
    absl::SleepFor(std::min(interval, deadline - now));
    auto next = client.GetStatus(args.id);
    if (!next.ok()) {
      printer.EndLine();
      // A follower's errors are not JSON Lines of progress: stderr always.
      std::fprintf(stderr, "ckptctl: status %s: %s\n", args.id.c_str(),
                   std::string(next.status().message()).c_str());
      return ExitCodeFor(next.status());
    }
    info = *std::move(next);
  }
  printer.EndLine();
  if (info.state == "COMMITTED") return kExitOk;
  std::fprintf(stderr, "ckptctl: checkpoint %s %s: %s (%s)\n",
               info.checkpoint_id.c_str(),
               info.state == "CANCELLED" ? "was cancelled" : "failed",
               info.error.empty() ? "no reason given" : info.error.c_str(),
               CodeName(info.error_code).c_str());
  return kExitCheckpointFailed;
}

}  // namespace

int Status(const StatusArgs& args) {
  auto client = Connect(args.daemon);
  if (!client.ok())
    return ReportError(args.daemon, "status", client.status(),
                       kExitUnreachable);
  auto info = (*client)->GetStatus(args.id);
  if (!info.ok()) {
    return ReportError(args.daemon, "status " + args.id, info.status(),
                       ExitCodeFor(info.status()));
  }
  if (args.follow) return Follow(**client, args, *std::move(info));
  if (args.daemon.json) {
    const ProgressView v = MakeProgressView(*info, std::nullopt, absl::Now());
    std::printf("%s\n", client::DumpJson(ProgressJson(v), 2).c_str());
  } else {
    PrintStatus(*info);
  }
  return kExitOk;
}

namespace {

// What a cancel came to: the checkpoint's state after it, and whether this
// node only forwarded it to the coordinator.
struct CancelOutcome {
  CheckpointInfo info;
  bool forwarded = false;
  bool timed_out = false;   // the forwarded cancel's --timeout passed
  std::string coordinator;  // "(unknown)" when the daemon names none
};

// Prints that this node forwarded the cancel (human output only).
void PrintForwarded(const CancelArgs& args, const CancelOutcome& o) {
  if (args.daemon.json) return;
  std::printf(
      "cancel of %s forwarded to the coordinator %s (this node had "
      "prepared: its part is durable and waits for the coordinator's "
      "decision)\n",
      args.id.c_str(), o.coordinator.c_str());
  std::fflush(stdout);
}

// Waits up to --timeout for the coordinator's decision on a forwarded
// cancel: o.info becomes the final state, or the latest one with
// o.timed_out set. Returns the error of a wait that failed otherwise.
absl::Status AwaitDecision(Client& client, const CancelArgs& args,
                           CancelOutcome& o) {
  auto done = client.Wait(args.id, absl::Seconds(args.timeout_seconds));
  if (done.ok()) {
    o.info = *std::move(done);
  } else if (absl::IsDeadlineExceeded(done.status())) {
    o.timed_out = true;
    if (auto now = client.GetStatus(args.id); now.ok()) o.info = *now;
  } else {
    return done.status();
  }
  return absl::OkStatus();
}

// Prints the outcome (a JSON object with --json) and returns the exit code.
int ReportCancel(const CancelArgs& args, const CancelOutcome& o) {
  const CheckpointInfo& info = o.info;
  int rc = kExitOk;
  if (o.timed_out) {
    rc = kExitTimeout;
  } else if (info.state == "COMMITTED") {
    rc = kExitFailed;
  }
  if (args.daemon.json) {
    json j = {{"ok", rc == kExitOk},
              {"checkpoint_id", info.checkpoint_id},
              {"state", info.state},
              {"forwarded", o.forwarded},
              {"coordinator", info.coordinator},
              {"error", info.error}};
    std::printf("%s\n", client::DumpJson(j, 2).c_str());
    return rc;
  }
  if (o.timed_out) {
    std::printf("%s is still %s after %gs; the coordinator %s decides\n",
                info.checkpoint_id.c_str(), info.state.c_str(),
                args.timeout_seconds, o.coordinator.c_str());
  } else if (info.state == "CANCELLED") {
    std::printf(
        "cancelled %s%s\n", args.id.c_str(),
        o.forwarded
            ? fmt::format(" (by the coordinator {})", o.coordinator).c_str()
            : "");
  } else if (info.state == "COMMITTED") {
    std::printf(
        "%s COMMITTED: the coordinator %s committed it before the "
        "cancel arrived\n",
        info.checkpoint_id.c_str(), o.coordinator.c_str());
  } else {
    // FAILED: aborted, though not (only) by this cancel.
    std::printf("%s %s: %s\n", info.checkpoint_id.c_str(), info.state.c_str(),
                info.error.empty() ? "no reason given" : info.error.c_str());
  }
  return rc;
}

}  // namespace

int Cancel(const CancelArgs& args) {
  auto client = Connect(args.daemon);
  if (!client.ok())
    return ReportError(args.daemon, "cancel", client.status(),
                       kExitUnreachable);
  // Before: a node of a multi-node checkpoint whose part is written and
  // that is COMMITTING either refuses the cancel (not prepared yet) or
  // forwards it (prepared).
  const absl::StatusOr<CheckpointInfo> before = (*client)->GetStatus(args.id);
  const absl::Status s = (*client)->Cancel(args.id, args.reason);
  if (!s.ok()) {
    return ReportError(args.daemon, "cancel " + args.id, s, ExitCodeFor(s));
  }
  // The daemon cancels on the spot (the state is CANCELLED now) unless this
  // node already prepared its part of a multi-node checkpoint: then it only
  // forwards the cancel to the coordinator, which decides (the checkpoint
  // may even have committed already), and the state is not final yet.
  auto info = (*client)->GetStatus(args.id);
  if (!info.ok()) {
    return ReportError(args.daemon,
                       "cancel " + args.id +
                           ": the daemon accepted the cancel "
                           "but then reported",
                       info.status(), ExitCodeFor(info.status()));
  }
  CancelOutcome o;
  o.info = *std::move(info);
  // Forwarded: the cancel was accepted while this node was COMMITTING (it
  // had prepared), or the state is still not final. (The coordinator may
  // decide before the GetStatus above: then only the first tells.)
  o.forwarded = !o.info.is_final() ||
                (before.ok() && before->num_nodes > 1 &&
                 !before->is_coordinator && before->state == "COMMITTING");
  o.coordinator = o.info.coordinator.empty() ? "(unknown)" : o.info.coordinator;
  if (o.forwarded) PrintForwarded(args, o);
  if (o.forwarded && !o.info.is_final()) {
    if (absl::Status w = AwaitDecision(**client, args, o); !w.ok()) {
      return ReportError(args.daemon, "cancel " + args.id + ": waiting", w,
                         ExitCodeFor(w));
    }
  }
  return ReportCancel(args, o);
}

int Wait(const WaitArgs& args) {
  auto client = Connect(args.daemon);
  if (!client.ok())
    return ReportError(args.daemon, "wait", client.status(), kExitUnreachable);
  const absl::Duration timeout = args.timeout_seconds < 0
                                     ? absl::InfiniteDuration()
                                     : absl::Seconds(args.timeout_seconds);
  // Client::Wait with no end issues Wait calls forever, also to a daemon
  // that no longer answers (each call ends in DEADLINE_EXCEEDED, the next
  // one starts). So wait in slices of --rpc-timeout and, between two,
  // ask GetStatus (itself bounded by --rpc-timeout): a daemon that does
  // not answer it ends the wait with the checkpoint and the socket named.
  const absl::Time end = absl::Now() + timeout;  // InfiniteFuture for no limit
  const absl::Duration slice = absl::Seconds(args.daemon.rpc_timeout_seconds);
  absl::StatusOr<CheckpointInfo> info;
  while (true) {
    info = (*client)->Wait(args.id, std::max(std::min(slice, end - absl::Now()),
                                             absl::ZeroDuration()));
    if (info.ok() || !absl::IsDeadlineExceeded(info.status()) ||
        absl::Now() >= end)
      break;
    auto now = (*client)->GetStatus(args.id);
    if (now.ok() && now->is_final()) {
      info = *std::move(now);
      break;
    }
    if (!now.ok()) {
      const std::string socket = args.daemon.socket.empty()
                                     ? client::DefaultSocketPath()
                                     : args.daemon.socket;
      const absl::Status s(
          now.status().code(),
          fmt::format("the daemon at {} stopped answering while waiting for "
                      "checkpoint {} "
                      "(GetStatus within --rpc-timeout {}s: {})",
                      socket, args.id, args.daemon.rpc_timeout_seconds,
                      std::string(now.status().message())));
      return ReportError(
          args.daemon, "wait " + args.id, s,
          absl::IsDeadlineExceeded(s) ? kExitUnreachable : ExitCodeFor(s));
    }
  }
  if (!info.ok()) {
    const int rc = absl::IsDeadlineExceeded(info.status())
                       ? kExitTimeout
                       : ExitCodeFor(info.status());
    return ReportError(args.daemon, "wait " + args.id, info.status(), rc);
  }
  const int rc = info->state == "COMMITTED" ? kExitOk : kExitFailed;
  if (args.daemon.json) {
    std::printf("%s\n", client::DumpJson(client::ToJson(*info), 2).c_str());
  } else if (rc == kExitOk) {
    std::string took;
    if (info->finished_unix_ms != 0 && info->created_unix_ms != 0) {
      took = fmt::format(
          " in {:.2f}s",
          (info->finished_unix_ms - info->created_unix_ms) / 1000.0);
    }
    std::printf(
        "%s %s (%s%s)\n", info->checkpoint_id.c_str(), info->state.c_str(),
        HumanBytes(info->file_bytes != 0 ? info->file_bytes : info->total_bytes)
            .c_str(),
        took.c_str());
  } else {
    std::printf("%s %s\n", info->checkpoint_id.c_str(), info->state.c_str());
    std::fflush(stdout);
    std::fprintf(stderr, "ckptctl: checkpoint %s %s: %s (%s)\n",
                 info->checkpoint_id.c_str(),
                 info->state == "CANCELLED" ? "was cancelled" : "failed",
                 info->error.empty() ? "no reason given" : info->error.c_str(),
                 CodeName(info->error_code).c_str());
  }
  return rc;
}

namespace {

// A number of seconds >= `min`.
CLI::Validator SecondsValidator(std::string flag, double min) {
  return CLI::Validator(
      [flag, min](std::string& v) -> std::string {
        char* end = nullptr;
        const double d = std::strtod(v.c_str(), &end);
        if (v.empty() || *end != '\0' || !(d >= min) || !std::isfinite(d)) {
          return fmt::format("{} needs a number of seconds >= {}, got '{}'",
                             flag, min, v);
        }
        return "";
      },
      "SECONDS");
}

constexpr const char* kSocketHelp =
    "the daemon's Unix socket (default: $CKPTD_SOCKET, else "
    "/run/ckptd/ckptd.sock)";

// What the daemon commands parse into, and which of them was chosen.
struct DaemonCommands {
  std::string socket;  // the global --socket
  ListArgs list;
  StatusArgs status;
  CancelArgs cancel;
  WaitArgs wait;
  RestoresArgs restores;
  CancelRestoreArgs cancel_restore;
  CLI::App* list_cmd = nullptr;
  CLI::App* status_cmd = nullptr;
  CLI::App* cancel_cmd = nullptr;
  CLI::App* wait_cmd = nullptr;
  CLI::App* restores_cmd = nullptr;
  CLI::App* cancel_restore_cmd = nullptr;
};

// Adds the options every daemon command has (--socket, --json,
// --rpc-timeout) to `sub`, parsing into `d`.
void AddCommonOptions(CLI::App* sub, DaemonArgs* d) {
  sub->add_option("--socket", d->socket, kSocketHelp);
  sub->add_flag("--json", d->json, "machine-readable output");
  sub->add_option("--rpc-timeout", d->rpc_timeout_seconds,
                  "deadline in SECONDS of each call to the daemon (default "
                  "30); a daemon "
                  "that does not answer within it ends the command (exit 3)")
      ->check(SecondsValidator("--rpc-timeout", 0.001));
}

// Adds `list`.
void AddListCommand(CLI::App* app, DaemonCommands* p) {
  p->list_cmd = app->add_subcommand(
      "list", "List the checkpoints the daemon knows, oldest first");
  AddCommonOptions(p->list_cmd, &p->list.daemon);
  p->list_cmd->add_option("--job", p->list.job, "only checkpoints of this job");
  p->list_cmd->add_flag("--include-disk", p->list.include_disk,
                        "also committed checkpoints recorded by earlier daemon "
                        "runs (still on disk)");
}

// Adds `status ID` with --follow and its --interval and --timeout.
void AddStatusCommand(CLI::App* app, DaemonCommands* p) {
  p->status_cmd =
      app->add_subcommand("status", "Show a checkpoint's state and progress");
  AddCommonOptions(p->status_cmd, &p->status.daemon);
  p->status_cmd->add_option("ID", p->status.id, "checkpoint id (directory)")
      ->required();
  CLI::Option* follow = p->status_cmd->add_flag(
      "-f,--follow,--watch", p->status.follow,
      "poll until the checkpoint is final, showing live progress (a redrawn "
      "line with a bar on a terminal, a line per change otherwise, a JSON "
      "object per poll with --json); exit 0 if it committed, 6 if it failed "
      "or was cancelled");
  p->status_cmd
      ->add_option("--interval", p->status.interval_seconds,
                   "--follow: seconds between polls (default 0.5)")
      ->check(SecondsValidator("--interval", 0.05))
      ->needs(follow);
  p->status_cmd
      ->add_option("--timeout", p->status.timeout_seconds,
                   "--follow: give up after SECONDS (exit 5); default: no "
                   "limit")
      ->check(SecondsValidator("--timeout", 0))
      ->needs(follow);
}

// Adds `cancel ID`.
void AddCancelCommand(CLI::App* app, DaemonCommands* p) {
  p->cancel_cmd = app->add_subcommand(
      "cancel", "Cancel a checkpoint that has not committed");
  AddCommonOptions(p->cancel_cmd, &p->cancel.daemon);
  p->cancel_cmd->add_option("ID", p->cancel.id, "checkpoint id (directory)")
      ->required();
  p->cancel_cmd->add_option("--reason", p->cancel.reason,
                            "recorded as the checkpoint's error");
  p->cancel_cmd
      ->add_option("--timeout", p->cancel.timeout_seconds,
                   "when this node forwarded the cancel to the coordinator "
                   "(multi-node, this node already prepared): seconds to wait "
                   "for the final state (default 10; then exit 5)")
      ->check(SecondsValidator("--timeout", 0));
}

// Adds `restores [ID]` and `cancel-restore ID` (cli/ckptctl_restores.cc).
void AddRestoreCommands(CLI::App* app, DaemonCommands* p) {
  p->restores_cmd = app->add_subcommand(
      "restores",
      "List the restores the daemon serves with their progress (running "
      "first, then the newest ended ones); one in detail with ID");
  AddCommonOptions(p->restores_cmd, &p->restores.daemon);
  p->restores_cmd->add_option("ID", p->restores.id, "restore id (r<n>)");

  p->cancel_restore_cmd = app->add_subcommand(
      "cancel-restore",
      "Cancel a running restore: its ranks' loads fail with CANCELLED");
  AddCommonOptions(p->cancel_restore_cmd, &p->cancel_restore.daemon);
  p->cancel_restore_cmd
      ->add_option("ID", p->cancel_restore.id, "restore id (r<n>)")
      ->required();
  p->cancel_restore_cmd->add_option("--reason", p->cancel_restore.reason,
                                    "told to the ranks and recorded");
}

// Adds `wait ID`.
void AddWaitCommand(CLI::App* app, DaemonCommands* p) {
  p->wait_cmd = app->add_subcommand("wait",
                                    "Wait until a checkpoint commits, fails or "
                                    "is cancelled (exit 0 only if committed)");
  AddCommonOptions(p->wait_cmd, &p->wait.daemon);
  p->wait_cmd->add_option("ID", p->wait.id, "checkpoint id (directory)")
      ->required();
  p->wait_cmd
      ->add_option("--timeout", p->wait.timeout_seconds,
                   "give up after SECONDS (exit 5); default: no limit")
      ->check(SecondsValidator("--timeout", 0));
}

// Runs the daemon command that was chosen (its --socket defaulting to the
// global one) and returns its exit code, or -1 if none was.
int RunChosen(DaemonCommands& p) {
  auto socket = [&](DaemonArgs& d) {
    if (d.socket.empty()) d.socket = p.socket;
  };
  if (*p.list_cmd) {
    socket(p.list.daemon);
    return List(p.list);
  }
  if (*p.status_cmd) {
    socket(p.status.daemon);
    return Status(p.status);
  }
  if (*p.cancel_cmd) {
    socket(p.cancel.daemon);
    return Cancel(p.cancel);
  }
  if (*p.wait_cmd) {
    socket(p.wait.daemon);
    return Wait(p.wait);
  }
  if (*p.restores_cmd) {
    socket(p.restores.daemon);
    return Restores(p.restores);
  }
  if (*p.cancel_restore_cmd) {
    socket(p.cancel_restore.daemon);
    return CancelRestore(p.cancel_restore);
  }
  return -1;
}

}  // namespace

std::function<int()> AddDaemonCommands(CLI::App* app) {
  auto p = std::make_shared<DaemonCommands>();
  app->add_option("--socket", p->socket, kSocketHelp);
  AddListCommand(app, p.get());
  AddStatusCommand(app, p.get());
  AddCancelCommand(app, p.get());
  AddRestoreCommands(app, p.get());
  AddWaitCommand(app, p.get());
  return [p]() -> int { return RunChosen(*p); };
}

}  // namespace ckptd::cli
