/* Copyright 2026 The ckptd Authors.
 *
 * The C ABI of libckptd_client (libckptd_client.so), for languages that
 * cannot use the C++ header (the Python package uses it through ctypes).
 * It wraps ckptd::client::Client (client/ckptd_client.h) one to one.
 *
 * Conventions
 *   - Every function that can fail returns an int: 0 on success, otherwise
 *     the status code (the gRPC / absl::StatusCode numbering, CKPTD_* below).
 *     The message of the last failure on the calling thread is
 *     ckptd_last_error(); a successful call sets it to "".
 *   - Strings are NUL-terminated UTF-8. Strings returned through a char**
 *     are allocated by the library and must be freed with
 *     ckptd_free_string(). Nothing else returned needs freeing.
 *   - A ckptd_client may be used from several threads at once, except that
 *     ckptd_close() must not run concurrently with any other call on it.
 *     ckptd_save() calls on one client are serialized internally.
 *   - No function throws or aborts on bad input; NULL arguments that are
 *     not documented as optional give CKPTD_INVALID_ARGUMENT.
 *
 *   ckptd_client* c;
 *   if (ckptd_connect("/run/ckptd/ckptd.sock", 2, &c) != 0)
 *     fprintf(stderr, "%s\n", ckptd_last_error());
 *   int64_t shape[2] = {1024, 1024};
 *   ckptd_item item = {0};
 *   item.fqn = "model.weight"; item.dtype = "float32"; item.ndim = 2;
 *   item.global_shape = shape; item.data = weights;
 *   rc = ckptd_save(c, "step_100", "job", 0, 1, &item, 1, 0, NULL);
 *   char state[32];
 *   rc = ckptd_wait(c, "step_100", -1, state, sizeof state);  // "COMMITTED"
 *   ckptd_close(c);
 */
#ifndef CKPTD_CLIENT_CKPTD_C_H_
#define CKPTD_CLIENT_CKPTD_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a struct below changes layout or a function its meaning.
 * 3: ckptd_save_options gained the multi-node (cluster) fields at its end,
 *    read by the new ckptd_save_ex2; "peer_address" in ckptd_info_json and
 *    the multi-node fields in the status JSON. */
/* 4: CUDA IPC items (ckptd_cuda_source, ckptd_save_options.cuda_sources);
 *    "cuda_ipc", "cuda_unavailable", "pinned_staging_bytes", "cuda_devices"
 *    in ckptd_info_json. */
/* Functions added without a version bump (no struct or existing function
 * changed; find them with dlsym): ckptd_reader_open_ex (payload CRC-32
 * checks can be turned off; every reader checks them by default). */
/* 5: restore through the daemon (ckptd_restore_index, ckptd_restore and
 *    their structs); "restore", "restore_gather_timeout_ms" and
 *    "named_arenas" in ckptd_info_json. */
/* 6: DCP's StorageWriter: ckptd_save_options.external_metadata and
 *    metadata_timeout_ms; ckptd_wait_data_durable_json, ckptd_layout_json,
 *    ckptd_commit_metadata; "awaiting_metadata" in the status JSON;
 *    ckptd_save_options.keep_every and compression. */
#define CKPTD_C_API_VERSION 6

/* Return codes (= google.rpc.Code = absl::StatusCode). */
#define CKPTD_OK 0
#define CKPTD_CANCELLED 1
#define CKPTD_UNKNOWN 2
#define CKPTD_INVALID_ARGUMENT 3
#define CKPTD_DEADLINE_EXCEEDED 4
#define CKPTD_NOT_FOUND 5
#define CKPTD_ALREADY_EXISTS 6
#define CKPTD_PERMISSION_DENIED 7
#define CKPTD_RESOURCE_EXHAUSTED 8
#define CKPTD_FAILED_PRECONDITION 9
#define CKPTD_ABORTED 10
#define CKPTD_OUT_OF_RANGE 11
#define CKPTD_UNIMPLEMENTED 12
#define CKPTD_INTERNAL 13
#define CKPTD_UNAVAILABLE 14
#define CKPTD_DATA_LOSS 15
#define CKPTD_UNAUTHENTICATED 16

/* A connection to the daemon (opaque). */
typedef struct ckptd_client ckptd_client;

