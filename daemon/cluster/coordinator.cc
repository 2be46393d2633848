// Copyright 2026 The ckptd Authors.
//
// The coordinator of multi-node checkpoints; the protocol is in the header.

#include "daemon/coordinator.h"

#include "daemon/checkpoint_dir.h"

#include <algorithm>
#include <map>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/checkpoint_manager.h"
#include "daemon/paths.h"
#include "daemon/tasks.h"
#include "fmt/format.h"
#include "format/checkpoint_writer.h"
#include "format/metadata.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

uint64_t IndexDigest(const NodeIndex& index) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  };
  auto mix_i = [&](int64_t v) { mix(&v, sizeof v); };
  auto mix_v = [&](const std::vector<int64_t>& v) {
    mix_i(static_cast<int64_t>(v.size()));
    if (!v.empty()) mix(v.data(), v.size() * sizeof(int64_t));
  };
  for (size_t r = 0; r < index.ranks.size(); ++r) {
    mix_i(index.ranks[r]);
    mix_i(static_cast<int64_t>(index.items[r].size()));
    for (size_t i = 0; i < index.items[r].size(); ++i) {
      const format::ItemDesc& it = index.items[r][i];
      mix_i(static_cast<int64_t>(it.fqn.size()));
      mix(it.fqn.data(), it.fqn.size());
      mix_i(static_cast<int64_t>(it.type));
      mix_i(static_cast<int64_t>(it.dtype));
      mix_v(it.global_shape);
      mix_v(it.chunk_offsets);
      mix_v(it.chunk_sizes);
      mix_i(static_cast<int64_t>(it.path.size()));
      for (const format::PathElement& e : it.path) {
        if (const auto* s = std::get_if<std::string>(&e)) {
          mix_i(-1 - static_cast<int64_t>(s->size()));
          mix(s->data(), s->size());
        } else {
          mix_i(std::get<int64_t>(e));
        }
      }
      mix_i(static_cast<int64_t>(index.nbytes[r][i]));
    }
  }
  return h;
}

namespace {

using Descs = std::vector<std::vector<format::ItemDesc>>;

struct Node {
  int node = 0;
  uint64_t attempt = 0;
  std::string name;
  std::vector<int> ranks;
  uint64_t digest = 0;
  std::shared_ptr<NodeIndex> index;  // until planned; null: cached
  PlanDone plan_waiter;
  bool planned = false;
  bool prepared = false;
  absl::Time prepared_at;
  std::vector<PrepareCall::Rank> storage;
  PrepareDone prepare_waiter;
  absl::Time last_contact;
  NodeProgress progress;
};

struct Global {
  std::string dir;
  // Step P opens the directory beneath its root without following symlinks
  // (CheckpointDir); the commit goes through io_dir, anchored to its fd.
  std::shared_ptr<CheckpointDir> dirh;
  std::string io_dir;
  std::string checkpoint_id;
  std::string job;
  int world_size = 0;
  int num_nodes = 0;
  bool overwrite = false;
  bool dedup = false;
  int keep_last_n = 0;
  State state = State::kPending;  // kPending: collecting indexes
  absl::Status error;
  std::map<int, Node> nodes;
  int ranks_claimed = 0;
  int nodes_planned = 0;
  int nodes_prepared = 0;
  bool committing = false;  // step 4 began: aborts are refused
  std::shared_ptr<const Descs> descs;
  std::shared_ptr<const format::SavePlan> plan;
  std::vector<size_t> kept;  // per rank: its items in the plan
  absl::Time created, finished = absl::InfinitePast();
};

// The last plan of a job, reused when every node's index repeats.
struct PlanCache {
  int world_size = 0;
  bool dedup = false;
  std::map<int, std::pair<uint64_t, std::vector<int>>>
      nodes;  // node → (digest, ranks)
  std::shared_ptr<const Descs> descs;
  std::shared_ptr<const format::SavePlan> plan;
  absl::Time used;
};
constexpr size_t kMaxCachedJobs = 8;
// About 350 bytes each (descs + plan): 4 M items ≈ 1.4 GB at most.
constexpr size_t kMaxCachedItems = size_t{4} << 20;

}  // namespace

class Coordinator::Impl {
 public:
  explicit Impl(CoordinatorOptions o)
      : options_(std::move(o)), env_(options_.env) {}
  void Start() {
    pool_ = std::make_unique<ThreadPool>(2);
    timer_ = std::thread([this] { Housekeeping(); });
  }
  void Shutdown() {
    {
      Deferred d;
      absl::MutexLock l(&mu_);
      stopping_ = true;
      for (auto& [dir, g] : globals_) {
        if (!IsFinal(g->state) && !g->committing) {
          FailLocked(*g,
                     absl::UnavailableError("the coordinator is shutting down"),
                     State::kFailed, d);
        }
      }
    }
    if (timer_.joinable()) timer_.join();
    pool_->Join();  // pool_ stays valid for late callers
  }

