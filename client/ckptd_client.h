// Copyright 2026 The ckptd Authors.
//
// libckptd_client: the C++ client of the per-node checkpoint daemon (ckptd).
// A trainer rank connects once, then hands the daemon its flattened state
// dict with Save(): the bytes are copied into a shared-memory arena the
// client owns and the daemon maps, and the call returns as soon as the daemon
// has adopted them ("staged"); writing and committing go on in the daemon.
//
// This header pulls in no gRPC, protobuf or CUDA (the implementation lives in
// client.cc). The protocol is proto/ckptd/v1/daemon.proto; a C ABI over this
// class is in client/ckptd_c.h.
//
//   auto client = ckptd::client::Client::Connect({.socket_path =
//   "/run/ckptd/ckptd.sock"}); if (!client.ok()) ...; auto id =
//   (*client)->Save("step_100", "my_job", rank, world_size, items);
//   ... training goes on ...
//   auto info = (*client)->Wait(*id);  // info->state == "COMMITTED"
#ifndef CKPTD_CLIENT_CKPTD_CLIENT_H_
#define CKPTD_CLIENT_CKPTD_CLIENT_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace ckptd::shm {
class Arena;
}  // namespace ckptd::shm

namespace ckptd::client {

// The socket a client uses when ClientOptions::socket_path is empty:
// $CKPTD_SOCKET if set and non-empty, else "/run/ckptd/ckptd.sock".
std::string DefaultSocketPath();

struct ClientOptions {
  // Path of the daemon's Unix socket ("unix:" is prepended; a path that
  // already starts with "unix:" is used as is). Empty: DefaultSocketPath().
  std::string socket_path;
  // Threads copying tensors into the arena (the calling thread is one of
  // them). Values < 1 mean 1.
  int copy_threads = 2;
  // Free text for the daemon's logs ("job/rank3"); empty: "pid <pid>".
  std::string owner;
  // Deadline of each Save batch, WaitArenaIdle and Wait call. A Wait longer
  // than this is issued as several calls.
  absl::Duration rpc_timeout = absl::Minutes(10);
  // Deadline of the other calls (GetInfo on Connect, arena registration,
  // GetStatus, List, Cancel).
  absl::Duration control_timeout = absl::Seconds(60);
};

// One element of an item's state-dict path (DCP planner_data): a dict key or
// a list index.
using PathElement = std::variant<std::string, int64_t>;

// A tensor chunk in CUDA device memory, shared with the daemon through
// legacy CUDA IPC (see ckptd_cuda_source in ckptd_c.h for how to fill it).
// The daemon copies it device-to-host itself; Save() returns once those
// copies completed. Only for a daemon whose DaemonInfo::cuda_ipc is true.
struct CudaSource {
  std::array<uint8_t, 64> ipc_handle{};  // cuIpcGetMemHandle of the allocation
  std::string device;                    // PCI bus id, "0000:3b:00.0"
  uint64_t offset = 0;  // of the chunk's first byte from the allocation base
  uint64_t allocation_size = 0;  // bytes of the allocation
};

// One item of a rank's flattened state dict (DCP's WriteItem). The struct
// only points at the caller's memory; it must stay valid during Save().
struct SaveItem {
  std::string fqn;
  // false: a tensor chunk; true: an opaque payload (normally torch.save
  // bytes of a non-tensor object) in `bytes`.
  bool is_bytes = false;
  // Tensors: torch dtype name without "torch." ("float32", "bfloat16"; the
  // aliases "float", "half", "long", ... are accepted and normalized).
  std::string dtype = "float32";
  // Tensors: the global tensor's shape and this chunk's box in it. For an
  // unsharded tensor offsets are 0 and sizes == global_shape. All three have
  // the same length (0 for a scalar), at most 64.
  std::vector<int64_t> global_shape, chunk_offsets, chunk_sizes;
  // Optional planner_data path; empty means {fqn}.
  std::vector<PathElement> path;
  // Tensors: host address of the chunk's element [0, ..., 0]. May be null
  // only if the chunk has no elements.
  const void* data = nullptr;
  // Tensors: strides of the chunk in memory, in elements (non-negative,
  // one per dimension); empty = C-contiguous. Non-contiguous chunks are
  // gathered into C order while copying.
  std::vector<int64_t> strides;
  // Bytes items: the payload.
  std::string_view bytes;
  // Tensors in CUDA memory: where the daemon finds the (C-contiguous) chunk;
  // `data` is then unused and `strides` must be empty or C-contiguous.
  const CudaSource* cuda = nullptr;
};

// A checkpoint spanning several nodes, one daemon each (ClusterSpec in the
// proto). The default (num_nodes 1, nothing else set) is a single-node
// checkpoint: every rank saves through the same daemon.
struct ClusterSpec {
  // Peer address (host:port) of the daemon on rank 0's node, the
  // checkpoint's coordinator (DaemonInfo::peer_address of that daemon).
  // Required when num_nodes > 1.
  std::string coordinator;
  // Ranks (of the checkpoint, i.e. the `rank` values passed to Save) that
  // save through this node's daemon; every rank of the node passes the same
  // list. Required when num_nodes > 1: unique, in [0, world_size), holding
  // the caller's rank. The nodes' lists partition [0, world_size).
  std::vector<int> local_ranks;
  // Daemons taking part, >= 1 (and <= world_size).
  int num_nodes = 1;
};

// Per-checkpoint options; every rank must pass the same ones.
struct SaveOptions {
  // Replace a committed checkpoint at the same path (default: the daemon
  // refuses with FAILED_PRECONDITION).
  bool overwrite = false;
  // DCP's dedup_save_to_lowest_rank.
  bool dedup_save_to_lowest_rank = false;
  // Retention of the checkpoint's job: once it commits, the daemon keeps
  // only the newest keep_last_n committed checkpoints of the job (never the
  // newest). 0: the daemon's keep_last_n setting.
  int keep_last_n = 0;
  // Retention also keeps every committed checkpoint of the job whose
  // directory name ends with a multiple of keep_every ("step_1200"), beyond
  // the newest keep_last_n (Orbax's keep_period). 0: none.
  int keep_every = 0;
  // Payload compression: "" (none), "zstd" or "zstd:N" (daemon.proto
  // SaveOptions.compression; single- and multi-node checkpoints, every
  // node the same).
  std::string compression;
  // Multi-node checkpoints; the same on every rank of a node. Sent with the
  // first batch of each Save unless it is the default (num_nodes <= 1,
  // no coordinator, no local_ranks).
  ClusterSpec cluster;
  // DCP's StorageWriter: the daemon writes the data files and publishes the
  // `.metadata` handed to CommitMetadata once WaitDataDurable returned
  // (daemon.proto). metadata_timeout: how long the durable data waits for
  // it (zero: the daemon's 10 min). Multi-node (cluster): WaitDataDurable,
  // GetLayout (every node's items) and CommitMetadata on the daemon of rank
  // 0's node only, which checks the .metadata against every node's layout;
  // every node must send the same external_metadata, metadata_timeout and
  // compression.
  bool external_metadata = false;
  absl::Duration metadata_timeout = absl::ZeroDuration();
};

// Where one item of an external_metadata checkpoint was written.
struct LayoutEntry {
  std::string fqn;
  bool is_bytes = false;
  std::vector<int64_t> offsets;  // tensor chunk: its global offsets
  std::string relative_path;     // "__0_0.distcp"
  uint64_t offset = 0;
  uint64_t length = 0;
  std::vector<std::string> transform_descriptors;  // compressed: zstd
};

// What one Save() cost the caller.
struct SaveStats {
  double copy_seconds = 0;   // copying into the arena (the memcpy part)
  double total_seconds = 0;  // the whole call: the trainer's stall
  uint64_t bytes = 0;        // data bytes of this rank
  int batches = 0;           // Save calls (> 1: streamed through the arena)
};

// A checkpoint as the daemon reports it (CheckpointStatus in the proto).
struct CheckpointInfo {
  std::string checkpoint_id;  // absolute directory
  std::string job;
  // "PENDING", "STAGING", "STAGED", "WRITING", "COMMITTING", "COMMITTED",
  // "FAILED", "CANCELLED" (or "CHECKPOINT_STATE_UNSPECIFIED").
  std::string state;
  std::string error;   // FAILED / CANCELLED: why
  int error_code = 0;  // absl::StatusCode / google.rpc.Code of the failure
  int world_size = 0, ranks_staged = 0;
  uint64_t total_bytes = 0;    // data bytes of all ranks (before dedup)
  uint64_t staged_bytes = 0;   // of total_bytes
  uint64_t written_bytes = 0;  // bytes written to data files so far
  uint64_t file_bytes = 0;     // bytes of the data files when complete
  uint64_t items = 0;
  uint32_t files = 0;
  int64_t created_unix_ms = 0;
  int64_t staged_unix_ms = 0;    // 0 until staged
  int64_t finished_unix_ms = 0;  // 0 until final
  // Multi-node checkpoints (num_nodes > 1): the byte counts and ranks_staged
  // above are then global (as of this node's last contact with the
  // coordinator); local_* are this node's.
  int num_nodes = 1;        // 1 (or 0 from an older daemon): single node
  std::string coordinator;  // peer address; empty on the coordinator
  bool is_coordinator = false;
  int nodes_planned = 0;
  int nodes_prepared = 0;  // data durable on their node
  int local_ranks = 0;     // ranks of this checkpoint on this node
  uint64_t local_total_bytes = 0;
  uint64_t local_written_bytes = 0;
  // external_metadata: data durable, waiting for CommitMetadata.
  bool awaiting_metadata = false;
  // Bytes of the checkpoint this node's memory tier holds (0: none).
  uint64_t memory_tier_bytes = 0;
  // peer_replicas: where this node's share is held in other nodes' memory
  // ("node 4 (10.0.0.3:7070) held"), and whose shares this node holds.
  std::vector<std::string> replica_holders;
  std::vector<std::string> replicas_held;

