// Copyright 2026 The ckptd Authors.
//
// SaveCore (save_core.h): its construction, start-up (journal, recovery,
// history, pool, GPU stager, coordinator, housekeeper) and shutdown, the
// lookups every part uses (directories resolved under the roots, attempts,
// arenas), and the timers.
#include "daemon/save/save_core.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_join.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/commit/paths.h"
#include "daemon/save/attempt.h"
#include "daemon/save/intake.h"
#include "daemon/save/tasks.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon::save {

SaveCore::SaveCore(const DaemonOptions& options)
    : options(options),
      env(options.env),
      clock(options.clock != nullptr ? options.clock : Clock::Real()),
      validator{options.max_world_size, options.max_items, options.max_batch},
      committer{options.env, options.checkpoint_roots, options.fsync},
      journal({options.env, JoinPath(options.state_dir, "journal"), clock}),
      limiter(options.write_rate_limit, clock),
      tier({.budget = options.memory_tier_bytes,
            .dir = options.memory_tier_dir,
            .env = options.env,
            .clock = clock}),
      arenas({options.max_arenas, options.max_arenas_per_client,
              options.max_arena_bytes_per_client, options.arena_idle_timeout,
              clock}),
      staging({options.staging_budget,
               static_cast<size_t>(options.max_pending_saves)}) {}

SaveCore::~SaveCore() = default;

// ---------------------------------------------------------------------------
// Start-up and shutdown
// ---------------------------------------------------------------------------

// Peer replicas and restores from other daemons' memory (shares.h), when
// the daemon has a peer service.
void StartShares(SaveCore& core) {
  if (!core.options.share_link_factory) return;
  core.shares = std::make_unique<Shares>(SharesOptions{
      .replicas = core.options.peer_replicas,
      .rate_limit = core.options.replica_rate_limit,
      .self = core.options.node_name,
      .restore_peers = core.options.restore_peers,
      .push_timeout = core.options.peer_timeout,
      .call_deadline = std::max(core.options.peer_timeout, absl::Seconds(30)),
      .tier = &core.tier,
      .links = core.options.share_link_factory,
      .trainers_staging =
          [&core] {
            absl::MutexLock l(&core.mu);
            for (const auto& [dir, c] : core.ckpts) {
              if (c->state == State::kPending || c->state == State::kStaging)
                return true;
            }
            return false;
          },
      .clock = core.clock});
}

