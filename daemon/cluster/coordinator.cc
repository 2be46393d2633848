// Copyright 2026 The ckptd Authors.
//
// The coordinator of multi-node checkpoints, part 1: the nodes' calls
// (Plan, Prepare, Heartbeat, Abort), aborts and the timers. The protocol is
// in coordinator.h; the rounds' tasks are in coordinator_rounds.cc.
#include "daemon/cluster/coordinator.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "common/absl_fmt.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "daemon/cluster/coordinator_impl.h"
#include "daemon/commit/paths.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

uint64_t IndexDigest(const NodeIndex& index) {
  Fnv1a h;
  auto mix_i = [&](int64_t v) { h.AddValue(v); };
  auto mix_v = [&](absl::Span<const int64_t> v) {
    mix_i(static_cast<int64_t>(v.size()));
    if (!v.empty()) h.Add(v.data(), v.size() * sizeof(int64_t));
  };
  for (size_t r = 0; r < index.ranks.size(); ++r) {
    mix_i(index.ranks[r]);
    mix_i(static_cast<int64_t>(index.items[r].size()));
    for (size_t i = 0; i < index.items[r].size(); ++i) {
      const format::ItemDesc& it = index.items[r][i];
      mix_i(static_cast<int64_t>(it.fqn.size()));
      h.Add(it.fqn);
      mix_i(static_cast<int64_t>(it.type));
      mix_i(static_cast<int64_t>(it.dtype));
      mix_v(it.global_shape);
      mix_v(it.chunk_offsets);
      mix_v(it.chunk_sizes);
      mix_i(static_cast<int64_t>(it.path.size()));
      for (const format::PathElement& e : it.path) {
        if (const auto* s = std::get_if<std::string>(&e)) {
          mix_i(-1 - static_cast<int64_t>(s->size()));
          h.Add(*s);
        } else {
          mix_i(std::get<int64_t>(e));
        }
      }
      mix_i(static_cast<int64_t>(index.nbytes[r][i]));
    }
  }
  return h.digest();
}

namespace {

// A Plan call's own consistency: sizes, its ranks, its index.
absl::Status CheckPlanCall(const PlanCall& call, const CoordinatorOptions& o) {
  if (call.world_size < 1 || call.world_size > o.max_world_size) {
    return absl::InvalidArgumentError(fmt::format(
        "world_size {} is not in [1, {}]", call.world_size, o.max_world_size));
  }
  if (call.num_nodes < 1 || call.num_nodes > call.world_size) {
    return absl::InvalidArgumentError(
        fmt::format("num_nodes {} is not in [1, world_size {}]", call.num_nodes,
                    call.world_size));
  }
  const std::vector<int>& r = call.ranks;
  if (r.empty() || r.front() != call.id.node ||
      !std::is_sorted(r.begin(), r.end()) ||
      std::adjacent_find(r.begin(), r.end()) != r.end() || r.front() < 0 ||
      r.back() >= call.world_size) {
    return absl::InvalidArgumentError(
        fmt::format("node {}: its ranks [{}] must be ascending, distinct, in "
                    "[0, {}) and start with the "
                    "node's id",
                    call.id.node, fmt::join(r, ", "), call.world_size));
  }
  if (!call.index) return absl::OkStatus();
  if (call.index->ranks != r || call.index->items.size() != r.size() ||
      call.index->nbytes.size() != r.size()) {
    return absl::InvalidArgumentError(fmt::format(
        "node {}: its index does not hold its ranks", call.id.node));
  }
  for (size_t i = 0; i < r.size(); ++i) {
    if (call.index->items[i].size() > o.max_items ||
        call.index->nbytes[i].size() != call.index->items[i].size()) {
      return absl::ResourceExhaustedError(
          fmt::format("rank {} has {} items; the limit is {}", r[i],
                      call.index->items[i].size(), o.max_items));
    }
  }
  return absl::OkStatus();
}

std::string NoCheckpoint(std::string_view id) {
  return fmt::format(
      "the coordinator knows no checkpoint '{}' (was it restarted?)", id);
}

}  // namespace

void Coordinator::Impl::Start() {
  pool_ = std::make_unique<ThreadPool>(2);
  timer_ = std::thread([this] { Housekeeping(); });
}

