// Copyright 2026 The ckptd Authors.
//
// DaemonOptions: every setting of ckptd, with its default. A config file
// (`key = value` lines, see config.h) and command-line flags (--key=value,
// which win) fill it; docs/configuration.md lists the same
// keys.
#ifndef CKPTD_DAEMON_OPTIONS_H_
#define CKPTD_DAEMON_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/env.h"

namespace ckptd::daemon {
class DeviceBackend;

class CoordinatorLink;     // cluster.h
class ShareLink;           // shares.h
class CheckpointObserver;  // checkpoint_manager.h

struct DaemonOptions {
  // --- Endpoints ---
  // Unix socket of the trainer/CLI service. Its directory is created (0755)
  // if missing; the socket gets `socket_mode`.
  std::string socket = "/run/ckptd/ckptd.sock";
  uint32_t socket_mode = 0660;
  // Unix socket (SOCK_SEQPACKET) where clients register arenas by passing a
  // sealed memfd (daemon/arena_listener.h, shm/fd_passing.h); same mode as
  // `socket`. Empty: `socket` + ".arena" (set by FinalizeOptions).
  std::string arena_socket;
  // UNSAFE, legacy single-user nodes only: also accept gRPC RegisterArena by
  // file name in shm_dir. The daemon then maps whatever file of that name it
  // can open, whoever asked (a client can have another user's arena
  // registered), and an unsealed file that its owner truncates makes the
  // daemon die of SIGBUS. Off: RegisterArena is FAILED_PRECONDITION.
  bool allow_named_arenas = false;

  // --- Metrics ---
  // TCP host:port of the HTTP endpoint serving /metrics (Prometheus text
  // format) and /healthz ("0.0.0.0:9464"; port 0 picks one, logged);
  // empty: off. docs/metrics.md lists the metrics.
  std::string http_listen;

  // --- Peers (multi-node checkpoints) ---
  // TCP address of the peer service ("0.0.0.0:7070"; port 0 picks one);
  // empty: off, and this daemon takes part in single-node checkpoints only.
  std::string peer_listen;
  // Address other daemons reach this one at (GetInfo.peer_address, handed
  // to the trainers); a port of 0 is replaced by the bound port; empty:
  // this host's name and the bound port.
  std::string peer_advertise;
  // File holding the shared token every peer call must carry (required
  // with peer_listen; readable by the daemon's user only).
  std::string peer_token_file;
  // TLS for the peer service and the calls to coordinators (PEM files);
  // all empty: plaintext TCP, authenticated by the token only.
  std::string peer_tls_cert;
  std::string peer_tls_key;
  std::string peer_tls_ca;  // CA that signs the peers' certificates
  // A peer not heard from for this long aborts the checkpoint.
  absl::Duration peer_timeout = absl::Seconds(30);
  // How often a node sends progress to the coordinator and learns the
  // global state.
  absl::Duration peer_heartbeat = absl::Seconds(1);
  // Coordinator: a node's "durable" is good for this long; the other nodes
  // must be durable by then or the checkpoint is aborted.
  absl::Duration commit_timeout = absl::Seconds(300);

  // --- Paths ---
  // Checkpoint directories must resolve (symlinks included) under one of
  // these. A relative checkpoint id is taken relative to the first.
  std::vector<std::string> checkpoint_roots = {"/var/lib/ckptd/checkpoints"};
  // Directory (tmpfs) where clients create shared-memory arenas.
  std::string shm_dir = "/dev/shm/ckptd";
  // Daemon state: the journal of unfinished checkpoints and the per-job
  // history used by retention.
  std::string state_dir = "/var/lib/ckptd/state";

  // --- Staging ---
  // Bytes of client arenas the daemon holds at once (staged, not yet
  // written). A checkpoint larger than this streams through it.
  uint64_t staging_budget = uint64_t{4} << 30;
  // Largest batch of one Save call; 0 = staging_budget / 2.
  uint64_t max_batch = 0;

