// Copyright 2026 The ckptd Authors.
//
// The arena registry: the client arenas the daemon has mapped (sealed
// memfds passed over the arena socket, or legacy named files), their
// per-uid quotas, the bytes checkpoints still hold of each, and the
// callers waiting for an arena to become idle.
//
//   MapFd / MapNamed   map a client's arena (I/O: call without locks)
//   CheckQuota, Insert register it under a fresh random id
//   Find               the arena a Save names
//   Hold / Unhold      bytes of it adopted by a checkpoint / written out;
//                      the last Unhold answers WaitIdle callers
//   Expire             the housekeeping pass: waiter deadlines, idle unmaps
//
// Takes: arena ids from SaveBatch; hands on: std::shared_ptr<Arena>, held
// by StagedExtent (save_types.h) so the mapping outlives a Release while a
// checkpoint still writes from it.
//
// Thread-safety: an Arena's `map`, `id`, `owner`, `uid` are constant after
// MapFd/MapNamed and may be read from any thread (the writer reads the
// mapping); everything else — the registry and the mutable fields of its
// arenas — is thread-compatible: the orchestrator calls it under its own
// lock (SaveCore::mu, daemon/save/save_core.h). Callbacks are never run
// here: they are added to the caller's Deferred.
#ifndef CKPTD_DAEMON_ARENA_ARENA_REGISTRY_H_
#define CKPTD_DAEMON_ARENA_ARENA_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/tasks.h"
#include "daemon/types/save_types.h"
#include "shm/fd_passing.h"
#include "shm/mapping.h"

namespace ckptd::daemon {

struct Arena {
  // Constant after mapping.
  uint64_t id = 0;
  std::unique_ptr<shm::Mapping> map;
  std::string owner;
  // The Unix user the arena belongs to: for an arena passed over the arena
  // socket, the sender's SO_PEERCRED uid (verified_uid); for one opened by
  // name (in-process callers), the file owner's uid.
  uint32_t uid = 0;
  bool verified_uid = false;

  // Mutable: only through the registry (under the orchestrator's lock).
  absl::Time last_used;
  uint64_t held_bytes = 0;  // named by extents not yet consumed
  bool released = false;    // ReleaseArena called
  struct IdleWaiter {
    uint64_t token;
    absl::Time deadline;
    DoneCallback done;
  };
  std::vector<IdleWaiter> idle_waiters;
};

struct ArenaRegistryOptions {
  int max_arenas = 4096;
  int max_arenas_per_client = 256;
  uint64_t max_arena_bytes_per_client = uint64_t{256} << 30;
  // Arenas no checkpoint holds bytes of for this long are unmapped.
  absl::Duration idle_timeout = absl::Minutes(30);
  Clock* clock = Clock::Real();
};

class ArenaRegistry {
 public:
  explicit ArenaRegistry(ArenaRegistryOptions options);

  // Maps an arena passed as a descriptor (takes `fd`, closed on failure
  // too): a memfd sealed against shrinking, at least `size` bytes.
  static absl::StatusOr<std::shared_ptr<Arena>> MapFd(
      int fd, uint64_t size, std::string_view owner,
      const shm::PeerCredentials& peer);
  // Maps the legacy arena file `name` in the shm directory (`dir_fd`) and
  // unlinks it; its owner is the file's owner uid. `client_pid` is the
  // caller's own claim, only logged (checked against /proc when visible).
  static absl::StatusOr<std::shared_ptr<Arena>> MapNamed(
      int dir_fd, std::string_view dir, std::string_view name, uint64_t size,
      std::string_view owner, int64_t client_pid);

  // max_arenas and the per-uid quotas for one more arena of `size` bytes:
  // RESOURCE_EXHAUSTED naming the uid and the limit.
  absl::Status CheckQuota(uint32_t uid, uint64_t size) const;
  // Registers `arena` under a fresh random id (an id from another client or
  // an earlier daemon run names no arena here) and returns it.
  uint64_t Insert(std::shared_ptr<Arena> arena);
  std::shared_ptr<Arena> Find(uint64_t id) const;
  // Unregisters the arena (checkpoints holding extents keep the mapping
  // alive); its idle waiters are answered OK. NOT_FOUND for an unknown id.
  absl::Status Release(uint64_t id, Deferred& d);
  // `done` runs once no checkpoint holds bytes of the arena (at once if
  // none does), with NOT_FOUND for an unknown id, or with DEADLINE_EXCEEDED
  // at `deadline` (Expire).
  void WaitIdle(uint64_t id, uint64_t token, absl::Time deadline,
                DoneCallback done, Deferred& d);
  // Drops the waiter of call `token` (its callback gets CANCELLED).
  bool DropWaiter(uint64_t token, Deferred& d);

  void Hold(Arena& arena, uint64_t bytes);
  void Unhold(Arena& arena, uint64_t bytes, Deferred& d);

  // Waiters past their deadline get DEADLINE_EXCEEDED; arenas idle longer
  // than idle_timeout are unmapped.
  void Expire(absl::Time now, Deferred& d);
  // Every waiter gets `error` (shutdown).
  void FailWaiters(const absl::Status& error, Deferred& d);

  int size() const { return static_cast<int>(arenas_.size()); }

 private:
  const ArenaRegistryOptions options_;
  absl::BitGen ids_;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Arena>> arenas_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_ARENA_ARENA_REGISTRY_H_