  // COMMITTED, FAILED or CANCELLED.
  bool is_final() const {
    return state == "COMMITTED" || state == "FAILED" || state == "CANCELLED";
  }
};

// The daemon's version and limits (GetInfoResponse).
struct DaemonInfo {
  std::string version, shm_dir, io_backend;
  uint64_t staging_budget_bytes = 0;
  uint64_t max_batch_bytes = 0;  // largest sum of extent lengths in one Save
  uint32_t max_items = 0;        // largest item index of one rank
  std::vector<std::string> checkpoint_roots;
  int64_t pid = 0;
  // host:port other daemons reach this one's peer service at (what rank 0
  // hands the other nodes as ClusterSpec::coordinator); empty when the peer
  // service is off (single-node only).
  std::string peer_address;
  // The GPU path: the daemon stages CudaSource items (else why not), its
  // pinned staging pool (a batch's device bytes must fit) and its GPUs.
  bool cuda_ipc = false;
  std::string cuda_unavailable;
  uint64_t pinned_staging_bytes = 0;
  std::vector<std::string> cuda_devices;
  // Where arenas are registered: the daemon's arena socket as the daemon
  // sees the path (empty: an older daemon, arenas go by name in shm_dir),
  // and whether the daemon still takes arenas by name (unsafe legacy mode).
  std::string arena_socket;
  bool named_arenas = false;
  // Whether the daemon serves restores (GetRestoreIndex / Restore; false
  // from older daemons), and how long a Restore batch waits for the other
  // ranks of its group before it is served with those that came.
  bool restore = false;
  uint32_t restore_gather_timeout_ms = 0;
};

// A checkpoint's index as the daemon decoded it (GetRestoreIndex).
struct RestoreIndex {
  std::string checkpoint_id;  // resolved absolute directory
  // JSON: {"dir", "version", "entries": [{"fqn", "type": "tensor", "dtype",
  // "size", "num_chunks"} | {"fqn", "type": "bytes", "nbytes"}],
  // "planner_data"} (ckptd_c.h: ckptd_reader_metadata_json_ex without
  // chunks, plus each bytes item's payload length).
  std::string index_json;
  // Identity of the .metadata the index came from; pass it as
  // RestoreOptions::identity to fail with ABORTED if the checkpoint changed.
  std::string identity;
};

// Options of one Restore.
struct RestoreOptions {
  // The restore group: every local rank of one load passes the same string
  // (at most 1024 bytes), so the daemon reads each byte range once for all
  // of them. Empty: this rank alone.
  std::string group;
  int local_rank = 0;        // 0 <= local_rank < local_world_size
  int local_world_size = 1;  // ranks of this node in the group
  // Check payload CRC-32s (DATA_LOSS naming the file, item and offset).
  bool verify_crc = true;
  // RestoreIndex::identity; empty: not checked.
  std::string identity;
  // Largest arena bytes of one Restore call (>= 64; capped at the daemon's
  // max_batch_bytes). Boxes larger than this are split. The arena is sized
  // for the largest batch, never more than this (unless a single bytes item
  // is larger).
  uint64_t batch_bytes = uint64_t{256} << 20;
  // Take the boxes from a group buffer when the daemon offers one (a group
  // batch of several ranks read once into one read-only memfd, fetched
  // over the arena socket: one copy per rank). false: always through this
  // rank's arena.
  bool group_buffer = true;
  // Take boxes from the files of the daemon's memory tier when it lends
  // them (a checkpoint it holds in memory: the rank maps the held file
  // read-only and copies each box once, straight into its destination).
  // false: through the arena or a group buffer.
  bool held_buffers = true;
};

// "Fill `data` with the box [offsets, offsets + sizes) of tensor `fqn`": a
// host destination. Only points at caller memory, which must stay valid
// during Restore().
struct RestoreTensor {
  std::string fqn;
  // The saved dtype (torch name without "torch."; aliases accepted): the
  // daemon refuses another one.
  std::string dtype = "float32";
  // Global offsets and sizes of the box (empty for a 0-d tensor).
  std::vector<int64_t> offsets, sizes;
  // Element strides of the destination (non-negative); empty: C order.
  std::vector<int64_t> strides;
  // Address of the destination's element [0, ..., 0]. May be null only if
  // the box has no elements.
  void* data = nullptr;
};

// A bytes item (the torch.save payload of a non-tensor value).
struct RestoreBytesItem {
  std::string fqn;
  uint64_t nbytes = 0;  // its length, from the index ("nbytes")
  std::string value;    // filled by Restore()
};

// What one Restore() did.
struct RestoreStats {
  // Payload bytes the daemon read from storage for this rank's batches
  // (the group's reads are counted once, at the rank whose batch did them).
  uint64_t storage_bytes = 0;
  uint64_t copied_bytes = 0;  // bytes the daemon wrote into this rank's arena
  uint64_t bytes = 0;         // bytes delivered to the caller's destinations
  int batches = 0;            // Restore calls
  int group_ranks = 0;        // most ranks served together in one batch
  double seconds = 0;         // the whole call
};

// One restore through the daemon as ListRestores reports it
// (daemon.proto RestoreProgress).
struct RestoreProgress {
  std::string id;             // "r<n>"
  std::string checkpoint_id;  // resolved checkpoint directory
  std::string group;          // empty: ranks restoring alone
  uint32_t uid = 0;
  int local_world_size = 1;
  std::string state;  // RUNNING, DONE, FAILED, CANCELLED, ABANDONED
  int64_t started_unix_ms = 0;
  int64_t last_active_unix_ms = 0;
  uint64_t batches = 0;
  uint64_t copied_bytes = 0;
  uint64_t storage_bytes = 0;
  int ranks_done = 0;
  std::string error;
  uint64_t peer_bytes = 0;  // of storage_bytes: from other daemons' memory
};

// A connection to the daemon.
//
// Thread-safety: Wait, GetStatus, List, Cancel, ListRestores, CancelRestore
// and info() may be called from
// any thread concurrently (also during a Save). Save, Reserve, Restore and
// GetRestoreIndex calls are serialized by an internal mutex (one arena per
// Client).
//
// Errors from the daemon keep their gRPC code (same numbering as
// absl::StatusCode) and the daemon's message unchanged.
class Client {
 public:
  // Connects to the daemon and fetches its info (GetInfo). UNAVAILABLE,
  // naming the socket, if no daemon answers there.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);