void Coordinator::Impl::Shutdown() {
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

absl::StatusOr<std::string> Coordinator::Impl::Resolve(
    std::string_view checkpoint_id) const {
  // realpath is I/O (slow on NFS): never under mu_.
  return ResolveCheckpointDir(options_.checkpoint_roots, checkpoint_id, env_);
}

std::shared_ptr<Global> Coordinator::Impl::FindLocked(
    std::string_view checkpoint_id,
    const absl::StatusOr<std::string>& resolved) {
  if (auto it = globals_.find(std::string(checkpoint_id));
      it != globals_.end()) {
    return it->second;
  }
  if (!resolved.ok()) return nullptr;
  auto it = globals_.find(*resolved);
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

// ---------------------------------------------------------------------------
// Plan round: collecting the nodes' indexes
// ---------------------------------------------------------------------------

void Coordinator::Impl::Plan(PlanCall call, PlanDone done) {
  const absl::StatusOr<std::string> dir = Resolve(call.id.checkpoint_id);
  Deferred d;
  absl::MutexLock l(&mu_);
  absl::Status s = dir.status();
  if (s.ok()) s = PlanLocked(call, *dir, done, d);
  if (s.ok()) return;
  if (!absl::IsFailedPrecondition(s) || s.message() != kIndexNotCached) {
    spdlog::warn("coordinator: plan of {} from node {} ({}) refused: {}",
                 call.id.checkpoint_id, call.id.node, call.id.node_name, s);
  }
  d.Add([done = std::move(done), s]() mutable { std::move(done)(s); });
}

absl::StatusOr<std::shared_ptr<Global>> Coordinator::Impl::RoundLocked(
    const PlanCall& call, const std::string& dir, const std::string& job) {
  std::shared_ptr<Global> earlier;
  if (auto it = globals_.find(dir); it != globals_.end()) {
    if (!IsFinal(it->second->state)) return it->second;
    earlier = it->second;
  }
  if (auto t = tombstones_.find(dir); t != tombstones_.end()) {
    if (call.started <= t->second.at) return t->second.error;
    tombstones_.erase(t);  // a later save of the same directory
  }
  auto g = std::make_shared<Global>();
  if (earlier) {
    for (const auto& [node, n] : earlier->nodes)
      g->earlier_attempts[node] = n.attempt;
    g->earlier_state = earlier->state;
    g->earlier_error = earlier->error;
  }
  g->dir = dir;
  g->checkpoint_id = call.id.checkpoint_id;
  g->job = job;
  g->world_size = call.world_size;
  g->num_nodes = call.num_nodes;
  g->overwrite = call.overwrite;
  g->dedup = call.dedup_save_to_lowest_rank;
  g->keep_last_n = call.keep_last_n;
  g->keep_every = call.keep_every;
  g->external = call.external_metadata;
  g->metadata_timeout = call.metadata_timeout;
  g->zstd_level = call.zstd_level;
  g->created = options_.clock->Now();
  globals_[dir] = g;
  spdlog::info(
      "coordinator: checkpoint {} (job '{}', {} ranks on {} nodes) started",
      dir, job, g->world_size, g->num_nodes);
  return g;
}

absl::Status Coordinator::Impl::CheckNodeLocked(const Global& g,
                                                const PlanCall& call,
                                                const std::string& job) {
  const PeerCallId& id = call.id;
  if (g.state != State::kPending) {
    return absl::FailedPreconditionError(fmt::format(
        "node {} ({}) sent its index for checkpoint {} after the plan was made",
        id.node, id.node_name, g.dir));
  }
  if (call.world_size != g.world_size || call.num_nodes != g.num_nodes ||
      call.overwrite != g.overwrite ||
      call.dedup_save_to_lowest_rank != g.dedup ||
      call.keep_last_n != g.keep_last_n || call.keep_every != g.keep_every ||
      job != g.job) {
    return absl::InvalidArgumentError(
        fmt::format("node {} ({}) disagrees with the other nodes on world_size "
                    "({} vs {}), num_nodes ({} vs "
                    "{}), job or the save options of checkpoint {}",
                    id.node, id.node_name, call.world_size, g.world_size,
                    call.num_nodes, g.num_nodes, g.dir));
  }
  if (call.external_metadata != g.external ||
      call.metadata_timeout != g.metadata_timeout ||
      call.zstd_level != g.zstd_level) {
    return absl::InvalidArgumentError(fmt::format(
        "node {} ({}) disagrees with the other nodes of checkpoint {} on "
        "external_metadata ({} vs {}), metadata_timeout ({} vs {}) or "
        "compression (zstd level {} vs {})",
        id.node, id.node_name, g.dir, call.external_metadata, g.external,
        absl::FormatDuration(call.metadata_timeout),
        absl::FormatDuration(g.metadata_timeout), call.zstd_level,
        g.zstd_level));
  }
  if (auto it = g.nodes.find(id.node); it != g.nodes.end()) {
    return absl::FailedPreconditionError(fmt::format(
        "node {} ({}) sent a second index for checkpoint {} (attempt {:x}, "
        "then {:x}): it "
        "restarted its checkpoint",
        id.node, id.node_name, g.dir, it->second.attempt, id.attempt));
  }
  for (const auto& [other_id, other] : g.nodes) {  // no two nodes claim a rank
    std::vector<int> both;
    std::set_intersection(other.ranks.begin(), other.ranks.end(),
                          call.ranks.begin(), call.ranks.end(),
                          std::back_inserter(both));
    if (!both.empty()) {
      return absl::InvalidArgumentError(fmt::format(
          "nodes {} ({}) and {} ({}) both claim rank {} of checkpoint {}",
          other_id, other.name, id.node, id.node_name, both.front(), g.dir));
    }
  }
  if (static_cast<int>(g.nodes.size()) >= g.num_nodes) {
    return absl::InvalidArgumentError(fmt::format(
        "node {} ({}) is one more than the {} nodes of checkpoint {}", id.node,
        id.node_name, g.num_nodes, g.dir));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::Impl::PlanLocked(PlanCall& call,
                                           const std::string& dir,
                                           PlanDone& done, Deferred& d) {
  if (stopping_)
    return absl::UnavailableError("the coordinator is shutting down");
  RETURN_IF_ERROR(CheckPlanCall(call, options_));
  const std::string job = call.id.job.empty() ? DirName(dir) : call.id.job;
  // The index: sent, or the cached copy of the same digest.
  if (!call.index && !cache_.Knows(job, call.id.node, call.index_digest,
                                   call.ranks, call.world_size)) {
    return absl::FailedPreconditionError(kIndexNotCached);
  }
  ASSIGN_OR_RETURN(std::shared_ptr<Global> g, RoundLocked(call, dir, job));
  if (absl::Status s = CheckNodeLocked(*g, call, job); !s.ok()) {
    FailLocked(*g, s, State::kFailed, d);  // its other nodes cannot complete it
    return s;
  }
  Node& n = g->nodes[call.id.node];
  n.node = call.id.node;
  n.attempt = call.id.attempt;
  n.name = call.id.node_name;
  n.failure_domain = call.failure_domain;
  n.ranks = call.ranks;
  n.digest = call.index_digest;
  n.index = std::const_pointer_cast<NodeIndex>(call.index);
  n.plan_waiter = std::move(done);
  n.last_contact = options_.clock->Now();
  g->ranks_claimed += static_cast<int>(call.ranks.size());
  if (static_cast<int>(g->nodes.size()) < g->num_nodes) return absl::OkStatus();
  if (g->ranks_claimed != g->world_size) {
    // The node's waiter is answered by the abort.
    FailLocked(
        *g,
        absl::InvalidArgumentError(fmt::format(
            "the {} nodes of checkpoint {} hold {} ranks, not world_size {}",
            g->num_nodes, dir, g->ranks_claimed, g->world_size)),
        State::kFailed, d);
    return absl::OkStatus();
  }
  g->state = State::kStaging;  // planning
  pool_->Submit([this, g]() mutable { RunPlan(std::move(g)); });
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Commit round: collecting the nodes' prepares
// ---------------------------------------------------------------------------

void Coordinator::Impl::Prepare(PrepareCall call, PrepareDone done) {
  const absl::StatusOr<std::string> dir = Resolve(call.id.checkpoint_id);
  Deferred d;
  absl::MutexLock l(&mu_);
  absl::Status s =
      PrepareLocked(call, dir.ok() ? *dir : std::string(), done, d);
  if (!s.ok())
    d.Add([done = std::move(done), s]() mutable { std::move(done)(s); });
}

absl::Status Coordinator::Impl::PrepareLocked(PrepareCall& call,
                                              const std::string& dir,
                                              PrepareDone& done, Deferred& d) {
  std::shared_ptr<Global> g = FindLocked(call.id.checkpoint_id, dir);
  if (!g) return absl::NotFoundError(NoCheckpoint(call.id.checkpoint_id));
  ASSIGN_OR_RETURN(Node * n, NodeLocked(*g, call.id));
  if (g->state == State::kCommitted) {
    d.Add([done = std::move(done), st = StatusOfLocked(*g)]() mutable {
      std::move(done)(st);
    });
    return absl::OkStatus();
  }
  if (IsFinal(g->state)) return g->error;
  if (!n->planned || n->prepared) {
    absl::Status s = absl::FailedPreconditionError(fmt::format(
        "node {} ({}) prepared checkpoint {} {}", call.id.node,
        call.id.node_name, g->dir, n->prepared ? "twice" : "before its plan"));
    FailLocked(*g, s, State::kFailed, d);
    return s;
  }
  // The node's storage must place exactly its planned items.
  bool shape_ok = call.ranks.size() == n->ranks.size();
  for (size_t i = 0; i < n->ranks.size() && shape_ok; ++i) {
    const size_t kept = g->kept[n->ranks[i]];
    shape_ok = call.ranks[i].rank == n->ranks[i] &&
               call.ranks[i].offset.size() == kept &&
               call.ranks[i].length.size() == kept &&
               (call.ranks[i].transforms.empty() ||
                call.ranks[i].transforms.size() == kept);
  }
  if (!shape_ok) {
    absl::Status s = absl::InvalidArgumentError(
        fmt::format("node {} ({}) prepared checkpoint {} with storage that "
                    "does not match its plan",
                    call.id.node, call.id.node_name, g->dir));
    FailLocked(*g, s, State::kFailed, d);
    return s;
  }
  n->prepared = true;
  n->prepared_at = n->last_contact = options_.clock->Now();
  n->storage = std::move(call.ranks);
  n->progress = call.progress;
  n->prepare_waiter = std::move(done);
  if (++g->nodes_prepared == g->num_nodes) {
    g->state = State::kCommitting;
    if (g->external) {
      // Not `committing` yet: until the .metadata comes, a cancel or
      // metadata_timeout still aborts.
      pool_->Submit([this, g]() mutable { RunDurable(std::move(g)); });
    } else {
      g->committing = true;
      pool_->Submit([this, g]() mutable { RunCommit(std::move(g)); });
    }
  }
  return absl::OkStatus();
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
    if (g.state == State::kCommitted)
      s.nodes.push_back({n.node, n.name, n.failure_domain});
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
  const absl::StatusOr<std::string> dir = Resolve(id.checkpoint_id);
  absl::StatusOr<GlobalStatus> result;
  {
    absl::MutexLock l(&mu_);
    std::shared_ptr<Global> g = FindLocked(id.checkpoint_id, dir);
    if (!g) {
      result = absl::NotFoundError(NoCheckpoint(id.checkpoint_id));
    } else if (absl::StatusOr<Node*> n = NodeLocked(*g, id); !n.ok()) {
      result = n.status();
    } else {
      (*n)->last_contact = options_.clock->Now();
      (*n)->progress = progress;
      result = StatusOfLocked(*g);
    }
  }
  std::move(done)(std::move(result));
}

void Coordinator::Impl::Abort(const PeerCallId& id, absl::Status reason,
                              AbortDone done) {
  const absl::StatusOr<std::string> dir = Resolve(id.checkpoint_id);
  absl::Status result;
  {
    Deferred d;
    absl::MutexLock l(&mu_);
    std::shared_ptr<Global> g = FindLocked(id.checkpoint_id, dir);
    if ((!g || IsFinal(g->state)) && dir.ok() &&
        !(g && g->nodes.contains(id.node))) {
      // No round collecting for it yet (or only an old one): the nodes of
      // this save that come later are told.
      tombstones_[*dir] = {
          absl::Status(
              reason.code(),
              fmt::format(
                  "node {} ({}) aborted checkpoint {} before sending its "
                  "index: {}",
                  id.node, id.node_name, *dir, reason.message())),
          options_.clock->Now()};
      spdlog::warn("coordinator: {}", tombstones_[*dir].error);
    } else if (!g) {
      result = absl::NotFoundError(fmt::format(
          "the coordinator knows no checkpoint '{}'", id.checkpoint_id));
    } else if (auto e = g->earlier_attempts.find(id.node);
               !g->nodes.contains(id.node) && e != g->earlier_attempts.end() &&
               e->second == id.attempt) {
      // A late Abort of this node's attempt in the previous round (it
      // failed, and the next save of the directory has begun): that round's
      // outcome, and this one goes on.
      spdlog::info(
          "coordinator: late abort of attempt {:x} of {} from node {} ({}) "
          "ignored: that round had ended ({}: {}); a new one is collecting",
          id.attempt, g->dir, id.node, id.node_name,
          StateName(g->earlier_state), g->earlier_error);
      // As for an Abort of a finished round (below).
      if (g->earlier_state == State::kCommitted) {
        result = absl::FailedPreconditionError(
            fmt::format("that attempt of {} is committed", g->dir));
      }
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
      FailLocked(*g,
                 absl::Status(reason.code(),
                              fmt::format("node {} ({}): {}", id.node,
                                          id.node_name, reason.message())),
                 absl::IsCancelled(reason) ? State::kCancelled : State::kFailed,
                 d);
    }
  }
  if (done) std::move(done)(result);
}

void Coordinator::Impl::FailLocked(Global& g, absl::Status error, State state,
                                   Deferred& d) {
  if (IsFinal(g.state)) return;
  g.state = state;
  g.error = error;
  g.finished = options_.clock->Now();
  spdlog::error("coordinator: checkpoint {} aborted on all {} nodes: {}", g.dir,
                g.num_nodes, error);
  if (static_cast<int>(g.nodes.size()) < g.num_nodes) {
    // Nodes of this save still to come are told at once.
    tombstones_[g.dir] = {error, g.finished};
  }
  for (auto& [id, n] : g.nodes) {
    if (n.prepare_waiter) {
      d.Add([done = std::move(n.prepare_waiter), error]() mutable {
        std::move(done)(error);
      });
      n.prepare_waiter = nullptr;
    }
    if (n.plan_waiter) {
      d.Add([done = std::move(n.plan_waiter), error]() mutable {
        std::move(done)(error);
      });
      n.plan_waiter = nullptr;
    }
    n.index.reset();
  }
  if (g.durable_waiter) {
    d.Add([done = std::move(g.durable_waiter), error]() mutable {
      std::move(done)(error);
    });
    g.durable_waiter = nullptr;
  }
  g.layout.reset();
}

absl::StatusOr<GlobalStatus> Coordinator::Impl::Status(
    std::string_view checkpoint_id) {
  const absl::StatusOr<std::string> dir = Resolve(checkpoint_id);
  absl::MutexLock l(&mu_);
  std::shared_ptr<Global> g = FindLocked(checkpoint_id, dir);
  if (!g)
    return absl::NotFoundError(
        fmt::format("no global checkpoint '{}'", checkpoint_id));
  return StatusOfLocked(*g);
}

// ---------------------------------------------------------------------------
// Timers
// ---------------------------------------------------------------------------

void Coordinator::Impl::Housekeeping() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                               absl::Milliseconds(50)))
        return;
    }
    Tick(options_.clock->Now());
  }
}