/* One item of a rank's flattened state dict. Only points at caller memory,
 * which must stay valid and unchanged during ckptd_save(). Zero-initialize
 * and fill what applies. */
typedef struct ckptd_item {
  /* Fully qualified name ("model.layers.0.weight"); required. */
  const char* fqn;
  /* 0: a tensor chunk; nonzero: an opaque payload (torch.save bytes). */
  int32_t is_bytes;
  /* Tensors: number of dimensions, 0..64 (0: a scalar). */
  int32_t ndim;
  /* Tensors: torch dtype name without "torch." ("float32", "bfloat16");
   * NULL means "float32". */
  const char* dtype;
  /* Tensors: ndim entries each. global_shape may be NULL only if ndim == 0;
   * chunk_offsets NULL: all 0; chunk_sizes NULL: equal to global_shape
   * (an unsharded tensor). */
  const int64_t* global_shape;
  const int64_t* chunk_offsets;
  const int64_t* chunk_sizes;
  /* Tensors: strides of the chunk in memory, in elements (ndim entries,
   * non-negative); NULL: C-contiguous. Non-contiguous chunks are gathered
   * into C order. */
  const int64_t* strides;
  /* Tensors: address of the chunk's element [0, ..., 0] (host memory).
   * Bytes items: the payload. NULL only when there are no bytes. */
  const void* data;
  /* Bytes items: payload length. Tensors: 0, or the expected
   * numel * element size (checked). */
  uint64_t nbytes;
  /* Optional DCP planner_data path as a JSON array of strings (dict keys)
   * and integers (list indices), e.g. "[\"optim\", \"state\", 3, \"exp_avg\"]";
   * NULL or "" means [fqn]. */
  const char* path_json;
} ckptd_item;

/* Options of one save. Zero-initialize and fill what applies. Fields are
 * only ever appended: ckptd_save_ex2() is told sizeof(ckptd_save_options)
 * of the caller's header and gives fields beyond it their zero default, so a
 * program built against an older header keeps working with a newer
 * library. */
/* A tensor chunk in CUDA device memory, shared with the daemon through
 * legacy CUDA IPC. Fill it with the driver API on the chunk's address p:
 * cuMemGetAddressRange(&base, &allocation_size, p), cuIpcGetMemHandle(
 * ipc_handle, p) (the handle names the whole allocation), offset = p - base,
 * and cuDeviceGetPCIBusId(device, sizeof device, dev). Allocations for which
 * cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE) is
 * 0 (expandable segments, cuMemCreate/VMM) cannot be shared this way. */
typedef struct ckptd_cuda_source {
  uint8_t ipc_handle[64];   /* CUipcMemHandle of the allocation */
  char device[32];          /* PCI bus id, NUL-terminated: "0000:3b:00.0" */
  uint64_t offset;          /* of the chunk's first byte from the allocation base */
  uint64_t allocation_size; /* bytes of the allocation */
} ckptd_cuda_source;

