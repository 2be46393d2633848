// Copyright 2026 The ckptd Authors.
//
// The plain structs the stages of one save hand each other, in data-flow
// order (README "Layout" draws the folders):
//
//   SaveBatch        service/ → manager: one Save call, decoded from its proto
//   RankIndex        staging/save_validator: a rank's validated item index
//   ValidatedBatch   staging/save_validator: a batch's extents, bounds-checked
//                    against the arena / CUDA buffers, in strict index order
//   StagedExtent     staging/ → write/: bytes adopted against the staging
//                    budget (an arena range, or pinned-pool pieces)
//   WritePlan        plan/node_planner → write/, commit/: which items each
//                    local rank writes, into which file
//   RankWriteResult  write/rank_writer → commit/: where each item landed
//   CommitRecord     commit/journal: the journal entry of an attempt (what
//                    recovery needs to finish or undo it)
//
// No stage keeps a pointer into another stage's struct after handing it
// on, except StagedExtent::data, which its `arena` / `hold` keeps alive.
#ifndef CKPTD_DAEMON_TYPES_SAVE_TYPES_H_
#define CKPTD_DAEMON_TYPES_SAVE_TYPES_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/types/checkpoint_state.h"
#include "format/metadata/metadata.h"
#include "format/plan/save_plan.h"

