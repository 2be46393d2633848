// Copyright 2026 The ckptd Authors.
//
// ckptctl list / status / cancel / wait: the operator commands that talk to
// a running daemon over its Unix socket (through libckptd_client).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/ckptctl.h"
#include "client/ckptd_client.h"
#include "client/info_json.h"
#include "common/absl_fmt.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ckptd::cli {
namespace {

using client::CheckpointInfo;
using client::Client;
using json = nlohmann::ordered_json;

std::string HumanBytes(uint64_t n) {
  if (n < 1024) return fmt::format("{} B", n);
  if (n < (1 << 20)) return fmt::format("{:.1f} KiB", n / 1024.0);
  if (n < (1ull << 30)) return fmt::format("{:.1f} MiB", n / 1048576.0);
  if (n < (1ull << 40)) return fmt::format("{:.2f} GiB", n / 1073741824.0);
  return fmt::format("{:.2f} TiB", n / 1099511627776.0);
}

std::string HumanDuration(absl::Duration d) {
  const int64_t s = absl::ToInt64Seconds(d);
  if (s < 0) return "-";
  if (s < 120) return fmt::format("{}s", s);
  if (s < 7200) return fmt::format("{}m", s / 60);
  if (s < 172800) return fmt::format("{}h", s / 3600);
  return fmt::format("{}d", s / 86400);
}

std::string Percent(uint64_t done, uint64_t total) {
  if (total == 0) return "-";
  return fmt::format("{:.1f}%", 100.0 * static_cast<double>(done) /
                                    static_cast<double>(total));
}

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
  options.control_timeout = absl::Seconds(30);
  return Client::Connect(options);
}

// Bytes done and expected of the checkpoint's current phase: staging
// (staged of total) until every rank staged, then writing (written of the
// data files' size, or of the data bytes while that is unknown).
std::pair<uint64_t, uint64_t> Progress(const CheckpointInfo& c) {
  if (c.state == "PENDING" || c.state == "STAGING") {
    return {c.staged_bytes, c.total_bytes};
  }
  const uint64_t total = c.file_bytes != 0 ? c.file_bytes : c.total_bytes;
  if (c.state == "COMMITTED") return {total, total};
  return {c.written_bytes, total};
}

std::string ProgressText(const CheckpointInfo& c) {
  const auto [done, total] = Progress(c);
  if (c.state == "COMMITTED") return HumanBytes(total);
  if (total == 0) return "-";
  const char* phase =
      c.state == "PENDING" || c.state == "STAGING" ? "staged" : "written";
  return fmt::format("{}/{} {} ({})", HumanBytes(done), HumanBytes(total),
                     phase, Percent(done, total));
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
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"ID", "JOB", "STATE", "PROGRESS", "AGE"});
  if (multi_node) rows.back().push_back("NODES");
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
  }
  PrintTable(rows);
  return kExitOk;
}

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
  if (args.daemon.json) {
    std::printf("%s\n", client::DumpJson(client::ToJson(*info), 2).c_str());
  } else {
    PrintStatus(*info);
  }
  return kExitOk;
}

int Cancel(const CancelArgs& args) {
  auto client = Connect(args.daemon);
  if (!client.ok())
    return ReportError(args.daemon, "cancel", client.status(),
                       kExitUnreachable);
  const absl::Status s = (*client)->Cancel(args.id, args.reason);
  if (!s.ok()) {
    return ReportError(args.daemon, "cancel " + args.id, s, ExitCodeFor(s));
  }
  if (args.daemon.json) {
    json j = {{"ok", true}, {"checkpoint_id", args.id}, {"state", "CANCELLED"}};
    std::printf("%s\n", client::DumpJson(j, 2).c_str());
  } else {
    std::printf("cancelled %s\n", args.id.c_str());
  }
  return kExitOk;
}

int Wait(const WaitArgs& args) {
  auto client = Connect(args.daemon);
  if (!client.ok())
    return ReportError(args.daemon, "wait", client.status(), kExitUnreachable);
  const absl::Duration timeout = args.timeout_seconds < 0
                                     ? absl::InfiniteDuration()
                                     : absl::Seconds(args.timeout_seconds);
  auto info = (*client)->Wait(args.id, timeout);
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

std::function<int()> AddDaemonCommands(CLI::App* app) {
  struct Parsed {
    std::string socket;  // the global --socket
    ListArgs list;
    StatusArgs status;
    CancelArgs cancel;
    WaitArgs wait;
    CLI::App* list_cmd = nullptr;
    CLI::App* status_cmd = nullptr;
    CLI::App* cancel_cmd = nullptr;
    CLI::App* wait_cmd = nullptr;
  };
  auto p = std::make_shared<Parsed>();
  const std::string socket_help =
      "the daemon's Unix socket (default: $CKPTD_SOCKET, else "
      "/run/ckptd/ckptd.sock)";
  app->add_option("--socket", p->socket, socket_help);
  auto add_common = [&](CLI::App* sub, DaemonArgs* d) {
    sub->add_option("--socket", d->socket, socket_help);
    sub->add_flag("--json", d->json, "machine-readable output");
  };

  p->list_cmd = app->add_subcommand(
      "list", "List the checkpoints the daemon knows, oldest first");
  add_common(p->list_cmd, &p->list.daemon);
  p->list_cmd->add_option("--job", p->list.job, "only checkpoints of this job");
  p->list_cmd->add_flag(
      "--include-disk", p->list.include_disk,
      "also committed checkpoints recorded by earlier daemon runs (still on disk)");

  p->status_cmd =
      app->add_subcommand("status", "Show a checkpoint's state and progress");
  add_common(p->status_cmd, &p->status.daemon);
  p->status_cmd->add_option("ID", p->status.id, "checkpoint id (directory)")
      ->required();

  p->cancel_cmd = app->add_subcommand(
      "cancel", "Cancel a checkpoint that has not committed");
  add_common(p->cancel_cmd, &p->cancel.daemon);
  p->cancel_cmd->add_option("ID", p->cancel.id, "checkpoint id (directory)")
      ->required();
  p->cancel_cmd->add_option("--reason", p->cancel.reason,
                            "recorded as the checkpoint's error");

  p->wait_cmd = app->add_subcommand("wait",
                                    "Wait until a checkpoint commits, fails or "
                                    "is cancelled (exit 0 only if committed)");
  add_common(p->wait_cmd, &p->wait.daemon);
  p->wait_cmd->add_option("ID", p->wait.id, "checkpoint id (directory)")
      ->required();
  p->wait_cmd
      ->add_option("--timeout", p->wait.timeout_seconds,
                   "give up after SECONDS (exit 5); default: no limit")
      ->check(CLI::Validator(
          [](std::string& v) -> std::string {
            char* end = nullptr;
            const double d = std::strtod(v.c_str(), &end);
            if (v.empty() || *end != '\0' || !(d >= 0)) {
              return "--timeout needs a number of seconds >= 0, got '" + v +
                     "'";
            }
            return "";
          },
          "SECONDS"));

  return [p]() -> int {
    auto socket = [&](DaemonArgs& d) {
      if (d.socket.empty()) d.socket = p->socket;
    };
    if (*p->list_cmd) {
      socket(p->list.daemon);
      return List(p->list);
    }
    if (*p->status_cmd) {
      socket(p->status.daemon);
      return Status(p->status);
    }
    if (*p->cancel_cmd) {
      socket(p->cancel.daemon);
      return Cancel(p->cancel);
    }
    if (*p->wait_cmd) {
      socket(p->wait.daemon);
      return Wait(p->wait);
    }
    return -1;
  };
}

}  // namespace ckptd::cli