absl::Status Start(SaveCore& core) {
  RETURN_IF_ERROR(core.journal.Init());
  const std::string history_dir = JoinPath(core.options.state_dir, "history");
  RETURN_IF_ERROR(CreateDirsDurably(core.env, history_dir));
  RETURN_IF_ERROR(core.env->CreateDirs(core.options.shm_dir));
  core.shm_dir_fd =
      ::open(core.options.shm_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (core.shm_dir_fd < 0) {
    return absl::ErrnoToStatus(
        errno, fmt::format("open shm_dir {}", core.options.shm_dir));
  }
  RecoveryOptions ro;
  ro.env = core.env;
  ro.journal_dir = core.journal.dir();
  ro.roots = core.options.checkpoint_roots;
  ro.now = core.clock->Now();
  ro.default_settle = core.options.commit_timeout + core.options.peer_timeout;
  ASSIGN_OR_RETURN(Recovered recovered, RecoverJournal(ro));
  core.recovery = std::move(recovered.report);
  {
    absl::MutexLock l(&core.mu);
    for (Recovered::Later& later : recovered.deferred) {
      core.dirs[later.record.dir].owner = kRecoveryOwner;
      core.deferred_recoveries.push_back(std::move(later));
    }
    for (HistoryRecord& rec : LoadHistoryRecords(core.env, history_dir)) {
      core.history.Load(std::move(rec));
    }
  }
  for (const Recovered::Commit& r : recovered.committed)
    tasks::SettleCommit(core, r.record, r.journal_path);
  // After recovery and its retention: what the store holds is checked
  // against the checkpoints as they now are.
  RETURN_IF_ERROR(core.tier.Open());
  StartShares(core);
  core.pool =
      std::make_unique<ThreadPool>(std::max(1, core.options.io_threads));
  RETURN_IF_ERROR(StartGpu(core));
  CoordinatorOptions co;
  co.env = core.env;
  co.checkpoint_roots = core.options.checkpoint_roots;
  co.fsync = core.options.fsync;
  co.stage_timeout = core.options.stage_timeout;
  co.peer_timeout = core.options.peer_timeout;
  co.commit_timeout = core.options.commit_timeout;
  co.forget_after = std::min(core.options.forget_after, absl::Hours(1));
  co.max_items = core.options.max_items;
  co.max_world_size = core.options.max_world_size;
  co.clock = core.clock;
  co.on_commit = [&core](const std::string& job, const std::string& dir,
                         absl::Time started, int keep_last_n,
                         int64_t keep_every) {
    // The coordinator's node saves ranks of the checkpoint too: its owner.
    int64_t uid = kUnknownUid;
    {
      absl::MutexLock l(&core.mu);
      if (auto it = core.ckpts.find(dir); it != core.ckpts.end())
        uid = it->second->uid;
    }
    tasks::SettleCommit(
        core, {dir, job, uid, std::nullopt, false, absl::ToUnixMillis(started)},
        /*journal_path=*/"", {keep_last_n, keep_every});
  };
  ASSIGN_OR_RETURN(core.coordinator, Coordinator::Create(std::move(co)));
  core.housekeeper = std::thread([&core] { Housekeeping(core); });
  return absl::OkStatus();
}

absl::Status StartGpu(SaveCore& core) {
  if (core.options.cuda == "off") {
    core.cuda_unavailable = "the daemon runs with cuda=off";
    return absl::OkStatus();
  }
  absl::StatusOr<std::shared_ptr<DeviceBackend>> backend =
      core.options.device_backend != nullptr
          ? absl::StatusOr<std::shared_ptr<DeviceBackend>>(
                core.options.device_backend)
          : OpenCudaBackend(core.options.cuda_library,
                            core.options.cuda_streams);
  absl::StatusOr<std::unique_ptr<GpuStager>> stager =
      absl::FailedPreconditionError("no CUDA backend");
  if (backend.ok()) {
    GpuStager::Options so;
    so.pinned_bytes = core.options.pinned_staging_bytes;
    stager = GpuStager::Create(*std::move(backend), so);
  } else {
    stager = backend.status();
  }
  if (!stager.ok()) {
    core.cuda_unavailable = std::string(stager.status().message());
    if (core.options.cuda == "on") {
      return absl::FailedPreconditionError(
          fmt::format("cuda=on: {}", core.cuda_unavailable));
    }
    spdlog::info("GPU path off (host saves only): {}", core.cuda_unavailable);
    return absl::OkStatus();
  }
  core.stager = *std::move(stager);
  return absl::OkStatus();
}

void BeginShutdown(SaveCore& core, const absl::Status& why) {
  Deferred d;
  absl::MutexLock l(&core.mu);
  if (core.stopping) return;
  core.stopping = true;
  for (auto& [id, c] : core.ckpts) {
    // A commit in progress is let finish (the pool drains in Shutdown).
    if (!IsFinal(c->state) && c->state != State::kCommitting) {
      attempt::FailLocked(core, c, why, State::kFailed, d);
    }
  }
  core.arenas.FailWaiters(why, d);
}

void Shutdown(SaveCore& core) {
  BeginShutdown(core, absl::UnavailableError("the daemon is shutting down"));
  // Copies in flight finish (their checkpoints failed above: they end their
  // tasks); queued ones are answered CANCELLED.
  if (core.stager) core.stager->Shutdown();
  if (core.shares) core.shares->Shutdown();  // pushes stop; calls refused
  if (core.housekeeper.joinable()) core.housekeeper.join();
  // Answers its nodes' pending calls (this node's included) with the abort.
  if (core.coordinator) core.coordinator.reset();
  // Link callbacks (remote coordinators) still due: they end their tasks.
  std::vector<std::shared_ptr<CoordinatorLink>> links;
  {
    absl::MutexLock l(&core.mu);
    for (const auto& [dir, c] : core.ckpts) {
      if (c->node && !c->is_coordinator) links.push_back(c->node->link);
    }
  }
  for (auto& link : links) link->CancelCalls();
  {
    absl::MutexLock l(&core.mu);
    auto no_link_calls = [&core]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core.mu) {
      if (core.link_callbacks > 0) return false;
      for (const auto& [dir, c] : core.ckpts) {
        if (c->multi && c->busy_tasks > 0) return false;
      }
      return true;
    };
    const absl::Duration limit = core.options.peer_timeout + absl::Seconds(5);
    if (!core.mu.AwaitWithTimeout(absl::Condition(&no_link_calls), limit)) {
      std::vector<std::string> busy;
      for (const auto& [dir, c] : core.ckpts) {
        if (c->multi && c->busy_tasks > 0) {
          busy.push_back(fmt::format("{} ({} task(s))", dir, c->busy_tasks));
        }
      }
      spdlog::error(
          "shutdown: multi-node calls still unanswered after {} (peer_timeout "
          "+ 5s): {} link callback(s) pending; checkpoints with busy tasks: "
          "{}; going on",
          absl::FormatDuration(limit), core.link_callbacks,
          busy.empty() ? "none" : absl::StrJoin(busy, ", "));
    }
  }
  core.pool
      ->Join();  // drains queued writer / cleanup tasks; the pool stays valid
  if (core.shm_dir_fd >= 0) ::close(core.shm_dir_fd);
}