  void Plan(PlanCall call, PlanDone done);
  void Prepare(PrepareCall call, PrepareDone done);
  void Heartbeat(const PeerCallId& id, const NodeProgress& progress,
                 HeartbeatDone done);
  void Abort(const PeerCallId& id, absl::Status reason, AbortDone done);
  absl::StatusOr<GlobalStatus> Status(std::string_view checkpoint_id);

 private:
  absl::Status PlanLocked(PlanCall& call, PlanDone& done, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The node's entry, checked against the call's attempt.
  absl::StatusOr<Node*> NodeLocked(Global& g, const PeerCallId& id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::shared_ptr<Global> FindLocked(std::string_view checkpoint_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(Global& g, absl::Status error, State state, Deferred& d)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  GlobalStatus StatusOfLocked(const Global& g)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunPlan(std::shared_ptr<Global> g);
  void RunCommit(std::shared_ptr<Global> g);
  absl::Status CheckFiles(const Global& g, const format::Metadata& md);
  void Housekeeping();

  const CoordinatorOptions options_;
  Env* const env_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Global>> globals_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, PlanCache> cache_ ABSL_GUARDED_BY(mu_);
  // Aborts from nodes that had not sent their index while no round was
  // collecting: they fail the nodes of that save that arrive later.
  struct Tombstone {
    absl::Status error;
    absl::Time at;
  };
  absl::flat_hash_map<std::string, Tombstone> tombstones_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<ThreadPool> pool_;
  std::thread timer_;
};

// ---------------------------------------------------------------------------
// Plan round
// ---------------------------------------------------------------------------

std::shared_ptr<Global> Coordinator::Impl::FindLocked(
    std::string_view checkpoint_id) {
  if (auto it = globals_.find(std::string(checkpoint_id)); it != globals_.end())
    return it->second;
  absl::StatusOr<std::string> dir =
      ResolveCheckpointDir(options_.checkpoint_roots, checkpoint_id);
  if (!dir.ok()) return nullptr;
  auto it = globals_.find(*dir);
  return it == globals_.end() ? nullptr : it->second;
}

absl::StatusOr<Node*> Coordinator::Impl::NodeLocked(Global& g,
                                                    const PeerCallId& id) {
  auto it = g.nodes.find(id.node);
  if (it == g.nodes.end()) {
    return absl::NotFoundError(fmt::format(
        "the coordinator has no index of node {} ({}) for checkpoint {}",
        id.node, id.node_name, g.dir));
  }
  if (it->second.attempt != id.attempt) {
    return absl::FailedPreconditionError(fmt::format(
        "node {} ({}) names attempt {:x} of checkpoint {}, but the coordinator "
        "has attempt {:x}",
        id.node, id.node_name, id.attempt, g.dir, it->second.attempt));
  }
  return &it->second;
}

void Coordinator::Impl::Plan(PlanCall call, PlanDone done) {
  Deferred d;
  absl::MutexLock l(&mu_);
  if (absl::Status s = PlanLocked(call, done, d); !s.ok()) {
    if (!absl::IsFailedPrecondition(s) || s.message() != kIndexNotCached) {
      spdlog::warn("coordinator: plan of {} from node {} ({}) refused: {}",
                   call.id.checkpoint_id, call.id.node, call.id.node_name, s);
    }
    d.Add([done = std::move(done), s]() mutable { std::move(done)(s); });
  }
}

absl::Status Coordinator::Impl::PlanLocked(PlanCall& call, PlanDone& done,
                                           Deferred& d) {
  if (stopping_)
    return absl::UnavailableError("the coordinator is shutting down");
  if (call.world_size < 1 || call.world_size > options_.max_world_size) {
    return absl::InvalidArgumentError(
        fmt::format("world_size {} is not in [1, {}]", call.world_size,
                    options_.max_world_size));
  }
  if (call.num_nodes < 1 || call.num_nodes > call.world_size) {
    return absl::InvalidArgumentError(
        fmt::format("num_nodes {} is not in [1, world_size {}]", call.num_nodes,
                    call.world_size));
  }
  if (call.ranks.empty() || call.ranks.front() != call.id.node ||
      !std::is_sorted(call.ranks.begin(), call.ranks.end()) ||
      std::adjacent_find(call.ranks.begin(), call.ranks.end()) !=
          call.ranks.end() ||
      call.ranks.front() < 0 || call.ranks.back() >= call.world_size) {
    return absl::InvalidArgumentError(fmt::format(
        "node {}: its ranks [{}] must be ascending, distinct, in [0, {}) and "
        "start with the "
        "node's id",
        call.id.node, fmt::join(call.ranks, ", "), call.world_size));
  }
  ASSIGN_OR_RETURN(
      std::string dir,
      ResolveCheckpointDir(options_.checkpoint_roots, call.id.checkpoint_id));
  const std::string job = call.id.job.empty() ? DirName(dir) : call.id.job;
  // The index: sent, or the cached copy of the same digest.
  if (call.index) {
    if (call.index->ranks != call.ranks ||
        call.index->items.size() != call.ranks.size() ||
        call.index->nbytes.size() != call.ranks.size()) {
      return absl::InvalidArgumentError(fmt::format(
          "node {}: its index does not hold its ranks", call.id.node));
    }
    for (size_t i = 0; i < call.ranks.size(); ++i) {
      if (call.index->items[i].size() > options_.max_items ||
          call.index->nbytes[i].size() != call.index->items[i].size()) {
        return absl::ResourceExhaustedError(
            fmt::format("rank {} has {} items; the limit is {}", call.ranks[i],
                        call.index->items[i].size(), options_.max_items));
      }
    }
  } else {
    auto c = cache_.find(job);
    auto n = c == cache_.end() ? decltype(c->second.nodes)::iterator{}
                               : c->second.nodes.find(call.id.node);
    if (c == cache_.end() || n == c->second.nodes.end() ||
        n->second.first != call.index_digest ||
        n->second.second != call.ranks ||
        c->second.world_size != call.world_size) {
      return absl::FailedPreconditionError(kIndexNotCached);
    }
  }
  std::shared_ptr<Global> g;
  if (auto it = globals_.find(dir);
      it != globals_.end() && !IsFinal(it->second->state)) {
    g = it->second;
  } else {
    if (auto t = tombstones_.find(dir); t != tombstones_.end()) {
      if (call.started <= t->second.at) return t->second.error;
      tombstones_.erase(t);  // a later save of the same directory
    }
    g = std::make_shared<Global>();
    g->dir = dir;
    g->checkpoint_id = call.id.checkpoint_id;
    g->job = job;
    g->world_size = call.world_size;
    g->num_nodes = call.num_nodes;
    g->overwrite = call.overwrite;
    g->dedup = call.dedup_save_to_lowest_rank;
    g->keep_last_n = call.keep_last_n;
    g->created = options_.clock();
    globals_[dir] = g;
    spdlog::info(
        "coordinator: checkpoint {} (job '{}', {} ranks on {} nodes) started",
        dir, job, g->world_size, g->num_nodes);
  }
  auto fail = [&](absl::Status s) {
    FailLocked(*g, s, State::kFailed, d);
    return s;
  };
  if (g->state != State::kPending) {
    return fail(absl::FailedPreconditionError(fmt::format(
        "node {} ({}) sent its index for checkpoint {} after the plan was made",
        call.id.node, call.id.node_name, dir)));
  }
  if (call.world_size != g->world_size || call.num_nodes != g->num_nodes ||
      call.overwrite != g->overwrite ||
      call.dedup_save_to_lowest_rank != g->dedup ||
      call.keep_last_n != g->keep_last_n || job != g->job) {
    return fail(absl::InvalidArgumentError(
        fmt::format("node {} ({}) disagrees with the other nodes on world_size "
                    "({} vs {}), num_nodes ({} vs "
                    "{}), job or the save options of checkpoint {}",
                    call.id.node, call.id.node_name, call.world_size,
                    g->world_size, call.num_nodes, g->num_nodes, dir)));
  }
  if (auto it = g->nodes.find(call.id.node); it != g->nodes.end()) {
    return fail(absl::FailedPreconditionError(
        fmt::format("node {} ({}) sent a second index for checkpoint {} "
                    "(attempt {:x}, then {:x}): it "
                    "restarted its checkpoint",
                    call.id.node, call.id.node_name, dir, it->second.attempt,
                    call.id.attempt)));
  }
  // Ranks: no two nodes claim one.
  for (const auto& [id, other] : g->nodes) {
    std::vector<int> both;
    std::set_intersection(other.ranks.begin(), other.ranks.end(),
                          call.ranks.begin(), call.ranks.end(),
                          std::back_inserter(both));
    if (!both.empty()) {
      return fail(absl::InvalidArgumentError(fmt::format(
          "nodes {} ({}) and {} ({}) both claim rank {} of checkpoint {}", id,
          other.name, call.id.node, call.id.node_name, both.front(), dir)));
    }
  }
  if (static_cast<int>(g->nodes.size()) >= g->num_nodes) {
    return fail(absl::InvalidArgumentError(fmt::format(
        "node {} ({}) is one more than the {} nodes of checkpoint {}",
        call.id.node, call.id.node_name, g->num_nodes, dir)));
  }
  Node& n = g->nodes[call.id.node];
  n.node = call.id.node;
  n.attempt = call.id.attempt;
  n.name = call.id.node_name;
  n.ranks = call.ranks;
  n.digest = call.index_digest;
  n.index = std::const_pointer_cast<NodeIndex>(call.index);
  n.plan_waiter = std::move(done);
  n.last_contact = options_.clock();
  g->ranks_claimed += static_cast<int>(call.ranks.size());
  if (static_cast<int>(g->nodes.size()) == g->num_nodes) {
    if (g->ranks_claimed != g->world_size) {
      // The node's waiter is answered by the abort.
      (void)fail(absl::InvalidArgumentError(fmt::format(
          "the {} nodes of checkpoint {} hold {} ranks, not world_size {}",
          g->num_nodes, dir, g->ranks_claimed, g->world_size)));
      return absl::OkStatus();
    }
    g->state = State::kStaging;  // planning
    pool_->Submit([this, g]() mutable { RunPlan(std::move(g)); });
  }
  return absl::OkStatus();
}

void Coordinator::Impl::RunPlan(std::shared_ptr<Global> g) {
  const absl::Time start = absl::Now();
  // Inputs, without the lock: the nodes' entries no longer change until
  // planned (the state is past kPending).
  std::shared_ptr<const Descs> descs;
  std::shared_ptr<const format::SavePlan> plan;
  bool cached = false;
  {
    Deferred d;  // before the lock: runs after it is released
    absl::MutexLock l(&mu_);
    if (IsFinal(g->state)) return;
    auto c = cache_.find(g->job);
    if (c != cache_.end() && c->second.world_size == g->world_size &&
        c->second.dedup == g->dedup &&
        c->second.nodes.size() == g->nodes.size()) {
      cached = true;
      for (const auto& [id, n] : g->nodes) {
        auto cn = c->second.nodes.find(id);
        if (cn == c->second.nodes.end() || cn->second.first != n.digest ||
            cn->second.second != n.ranks) {
          cached = false;
          break;
        }
      }
      if (cached) {
        descs = c->second.descs;
        plan = c->second.plan;
        c->second.used = absl::Now();
      }
    }
    if (!cached) {
      auto built = std::make_shared<Descs>(g->world_size);
      for (auto& [id, n] : g->nodes) {
        if (!n.index) {
          // Digest only: the cache had it when the node called; another
          // checkpoint of the job may have replaced it since.
          auto cn = c == cache_.end() ? decltype(c->second.nodes)::iterator{}
                                      : c->second.nodes.find(id);
          if (c == cache_.end() || cn == c->second.nodes.end() ||
              cn->second.first != n.digest) {
            FailLocked(*g,
                       absl::AbortedError(
                           fmt::format("the plan cache of job '{}' changed "
                                       "while node {} relied on it; "
                                       "save again",
                                       g->job, id)),
                       State::kFailed, d);
            return;
          }
        }
        for (size_t i = 0; i < n.ranks.size(); ++i) {
          if (n.index) {
            (*built)[n.ranks[i]] = std::move(n.index->items[i]);
          } else {
            (*built)[n.ranks[i]] = (*c->second.descs)[n.ranks[i]];
          }
        }
        n.index.reset();
      }
      descs = std::move(built);
    }
  }
  absl::Status s;
  if (!cached) {
    format::PlanOptions po;
    po.dedup_save_to_lowest_rank = g->dedup;
    po.max_items = options_.max_items * static_cast<uint64_t>(g->world_size);
    absl::StatusOr<format::SavePlan> p = format::PlanSave(*descs, po);
    if (p.ok()) {
      plan = std::make_shared<const format::SavePlan>(*std::move(p));
    } else {
      s = p.status();
    }
  }
  // P. The directory, with no stale commit marker, before any node writes.
  if (s.ok()) {
    s = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(std::unique_ptr<CheckpointDir> dirh,
                       CheckpointDir::Open(env_, options_.checkpoint_roots, g->dir,
                                           /*create=*/true));
      const std::string io_dir = dirh->io_path();
      {
        absl::MutexLock l(&mu_);
        g->io_dir = io_dir;
        g->dirh = std::move(dirh);
      }
      const std::string marker = JoinPath(io_dir, format::kMetadataName);
      if (absl::Status e = env_->FileExists(marker); e.ok()) {
        if (!g->overwrite) {
          return absl::FailedPreconditionError(
              fmt::format("{} already holds a committed checkpoint (save with "
                          "overwrite to replace it)",
                          g->dir));
        }
        RETURN_IF_ERROR(env_->RemoveFile(marker));
        RETURN_IF_ERROR(env_->SyncDir(io_dir));
      } else if (!absl::IsNotFound(e)) {
        return e;
      }
      return absl::OkStatus();
    }();
  }
  // Each node's part: which of its items survive, and its files.
  std::map<int, NodePlan> parts;
  if (s.ok()) {
    std::vector<int> owner(g->world_size, -1);
    std::vector<size_t> slot(g->world_size, 0);
    {
      absl::MutexLock l(&mu_);
      for (const auto& [id, n] : g->nodes) {
        NodePlan& np = parts[id];
        np.cached = cached;
        for (size_t i = 0; i < n.ranks.size(); ++i) {
          owner[n.ranks[i]] = id;
          slot[n.ranks[i]] = i;
          np.ranks.push_back(
              {n.ranks[i], std::vector<bool>((*descs)[n.ranks[i]].size()), ""});
        }
      }
    }
    for (const format::PlannedItem& pi : plan->items) {
      parts[owner[pi.rank]].ranks[slot[pi.rank]].keep[pi.item_index] = true;
    }
    for (const format::PlannedFile& f : plan->files) {
      parts[owner[f.rank]].ranks[slot[f.rank]].file = f.relative_path;
    }
  }
  Deferred d;
  absl::MutexLock l(&mu_);
  if (IsFinal(g->state)) return;
  if (!s.ok()) {
    FailLocked(*g, s, State::kFailed, d);
    return;
  }
  g->descs = descs;
  g->plan = plan;
  g->kept.assign(g->world_size, 0);
  for (const format::PlannedItem& pi : plan->items) ++g->kept[pi.rank];
  g->state = State::kWriting;
  g->nodes_planned = g->num_nodes;
  if (!cached) {
    PlanCache& c = cache_[g->job];
    c.world_size = g->world_size;
    c.dedup = g->dedup;
    c.nodes.clear();
    for (const auto& [id, n] : g->nodes) c.nodes[id] = {n.digest, n.ranks};
    c.descs = descs;
    c.plan = plan;
    c.used = absl::Now();
    auto cached_items = [&] {
      size_t n = 0;
      for (const auto& [job, e] : cache_) n += e.plan->items.size();
      return n;
    };
    while (cache_.size() > kMaxCachedJobs ||
           (cache_.size() > 1 && cached_items() > kMaxCachedItems)) {
      auto oldest = cache_.begin();
      for (auto it = cache_.begin(); it != cache_.end(); ++it) {
        if (it->second.used < oldest->second.used) oldest = it;
      }
      cache_.erase(oldest);
    }
  }
  spdlog::info(
      "coordinator: checkpoint {}: {} items of {} ranks planned into {} "
      "files{} in {}",
      g->dir, plan->items.size(), g->world_size, plan->files.size(),
      cached ? " (plan cache)" : "", absl::FormatDuration(absl::Now() - start));
  for (auto& [id, n] : g->nodes) {
    n.planned = true;
    n.last_contact = options_.clock();
    if (n.plan_waiter) {
      d.Add([done = std::move(n.plan_waiter),
             part = std::move(parts[id])]() mutable {
        std::move(done)(std::move(part));
      });
      n.plan_waiter = nullptr;
    }
  }
}

// ---------------------------------------------------------------------------
// Commit round
// ---------------------------------------------------------------------------

void Coordinator::Impl::Prepare(PrepareCall call, PrepareDone done) {
  Deferred d;
  absl::MutexLock l(&mu_);
  auto reply = [&](absl::StatusOr<GlobalStatus> s) {
    d.Add([done = std::move(done), s]() mutable { std::move(done)(s); });
  };
  std::shared_ptr<Global> g = FindLocked(call.id.checkpoint_id);
  if (!g) {
    return reply(absl::NotFoundError(fmt::format(
        "the coordinator knows no checkpoint '{}' (was it restarted?)",
        call.id.checkpoint_id)));
  }
  absl::StatusOr<Node*> n = NodeLocked(*g, call.id);
  if (!n.ok()) return reply(n.status());
  if (g->state == State::kCommitted) return reply(StatusOfLocked(*g));
  if (IsFinal(g->state)) return reply(g->error);
  if (!(*n)->planned || (*n)->prepared) {
    absl::Status s = absl::FailedPreconditionError(
        fmt::format("node {} ({}) prepared checkpoint {} {}", call.id.node,
                    call.id.node_name, g->dir,
                    (*n)->prepared ? "twice" : "before its plan"));
    FailLocked(*g, s, State::kFailed, d);
    return reply(s);
  }
  // The node's storage must place exactly its planned items.
  const Node& node = **n;
  bool shape_ok = call.ranks.size() == node.ranks.size();
  for (size_t i = 0; i < node.ranks.size() && shape_ok; ++i) {
    const size_t kept = g->kept[node.ranks[i]];
    shape_ok = call.ranks[i].rank == node.ranks[i] &&
               call.ranks[i].offset.size() == kept &&
               call.ranks[i].length.size() == kept;
  }
  if (!shape_ok) {
    absl::Status s = absl::InvalidArgumentError(
        fmt::format("node {} ({}) prepared checkpoint {} with storage that "
                    "does not match its plan",
                    call.id.node, call.id.node_name, g->dir));
    FailLocked(*g, s, State::kFailed, d);
    return reply(s);
  }
  (*n)->prepared = true;
  (*n)->prepared_at = (*n)->last_contact = options_.clock();
  (*n)->storage = std::move(call.ranks);
  (*n)->progress = call.progress;
  (*n)->prepare_waiter = std::move(done);
  if (++g->nodes_prepared == g->num_nodes) {
    g->state = State::kCommitting;
    g->committing = true;
    pool_->Submit([this, g]() mutable { RunCommit(std::move(g)); });
  }
}

absl::Status Coordinator::Impl::CheckFiles(const Global& g,
                                           const format::Metadata& md) {
  absl::flat_hash_map<std::string, uint64_t> need;
  for (const auto& [key, info] : md.storage_data) {
    uint64_t& n = need[info.relative_path];
    n = std::max(n, info.offset + info.length);
  }
  for (const auto& [file, bytes] : need) {
    absl::StatusOr<uint64_t> size = env_->GetFileSize(JoinPath(g.dir, file));
    if (!size.ok() || *size < bytes) {
      return absl::FailedPreconditionError(fmt::format(
          "data file {} of checkpoint {} is {} to the coordinator (needs {} "
          "bytes): checkpoint "
          "storage must be shared by all nodes, and no node may have given up",
          file, g.dir,
          size.ok() ? fmt::format("{} bytes", *size)
                    : fmt::format("{}", size.status()),
          bytes));
    }
  }
  return absl::OkStatus();
}

void Coordinator::Impl::RunCommit(std::shared_ptr<Global> g) {
  const absl::Time start = absl::Now();
  // Every node prepared and `committing` is set: the plan and the nodes'
  // storage no longer change, so the metadata is built without the lock
  // (2 M items take a second; other checkpoints' calls go on meanwhile).
  format::Metadata md;
  {
    md.state_dict_metadata = g->plan->metadata.state_dict_metadata;
    md.planner_data = g->plan->metadata.planner_data;
    md.version = g->plan->metadata.version;
    // storage_data in rank order, each rank's items in file order (plan
    // items are in rank order, then item order).
    std::vector<const PrepareCall::Rank*> storage(g->world_size, nullptr);
    for (const auto& [id, n] : g->nodes) {
      for (const PrepareCall::Rank& r : n.storage) storage[r.rank] = &r;
    }
    std::vector<size_t> cursor(g->world_size, 0);
    md.storage_data.reserve(g->plan->items.size());
    for (const format::PlannedItem& pi : g->plan->items) {
      const PrepareCall::Rank& r = *storage[pi.rank];
      const size_t k = cursor[pi.rank]++;
      md.storage_data.emplace_back(
          (*g->descs)[pi.rank][pi.item_index].Key(),
          format::StorageInfo{
              g->plan->files[0].relative_path, r.offset[k], r.length[k], {}});
    }
    // The file of each item: its rank's file.
    absl::flat_hash_map<int, const std::string*> file_of;
    for (const format::PlannedFile& f : g->plan->files)
      file_of[f.rank] = &f.relative_path;
    for (size_t i = 0; i < md.storage_data.size(); ++i) {
      md.storage_data[i].second.relative_path =
          *file_of[g->plan->items[i].rank];
    }
  }
  format::StorageMeta sm;
  sm.checkpoint_id = g->dir;
  md.storage_meta = sm;
  // A node that lost the coordinator waits commit_timeout + peer_timeout
  // after its prepare before it decides from .metadata; the coordinator
  // never renames .metadata in after commit_timeout of any prepare.
  auto prepares_good = [&]() -> absl::Status {
    absl::MutexLock l(&mu_);
    const absl::Time now = options_.clock();
    for (const auto& [id, n] : g->nodes) {
      if (now - n.prepared_at > options_.commit_timeout) {
        return absl::DeadlineExceededError(fmt::format(
            "node {} ({}) prepared {} ago, more than commit_timeout {}", id,
            n.name, absl::FormatDuration(now - n.prepared_at),
            absl::FormatDuration(options_.commit_timeout)));
      }
    }
    return absl::OkStatus();
  };
  std::string io_dir;
  {
    absl::MutexLock l(&mu_);
    io_dir = g->io_dir.empty() ? g->dir : g->io_dir;
  }
  const std::string marker = JoinPath(io_dir, format::kMetadataName);
  const std::string tmp = marker + ".tmp";
  absl::Status s = [&]() -> absl::Status {
    // 3. Validation: every node's prepare still good, every file visible.
    RETURN_IF_ERROR(prepares_good());
    RETURN_IF_ERROR(CheckFiles(*g, md));
    // 4. .metadata.tmp → fsync → (prepares still good) → rename → fsync dir.
    ASSIGN_OR_RETURN(std::string bytes,
                     format::EncodeMetadata(md, format::EncodeOptions{}));
    {
      ASSIGN_OR_RETURN(auto f, env_->NewWritableFile(tmp));
      RETURN_IF_ERROR(f->Append(bytes));
      if (options_.fsync) RETURN_IF_ERROR(f->Sync());
      RETURN_IF_ERROR(f->Close());
    }
    if (absl::Status late = prepares_good(); !late.ok()) {
      (void)env_->RemoveFile(tmp);
      return late;
    }
    RETURN_IF_ERROR(env_->RenameFile(tmp, marker));
    if (options_.fsync) RETURN_IF_ERROR(env_->SyncDir(io_dir));
    // 5. Nobody took a file away meanwhile.
    if (absl::Status again = CheckFiles(*g, md); !again.ok()) {
      (void)env_->RemoveFile(marker);
      (void)env_->SyncDir(io_dir);
      return again;
    }
    return absl::OkStatus();
  }();
  bool committed = false;
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    g->committing = false;
    if (!s.ok()) {
      (void)env_->RemoveFile(tmp);
      FailLocked(*g, s, State::kFailed, d);
    } else {
      g->state = State::kCommitted;
      g->finished = options_.clock();
      committed = true;
      spdlog::info(
          "coordinator: checkpoint {} committed: {} nodes, {} items, .metadata "
          "in {} ({} after "
          "the first index)",
          g->dir, g->num_nodes, md.storage_data.size(),
          absl::FormatDuration(absl::Now() - start),
          absl::FormatDuration(g->finished - g->created));
      const GlobalStatus final_status = StatusOfLocked(*g);
      for (auto& [id, n] : g->nodes) {
        if (n.prepare_waiter) {
          d.Add([done = std::move(n.prepare_waiter), final_status]() mutable {
            std::move(done)(final_status);
          });
          n.prepare_waiter = nullptr;
        }
      }
    }
  }
  if (committed && options_.on_commit)
    options_.on_commit(g->job, g->dir, g->keep_last_n);
}

// ---------------------------------------------------------------------------
// Heartbeats, aborts, status
// ---------------------------------------------------------------------------

GlobalStatus Coordinator::Impl::StatusOfLocked(const Global& g) {
  GlobalStatus s;
  s.state = g.state == State::kStaging ? State::kPending : g.state;
  s.num_nodes = g.num_nodes;
  s.nodes_planned = g.nodes_planned;
  s.nodes_prepared = g.nodes_prepared;
  s.error = g.error;
  State least = State::kCommitted;
  for (const auto& [id, n] : g.nodes) {
    s.ranks_staged += n.progress.ranks_staged;
    s.total_bytes += n.progress.total_bytes;
    s.staged_bytes += n.progress.staged_bytes;
    s.written_bytes += n.progress.written_bytes;
    if (n.progress.state != State{}) least = std::min(least, n.progress.state);
  }
  // Between plan and commit the global state is the least advanced node's.
  if (g.state == State::kWriting &&
      static_cast<int>(g.nodes.size()) == g.num_nodes) {
    s.state = std::clamp(least, State::kStaging, State::kCommitting);
  }
  return s;
}

void Coordinator::Impl::Heartbeat(const PeerCallId& id,
                                  const NodeProgress& progress,
                                  HeartbeatDone done) {
  absl::StatusOr<GlobalStatus> result;
  {
    absl::MutexLock l(&mu_);
    std::shared_ptr<Global> g = FindLocked(id.checkpoint_id);
    if (!g) {
      result = absl::NotFoundError(fmt::format(
          "the coordinator knows no checkpoint '{}' (was it restarted?)",
          id.checkpoint_id));
    } else if (absl::StatusOr<Node*> n = NodeLocked(*g, id); !n.ok()) {
      result = n.status();
    } else {
      (*n)->last_contact = options_.clock();
      (*n)->progress = progress;
      result = StatusOfLocked(*g);
    }
  }
  std::move(done)(std::move(result));
}

void Coordinator::Impl::Abort(const PeerCallId& id, absl::Status reason,
                              AbortDone done) {
  absl::Status result;
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    std::shared_ptr<Global> g = FindLocked(id.checkpoint_id);
    absl::StatusOr<std::string> dir =
        ResolveCheckpointDir(options_.checkpoint_roots, id.checkpoint_id);
    if ((!g || IsFinal(g->state)) && dir.ok() &&
        !(g && g->nodes.contains(id.node))) {
      // No round collecting for it yet (or only an old one): the nodes of
      // this save that come later are told.
      tombstones_[*dir] = {
          absl::Status(
              reason.code(),
              fmt::format("node {} ({}) aborted checkpoint {} before "
                          "sending its index: {}",
                          id.node, id.node_name, *dir, reason.message())),
          options_.clock()};
      spdlog::warn("coordinator: {}", tombstones_[*dir].error);
    } else if (!g) {
      result = absl::NotFoundError(fmt::format(
          "the coordinator knows no checkpoint '{}'", id.checkpoint_id));
    } else if (absl::StatusOr<Node*> n = NodeLocked(*g, id);
               !n.ok() &&
               !(absl::IsNotFound(n.status()) && g->state == State::kPending)) {
      // (A node failed before sending its index may still abort the
      // collecting round: the others would wait for it in vain.)
      result = n.status();
    } else if (IsFinal(g->state)) {
      result = g->state == State::kCommitted
                   ? absl::FailedPreconditionError(
                         fmt::format("{} is committed", g->dir))
                   : absl::OkStatus();
    } else if (g->committing) {
      result = absl::FailedPreconditionError(fmt::format(
          "{} is being committed; the abort came too late", g->dir));
    } else {
      const bool cancel = absl::IsCancelled(reason);
      FailLocked(*g,
                 absl::Status(reason.code(),
                              fmt::format("node {} ({}): {}", id.node,
                                          id.node_name, reason.message())),
                 cancel ? State::kCancelled : State::kFailed, d);
    }
  }
  if (done) std::move(done)(result);
}

