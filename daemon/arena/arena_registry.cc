// Copyright 2026 The ckptd Authors.
#include "daemon/arena/arena_registry.h"

#include <sys/stat.h>

#include <utility>

#include "common/absl_fmt.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

void AnswerAll(std::vector<Arena::IdleWaiter>& waiters, const absl::Status& s,
               Deferred& d) {
  for (auto& w : waiters) {
    d.Add([done = std::move(w.done), s]() mutable { std::move(done)(s); });
  }
  waiters.clear();
}

}  // namespace

ArenaRegistry::ArenaRegistry(ArenaRegistryOptions options)
    : options_(std::move(options)) {}

absl::StatusOr<std::shared_ptr<Arena>> ArenaRegistry::MapFd(
    int fd, uint64_t size, std::string_view owner,
    const shm::PeerCredentials& peer) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<shm::Mapping> map,
      shm::Mapping::FromFd(
          fd, size, fmt::format("arena of pid {} uid {}", peer.pid, peer.uid)));
  auto arena = std::make_shared<Arena>();
  arena->map = std::move(map);
  arena->owner = std::string(owner);
  arena->uid = peer.uid;
  arena->verified_uid = true;
  return arena;
}

absl::StatusOr<std::shared_ptr<Arena>> ArenaRegistry::MapNamed(
    int dir_fd, std::string_view dir, std::string_view name, uint64_t size,
    std::string_view owner, int64_t client_pid) {
  ASSIGN_OR_RETURN(std::unique_ptr<shm::Mapping> map,
                   shm::Mapping::Open(dir_fd, dir, name, size));
  auto arena = std::make_shared<Arena>();
  arena->map = std::move(map);
  arena->owner = std::string(owner);
  arena->uid = arena->map->owner_uid();
  // The file's owner uid is kernel-assigned; the pid is the caller's claim,
  // confirmed when /proc/<pid> is visible and has that uid.
  std::string pid_check = "not visible in this pid namespace";
  if (struct stat st;
      client_pid > 0 &&
      ::stat(fmt::format("/proc/{}", client_pid).c_str(), &st) == 0) {
    pid_check = st.st_uid == arena->uid ? "verified" : "uid MISMATCH";
  }
  spdlog::info(
      "arena file '{}' ({} bytes) mapped for uid={} pid={} ({}), owner '{}'",
      EscapeForLog(name), size, arena->uid, client_pid, pid_check,
      EscapeForLog(owner));
  return arena;
}

absl::Status ArenaRegistry::CheckQuota(uint32_t uid, uint64_t size) const {
  if (static_cast<int>(arenas_.size()) >= options_.max_arenas) {
    return absl::ResourceExhaustedError(fmt::format(
        "{} arenas are registered already (max_arenas); release unused ones",
        arenas_.size()));
  }
  int count = 0;
  uint64_t bytes = 0;
  for (const auto& [id, a] : arenas_) {
    if (a->uid != uid) continue;
    ++count;
    bytes += a->map->size();
  }
  if (count >= options_.max_arenas_per_client) {
    return absl::ResourceExhaustedError(
        fmt::format("uid {} has {} arenas registered already "
                    "(max_arenas_per_client = {}); release unused "
                    "ones",
                    uid, count, options_.max_arenas_per_client));
  }
  if (size > options_.max_arena_bytes_per_client ||
      bytes > options_.max_arena_bytes_per_client - size) {
    return absl::ResourceExhaustedError(
        fmt::format("uid {} has {} bytes of arenas registered already; {} more "
                    "would exceed "
                    "max_arena_bytes_per_client = {} bytes",
                    uid, bytes, size, options_.max_arena_bytes_per_client));
  }
  return absl::OkStatus();
}

uint64_t ArenaRegistry::Insert(std::shared_ptr<Arena> arena) {
  do {
    arena->id = absl::Uniform<uint64_t>(ids_);
  } while (arena->id == 0 || arenas_.contains(arena->id));
  arena->last_used = options_.clock->Now();
  const uint64_t id = arena->id;
  arenas_[id] = std::move(arena);
  return id;
}

std::shared_ptr<Arena> ArenaRegistry::Find(uint64_t id) const {
  auto it = arenas_.find(id);
  return it == arenas_.end() ? nullptr : it->second;
}

absl::Status ArenaRegistry::Release(uint64_t id, Deferred& d) {
  auto it = arenas_.find(id);
  if (it == arenas_.end()) {
    return absl::NotFoundError(fmt::format("arena {} is not registered", id));
  }
  it->second->released = true;
  AnswerAll(it->second->idle_waiters, absl::OkStatus(), d);
  arenas_.erase(it);
  return absl::OkStatus();
}

void ArenaRegistry::WaitIdle(uint64_t id, uint64_t token, absl::Time deadline,
                             DoneCallback done, Deferred& d) {
  auto it = arenas_.find(id);
  if (it == arenas_.end()) {
    d.Add([done = std::move(done), id]() mutable {
      std::move(done)(
          absl::NotFoundError(fmt::format("arena {} is not registered", id)));
    });
  } else if (it->second->held_bytes == 0) {
    d.Add([done = std::move(done)]() mutable {
      std::move(done)(absl::OkStatus());
    });
  } else {
    it->second->idle_waiters.push_back({token, deadline, std::move(done)});
  }
}

bool ArenaRegistry::DropWaiter(uint64_t token, Deferred& d) {
  for (auto& [id, a] : arenas_) {
    for (auto w = a->idle_waiters.begin(); w != a->idle_waiters.end(); ++w) {
      if (w->token != token) continue;
      d.Add([done = std::move(w->done)]() mutable {
        std::move(done)(absl::CancelledError("the caller went away"));
      });
      a->idle_waiters.erase(w);
      return true;
    }
  }
  return false;
}

void ArenaRegistry::Hold(Arena& arena, uint64_t bytes) {
  arena.held_bytes += bytes;
  arena.last_used = options_.clock->Now();
}

void ArenaRegistry::Unhold(Arena& arena, uint64_t bytes, Deferred& d) {
  arena.held_bytes -= bytes;
  arena.last_used = options_.clock->Now();
  if (arena.held_bytes == 0) AnswerAll(arena.idle_waiters, absl::OkStatus(), d);
}

void ArenaRegistry::Expire(absl::Time now, Deferred& d) {
  std::vector<uint64_t> idle;
  for (auto& [id, a] : arenas_) {
    for (auto w = a->idle_waiters.begin(); w != a->idle_waiters.end();) {
      if (now < w->deadline) {
        ++w;
        continue;
      }
      d.Add([done = std::move(w->done), id = id]() mutable {
        std::move(done)(absl::DeadlineExceededError(
            fmt::format("arena {} is still in use by a checkpoint", id)));
      });
      w = a->idle_waiters.erase(w);
    }
    if (a->held_bytes == 0 && a->idle_waiters.empty() &&
        now - a->last_used > options_.idle_timeout) {
      idle.push_back(id);
    }
  }
  for (uint64_t id : idle) {
    spdlog::info("arena {} unmapped after {} idle", id,
                 absl::FormatDuration(options_.idle_timeout));
    arenas_.erase(id);
  }
}

void ArenaRegistry::FailWaiters(const absl::Status& error, Deferred& d) {
  for (auto& [id, a] : arenas_) AnswerAll(a->idle_waiters, error, d);
}

}  // namespace ckptd::daemon