typedef struct ckptd_save_options {
  /* Replace a committed checkpoint at the same path. */
  int32_t overwrite;
  /* DCP's dedup_save_to_lowest_rank. */
  int32_t dedup_save_to_lowest_rank;
  /* Retention of this checkpoint's job: once it commits, the daemon keeps
   * only the newest keep_last_n committed checkpoints of the job (never the
   * newest). 0: the daemon's keep_last_n setting. */
  int32_t keep_last_n;
  /* ---- API version 3: multi-node checkpoints (ClusterSpec). All zero /
   * NULL: a single-node checkpoint (every rank saves through one daemon).
   * The same on every rank of a node; see ckptd::client::ClusterSpec. */
  /* Peer address (host:port) of the daemon on rank 0's node, the
   * checkpoint's coordinator; required when num_nodes > 1. NULL: "". */
  const char* coordinator;
  /* num_local_ranks ranks (of the checkpoint) saving through this node's
   * daemon: unique, in [0, world_size), holding the caller's rank;
   * required when num_nodes > 1. May be NULL when num_local_ranks is 0. */
  const int32_t* local_ranks;
  int32_t num_local_ranks;
  /* Daemons (nodes) taking part; 0 means 1 (single node). */
  int32_t num_nodes;
  /* ---- API version 4: CUDA IPC items. NULL, or an array of n pointers
   * parallel to the items: a non-NULL entry i makes item i a C-contiguous
   * tensor chunk in CUDA memory that the daemon copies itself (D2H on its
   * own streams into its pinned pool) — item i's `data` and `strides` are
   * then ignored (strides must be NULL). Only for a daemon whose info says
   * "cuda_ipc": true; otherwise CKPTD_FAILED_PRECONDITION. The caller must
   * have synchronized the streams writing these tensors before the call. */
  const struct ckptd_cuda_source* const* cuda_sources;
  /* ---- API version 6: DCP's StorageWriter. Non-zero: the daemon writes
   * the data files but publishes the `.metadata` handed to
   * ckptd_commit_metadata (the same on every rank). Multi-node: only on
   * the daemon of rank 0's node (the coordinator), which checks it against
   * every node's layout (ckptd_get_layout there returns all of them). */
  int32_t external_metadata;
  /* How long the durable data waits for that `.metadata` before the
   * checkpoint fails; 0: the daemon's default (10 min). */
  uint32_t metadata_timeout_ms;
  /* Retention also keeps every committed checkpoint of the job whose
   * directory name ends with a multiple of keep_every ("step_1200"), beyond
   * the newest keep_last_n (Orbax's keep_period). 0: none; < 0 invalid. */
  int32_t keep_every;
  /* Payload compression: NULL or "" (none), "zstd" (level 3) or "zstd:N"
   * (N in 1..19): stock dcp.load of torch >= 2.7 reads it. Single-node
   * checkpoints only. */
  const char* compression;
} ckptd_save_options;

typedef struct ckptd_save_stats {
  double copy_seconds;  /* copying into shared memory */
  double total_seconds; /* the whole call (the trainer's stall) */
  uint64_t bytes;       /* data bytes of this rank */
  int32_t batches;      /* Save calls; > 1 when streamed */
} ckptd_save_stats;

/* The message of the calling thread's last failed call, "" after a
 * successful one. Valid until the thread's next ckptd_* call. Never NULL. */
const char* ckptd_last_error(void);

/* CKPTD_C_API_VERSION of the loaded library. */
int ckptd_api_version(void);

/* Connects to the daemon at `socket_path` (NULL or "": $CKPTD_SOCKET, else
 * /run/ckptd/ckptd.sock) and fetches its info. `copy_threads` < 1 means 1.
 * On success *out is a new client, to be closed with ckptd_close().
 * CKPTD_UNAVAILABLE when no daemon answers there. */
int ckptd_connect(const char* socket_path, int copy_threads,
                  ckptd_client** out);

/* ckptd_connect with more options: `owner` (NULL: "pid N") is shown in the
 * daemon's logs; `rpc_timeout_seconds` <= 0 keeps the default (600 s)
 * deadline of each Save batch and Wait call. */
int ckptd_connect_ex(const char* socket_path, int copy_threads,
                     const char* owner, double rpc_timeout_seconds,
                     ckptd_client** out);

/* Releases the client's shared-memory arena and closes the connection.
 * NULL is a no-op. */
void ckptd_close(ckptd_client* client);

/* The daemon's GetInfo answer as a JSON object: {"version", "pid",
 * "shm_dir", "io_backend", "staging_budget_bytes", "max_batch_bytes",
 * "max_items", "checkpoint_roots": [...], "peer_address"} (peer_address:
 * host:port of the daemon's peer service, "" when it is off), and since
 * API version 4 "cuda_ipc" (the daemon stages ckptd_cuda_source items),
 * "cuda_unavailable" (else why not), "pinned_staging_bytes" and
 * "cuda_devices" (PCI bus ids), and "arena_socket" (where the client
 * registers its sealed memfd arenas; "" from older daemons); since API
 * version 5 "named_arenas", "restore" (the daemon serves ckptd_restore;
 * false from older daemons) and "restore_gather_timeout_ms". Free
 * *json_out. */
int ckptd_info_json(ckptd_client* client, char** json_out);

/* Saves this rank's part of checkpoint `checkpoint_id` (a directory,
 * absolute or relative to the daemon's first checkpoint root); `job` (NULL:
 * "") is the retention group. Returns once the daemon has staged the rank:
 * the caller may then modify the tensors. `copy_seconds_out` may be NULL.
 * Items are validated locally before anything is sent
 * (CKPTD_INVALID_ARGUMENT naming the item). */