void Coordinator::Impl::FailLocked(Global& g, absl::Status error, State state,
                                   Deferred& d) {
  if (IsFinal(g.state)) return;
  g.state = state;
  g.error = error;
  g.finished = options_.clock();
  spdlog::error("coordinator: checkpoint {} aborted on all {} nodes: {}", g.dir,
                g.num_nodes, error);
  if (static_cast<int>(g.nodes.size()) < g.num_nodes) {
    // Nodes of this save still to come are told at once.
    tombstones_[g.dir] = {error, g.finished};
  }
  for (auto& [id, n] : g.nodes) {
    for (auto* waiter : {&n.prepare_waiter}) {
      if (*waiter) {
        d.Add([done = std::move(*waiter), error]() mutable {
          std::move(done)(error);
        });
        *waiter = nullptr;
      }
    }
    if (n.plan_waiter) {
      d.Add([done = std::move(n.plan_waiter), error]() mutable {
        std::move(done)(error);
      });
      n.plan_waiter = nullptr;
    }
    n.index.reset();
  }
}

absl::StatusOr<GlobalStatus> Coordinator::Impl::Status(
    std::string_view checkpoint_id) {
  absl::MutexLock l(&mu_);
  std::shared_ptr<Global> g = FindLocked(checkpoint_id);
  if (!g)
    return absl::NotFoundError(
        fmt::format("no global checkpoint '{}'", checkpoint_id));
  return StatusOfLocked(*g);
}

