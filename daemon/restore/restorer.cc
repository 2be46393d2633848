// Copyright 2026 The ckptd Authors.
#include "daemon/restore/restorer.h"

#include <algorithm>
#include <utility>

#include "daemon/arena/arena_registry.h"
#include "daemon/commit/paths.h"
#include "daemon/restore/batch_reader.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

// A uid no file has: MayRead then checks the "other" permission bits.
constexpr uint32_t kAnyone = 0xFFFFFFFFu;

CheckpointCacheOptions CacheOptions(const RestorerOptions& o) {
  CheckpointCacheOptions c;
  c.capacity = o.cached_checkpoints;
  c.reader.env = o.env;
  c.reader.threads = std::max(1, o.read_threads);
  c.reader.verify_crc = true;
  c.reader.direct_io = o.direct_io;
  c.tier = o.memory_tier;
  c.peers = o.peers;
  c.peers_only_missing = o.peers_only_missing;
  c.observer = o.observer;
  return c;
}

// The caller's arena: registered, passed over the arena socket (so its uid
// is the kernel's word). FAILED_PRECONDITION / NOT_FOUND otherwise.
absl::StatusOr<std::shared_ptr<const Arena>> CallerArena(
    const RestorerOptions& o, uint64_t arena_id) {
  std::shared_ptr<const Arena> arena =
      o.find_arena ? o.find_arena(arena_id) : nullptr;
  if (arena == nullptr) {
    return absl::NotFoundError(fmt::format(
        "arena {} is not registered (expired after arena_idle_timeout, or "
        "the daemon restarted): register a new arena",
        arena_id));
  }
  if (!arena->verified_uid) {
    return absl::FailedPreconditionError(fmt::format(
        "arena {} was registered by name: restores need an arena passed over "
        "the arena socket (a sealed memfd)",
        arena_id));
  }
  return arena;
}

// A restore is abandoned when none of its ranks sent a batch for as long as
// restore_groups keeps an idle group.
RestoreProgressOptions ProgressOptions(const RestorerOptions& o) {
  RestoreProgressOptions p;
  p.idle_timeout = RestoreIdleTimeout(o.gather_timeout);
  return p;
}

}  // namespace

Restorer::Restorer(RestorerOptions options)
    : options_(std::move(options)),
      cache_(CacheOptions(options_)),
      buffers_(GroupBuffersOptions{options_.buffer_bytes, absl::Seconds(60)}),
      pool_(std::max(1, options_.threads)),
      groups_(options_.gather_timeout),
      progress_(ProgressOptions(options_)) {
  if (options_.housekeeping_thread) {
    housekeeper_ = std::thread([this] { Housekeeping(); });
  }
}

Restorer::~Restorer() { Shutdown(); }

void Restorer::Shutdown() {
  std::vector<GroupBatch> left;
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    groups_.TakeAll(&left);
  }
  if (housekeeper_.joinable()) housekeeper_.join();
  for (GroupBatch& g : left) {
    for (GroupMember& m : g.members) {
      std::move(m.done)(absl::UnavailableError(
          "the daemon is shutting down: restore batch not served (retry "
          "against the restarted daemon, or load with via_daemon=False)"));
    }
  }
  pool_.Join();
}

void Restorer::Housekeeping() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                               absl::Milliseconds(100))) {
        return;
      }
    }
    Tick(options_.clock->Now());
  }
}

void Restorer::Tick(absl::Time now) {
  std::vector<GroupBatch> ready;
  {
    absl::MutexLock l(&mu_);
    groups_.Expire(now, &ready);
    progress_.Expire(now);
  }
  buffers_.Expire(now);
  for (const GroupBatch& g : ready) {
    if (g.members.size() > 0) {
      spdlog::info(
          "restore of {}: batch {} served at its gather deadline with {} of "
          "{} local ranks",
          g.dir, g.members[0].batch.batch, g.members.size(),
          g.members[0].batch.local_world_size);
    }
  }
  Dispatch(std::move(ready));
}

int Restorer::gathering() const {
  absl::MutexLock l(&mu_);
  return groups_.gathering();
}

