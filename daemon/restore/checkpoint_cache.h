// Copyright 2026 The ckptd Authors.
//
// The checkpoints the daemon restores from, decoded once per node: a
// CheckpointReader (compact .metadata, open data files, the CRC-checked
// records) per directory, keyed by the directory and the identity of its
// .metadata (device, inode, size, mtime), so a checkpoint rewritten in
// place is decoded afresh. At most `capacity` are kept (least recently used
// dropped; readers still in use live on through their shared_ptr).
//
// Concurrent requests for a checkpoint being decoded wait for that one
// decode (single flight) without holding a thread: their callbacks run on
// the thread that decoded it.
//
// Takes: a resolved directory. Hands on: CachedCheckpoint (below) to the
// batch reader, which only calls the reader's thread-safe methods.
#ifndef CKPTD_DAEMON_RESTORE_CHECKPOINT_CACHE_H_
#define CKPTD_DAEMON_RESTORE_CHECKPOINT_CACHE_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/env.h"
#include "daemon/restore/restore_types.h"
#include "daemon/tier/memory_tier.h"
#include "daemon/tier/share_source.h"
#include "format/checkpoint/checkpoint_reader.h"

namespace ckptd::daemon {

// Owner, group and mode of a file of the checkpoint, as lstat saw them
// when it was decoded.
struct FileAccess {
  std::string path;  // for messages
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t mode = 0;
};

struct CachedCheckpoint {
  std::string dir;
  std::string identity;  // "dev:ino:size:mtime_ns" of .metadata
  // Counts the bytes read from the data files (CheckpointCacheOptions::
  // observer; null without one). Below tier_env, so declared before it.
  std::unique_ptr<Env> counting_env;
  // Data files read from other daemons' memory (peer_env.h); null when no
  // other daemon holds any. Below tier_env, above counting_env.
  std::unique_ptr<Env> peer_env;
  size_t peer_files = 0;                        // files other daemons hold
  mutable std::atomic<uint64_t> peer_bytes{0};  // fetched from them
  // The memory tier's view of the checkpoint when it holds it (the reader
  // opens its data files through it); null otherwise.
  std::unique_ptr<Env> tier_env;
  uint64_t tier_bytes = 0;     // held in memory when it was decoded
  MemoryTier* tier = nullptr;  // the tier that held it (with tier_env)
  std::unique_ptr<format::CheckpointReader> reader;
  // format::MetadataJson without chunk lists, with bytes sizes.
  std::shared_ptr<const std::string> index_json;
  // The directory, .metadata and every data file its storage names: who
  // may read them (MayRead).
  std::vector<FileAccess> files;
};

// Whether user `uid` (member of `groups`) may read every file of `ckpt`:
// PERMISSION_DENIED naming the first it may not. uid 0 may read all.
absl::Status MayRead(const CachedCheckpoint& ckpt, uint32_t uid,
                     const std::vector<uint32_t>& groups);
// The groups of `uid` (primary and supplementary; empty if unknown).
std::vector<uint32_t> GroupsOf(uint32_t uid);

struct CheckpointCacheOptions {
  int capacity = 4;
  format::CheckpointReaderOptions reader;
  // Where committed checkpoints may be held in memory (not owned; null:
  // every byte from storage).
  MemoryTier* tier = nullptr;
  // Told the bytes read from data files (not owned; may be null).
  RestoreObserver* observer = nullptr;
  // Other daemons' memory (peer_replicas; not owned; null: none), read
  // only for files missing from storage if `peers_only_missing`.
  ShareSource* peers = nullptr;
  bool peers_only_missing = false;
};

class CheckpointCache {
 public:
  using Callback = absl::AnyInvocable<void(
      absl::StatusOr<std::shared_ptr<const CachedCheckpoint>>)>;

  explicit CheckpointCache(CheckpointCacheOptions options)
      : options_(std::move(options)) {}

  // The checkpoint at resolved directory `dir`, decoded now (on the calling
  // thread, which must be one that may do I/O) unless the cache holds it
  // with the same .metadata identity or another thread is decoding it.
  // `done` runs exactly once: on this thread, or on the decoding thread.
  // Errors: NOT_FOUND (no .metadata), PERMISSION_DENIED (a data file that
  // is a symbolic link or not a regular file), DATA_LOSS / INVALID_ARGUMENT
  // from decoding.
  void Get(const std::string& dir, Callback done);

  int size() const;

 private:
  struct Entry {
    std::string identity;
    std::shared_ptr<const CachedCheckpoint> ckpt;  // null while loading
    std::vector<Callback> waiters;                 // while loading
  };
  absl::StatusOr<std::shared_ptr<const CachedCheckpoint>> Load(
      const std::string& dir, const std::string& identity);
  void TouchLocked(const std::string& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StackEnvs(CachedCheckpoint& ckpt,
                 format::CheckpointReaderOptions& ro) const;

  const CheckpointCacheOptions options_;
  mutable absl::Mutex mu_;
  std::list<std::pair<std::string, Entry>> lru_ ABSL_GUARDED_BY(mu_);
};

// "dev:ino:size:mtime_ns" of `dir`/.metadata; NOT_FOUND if it is missing.
absl::StatusOr<std::string> MetadataIdentity(const std::string& dir);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_RESTORE_CHECKPOINT_CACHE_H_
