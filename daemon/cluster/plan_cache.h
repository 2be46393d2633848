// Copyright 2026 The ckptd Authors.
//
// The coordinator's plan cache: the last global plan of each job, reused
// when every node's index repeats (the common case: a training job saves
// the same state dict shape every time). A node then sends only its
// index's digest (IndexDigest); the coordinator answers kIndexNotCached
// when it has no entry for it, and the node resends the index.
//
// Bounded: at most kMaxJobs jobs and kMaxItems planned items together
// (about 350 bytes each: 4 M items ≈ 1.4 GB); the least recently used job
// goes first (the newest entry always stays).
//
// Thread-compatible: the coordinator guards it with its lock. The
// descriptions and plans it hands out are immutable (shared_ptr<const>)
// and may be read without the lock.
#ifndef CKPTD_DAEMON_CLUSTER_PLAN_CACHE_H_
#define CKPTD_DAEMON_CLUSTER_PLAN_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "format/plan/save_plan.h"

namespace ckptd::daemon {

// Every rank's items, by global rank.
using Descs = std::vector<std::vector<format::ItemDesc>>;
// node id → (index digest, its ranks)
using NodeDigests = std::map<int, std::pair<uint64_t, std::vector<int>>>;

class PlanCache {
 public:
  static constexpr size_t kMaxJobs = 8;
  static constexpr size_t kMaxItems = size_t{4} << 20;

  struct Entry {
    int world_size = 0;
    bool dedup = false;
    NodeDigests nodes;
    std::shared_ptr<const Descs> descs;
    std::shared_ptr<const format::SavePlan> plan;
    absl::Time used;
  };

  // A digest-only Plan call of `node` can be served: the job's entry holds
  // that node's index with this digest and these ranks.
  bool Knows(const std::string& job, int node, uint64_t digest,
             const std::vector<int>& ranks, int world_size) const;
  // The job's entry when every node of this round repeats it (the whole
  // plan is reused; marked used at `now`), else null.
  const Entry* Match(const std::string& job, int world_size, bool dedup,
                     const NodeDigests& nodes, absl::Time now);
  // The job's entry whatever it holds (digest-only nodes take their items
  // from it), or null.
  const Entry* Find(const std::string& job) const;
  // Replaces the job's entry and evicts down to the bounds.
  void Insert(const std::string& job, Entry entry);

  size_t jobs() const { return entries_.size(); }

 private:
  absl::flat_hash_map<std::string, Entry> entries_;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_PLAN_CACHE_H_