absl::StatusOr<std::string> Restorer::Resolve(const std::string& id) {
  return ResolveCheckpointDir(options_.checkpoint_roots, id, options_.env);
}

void Restorer::GetIndex(std::string checkpoint_id, uint64_t arena_id,
                        IndexCallback done) {
  pool_.SubmitOrRun([this, id = std::move(checkpoint_id), arena_id,
                     done = std::move(done)]() mutable {
    absl::StatusOr<std::string> dir = Resolve(id);
    if (!dir.ok()) return std::move(done)(std::move(dir).status());
    uint32_t uid = kAnyone;
    if (arena_id != 0) {
      absl::StatusOr<std::shared_ptr<const Arena>> arena =
          CallerArena(options_, arena_id);
      if (!arena.ok()) return std::move(done)(std::move(arena).status());
      uid = (*arena)->uid;
    }
    cache_.Get(*dir, [uid, done = std::move(done)](
                         absl::StatusOr<std::shared_ptr<const CachedCheckpoint>>
                             ckpt) mutable {
      if (!ckpt.ok()) return std::move(done)(std::move(ckpt).status());
      const absl::Status may = MayRead(**ckpt, uid, GroupsOf(uid));
      if (!may.ok()) return std::move(done)(OwnStatus(may));
      std::move(done)(
          RestoreIndex{(*ckpt)->dir, (*ckpt)->index_json, (*ckpt)->identity});
    });
  });
}

void Restorer::Restore(RestoreBatch batch, RestoreCallback done) {
  pool_.SubmitOrRun([this, batch = std::move(batch),
                     done = std::move(done)]() mutable {
    absl::StatusOr<std::string> dir = Resolve(batch.checkpoint_id);
    if (!dir.ok()) return std::move(done)(std::move(dir).status());
    absl::StatusOr<std::shared_ptr<const Arena>> arena =
        CallerArena(options_, batch.arena_id);
    if (!arena.ok()) return std::move(done)(std::move(arena).status());
    const uint32_t uid = (*arena)->uid;
    GroupMember member{std::move(batch), *std::move(arena), std::move(done)};
    std::vector<GroupBatch> ready;
    GroupMember rejected;
    absl::Status added;
    bool anew = false;       // a restarted job reusing the group's name
    std::string anew_group;  // for its log line, copied only then
    int anew_rank = 0;
    {
      absl::MutexLock l(&mu_);
      if (stopping_) {
        added = absl::UnavailableError("the daemon is shutting down");
        rejected = std::move(member);
      } else {
        const absl::Time now = options_.clock->Now();
        const RestoreBatch& b = member.batch;
        anew = groups_.StartsAnew(*dir, uid, b);
        if (anew) {
          anew_group = b.group;
          anew_rank = b.local_rank;
        }
        const RestoreKey key{uid, *dir, b.group};
        const int local_world_size = b.local_world_size;
        const uint32_t batch_no = b.batch;
        // Listed only once the groups took it: a refused batch (out of
        // order, after the rank's last) leaves no RUNNING restore behind.
        added = progress_.Admissible(key, batch_no);
        if (added.ok()) {
          added =
              groups_.Add(*dir, uid, std::move(member), now, &ready, &rejected);
        } else {
          rejected = std::move(member);
        }
        if (added.ok()) {
          added = progress_.Admit(key, local_world_size, batch_no, now, anew);
        }
      }
    }
    if (anew && added.ok()) {
      spdlog::info(
          "restore group '{}' of {}: local rank {} sent batch 0 again (a "
          "restarted job loading anew): the group starts over, what it was "
          "gathering is served now",
          anew_group, *dir, anew_rank);
    }
    if (!added.ok()) std::move(rejected.done)(std::move(added));
    Dispatch(std::move(ready));
  });
}

absl::StatusOr<shm::FetchedFd> Restorer::FetchGroupBuffer(
    const std::string& token, uint32_t uid) {
  return buffers_.Fetch(token, uid);
}