int ckptd_save(ckptd_client* client, const char* checkpoint_id, const char* job,
               int rank, int world_size, const ckptd_item* items, size_t n,
               int overwrite, double* copy_seconds_out);

/* ckptd_save with all options. `options` NULL: defaults, else
 * `options_size` is sizeof(ckptd_save_options) as the caller compiled it
 * (fields beyond it are taken as zero). A size below that of the API
 * version 2 struct (12 bytes), or a larger struct whose bytes beyond the
 * fields this library knows are not all zero, is CKPTD_INVALID_ARGUMENT.
 * `stats_out` may be NULL; `resolved_id_out` may be NULL, else receives the
 * absolute checkpoint directory (free it). The cluster fields are validated
 * locally before anything is sent (CKPTD_INVALID_ARGUMENT naming the field). */
int ckptd_save_ex2(ckptd_client* client, const char* checkpoint_id,
                   const char* job, int rank, int world_size,
                   const ckptd_item* items, size_t n,
                   const ckptd_save_options* options, size_t options_size,
                   ckptd_save_stats* stats_out, char** resolved_id_out);

/* The API version 2 entry point, kept for programs built against it: reads
 * only overwrite, dedup_save_to_lowest_rank and keep_last_n of `options`
 * (the version 2 struct) and saves a single-node checkpoint. New code calls
 * ckptd_save_ex2. */
int ckptd_save_ex(ckptd_client* client, const char* checkpoint_id,
                  const char* job, int rank, int world_size,
                  const ckptd_item* items, size_t n,
                  const ckptd_save_options* options,
                  ckptd_save_stats* stats_out, char** resolved_id_out);

/* Waits until the checkpoint is final or `timeout_ms` passes (< 0: no
 * limit). Returns 0 when it reached a final state, whose name ("COMMITTED",
 * "FAILED", "CANCELLED") is copied into state_buf (truncated to len-1
 * bytes; state_buf may be NULL when len is 0); for FAILED and CANCELLED
 * ckptd_last_error() holds the checkpoint's error. CKPTD_DEADLINE_EXCEEDED
 * on timeout, CKPTD_NOT_FOUND for an unknown checkpoint. */
int ckptd_wait(ckptd_client* client, const char* checkpoint_id,
               int64_t timeout_ms, char* state_buf, size_t len);

/* DCP's StorageWriter (ckptd_save_options.external_metadata). As
 * ckptd_wait_json, but also returns once the checkpoint's data is durable
 * and the daemon awaits its `.metadata` ("awaiting_metadata": true). */
int ckptd_wait_data_durable_json(ckptd_client* client,
                                 const char* checkpoint_id, int64_t timeout_ms,
                                 char** json_out);
/* Where each written item of an awaiting checkpoint is, as JSON:
 * {"checkpoint_id": "/abs", "entries": [{"fqn": "w", "bytes": false,
 * "offsets": [0, 0], "path": "__0_0.distcp", "offset": 0, "length": 64,
 * "transforms": []},
 * ...]}. CKPTD_FAILED_PRECONDITION unless awaiting_metadata. */
int ckptd_layout_json(ckptd_client* client, const char* checkpoint_id,
                      char** json_out);
/* Hands the pickled torch Metadata (storage_data filled from the layout)
 * to the daemon, which checks it against what was written and publishes
 * it; ckptd_wait tells the outcome. */
int ckptd_commit_metadata(ckptd_client* client, const char* checkpoint_id,
                          const void* metadata, size_t len);

/* ckptd_wait returning the final status as JSON (as ckptd_status_json). */
int ckptd_wait_json(ckptd_client* client, const char* checkpoint_id,
                    int64_t timeout_ms, char** json_out);

