// Copyright 2026 The ckptd Authors.
//
// ckptctl restores / cancel-restore: the restores a daemon serves
// (ListRestores, CancelRestore; daemon/restore/restore_progress.h).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/ckptctl.h"
#include "cli/progress.h"
#include "client/ckptd_client.h"
#include "client/info_json.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ckptd::cli {
namespace {

using client::RestoreProgress;
using json = nlohmann::ordered_json;

json ToJson(const RestoreProgress& r) {
  return json{{"id", r.id},
              {"checkpoint_id", r.checkpoint_id},
              {"group", r.group},
              {"uid", r.uid},
              {"local_world_size", r.local_world_size},
              {"state", r.state},
              {"started_unix_ms", r.started_unix_ms},
              {"last_active_unix_ms", r.last_active_unix_ms},
              {"batches", r.batches},
              {"copied_bytes", r.copied_bytes},
              {"storage_bytes", r.storage_bytes},
              {"peer_bytes", r.peer_bytes},
              {"ranks_done", r.ranks_done},
              {"error", r.error}};
}

// "3/8" ranks done of a group; "-" for ranks alone.
std::string RanksText(const RestoreProgress& r) {
  if (r.group.empty()) return "-";
  return fmt::format("{}/{}", r.ranks_done, r.local_world_size);
}

std::string Ago(int64_t unix_ms, absl::Time now) {
  if (unix_ms == 0) return "-";
  return HumanDuration(now - absl::FromUnixMillis(unix_ms)) + " ago";
}

void PrintOne(const RestoreProgress& r) {
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = {
      {"restore", r.id},
      {"checkpoint", r.checkpoint_id},
      {"group", r.group.empty() ? "- (ranks alone)" : r.group},
      {"uid", fmt::format("{}", r.uid)},
      {"state", r.state},
      {"ranks done", RanksText(r)},
      {"batches", fmt::format("{}", r.batches)},
      {"copied", HumanBytes(r.copied_bytes) + " into the ranks' arenas"},
      {"read", HumanBytes(r.storage_bytes) + " from the checkpoint's files"},
      {"from peers",
       HumanBytes(r.peer_bytes) + " of it from other daemons' memory"},
      {"started", fmt::format("{} ({})", Timestamp(r.started_unix_ms),
                              Ago(r.started_unix_ms, now))},
      {"last batch", Ago(r.last_active_unix_ms, now)},
  };
  if (!r.error.empty()) rows.push_back({"error", r.error});
  PrintTable(rows);
}

void PrintAll(const std::vector<RestoreProgress>& list) {
  const absl::Time now = absl::Now();
  std::vector<std::vector<std::string>> rows = {
      {"ID", "STATE", "RANKS", "BATCHES", "COPIED", "READ", "FROM PEERS",
       "LAST BATCH", "CHECKPOINT"}};
  for (const RestoreProgress& r : list) {
    rows.push_back({r.id, r.state, RanksText(r), fmt::format("{}", r.batches),
                    HumanBytes(r.copied_bytes), HumanBytes(r.storage_bytes),
                    r.peer_bytes > 0 ? HumanBytes(r.peer_bytes) : "-",
                    Ago(r.last_active_unix_ms, now), r.checkpoint_id});
  }
  PrintTable(rows);
}

}  // namespace

int Restores(const RestoresArgs& args) {
  auto client = Connect(args.daemon);
  if (!client.ok()) {
    return ReportError(args.daemon, "restores", client.status(),
                       kExitUnreachable);
  }
  auto list = (*client)->ListRestores();
  if (!list.ok()) {
    return ReportError(args.daemon, "restores", list.status(),
                       ExitCodeFor(list.status()));
  }
  std::vector<RestoreProgress> shown;
  for (const RestoreProgress& r : *list) {
    if (args.id.empty() || r.id == args.id) shown.push_back(r);
  }
  if (!args.id.empty() && shown.empty()) {
    return ReportError(
        args.daemon, "restores " + args.id,
        absl::NotFoundError(fmt::format(
            "no restore {} (the daemon lists running restores and the newest "
            "ended ones)",
            args.id)),
        kExitNotFound);
  }
  if (args.daemon.json) {
    json j = json::array();
    for (const RestoreProgress& r : shown) j.push_back(ToJson(r));
    if (!args.id.empty()) j = j[0];
    std::printf("%s\n", client::DumpJson(j, 2).c_str());
  } else if (!args.id.empty()) {
    PrintOne(shown[0]);
  } else if (shown.empty()) {
    std::printf("no restores\n");
  } else {
    PrintAll(shown);
  }
  return kExitOk;
}

int CancelRestore(const CancelRestoreArgs& args) {
  auto client = Connect(args.daemon);
  if (!client.ok()) {
    return ReportError(args.daemon, "cancel-restore", client.status(),
                       kExitUnreachable);
  }
  const absl::Status s = (*client)->CancelRestore(args.id, args.reason);
  if (!s.ok()) {
    return ReportError(args.daemon, "cancel-restore " + args.id, s,
                       ExitCodeFor(s));
  }
  if (args.daemon.json) {
    std::printf(
        "%s\n",
        client::DumpJson(json{{"ok", true}, {"id", args.id}}, 2).c_str());
  } else {
    std::printf("restore %s cancelled\n", args.id.c_str());
  }
  return kExitOk;
}

}  // namespace ckptd::cli
