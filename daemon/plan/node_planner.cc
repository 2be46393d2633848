// Copyright 2026 The ckptd Authors.
#include "daemon/plan/node_planner.h"

#include <string>
#include <utility>

#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ckptd::daemon {

absl::StatusOr<WritePlan> PlanSingleNode(
    absl::Span<const RankIndex* const> ranks,
    const NodePlannerOptions& options) {
  std::vector<std::vector<format::ItemDesc>> descs(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) descs[r] = ranks[r]->items;
  format::PlanOptions po;
  po.dedup_save_to_lowest_rank = options.dedup_save_to_lowest_rank;
  po.max_items = options.max_items;
  WritePlan out;
  ASSIGN_OR_RETURN(out.plan, format::PlanSave(descs, po));
  out.ranks.resize(ranks.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    out.ranks[r].plan_index.assign(ranks[r]->items.size(), -1);
  }
  for (size_t p = 0; p < out.plan.items.size(); ++p) {
    const format::PlannedItem& pi = out.plan.items[p];
    out.ranks[pi.rank].plan_index[pi.item_index] = static_cast<int64_t>(p);
  }
  for (const format::PlannedFile& f : out.plan.files) {
    out.ranks[f.rank].relative_path = f.relative_path;
  }
  return out;
}

NodeIndex MakeNodeIndex(absl::Span<const int> local_ranks,
                        absl::Span<const RankIndex* const> indexes) {
  NodeIndex index;
  index.ranks.assign(local_ranks.begin(), local_ranks.end());
  for (const RankIndex* r : indexes) {
    index.items.push_back(r->items);
    index.nbytes.push_back(r->nbytes);
  }
  return index;
}

absl::StatusOr<WritePlan> PlanFromCoordinator(
    const NodePlan& plan, absl::Span<const int> local_ranks,
    absl::Span<const RankIndex* const> indexes, int world_size) {
  if (plan.ranks.size() != local_ranks.size()) {
    return absl::InternalError(
        "the coordinator's plan does not cover this node's ranks");
  }
  // plan.items / files: the node's surviving items and files only (rank
  // order, then item order).
  WritePlan out;
  out.cached = plan.cached;
  out.ranks.resize(world_size);
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    const NodePlan::Rank& pr = plan.ranks[i];
    const int r = local_ranks[i];
    const RankIndex& index = *indexes[i];
    if (pr.rank != r || pr.keep.size() != index.items.size()) {
      return absl::InternalError(fmt::format(
          "the coordinator's plan for rank {} does not match its {} items", r,
          index.items.size()));
    }
    if (!pr.file.empty() && pr.file != fmt::format("__{}_0.distcp", r)) {
      return absl::InternalError(fmt::format(
          "the coordinator named file '{}' for rank {}", pr.file, r));
    }
    RankFilePlan& rp = out.ranks[r];
    rp.plan_index.assign(index.items.size(), -1);
    std::vector<size_t> file_items;
    for (size_t k = 0; k < pr.keep.size(); ++k) {
      if (!pr.keep[k]) continue;
      rp.plan_index[k] = static_cast<int64_t>(out.plan.items.size());
      file_items.push_back(out.plan.items.size());
      out.plan.items.push_back({r, k, 0});
    }
    if (!pr.file.empty()) {
      rp.relative_path = pr.file;
      out.plan.files.push_back({pr.file, r, std::move(file_items)});
    }
  }
  return out;
}

}  // namespace ckptd::daemon
