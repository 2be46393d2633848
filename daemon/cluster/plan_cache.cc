// Copyright 2026 The ckptd Authors.
#include "daemon/cluster/plan_cache.h"

namespace ckptd::daemon {

bool PlanCache::Knows(const std::string& job, int node, uint64_t digest,
                      const std::vector<int>& ranks, int world_size) const {
  auto e = entries_.find(job);
  if (e == entries_.end() || e->second.world_size != world_size) return false;
  auto n = e->second.nodes.find(node);
  return n != e->second.nodes.end() && n->second.first == digest &&
         n->second.second == ranks;
}

const PlanCache::Entry* PlanCache::Match(const std::string& job, int world_size,
                                         bool dedup, const NodeDigests& nodes,
                                         absl::Time now) {
  auto e = entries_.find(job);
  if (e == entries_.end() || e->second.world_size != world_size ||
      e->second.dedup != dedup || e->second.nodes != nodes) {
    return nullptr;
  }
  e->second.used = now;
  return &e->second;
}

const PlanCache::Entry* PlanCache::Find(const std::string& job) const {
  auto e = entries_.find(job);
  return e == entries_.end() ? nullptr : &e->second;
}

void PlanCache::Insert(const std::string& job, Entry entry) {
  entries_[job] = std::move(entry);
  auto items = [&] {
    size_t n = 0;
    for (const auto& [j, e] : entries_) n += e.plan->items.size();
    return n;
  };
  while (entries_.size() > kMaxJobs ||
         (entries_.size() > 1 && items() > kMaxItems)) {
    auto oldest = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == job) continue;  // the newest stays
      if (oldest == entries_.end() || it->second.used < oldest->second.used)
        oldest = it;
    }
    if (oldest == entries_.end()) return;
    entries_.erase(oldest);
  }
}

}  // namespace ckptd::daemon
