// Copyright 2026 The ckptd Authors.
#include "daemon/cluster/participant.h"

#include "format/metadata/metadata.h"

namespace ckptd::daemon {

PlanCall MakePlanCall(const PeerCallId& id, const PlanCallSpec& spec,
                      const NodeIndex& index) {
  PlanCall call;
  call.id = id;
  call.world_size = spec.world_size;
  call.num_nodes = spec.num_nodes;
  call.overwrite = spec.overwrite;
  call.dedup_save_to_lowest_rank = spec.dedup_save_to_lowest_rank;
  call.keep_last_n = spec.keep_last_n;
  call.keep_every = spec.keep_every;
  call.external_metadata = spec.external_metadata;
  call.metadata_timeout = spec.metadata_timeout;
  call.zstd_level = spec.zstd_level;
  call.index_digest = IndexDigest(index);
  call.started = spec.started;
  call.ranks = index.ranks;
  for (const auto& items : index.items)
    call.item_counts.push_back(items.size());
  return call;
}

PrepareCall MakePrepareCall(const PeerCallId& id,
                            absl::Span<const int> local_ranks,
                            const WritePlan& plan,
                            absl::Span<const format::StorageInfo> infos,
                            const NodeProgress& progress) {
  PrepareCall call;
  call.id = id;
  for (int r : local_ranks) {
    PrepareCall::Rank& pr = call.ranks.emplace_back();
    pr.rank = r;
    bool transformed = false;
    for (int64_t p : plan.ranks[r].plan_index) {
      if (p < 0) continue;
      pr.offset.push_back(infos[p].offset);
      pr.length.push_back(infos[p].length);
      pr.transforms.push_back(infos[p].transform_descriptors);
      transformed = transformed || !infos[p].transform_descriptors.empty();
    }
    if (!transformed) pr.transforms.clear();
  }
  call.progress = progress;
  return call;
}

HeartbeatStep NextHeartbeatStep(const ParticipantState& p, absl::Time now,
                                const ParticipantTimeouts& t) {
  if (!p.prepare_sent && now - p.last_contact > t.peer_timeout) {
    return HeartbeatStep::kUnreachable;
  }
  // Prepared: silence alone decides nothing until the coordinator can no
  // longer commit (it renames .metadata in only within commit_timeout of
  // every prepare, plus metadata_timeout when it awaits DCP's .metadata);
  // then .metadata decides.
  if (p.prepare_sent && !p.in_doubt && now - p.last_contact > t.peer_timeout &&
      now - p.prepare_sent_at >
          t.commit_timeout + t.metadata_timeout + t.peer_timeout) {
    return HeartbeatStep::kResolve;
  }
  if (p.in_doubt || p.heartbeat_in_flight ||
      now - p.last_heartbeat < t.peer_heartbeat) {
    return HeartbeatStep::kNothing;
  }
  return HeartbeatStep::kSend;
}

bool NodeDataCommitted(Env* env, const std::string& io_dir,
                       absl::Span<const int> local_ranks,
                       absl::Span<const RankIndex* const> indexes,
                       const WritePlan& plan,
                       absl::Span<const format::StorageInfo> infos) {
  absl::StatusOr<std::string> bytes = ReadFileToString(
      env, JoinPath(io_dir, format::kMetadataName), uint64_t{8} << 30);
  if (!bytes.ok()) return false;
  absl::StatusOr<format::Metadata> md = format::DecodeMetadata(*bytes);
  if (!md.ok()) return false;
  for (size_t i = 0; i < local_ranks.size(); ++i) {
    const RankIndex& index = *indexes[i];
    const RankFilePlan& rp = plan.ranks[local_ranks[i]];
    for (size_t k = 0; k < index.items.size(); ++k) {
      const int64_t p = rp.plan_index[k];
      if (p < 0) continue;
      const format::StorageInfo* info = md->FindStorage(index.items[k].Key());
      if (info == nullptr || info->relative_path != infos[p].relative_path ||
          info->offset != infos[p].offset || info->length != infos[p].length) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace ckptd::daemon