/* The checkpoint's status as a JSON object: {"checkpoint_id", "job",
 * "state", "world_size", "ranks_staged", "total_bytes", "staged_bytes",
 * "written_bytes", "file_bytes", "items", "files", "error", "error_code",
 * "created_unix_ms", "staged_unix_ms", "finished_unix_ms", "num_nodes",
 * "coordinator", "is_coordinator", "nodes_planned", "nodes_prepared",
 * "local_ranks" (a count), "local_total_bytes", "local_written_bytes",
 * "awaiting_metadata", "memory_tier_bytes" (held in this node's memory
 * tier)}.
 * num_nodes <= 1: a single-node checkpoint; above 1 the byte counts and
 * ranks_staged are global and local_* this node's. Free *json_out. */
int ckptd_status_json(ckptd_client* client, const char* checkpoint_id,
                      char** json_out);

/* The checkpoints the daemon knows, oldest first, as a JSON array of status
 * objects. `job` NULL or "": all jobs; `include_disk` nonzero: also
 * committed checkpoints found on disk. Free *json_out. */
int ckptd_list_json(ckptd_client* client, const char* job, int include_disk,
                    char** json_out);

/* Cancels a checkpoint that has not committed (`reason` may be NULL).
 * CKPTD_FAILED_PRECONDITION if it is already final. */
int ckptd_cancel(ckptd_client* client, const char* checkpoint_id,
                 const char* reason);

/* Creates (or grows) the client's shared-memory arena now so that the first
 * ckptd_save() of up to `bytes` data bytes does not pay for creating and
 * pre-faulting it (about 1 s per GiB). The arena is capped at the daemon's
 * staging budget / batch limit exactly as ckptd_save() would size it. */
int ckptd_reserve(ckptd_client* client, uint64_t bytes);

/* ---- Reading checkpoints (no daemon involved) ----------------------------
 * A reader opens a DCP checkpoint directory written by ckptd or by stock
 * torch.distributed.checkpoint.save, and fills caller buffers with any box of
 * any tensor, resharding across the saved chunks (dcp-format.md §5.3): only
 * the byte ranges needed are read. Thread-safe: several threads may call
 * ckptd_reader_read() on one reader at once. */
typedef struct ckptd_reader ckptd_reader;

/* Opens `dir` and reads and validates its `.metadata`. `threads` < 1 means 1:
 * the number of threads ckptd_reader_read() uses. CKPTD_NOT_FOUND when the
 * directory or its `.metadata` does not exist; CKPTD_DATA_LOSS for a corrupt
 * `.metadata`. */
int ckptd_reader_open(const char* dir, int threads, ckptd_reader** out);

/* Flags of ckptd_reader_open_ex. */
/* Do not check payload CRC-32s: values are returned even from records whose
 * checksum does not match (benchmarks, salvaging a damaged checkpoint). */
#define CKPTD_READER_NO_VERIFY_CRC 1u

/* ckptd_reader_open with flags (CKPTD_READER_*; 0 = ckptd_reader_open).
 * Unknown flag bits are CKPTD_INVALID_ARGUMENT.
 *
 * Payload CRC-32s (without CKPTD_READER_NO_VERIFY_CRC, and always with
 * ckptd_reader_open): no value is returned from a zip record whose CRC-32
 * does not match its archive. A read that covers a saved chunk whole, into
 * a destination of the same C-order layout, checks the CRC on the bytes as
 * they arrive; any other read of a chunk (part of it when resharding, or a
 * strided destination) reads the chunk's whole record through CRC-32, once
 * per reader (row boxes are copied out of that pass, other boxes are read
 * after it), so bytes_read_out counts whole chunks. ckptd_reader_read_bytes
 * checks every record of a
 * bytes item's torch.save archive. A mismatch is CKPTD_DATA_LOSS; the
 * message names the file, the archive offset, the item (fqn and chunk
 * offsets), the record and its offset in the file. Added after API version
 * 4 without a bump: look it up with dlsym. */
int ckptd_reader_open_ex(const char* dir, int threads, uint32_t flags,
                         ckptd_reader** out);

/* NULL is a no-op. */
void ckptd_reader_close(ckptd_reader* reader);

/* The checkpoint's metadata as JSON:
 *   {"dir": "/abs/dir", "version": "1.0.0" or null,
 *    "entries": [ {"fqn": "model.w", "type": "tensor", "dtype": "float32",
 *                  "size": [4, 6], "chunks": [{"offsets": [0, 0],
 *                  "sizes": [2, 6]}, ...]},
 *                 {"fqn": "step", "type": "bytes"}, ... ],   (metadata order)
 *    "planner_data": {"model.w": ["model", "w"], ...} or null }
 * planner_data paths hold strings (dict keys) and integers (list indices);
 * it is null when the checkpoint has none or holds a planner_data that is
 * not a dict of tuples/lists of str/int.
 * Free *json_out. */