  // Releases the arena (ReleaseArena, errors ignored) and unmaps it. The
  // daemon keeps bytes it still needs (it has its own mapping).
  ~Client();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The GetInfo answer of Connect.
  const DaemonInfo& info() const { return info_; }
  const ClientOptions& options() const { return options_; }

  // Saves this rank's part of checkpoint `checkpoint_id` (a directory:
  // absolute, or relative to the daemon's first checkpoint root). `job` is
  // the retention group (empty: the daemon's default). Copies the items'
  // bytes into the arena and returns once the daemon reports the rank staged
  // — the caller may then modify the tensors again. Returns the resolved
  // (absolute) checkpoint id.
  //
  // Items and options.cluster are validated locally first
  // (INVALID_ARGUMENT, RESOURCE_EXHAUSTED beyond the daemon's max_items)
  // before any call to the daemon. A rank
  // larger than the daemon's max_batch_bytes is streamed through the arena
  // in several batches. If this call fails after talking to the daemon the
  // checkpoint is aborted by the daemon.
  absl::StatusOr<std::string> Save(const std::string& checkpoint_id,
                                   const std::string& job, int rank,
                                   int world_size,
                                   absl::Span<const SaveItem> items,
                                   const SaveOptions& options = {},
                                   SaveStats* stats = nullptr);