void Coordinator::Impl::Housekeeping() {
  while (true) {
    Deferred d;
    absl::MutexLock l(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             absl::Milliseconds(50)))
      return;
    const absl::Time now = options_.clock();
    std::vector<std::string> forget;
    for (auto& [dir, gp] : globals_) {
      Global& g = *gp;
      if (IsFinal(g.state)) {
        if (now - g.finished > options_.forget_after) forget.push_back(dir);
        continue;
      }
      if (g.committing) continue;
      if (g.state == State::kPending &&
          now - g.created > options_.stage_timeout) {
        std::vector<int> claimed(g.world_size, 0);
        for (const auto& [id, n] : g.nodes) {
          for (int r : n.ranks) claimed[r] = 1;
        }
        std::string missing;
        int shown = 0;
        for (int r = 0; r < g.world_size && shown < 16; ++r) {
          if (!claimed[r])
            missing += fmt::format("{}{}", shown++ ? ", " : "", r);
        }
        FailLocked(g,
                   absl::DeadlineExceededError(fmt::format(
                       "{} of {} nodes sent their index within stage_timeout "
                       "{}; ranks [{}] "
                       "are on no node heard from",
                       g.nodes.size(), g.num_nodes,
                       absl::FormatDuration(options_.stage_timeout), missing)),
                   State::kFailed, d);
        continue;
      }
      for (const auto& [id, n] : g.nodes) {
        // A prepared node's files are durable: it may die now without
        // blocking the commit (step 3 checks its files are there).
        if (!n.prepared && now - n.last_contact > options_.peer_timeout) {
          FailLocked(
              g,
              absl::UnavailableError(fmt::format(
                  "node {} ({}) was not heard from for {} (peer_timeout)", id,
                  n.name, absl::FormatDuration(now - n.last_contact))),
              State::kFailed, d);
          break;
        }
        if (n.prepared && now - n.prepared_at > options_.commit_timeout) {
          std::vector<int> waiting;
          for (const auto& [oid, o] : g.nodes) {
            if (!o.prepared) waiting.push_back(oid);
          }
          FailLocked(g,
                     absl::DeadlineExceededError(fmt::format(
                         "nodes [{}] were not durable within commit_timeout {} "
                         "of node {}'s",
                         fmt::join(waiting, ", "),
                         absl::FormatDuration(options_.commit_timeout), id)),
                     State::kFailed, d);
          break;
        }
      }
    }
    for (const std::string& dir : forget) globals_.erase(dir);
    for (auto it = tombstones_.begin(); it != tombstones_.end();) {
      if (now - it->second.at > options_.stage_timeout) {
        tombstones_.erase(it++);
      } else {
        ++it;
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Coordinator
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    CoordinatorOptions options) {
  if (options.env == nullptr)
    return absl::InvalidArgumentError("CoordinatorOptions.env is not set");
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->Start();
  return std::unique_ptr<Coordinator>(new Coordinator(std::move(impl)));
}

Coordinator::Coordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Coordinator::~Coordinator() { impl_->Shutdown(); }

void Coordinator::Plan(PlanCall call, PlanDone done) {
  impl_->Plan(std::move(call), std::move(done));
}
void Coordinator::Prepare(PrepareCall call, PrepareDone done) {
  impl_->Prepare(std::move(call), std::move(done));
}
void Coordinator::Heartbeat(PeerCallId id, NodeProgress progress,
                            HeartbeatDone done) {
  impl_->Heartbeat(id, progress, std::move(done));
}
void Coordinator::Abort(PeerCallId id, absl::Status reason, AbortDone done) {
  impl_->Abort(id, std::move(reason), std::move(done));
}
absl::StatusOr<GlobalStatus> Coordinator::Status(
    std::string_view checkpoint_id) {
  return impl_->Status(checkpoint_id);
}

}  // namespace ckptd::daemon