int ckptd_reader_metadata_json(ckptd_reader* reader, char** json_out);

/* Flags of ckptd_reader_metadata_json_ex. */
/* Entries of tensors carry "num_chunks" instead of the "chunks" list (the
 * JSON of a checkpoint of millions of chunks stays small; a loader asks for
 * its boxes with ckptd_reader_read, or for the chunks overlapping a box with
 * ckptd_reader_chunks_json). */
#define CKPTD_METADATA_JSON_NO_CHUNKS 1u

/* ckptd_reader_metadata_json with flags (CKPTD_METADATA_JSON_*; 0 = the
 * same JSON). Unknown flag bits are CKPTD_INVALID_ARGUMENT. Added after API
 * version 4 without a bump: look it up with dlsym. */
int ckptd_reader_metadata_json_ex(ckptd_reader* reader, uint32_t flags,
                                  char** json_out);

/* The saved chunks of tensor `fqn` that overlap the box [offsets, offsets +
 * sizes) (`ndim` entries each; both NULL: every chunk), in chunk order, as
 * JSON: [{"offsets": [...], "sizes": [...], "file": "__0_0.distcp",
 * "offset": 1024, "length": 4096}, ...] ("file"/"offset"/"length" absent
 * for a chunk without a storage entry). Found through the reader's box index
 * (O(log n + hits) for shardings along one dimension), not a scan.
 * CKPTD_NOT_FOUND for an unknown fqn, CKPTD_INVALID_ARGUMENT for a bytes item
 * or an ndim that is not the tensor's. Free *json_out. Added after API
 * version 4 without a bump: look it up with dlsym. */
int ckptd_reader_chunks_json(ckptd_reader* reader, const char* fqn,
                             int32_t ndim, const int64_t* offsets,
                             const int64_t* sizes, char** json_out);

/* "Fill `data` with the box [offsets, offsets + sizes) of tensor `fqn`." */
typedef struct ckptd_read_request {
  const char* fqn;
  /* Destination dtype name (as in ckptd_item); must equal the saved dtype
   * (CKPTD_INVALID_ARGUMENT otherwise: convert on the caller's side). */
  const char* dtype;
  int32_t ndim;
  /* ndim entries each; offsets NULL: all 0. */
  const int64_t* offsets;
  const int64_t* sizes;
  /* Destination strides in elements (non-negative); NULL: C-contiguous. */
  const int64_t* strides;
  /* Address of the destination's element [0, ..., 0] (host memory). */
  void* data;
} ckptd_read_request;

/* Plans and fills every request (reading with the reader's threads).
 * Errors name the tensor: unknown fqn (CKPTD_NOT_FOUND), a bytes item asked
 * as a tensor, dtype or rank mismatch, a box outside the tensor or not
 * covered by saved chunks (CKPTD_INVALID_ARGUMENT), corrupt or truncated
 * payloads (CKPTD_DATA_LOSS). On failure some destinations may have been
 * partly written. `bytes_read_out` may be NULL. */
int ckptd_reader_read(ckptd_reader* reader, const ckptd_read_request* requests,
                      size_t n, uint64_t* bytes_read_out);

/* The raw payload of bytes item `fqn` (a torch.save archive): *data_out is
 * allocated by the library (free it with ckptd_free_string), *len_out its
 * length. */
int ckptd_reader_read_bytes(ckptd_reader* reader, const char* fqn,
                            char** data_out, uint64_t* len_out);

/* ---- Restoring through the daemon (API version 5) -----------------------
 * The daemon reads the checkpoint for the node's ranks: each byte range is
 * read once for all local ranks of one restore group and copied into each
 * rank's shared-memory arena, from which the library copies it into the
 * caller's buffers. Only for a daemon whose info says "restore": true
 * (otherwise CKPTD_FAILED_PRECONDITION: use the reader above). */