  // Creates (or grows) the shared-memory arena now, so that a later Save of
  // up to `bytes` data bytes finds it ready and does not pay for creating,
  // registering and pre-faulting it (about 1 s per GiB). The arena is sized
  // as Save would size it for one item of `bytes` bytes: capped at the
  // daemon's max_batch_bytes and staging budget, rounded up to 2 MiB. An
  // existing arena at least that large is kept (no call to the daemon);
  // `bytes` == 0 does nothing. Serialized with Save.
  absl::Status Reserve(uint64_t bytes);

  // Blocks until the checkpoint is COMMITTED, FAILED or CANCELLED (returned
  // as an OK result: check `state`), or `timeout` passes
  // (DEADLINE_EXCEEDED). NOT_FOUND for an unknown checkpoint. Waits in calls
  // of at most rpc_timeout; a call the daemon does not answer at all within
  // its deadline (the call's timeout + 10 s) ends the wait, with or without
  // `timeout`: DEADLINE_EXCEEDED "the daemon at SOCKET did not answer a Wait
  // for checkpoint ID within Ns".
  absl::StatusOr<CheckpointInfo> Wait(
      const std::string& checkpoint_id,
      absl::Duration timeout = absl::InfiniteDuration(),
      bool until_data_durable = false);

  // DCP's StorageWriter (SaveOptions::external_metadata). WaitDataDurable:
  // Wait that also returns once the data is durable and the daemon awaits
  // the `.metadata` (CheckpointInfo::awaiting_metadata). GetLayout: where
  // each written item is (FAILED_PRECONDITION unless awaiting). Then
  // CommitMetadata hands the pickled Metadata (storage_data filled from the
  // layout); the daemon checks and publishes it, and Wait tells the result.
  // The arena (made if there is none) tells the daemon the caller's uid,
  // which must be the saver's.
  absl::StatusOr<CheckpointInfo> WaitDataDurable(
      const std::string& checkpoint_id,
      absl::Duration timeout = absl::InfiniteDuration()) {
    return Wait(checkpoint_id, timeout, /*until_data_durable=*/true);
  }
  absl::StatusOr<std::vector<LayoutEntry>> GetLayout(
      const std::string& checkpoint_id);
  absl::Status CommitMetadata(const std::string& checkpoint_id,
                              std::string_view metadata);

