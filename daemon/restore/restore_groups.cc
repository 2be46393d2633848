// Copyright 2026 The ckptd Authors.
#include "daemon/restore/restore_groups.h"

#include <algorithm>
#include <utility>

#include "fmt/format.h"

namespace ckptd::daemon {

bool RestoreGroups::StartsAnew(const Group& g, const RestoreBatch& b) {
  if (b.batch != 0 || b.local_rank < 0 ||
      b.local_rank >= static_cast<int>(g.next_batch.size())) {
    return false;
  }
  return g.next_batch[b.local_rank] > 0 || g.finished[b.local_rank];
}

bool RestoreGroups::StartsAnew(const std::string& dir, uint32_t uid,
                               const RestoreBatch& b) const {
  if (b.group.empty()) return false;
  auto it = groups_.find(Key{uid, dir, b.group});
  return it != groups_.end() && StartsAnew(it->second, b);
}

absl::Status RestoreGroups::Add(const std::string& dir, uint32_t uid,
                                GroupMember member, absl::Time now,
                                std::vector<GroupBatch>* ready,
                                GroupMember* rejected) {
  const RestoreBatch& b = member.batch;
  if (b.group.empty()) {  // a rank on its own: nothing to gather
    GroupBatch gb{dir, uid, {}};
    gb.members.push_back(std::move(member));
    ready->push_back(std::move(gb));
    return absl::OkStatus();
  }
  const Key key{uid, dir, b.group};
  auto [it, fresh] = groups_.try_emplace(key);
  Group& g = it->second;
  auto reject = [&](absl::Status s) {
    *rejected = std::move(member);
    return s;
  };
  if (!fresh && StartsAnew(g, b)) {  // a restarted job (see the header)
    for (auto& [k, ga] : g.pending) {
      ready->push_back(GroupBatch{dir, uid, std::move(ga.members)});
    }
    g = Group{};
    fresh = true;
  }
  if (fresh) {
    g.local_world_size = b.local_world_size;
    g.next_batch.assign(b.local_world_size, 0);
    g.finished.assign(b.local_world_size, false);
    g.absent.assign(b.local_world_size, false);
  } else if (g.local_world_size != b.local_world_size) {
    return reject(absl::InvalidArgumentError(fmt::format(
        "restore group '{}': local_world_size {} but its other ranks sent {}",
        b.group, b.local_world_size, g.local_world_size)));
  }
  const int r = b.local_rank;
  if (g.finished[r]) {
    return reject(absl::FailedPreconditionError(fmt::format(
        "restore group '{}': local rank {} sent its last batch already "
        "(start a new group for a new load)",
        b.group, r)));
  }
  if (b.batch < g.next_batch[r]) {
    return reject(absl::InvalidArgumentError(fmt::format(
        "restore group '{}': local rank {} sent batch {} after batch {}",
        b.group, r, b.batch, g.next_batch[r] - 1)));
  }
  g.next_batch[r] = b.batch + 1;
  g.absent[r] = false;
  if (b.last) g.finished[r] = true;
  g.last_active = now;
  auto [pit, pfresh] = g.pending.try_emplace(b.batch);
  if (pfresh) pit->second.deadline = now + gather_timeout_;
  pit->second.members.push_back(std::move(member));
  CollectReady(key, g, now, /*expire=*/false, ready);
  return absl::OkStatus();
}

void RestoreGroups::CollectReady(const Key& key, Group& g, absl::Time now,
                                 bool expire, std::vector<GroupBatch>* ready) {
  for (auto pit = g.pending.begin(); pit != g.pending.end();) {
    const uint32_t k = pit->first;
    Gathering& ga = pit->second;
    std::vector<bool> here(g.local_world_size, false);
    for (const GroupMember& m : ga.members) here[m.batch.local_rank] = true;
    auto waits_for = [&](int r) {
      // Not present, not finished, not absent, and its batch k not served
      // already (it would have come after a gathering of k timed out).
      return !here[r] && !g.finished[r] && !g.absent[r] && g.next_batch[r] <= k;
    };
    bool complete = true;
    for (int r = 0; r < g.local_world_size && complete; ++r) {
      complete = !waits_for(r);
    }
    if (!complete && expire && now >= ga.deadline) {
      for (int r = 0; r < g.local_world_size; ++r) {
        if (waits_for(r)) g.absent[r] = true;
      }
      complete = true;
    }
    if (!complete) {
      ++pit;
      continue;
    }
    ready->push_back(
        GroupBatch{std::get<1>(key), std::get<0>(key), std::move(ga.members)});
    pit = g.pending.erase(pit);
  }
}

void RestoreGroups::Expire(absl::Time now, std::vector<GroupBatch>* ready) {
  for (auto it = groups_.begin(); it != groups_.end();) {
    Group& g = it->second;
    CollectReady(it->first, g, now, /*expire=*/true, ready);
    bool all_done = true;
    for (bool f : g.finished) all_done = all_done && f;
    const absl::Duration idle = RestoreIdleTimeout(gather_timeout_);
    if (g.pending.empty() && (all_done || now - g.last_active > idle)) {
      it = groups_.erase(it);
    } else {
      ++it;
    }
  }
}

void RestoreGroups::TakeAll(std::vector<GroupBatch>* out) {
  for (auto& [key, g] : groups_) {
    for (auto& [k, ga] : g.pending) {
      out->push_back(GroupBatch{std::get<1>(key), std::get<0>(key),
                                std::move(ga.members)});
    }
  }
  groups_.clear();
}

void RestoreGroups::TakeGroup(const RestoreKey& key,
                              std::vector<GroupBatch>* out) {
  auto it = groups_.find(key);
  if (it == groups_.end()) return;
  for (auto& [k, ga] : it->second.pending) {
    out->push_back(
        GroupBatch{std::get<1>(key), std::get<0>(key), std::move(ga.members)});
  }
  groups_.erase(it);
}

int RestoreGroups::gathering() const {
  int n = 0;
  for (const auto& [key, g] : groups_) n += static_cast<int>(g.pending.size());
  return n;
}

}  // namespace ckptd::daemon
