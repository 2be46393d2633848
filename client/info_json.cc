// Copyright 2026 The ckptd Authors.
#include "client/info_json.h"

namespace ckptd::client {

nlohmann::ordered_json ToJson(const CheckpointInfo& info) {
  return nlohmann::ordered_json{
      {"checkpoint_id", info.checkpoint_id},
      {"job", info.job},
      {"state", info.state},
      {"world_size", info.world_size},
      {"ranks_staged", info.ranks_staged},
      {"total_bytes", info.total_bytes},
      {"staged_bytes", info.staged_bytes},
      {"written_bytes", info.written_bytes},
      {"file_bytes", info.file_bytes},
      {"items", info.items},
      {"files", info.files},
      {"error", info.error},
      {"error_code", info.error_code},
      {"created_unix_ms", info.created_unix_ms},
      {"staged_unix_ms", info.staged_unix_ms},
      {"finished_unix_ms", info.finished_unix_ms},
      {"num_nodes", info.num_nodes},
      {"coordinator", info.coordinator},
      {"is_coordinator", info.is_coordinator},
      {"nodes_planned", info.nodes_planned},
      {"nodes_prepared", info.nodes_prepared},
      {"local_ranks", info.local_ranks},
      {"local_total_bytes", info.local_total_bytes},
      {"local_written_bytes", info.local_written_bytes},
      {"awaiting_metadata", info.awaiting_metadata},
      {"memory_tier_bytes", info.memory_tier_bytes},
      {"replica_holders", info.replica_holders},
      {"replicas_held", info.replicas_held},
  };
}

nlohmann::ordered_json ToJson(const DaemonInfo& info) {
  return nlohmann::ordered_json{
      {"version", info.version},
      {"pid", info.pid},
      {"shm_dir", info.shm_dir},
      {"io_backend", info.io_backend},
      {"staging_budget_bytes", info.staging_budget_bytes},
      {"max_batch_bytes", info.max_batch_bytes},
      {"max_items", info.max_items},
      {"checkpoint_roots", info.checkpoint_roots},
      {"peer_address", info.peer_address},
      {"cuda_ipc", info.cuda_ipc},
      {"cuda_unavailable", info.cuda_unavailable},
      {"pinned_staging_bytes", info.pinned_staging_bytes},
      {"cuda_devices", info.cuda_devices},
      {"arena_socket", info.arena_socket},
      {"named_arenas", info.named_arenas},
      {"restore", info.restore},
      {"restore_gather_timeout_ms", info.restore_gather_timeout_ms},
  };
}

}  // namespace ckptd::client