  // The checkpoint's current state. NOT_FOUND for an unknown checkpoint.
  absl::StatusOr<CheckpointInfo> GetStatus(const std::string& checkpoint_id);

  // Checkpoints the daemon knows, oldest first; `job` empty: all jobs;
  // `include_disk`: also committed checkpoints found under the roots.
  absl::StatusOr<std::vector<CheckpointInfo>> List(const std::string& job = "",
                                                   bool include_disk = false);

  // Cancels a checkpoint that has not committed. FAILED_PRECONDITION if it
  // already reached a final state.
  absl::Status Cancel(const std::string& checkpoint_id,
                      const std::string& reason = "");

  // Restores the daemon serves (running first) and the newest ended ones;
  // empty from a daemon that does not serve restores.
  absl::StatusOr<std::vector<RestoreProgress>> ListRestores();
  // Cancels running restore `id`: NOT_FOUND for an unknown one,
  // FAILED_PRECONDITION for one that has ended.
  absl::Status CancelRestore(const std::string& id,
                             const std::string& reason = "");

  // The index of checkpoint `checkpoint_id` (a directory: absolute, or
  // relative to the daemon's first checkpoint root; it must resolve under a
  // root, and the caller's user must be able to read it: the arena, made
  // here if there is none yet, tells the daemon who asks).
  // FAILED_PRECONDITION when the daemon does not serve restores
  // (DaemonInfo::restore); NOT_FOUND without a .metadata; DATA_LOSS for a
  // corrupt one. Waits for a Save in progress (the arena).
  absl::StatusOr<RestoreIndex> GetRestoreIndex(std::string_view checkpoint_id);