std::vector<RestoreProgressInfo> Restorer::ListRestores() const {
  absl::MutexLock l(&mu_);
  return progress_.List();
}

absl::Status Restorer::CancelRestore(const std::string& id,
                                     const std::string& reason) {
  std::vector<GroupBatch> taken;
  std::shared_ptr<const Cancellation> cancel;
  {
    absl::MutexLock l(&mu_);
    absl::StatusOr<RestoreKey> key =
        progress_.Cancel(id, reason, options_.clock->Now());
    if (!key.ok()) return OwnStatus(key.status());
    groups_.TakeGroup(*key, &taken);
    cancel = progress_.CancellationOf(*key);
  }
  spdlog::info(
      "{} ({} gathering batches answered; a batch being read stops "
      "at its next chunk)",
      std::string(cancel->status().message()), taken.size());
  for (GroupBatch& g : taken) {
    for (GroupMember& m : g.members) std::move(m.done)(cancel->status());
  }
  return absl::OkStatus();
}

void Restorer::RecordServed(
    const GroupBatch& group,
    const std::vector<absl::StatusOr<RestoreReply>>& results) {
  ServedBatch served;
  served.ranks = static_cast<int>(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    if (group.members[i].batch.last) ++served.ranks_last;
    if (results[i].ok()) {
      served.copied_bytes += results[i]->copied_bytes;
      served.storage_bytes += results[i]->storage_bytes;
      served.peer_bytes += results[i]->peer_bytes;
    } else if (served.first_error.ok()) {
      served.first_error = OwnStatus(results[i].status());
    }
  }
  absl::MutexLock l(&mu_);
  progress_.Served(KeyOf(group), served, options_.clock->Now());
}

void Restorer::Dispatch(std::vector<GroupBatch> ready) {
  for (GroupBatch& g : ready) {
    pool_.SubmitOrRun(
        [this, g = std::move(g)]() mutable { Serve(std::move(g)); });
  }
}

void Restorer::Serve(GroupBatch group) {
  // Copied out before `group` moves into the callback.
  const std::string dir = group.dir;
  RestoreObserver* const observer = options_.observer;
  // Raised if the restore is cancelled while the batch is read.
  std::shared_ptr<const Cancellation> cancel;
  {
    absl::MutexLock l(&mu_);
    cancel = progress_.CancellationOf(KeyOf(group));
  }
  cache_.Get(dir, [this, group = std::move(group), observer,
                   cancel = std::move(cancel)](
                      absl::StatusOr<std::shared_ptr<const CachedCheckpoint>>
                          ckpt) mutable {
    const size_t n = group.members.size();
    std::vector<absl::StatusOr<RestoreReply>> results(n, RestoreReply{});
    if (!ckpt.ok()) {
      for (auto& r : results) r = OwnStatus(ckpt.status());
    } else {
      const absl::Status may =
          MayRead(**ckpt, group.caller_uid, GroupsOf(group.caller_uid));
      for (size_t i = 0; i < n; ++i) {
        const std::string& want = group.members[i].batch.identity;
        if (!may.ok()) {
          results[i] = OwnStatus(may);
        } else if (!want.empty() && want != (*ckpt)->identity) {
          results[i] = absl::AbortedError(fmt::format(
              "checkpoint {} changed since its index was read (.metadata "
              "{} then, {} now): load again",
              group.dir, want, (*ckpt)->identity));
        }
      }
      ServeGroupBatch(**ckpt, group,
                      options_.buffer_bytes > 0 ? &buffers_ : nullptr,
                      options_.clock->Now(), cancel.get(), &results);
    }
    RecordServed(group, results);
    if (observer != nullptr) {
      uint64_t storage = 0;
      for (const auto& r : results) {
        if (r.ok()) storage = std::max(storage, r->storage_bytes);
      }
      observer->RestoreBatchRead(static_cast<int>(n), storage);
      for (const auto& r : results) {
        observer->RestoreAnswered(r.status().code(),
                                  r.ok() ? r->copied_bytes : 0);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      std::move(group.members[i].done)(std::move(results[i]));
    }
  });
}

}  // namespace ckptd::daemon