// ---------------------------------------------------------------------------
// Lookups
// ---------------------------------------------------------------------------

absl::StatusOr<std::string> Resolve(const SaveCore& core, std::string_view id) {
  return ResolveCheckpointDir(core.options.checkpoint_roots, id, core.env);
}

std::shared_ptr<Checkpoint> FindLocked(
    SaveCore& core, std::string_view id,
    const absl::StatusOr<std::string>& resolved) {
  auto it = core.ckpts.find(std::string(id));
  if (it != core.ckpts.end()) return it->second;
  if (!resolved.ok()) return nullptr;
  it = core.ckpts.find(*resolved);
  return it == core.ckpts.end() ? nullptr : it->second;
}

std::shared_ptr<const Arena> FindArena(SaveCore& core, uint64_t id) {
  absl::MutexLock l(&core.mu);
  std::shared_ptr<Arena> arena = core.arenas.Find(id);
  if (arena != nullptr) arena->last_used = core.clock->Now();
  return arena;
}

// ---------------------------------------------------------------------------
// Timers
// ---------------------------------------------------------------------------

void Tick(SaveCore& core, absl::Time now) {
  Deferred d;
  absl::MutexLock l(&core.mu);
  std::vector<std::string> forget;
  for (auto& [dir, c] : core.ckpts) {
    if (IsFinal(c->state)) {
      if (now - c->finished > core.options.forget_after && c->busy_tasks == 0)
        forget.push_back(dir);
      continue;
    }
    attempt::TickLocked(core, c, now, d);
  }
  for (const std::string& dir : forget) core.ckpts.erase(dir);
  core.arenas.Expire(now, d);
  SettleDueRecoveriesLocked(core, now, d);
}

void SettleDueRecoveriesLocked(SaveCore& core, absl::Time now, Deferred& d) {
  auto due = std::partition(
      core.deferred_recoveries.begin(), core.deferred_recoveries.end(),
      [now](const Recovered::Later& l) { return l.due > now; });
  for (auto it = due; it != core.deferred_recoveries.end(); ++it) {
    // The decision is I/O: on the pool, the directory still held.
    d.Add([&core, later = std::move(*it)] {
      core.pool->SubmitOrRun([&core, later] {
        absl::StatusOr<bool> committed =
            SettleJournalEntry(core.env, core.options.checkpoint_roots,
                               later.record, later.journal_path);
        if (!committed.ok()) {
          spdlog::error(
              "recovery: could not settle the deferred checkpoint {}: {} (the "
              "entry stays for the next start)",
              later.record.dir, committed.status());
        } else if (*committed) {
          tasks::SettleCommit(core, later.record, later.journal_path);
        }
        Deferred d;
        absl::MutexLock l(&core.mu);
        tasks::ReleaseDirOwnerLocked(core, later.record.dir, kRecoveryOwner, d);
      });
    });
  }
  core.deferred_recoveries.erase(due, core.deferred_recoveries.end());
}

void Housekeeping(SaveCore& core) {
  while (true) {
    {
      absl::MutexLock l(&core.mu);
      if (core.mu.AwaitWithTimeout(absl::Condition(&core.stopping),
                                   absl::Milliseconds(100)))
        return;
    }
    Tick(core, core.clock->Now());
  }
}

}  // namespace ckptd::daemon::save