  // --- GPU (gpu_stager.h) ---
  // "auto": stage CUDA IPC handles when the driver and a device are there,
  // else serve host saves only (device extents are refused with the
  // reason); "on": start-up fails without CUDA; "off": never load CUDA.
  std::string cuda = "auto";
  std::string cuda_library = "libcuda.so.1";  // dlopen()ed at start-up
  // Page-locked host memory device bytes are copied into, allocated once at
  // start-up (needs LimitMEMLOCK / CAP_IPC_LOCK). A checkpoint's device
  // bytes beyond it stream through it (the stall then includes writing).
  uint64_t pinned_staging_bytes = uint64_t{4} << 30;
  int cuda_streams = 2;  // device-to-host copy streams per GPU

  // --- Writer ---
  // "auto" (io_uring if it works, else pwrite), "io_uring" or "pwrite".
  std::string io_backend = "auto";
  int io_threads = 2;   // files written concurrently
  int queue_depth = 4;  // io_uring writes in flight per file
  uint64_t write_block = uint64_t{4} << 20;  // bytes per io_uring write
  uint64_t write_pool = uint64_t{32} << 20;  // io_uring buffers in all
  // O_DIRECT data files (io_uring only; files on a file system without
  // O_DIRECT are written buffered). Buffered io_uring writes are punted to
  // kernel workers and measured 2.5-3x slower than pwrite here, O_DIRECT
  // 1-1.6x faster (bench/uring_bench.cc).
  bool direct_io = true;
  bool fsync = true;  // false only for tests/benchmarks of CPU cost
  // Cap on data-file write bandwidth in bytes/s (all files together), so
  // checkpoint writes do not starve the job's own I/O; 0 = unlimited.
  uint64_t write_rate_limit = 0;
  // Hung storage (a frozen or dead file system, an NFS server gone): a write
  // or fsync of a file (data, .metadata, journal) that makes no progress for
  // this long fails with DEADLINE_EXCEEDED "write of FILE at offset N made
  // no progress for 5m (write_timeout)", and so does its checkpoint. Both
  // writers (uring_env.h, write_timeout_env.h). 0 = off (wait for ever).
  absl::Duration write_timeout = absl::Seconds(300);

  // --- Lifecycle ---
  // Committed checkpoints kept per job (older ones are deleted after a
  // commit); 0 keeps all. The newest committed is never deleted.
  int keep_last_n = 0;
  // A checkpoint whose ranks make no progress (index or bytes) for this long
  // before being staged is aborted.
  absl::Duration stage_timeout = absl::Seconds(120);
  // A streaming rank (batches larger than max_batch) whose client sends no
  // next batch this long after its previous one was answered is taken as
  // gone and the checkpoint aborted (the lease between batches; during a
  // Save call the call itself is the lease).
  absl::Duration batch_gap_timeout = absl::Seconds(15);
  // Arenas not referenced by a Save for this long are unmapped.
  absl::Duration arena_idle_timeout = absl::Minutes(30);
  // Finished checkpoints stay listed (in memory) this long.
  absl::Duration forget_after = absl::Hours(24);
  // On SIGTERM/SIGINT, checkpoints whose local ranks are all staged get this
  // long to finish; the others are aborted. What is still unfinished then is
  // logged and aborted, and the teardown after it is bounded: if it has not
  // ended within write_timeout + 30 s (+ peer_timeout + 5 s with peers), the
  // daemon logs the checkpoints it abandons and exits with status 3 (start-up
  // recovery removes their files). daemon_main.cc.
  absl::Duration shutdown_grace = absl::Seconds(60);

  // --- Limits (requests beyond them: RESOURCE_EXHAUSTED) ---
  uint32_t max_items = 1u << 20;  // items of one rank
  int max_world_size = 1 << 16;
  int max_active_checkpoints = 16;  // not yet finished
  int max_arenas = 4096;
  // Per client uid (the arena socket's SO_PEERCRED; a named arena's file
  // owner): arenas and arena bytes registered at once, so that one user
  // cannot take every arena slot.
  int max_arenas_per_client = 256;
  uint64_t max_arena_bytes_per_client = uint64_t{256} << 30;
  int max_pending_saves = 1024;  // Save calls waiting for the budget