namespace ckptd::daemon {

// A CUDA allocation named by a Save (daemon.proto CudaBuffer).
struct CudaBufferDesc {
  std::string ipc_handle;  // 64 bytes
  std::string device;      // PCI bus id
  uint64_t size = 0;       // as the client claims it
};

// Bytes [item_offset, item_offset + length) of item `item`, found at
// [arena_offset, arena_offset + length) of the batch's arena.
struct ExtentRef {
  uint32_t item = 0;
  uint64_t item_offset = 0;
  uint64_t arena_offset = 0;
  uint64_t length = 0;
  // k > 0: the bytes are at arena_offset of SaveBatch::cuda_buffers[k - 1]
  // instead (the GPU path).
  uint32_t cuda_buffer = 0;
};

// SaveRequest.cluster: the ranks of this node in a multi-node checkpoint.
struct ClusterSpec {
  std::string coordinator;       // peer address of rank 0's daemon
  std::vector<int> local_ranks;  // ascending
  int num_nodes = 1;             // 1: single-node (the other fields unused)
  bool operator==(const ClusterSpec&) const = default;
};

// One Save call, decoded from its proto by the service.
struct SaveBatch {
  std::string checkpoint_id;  // as the client gave it (resolved here)
  std::string job;            // empty: the checkpoint directory's parent
  int rank = 0;
  int world_size = 0;
  uint32_t sequence = 0;
  std::vector<format::ItemDesc> items;  // sequence 0: the rank's index
  std::vector<uint64_t> item_nbytes;    // parallel to items
  uint64_t arena_id = 0;
  std::vector<ExtentRef> extents;
  bool last = false;
  bool overwrite = false;
  bool dedup_save_to_lowest_rank = false;
  int keep_last_n = 0;     // 0: DaemonOptions::keep_last_n
  int64_t keep_every = 0;  // 0: none (History::Record)
  int zstd_level = 0;      // SaveOptions.compression "zstd[:N]"; 0: none
  ClusterSpec cluster;     // sequence 0
  std::vector<CudaBufferDesc> cuda_buffers;  // named by extents' cuda_buffer
  // DCP's StorageWriter: `.metadata` comes from CommitMetadata, awaited for
  // metadata_timeout once the data is durable (daemon.proto SaveOptions).
  bool external_metadata = false;
  absl::Duration metadata_timeout = absl::Minutes(10);
};

// Where one written item is (an external_metadata checkpoint's GetLayout):
// its storage_data key and value.
struct LayoutEntry {
  format::StorageKey key;
  format::StorageInfo info;
};

struct Layout {
  std::string checkpoint_id;         // resolved absolute directory
  std::vector<LayoutEntry> entries;  // plan order
};

struct SaveReply {
  std::string checkpoint_id;
  State state = State::kStaging;  // kStaged after the rank's last batch
  uint64_t staged_bytes = 0;      // of this rank
};

using SaveCallback = absl::AnyInvocable<void(absl::StatusOr<SaveReply>) &&>;
using InfoCallback =
    absl::AnyInvocable<void(absl::StatusOr<CheckpointInfo>) &&>;
using DoneCallback = absl::AnyInvocable<void(absl::Status) &&>;

// A rank's item index (its sequence-0 batch), validated: every tensor chunk
// in bounds of its global shape, nbytes = numel × element size, no empty
// bytes item.
struct RankIndex {
  std::vector<format::ItemDesc> items;
  std::vector<uint64_t> nbytes;  // parallel to items
  uint64_t total = 0;            // sum of nbytes
};

// Where the next extent of a rank must start (extents arrive in strict
// index order, each rank's items back to back).
struct ExtentCursor {
  uint32_t item = 0;
  uint64_t offset = 0;  // within `item`
};

struct Arena;  // staging/arena_registry.h

// A byte range ready to be written: in a client arena (`arena` set; its
// mapping stays valid while this is held), in the pinned staging pool
// (`hold` keeps the slab), or, before the GPU stager copied it, in a CUDA
// buffer (cuda_buffer > 0, data null: arena_offset is the offset in that
// batch's CudaBufferDesc list entry cuda_buffer - 1).
struct StagedExtent {
  std::shared_ptr<Arena> arena;
  const char* data = nullptr;
  uint64_t arena_offset = 0;
  uint64_t length = 0;
  uint32_t item = 0;
  uint64_t item_offset = 0;
  std::shared_ptr<const void> hold;
  uint32_t cuda_buffer = 0;
};

// One batch's extents after validation (their `arena` not yet attached).
struct ValidatedBatch {
  std::vector<StagedExtent> extents;
  uint64_t bytes = 0;         // all extents
  uint64_t arena_bytes = 0;   // of `bytes`, in the client's arena (the budget)
  uint64_t device_bytes = 0;  // of `bytes`, in CUDA buffers
  ExtentCursor next;          // the rank's cursor after this batch
};

// What one local rank writes.
struct RankFilePlan {
  // Per item of the rank: its index in WritePlan::plan.items, or -1 (the
  // item is written by another rank: dedup).
  std::vector<int64_t> plan_index;
  std::string relative_path;  // "__3_0.distcp"; empty: the rank writes none
};

// The node's write plan.
struct WritePlan {
  // Single-node: the whole plan (metadata skeleton included). Multi-node:
  // the node's share of the coordinator's plan (items and files of the
  // local ranks; metadata empty: the coordinator commits).
  format::SavePlan plan;
  std::vector<RankFilePlan> ranks;  // per rank of the world; local ones set
  bool cached = false;              // multi-node: the plan cache answered
};

// Where one rank's written items landed; the file is fsynced and closed.
struct RankWriteResult {
  // (index in WritePlan::plan.items, location), in the rank's item order.
  std::vector<std::pair<int64_t, format::StorageInfo>> items;
  uint64_t file_bytes = 0;  // 0: the rank wrote no file
};

// The journal entry of one attempt at a checkpoint directory (written
// durably before anything in the directory, removed after the commit; see
// docs/durability.md). Recovery finds unfinished attempts by it.
struct CommitRecord {
  std::string dir;  // resolved checkpoint directory
  std::string job;
  int64_t uid = -1;  // the saving Unix user; -1: unknown
  // A node of a multi-node checkpoint: only these ranks' data files are
  // this daemon's (recovery removes no marker and no other file).
  std::optional<std::vector<int>> ranks;
  // A retention deletion in progress (recovery finishes it), not a save.
  bool deleting = false;
  // When the save started (ms since the epoch; 0: unknown): the history,
  // and so retention, orders checkpoints by it.
  int64_t started_ms = 0;
  // A node's entry: how long the coordinator may still commit after this
  // node's prepare (commit_timeout + metadata_timeout + peer_timeout of the
  // save, ms; 0: unknown, the daemon's own). Recovery decides no sooner
  // after a restart (recovery.h).
  int64_t settle_ms = 0;
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_TYPES_SAVE_TYPES_H_