  // Fills `tensors` and `bytes_items` from checkpoint `checkpoint_id`
  // through the daemon: the wants are packed into batches of at most
  // options.batch_bytes (restore_batches.h) that the daemon fills in the
  // arena, and each batch is copied out into the destinations (with
  // copy_threads threads) before the next is asked for. Every rank sends at
  // least one batch (an empty one when it wants nothing), so its group does
  // not wait for it. Destinations are validated locally before any call
  // (INVALID_ARGUMENT); the daemon checks them against the checkpoint
  // (NOT_FOUND for an unknown fqn, INVALID_ARGUMENT for a dtype, rank or
  // box that does not match) and reports damaged files as DATA_LOSS naming
  // the file. Errors name the checkpoint. On failure some destinations may
  // have been written. Serialized with Save (one arena); waits for the
  // arena to be idle first.
  absl::StatusOr<RestoreStats> Restore(
      std::string_view checkpoint_id, const RestoreOptions& options,
      absl::Span<const RestoreTensor> tensors,
      absl::Span<RestoreBytesItem> bytes_items);

 private:
  struct Rpc;  // gRPC channel and stub (client.cc)

  Client(ClientOptions options, std::unique_ptr<Rpc> rpc, DaemonInfo info);

  // The arena id that tells the daemon the caller's uid (made if there is
  // none yet), after checking `checkpoint_id`.
  absl::StatusOr<uint64_t> CallerArena(const std::string& checkpoint_id)
      ABSL_LOCKS_EXCLUDED(save_mu_);
  // Makes arena_ at least `bytes` large and idle (no checkpoint still
  // reading it): waits for an existing one, or replaces it. `populate`:
  // every page of it faulted in (a save writes all of it inside the
  // trainer's stall); a restore does not, since the daemon writes the arena
  // only for what a group buffer does not serve.
  absl::Status PrepareArena(uint64_t bytes, bool need_idle,
                            bool populate = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu_);
  void ReleaseArena() ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu_);
  // The daemon's arena socket as this process reaches it.
  std::string ArenaSocketPath() const;

  // Constant after construction.
  const ClientOptions options_;
  const std::unique_ptr<Rpc> rpc_;
  const DaemonInfo info_;

  absl::Mutex save_mu_;  // serializes Save, Reserve and Restore
  std::unique_ptr<shm::Arena> arena_ ABSL_GUARDED_BY(save_mu_);
  uint64_t arena_id_ ABSL_GUARDED_BY(save_mu_) = 0;  // 0: none registered
  // Every page of arena_ has been faulted in (PrepareArena's `populate`).
  bool arena_populated_ ABSL_GUARDED_BY(save_mu_) = false;
};

}  // namespace ckptd::client

#endif  // CKPTD_CLIENT_CKPTD_CLIENT_H_