  // --- Restore through the daemon (daemon/restore/, docs/restore.md) ---
  // A Restore batch waits this long for the other local ranks of its group
  // before it is served with the ranks that came (a dead trainer delays its
  // group by at most this much).
  absl::Duration restore_gather_timeout = absl::Seconds(10);
  int restore_threads = 2;             // group batches served at once
  int restore_read_threads = 4;        // reading threads of one group batch
  int restore_cached_checkpoints = 4;  // decoded .metadata kept (LRU)
  // Group batches read whole stored records of 1 MiB and more with
  // O_DIRECT straight into their group buffer: each byte is read once for
  // the node and hands on from there, so it skips the page cache (no copy,
  // no cache filled with bytes nobody reads again). Where the file system
  // refuses O_DIRECT, reads go through the page cache as when off.
  bool restore_direct_io = true;
  // Memory of the group buffers alive at once: a group batch of several
  // ranks is read once into one and each rank copies its boxes from it
  // (daemon/restore/group_buffers.h); 0: through the ranks' arenas. At
  // most staging_budget (FinalizeOptions lowers it to that): the daemon's
  // own memory for restores counts within the staging budget.
  uint64_t restore_buffer_bytes = uint64_t{1} << 30;
  // The memory tier (daemon/tier/memory_tier.h): bytes of committed
  // checkpoints kept in memory, newest per job first, to restore a
  // restarted trainer without reading storage. 0: off.
  uint64_t memory_tier_bytes = 0;
  // Where the memory tier's held files live so that a daemon restart keeps
  // them (daemon/tier/tier_store.h): a tmpfs directory of this daemon's
  // own. Empty: memfds, gone with the daemon process.
  std::string memory_tier_dir;

  // Peer replicas (daemon/cluster/shares.h, docs/restore.md "Peer
  // replicas"): copies of this node's share of a job's newest multi-node
  // checkpoint in the memory tiers of this many other nodes (0..2).
  int peer_replicas = 0;
  // This node's failure domain; replicas go to nodes of other domains.
  std::string failure_domain;
  // Bytes/s the replicas are pushed at (0: unlimited).
  uint64_t replica_rate_limit = 0;
  // Other daemons to ask, at a restore, for what they hold in memory
  // (host:port); the nodes of checkpoints committed here are asked too.
  std::vector<std::string> restore_peers;
  // prefer: read data files other daemons hold from them; missing: only
  // those gone from storage; off: never.
  std::string peer_restore = "prefer";

  // --- Logging ---
  std::string log_level = "info";  // trace, debug, info, warn, error
  std::string log_file;            // empty: stderr

  // --- Injected for tests ---
  Env* env = nullptr;  // nullptr: chosen from io_backend at start-up
  // Links to remote coordinators; set by the daemon from the peer_*
  // settings (peer_service.h). Unset: multi-node saves are refused unless
  // this node is the coordinator.
  std::function<absl::StatusOr<std::shared_ptr<CoordinatorLink>>(
      const std::string&)>
      link_factory;
  // This node's name in peer messages (set from peer_advertise).
  std::string node_name;
  // Links to other daemons for replicas and restores from their memory;
  // set by the daemon with link_factory. Unset: no replicas.
  std::function<absl::StatusOr<std::shared_ptr<ShareLink>>(const std::string&)>
      share_link_factory;
  // The device behind the GPU stager instead of the CUDA driver (tests).
  std::shared_ptr<DeviceBackend> device_backend;
  // Told of checkpoint events (metrics, http_server.h); not owned, must
  // outlive the manager. nullptr: none.
  CheckpointObserver* observer = nullptr;
  // The time source of every timeout (common/clock.h); tests inject a
  // SimulatedClock. Not owned; must outlive the daemon's components.
  Clock* clock = Clock::Real();
};

// Resolves max_batch and checks the values (INVALID_ARGUMENT naming the key).
absl::Status FinalizeOptions(DaemonOptions* options);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_OPTIONS_H_
