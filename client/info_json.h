// Copyright 2026 The ckptd Authors.
//
// Internal to ckptd (C ABI and ckptctl, not installed): the JSON form of the
// client's result structs, so that `ckptctl ... --json` and the C ABI's
// *_json functions print the same objects. Field names are those of the C++
// structs (and of CheckpointStatus in daemon.proto).
#ifndef CKPTD_CLIENT_INFO_JSON_H_
#define CKPTD_CLIENT_INFO_JSON_H_

#include <string>
#include <vector>

#include "client/ckptd_client.h"
#include "format/metadata/metadata.h"
#include "format/metadata/metadata_json.h"
#include "nlohmann/json.hpp"

namespace ckptd::client {

// {"checkpoint_id", "job", "state", "world_size", "ranks_staged",
//  "total_bytes", "staged_bytes", "written_bytes", "file_bytes", "items",
//  "files", "error", "error_code", "created_unix_ms", "staged_unix_ms",
//  "finished_unix_ms", "num_nodes", "coordinator", "is_coordinator",
//  "nodes_planned", "nodes_prepared", "local_ranks", "local_total_bytes",
//  "local_written_bytes", "awaiting_metadata", "memory_tier_bytes"}
nlohmann::ordered_json ToJson(const CheckpointInfo& info);
// {"version", "pid", "shm_dir", "io_backend", "staging_budget_bytes",
//  "max_batch_bytes", "max_items", "checkpoint_roots", "peer_address",
//  "cuda_ipc", "cuda_unavailable", "pinned_staging_bytes", "cuda_devices",
//  "arena_socket", "named_arenas", "restore", "restore_gather_timeout_ms"}
nlohmann::ordered_json ToJson(const DaemonInfo& info);

// DumpJson (dump() that cannot throw) and PathToJson (a planner_data path
// as a JSON array): format/metadata/metadata_json.h, shared with the daemon.
using format::DumpJson;
using format::PathToJson;

}  // namespace ckptd::client

#endif  // CKPTD_CLIENT_INFO_JSON_H_