void Coordinator::Impl::Tick(absl::Time now) {
  Deferred d;
  absl::MutexLock l(&mu_);
  std::vector<std::string> forget;
  for (auto& [dir, g] : globals_) {
    if (IsFinal(g->state)) {
      if (now - g->finished > options_.forget_after) forget.push_back(dir);
      continue;
    }
    if (!g->committing) TickGlobalLocked(*g, now, d);
  }
  for (const std::string& dir : forget) globals_.erase(dir);
  absl::erase_if(tombstones_, [&](const auto& t) {
    return now - t.second.at > options_.stage_timeout;
  });
}

void Coordinator::Impl::TickGlobalLocked(Global& g, absl::Time now,
                                         Deferred& d) {
  if (g.state == State::kPending && now - g.created > options_.stage_timeout) {
    std::vector<int> missing;
    std::vector<bool> claimed(g.world_size, false);
    for (const auto& [id, n] : g.nodes) {
      for (int r : n.ranks) claimed[r] = true;
    }
    for (int r = 0; r < g.world_size; ++r) {
      if (!claimed[r]) missing.push_back(r);
    }
    FailLocked(g,
               absl::DeadlineExceededError(
                   fmt::format("{} of {} nodes sent their index within "
                               "stage_timeout {}; ranks [{}] are on "
                               "no node heard from",
                               g.nodes.size(), g.num_nodes,
                               absl::FormatDuration(options_.stage_timeout),
                               FormatRanks(missing))),
               State::kFailed, d);
    return;
  }
  if (g.external && g.nodes_prepared == g.num_nodes) {
    // Every node durable: DCP's .metadata is awaited (RunDurable set
    // awaiting_since), for metadata_timeout.
    if (g.awaiting_since != absl::InfinitePast() &&
        now - g.awaiting_since > g.metadata_timeout) {
      FailLocked(g,
                 absl::DeadlineExceededError(fmt::format(
                     "no .metadata was handed over (CommitMetadata) within {} "
                     "of every node's data becoming durable "
                     "(metadata_timeout): DCP's StorageWriter.finish did not "
                     "run on rank 0 — did a rank fail?",
                     absl::FormatDuration(g.metadata_timeout))),
                 State::kFailed, d);
    }
    return;
  }
  for (const auto& [id, n] : g.nodes) {
    // A prepared node's files are durable: it may die now without blocking
    // the commit (the commit checks its files are there).
    if (!n.prepared && now - n.last_contact > options_.peer_timeout) {
      FailLocked(g,
                 absl::UnavailableError(fmt::format(
                     "node {} ({}) was not heard from for {} (peer_timeout)",
                     id, n.name, absl::FormatDuration(now - n.last_contact))),
                 State::kFailed, d);
      return;
    }
    if (n.prepared && now - n.prepared_at > options_.commit_timeout) {
      std::vector<int> waiting;
      for (const auto& [oid, o] : g.nodes) {
        if (!o.prepared) waiting.push_back(oid);
      }
      FailLocked(g,
                 absl::DeadlineExceededError(fmt::format(
                     "nodes [{}] were not durable within commit_timeout {} of "
                     "node {}'s",
                     fmt::join(waiting, ", "),
                     absl::FormatDuration(options_.commit_timeout), id)),
                 State::kFailed, d);
      return;
    }
  }
}

// ---------------------------------------------------------------------------
// Coordinator
// ---------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    CoordinatorOptions options) {
  if (options.env == nullptr) {
    return absl::InvalidArgumentError("CoordinatorOptions.env is not set");
  }
  if (options.clock == nullptr) options.clock = Clock::Real();
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
void Coordinator::AwaitDataDurable(PeerCallId id, DurableDone done) {
  impl_->AwaitDataDurable(id, std::move(done));
}
absl::StatusOr<std::vector<LayoutEntry>> Coordinator::GlobalLayout(
    std::string_view checkpoint_id) {
  return impl_->GlobalLayout(checkpoint_id);
}
absl::Status Coordinator::CommitMetadata(std::string_view checkpoint_id,
                                         std::string bytes) {
  return impl_->CommitMetadata(checkpoint_id, std::move(bytes));
}
absl::StatusOr<GlobalStatus> Coordinator::Status(
    std::string_view checkpoint_id) {
  return impl_->Status(checkpoint_id);
}
void Coordinator::TickForTest(absl::Time now) { impl_->Tick(now); }

}  // namespace ckptd::daemon