/* The checkpoint's index as the daemon decoded it: *json_out receives the
 * JSON of ckptd_reader_metadata_json_ex(CKPTD_METADATA_JSON_NO_CHUNKS)
 * except that bytes entries carry "nbytes" (their payload length) and "dir"
 * is the directory as the daemon resolved it; *identity_out (may be NULL)
 * the identity of its .metadata (pass it as ckptd_restore_options.identity).
 * `checkpoint_id` is absolute or relative to the daemon's first checkpoint
 * root, and must resolve under a root (CKPTD_PERMISSION_DENIED otherwise).
 * CKPTD_NOT_FOUND without a .metadata, CKPTD_DATA_LOSS for a corrupt one.
 * Free both strings. */
int ckptd_restore_index(ckptd_client* client, const char* checkpoint_id,
                        char** json_out, char** identity_out);

/* Flags of ckptd_restore_options. */
/* Do not check payload CRC-32s (as CKPTD_READER_NO_VERIFY_CRC). */
#define CKPTD_RESTORE_NO_VERIFY_CRC 1u

/* Options of one restore; zero-initialize and fill what applies. */
typedef struct ckptd_restore_options {
  /* The restore group: every local rank of one load passes the same string
   * (at most 1024 bytes); NULL or "": this rank alone. */
  const char* group;
  /* 0 <= local_rank < local_world_size; local_world_size 0 means 1. */
  int32_t local_rank;
  int32_t local_world_size;
  /* CKPTD_RESTORE_* flags. Unknown bits are CKPTD_INVALID_ARGUMENT. */
  uint32_t flags;
  /* The identity from ckptd_restore_index (CKPTD_ABORTED if the checkpoint
   * changed since); NULL or "": not checked. */
  const char* identity;
  /* Largest arena bytes of one Restore call (0: 256 MiB; else >= 64,
   * capped at the daemon's max_batch_bytes); larger boxes are split. Every
   * rank of a group must pass the same value. */
  uint64_t batch_bytes;
} ckptd_restore_options;

/* A bytes item to restore: fill fqn and nbytes (the index's "nbytes");
 * ckptd_restore sets data (a buffer allocated by the library, free it with
 * ckptd_free_string; NUL-terminated after `length` bytes) and length. */
typedef struct ckptd_restore_bytes {
  const char* fqn;
  uint64_t nbytes;
  char* data;
  uint64_t length;
} ckptd_restore_bytes;

typedef struct ckptd_restore_stats {
  /* Payload bytes the daemon read from storage for this rank's batches (a
   * group's reads are counted once, at the rank whose batch did them). */
  uint64_t storage_bytes;
  uint64_t copied_bytes; /* bytes the daemon wrote into this rank's arena */
  uint64_t bytes;        /* bytes delivered into the caller's buffers */
  int32_t batches;       /* Restore calls */
  int32_t group_ranks;   /* most ranks served together in one batch */
  double seconds;        /* the whole call */
} ckptd_restore_stats;

/* Fills `tensors` (ckptd_read_request as for ckptd_reader_read: a box of a
 * saved tensor in the saved dtype, into host memory, any strides) and the
 * bytes items through the daemon. `opts` NULL: defaults. `tensors` may be
 * NULL when n_tensors is 0, `bytes_items` when n_bytes is 0; `stats_out`
 * may be NULL. A rank with nothing to restore still calls it (its group's
 * batches are gathered across ranks). Requests are validated locally first
 * (CKPTD_INVALID_ARGUMENT naming the request); the daemon's errors name the
 * checkpoint and item: unknown fqn (CKPTD_NOT_FOUND), dtype, rank or box
 * mismatch (CKPTD_INVALID_ARGUMENT), damaged files (CKPTD_DATA_LOSS naming
 * the file). On failure every bytes item's data is NULL and some tensor
 * buffers may have been written. */
int ckptd_restore(ckptd_client* client, const char* checkpoint_id,
                  const ckptd_restore_options* opts,
                  const ckptd_read_request* tensors, size_t n_tensors,
                  ckptd_restore_bytes* bytes_items, size_t n_bytes,
                  ckptd_restore_stats* stats_out);

/* Frees a string or buffer returned by this library. NULL is a no-op. */
void ckptd_free_string(char* s);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* CKPTD_CLIENT_CKPTD_C_H_ */
