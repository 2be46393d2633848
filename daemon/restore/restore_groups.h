// Copyright 2026 The ckptd Authors.
//
// Gathers the Restore batches of a node's ranks into group batches: batch
// k of every local rank of a group is served together, so a byte range two
// ranks want is read once. A group batch is ready when every local rank of
// the group has sent its batch k, has finished (sent its last batch
// earlier), has moved past k (its batch k was served without it) or is
// absent; or at its gather deadline, with the ranks that came. A rank that
// missed a gather deadline is absent until it sends again, so a dead
// trainer delays its group by one gather timeout, not one per batch. No
// I/O, no threads: the restorer calls it under its lock and serves what it
// returns.
//
// Groups are keyed by (caller uid, checkpoint directory, group string), so
// one user's ranks never join another user's group.
//
// A rank that sent batches of a group and then sends batch 0 again starts a
// new load under the same name: the Python client names a load's group
// "<dir>#<n>" and counts n from 0 in every process, so a job that crashed
// mid-load and restarted sends exactly that, while a live rank never sends
// batch 0 twice. The group starts anew: what it was gathering is served at
// once (as at a deadline: every member's bytes go to its own arena) and its
// ranks' progress is forgotten. (A restarted rank whose old self had sent
// nothing cannot be told from a late rank: coming before the ranks that
// had, it joins the group as it stands and is served, and a rank that
// then starts the group anew waits a gather timeout for it. The Python
// client avoids this under torchrun by naming a restarted job's loads
// apart; docs/restore.md, "Restarts".)
#ifndef CKPTD_DAEMON_RESTORE_RESTORE_GROUPS_H_
#define CKPTD_DAEMON_RESTORE_RESTORE_GROUPS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/restore/restore_types.h"

namespace ckptd::daemon {

class RestoreGroups {
 public:
  explicit RestoreGroups(absl::Duration gather_timeout)
      : gather_timeout_(gather_timeout) {}

  // Whether `b` (of checkpoint `dir` from user `uid`) starts its group anew
  // (see above): Add will, and the restore it belongs to is a new one.
  bool StartsAnew(const std::string& dir, uint32_t uid,
                  const RestoreBatch& b) const;

  // Adds `member` (a batch of checkpoint `dir` from user `uid`). On error
  // (INVALID_ARGUMENT: local_world_size differs from the group's, the rank
  // sent this batch already or is out of range; FAILED_PRECONDITION: the
  // rank sent its last batch already and sends a later one) `member` is
  // returned untouched in `rejected` and the error returned. Group batches
  // made ready by it (those of a group it starts anew included) are
  // appended to `ready`.
  absl::Status Add(const std::string& dir, uint32_t uid, GroupMember member,
                   absl::Time now, std::vector<GroupBatch>* ready,
                   GroupMember* rejected);

  // Group batches past their gather deadline (served with the ranks that
  // came); forgets groups whose ranks all finished (so a restarted job may
  // reuse the name) and groups idle for RestoreIdleTimeout.
  void Expire(absl::Time now, std::vector<GroupBatch>* ready);

  // Every batch still gathering (shutdown).
  void TakeAll(std::vector<GroupBatch>* out);

  // The batches of group `key` still gathering; the group is forgotten
  // (its restore was cancelled).
  void TakeGroup(const RestoreKey& key, std::vector<GroupBatch>* out);

  // Batches gathering now, for status and tests.
  int gathering() const;

 private:
  using Key = RestoreKey;
  struct Gathering {
    absl::Time deadline;
    std::vector<GroupMember> members;
  };
  struct Group {
    int local_world_size = 1;
    std::vector<uint32_t> next_batch;  // per local rank
    std::vector<bool> finished;        // per local rank
    std::vector<bool> absent;          // missed a deadline, not heard since
    std::map<uint32_t, Gathering> pending;
    absl::Time last_active;
  };
  static bool StartsAnew(const Group& g, const RestoreBatch& b);
  // Moves the ready batches of `g` to `ready`.
  void CollectReady(const Key& key, Group& g, absl::Time now, bool expire,
                    std::vector<GroupBatch>* ready);

  const absl::Duration gather_timeout_;
  std::map<Key, Group> groups_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_RESTORE_RESTORE_GROUPS_H_
