// Copyright 2026 The ckptd Authors.
//
// UringEnv: the daemon's data-file writer. An Env whose NewWritableFile
// returns a file that copies appended bytes into pre-faulted block buffers
// and writes full blocks with io_uring (IORING_OP_WRITE), several in flight
// per file; Sync() is IORING_OP_FSYNC. Every other Env operation forwards to
// the wrapped `base` Env, so a FaultInjectionEnv can wrap a UringEnv (or be
// its base) in tests.
//
// Write path of one file (uring_env.cc has the details):
//   Append  → memcpy into the file's current block (taken from the pool);
//             a full block is submitted at its file offset and the file
//             moves on to a fresh block, with at most `queue_depth` blocks
//             of the file in flight.
//   Sync    → the partial block is written (direct: padded to 4096 bytes),
//             every in-flight write is waited for, the file is ftruncate'd
//             to its true size if padding was written, then fsync.
//   Close   → like Sync without the fsync, then close(2).
// Short writes are resubmitted for the rest, -EAGAIN/-EINTR retried. Any
// other error becomes a Status naming the path and the offset ("write
// /d/__0_0.distcp at offset 8388608: No space left on device";
// ErrnoToEnvStatus, so ENOSPC is RESOURCE_EXHAUSTED); the file remembers
// the first error and returns it from this and every later call (Close
// too). An error of a write still in flight surfaces on a later call.
//
// Hung storage (options.write_timeout > 0): a file that waits that long for
// a completion of its writes or fsync and sees none (a frozen or dead file
// system, an NFS server gone) gives up: the call returns DEADLINE_EXCEEDED
// "write of /d/__0_0.distcp at offset 8388608 made no progress for 5m
// (write_timeout)" (or "fsync of ..."), and so does every later call on the
// file; Close does not wait again. The buffers of the writes the kernel
// still holds are kept out of the pool (UringEnvStats::abandoned_blocks,
// logged) until their completions arrive, which puts them back; a late
// completion therefore never writes from a buffer holding other data, and a
// pool whose writes never complete is never unmapped. A file that needs a
// buffer while every buffer is held that way waits write_timeout for one,
// then fails the same way. Only waits for completions are bounded: open(2),
// ftruncate and the Env operations forwarded to `base` are not.
//
// Buffer pool rule (why any number of files and threads can share a pool of
// even one block without deadlock):
//  1. All write buffers of a UringEnv are one allocation of
//     floor(pool_bytes / block_bytes) blocks, made and pre-faulted in
//     Create. A file holds at most `queue_depth` blocks (in flight plus the
//     one being filled) and returns each to the pool as soon as its write
//     completes.
//  2. A file that needs a block takes a free one only if that leaves a block
//     for every file already waiting. Otherwise it waits for one of its own
//     writes to complete and reuses that block; only a file with nothing in
//     flight becomes a waiter.
//  3. A waiter takes the next free block. Blocks held by files inside a
//     call come back (or get parked) without help, since such a file never
//     waits on the pool while holding blocks; when every block of the pool
//     is parked in idle files (a file is idle between calls, e.g. while its
//     thread writes another file), the waiter reclaims an idle file's
//     blocks: it waits for that file's in-flight writes and writes out its
//     partial block early (direct mode keeps the last partial 4 KiB page in
//     a small per-file buffer, outside the pool, and rewrites it with the
//     file's next block). So every file always gets at least one block
//     eventually (its reserve), whatever the number of files and threads.
//  Reclaiming costs an early, smaller write; it never happens while the pool
//  has queue_depth blocks per concurrently written file.
//
// Thread-safety: UringEnv is thread-safe. Each WritableFile it returns is
// used by one thread at a time (other threads may reclaim its blocks while
// it is idle; that is internally synchronized).
// Ownership: `base` must outlive the UringEnv, and every WritableFile must
// be destroyed before the UringEnv that made it (checked: the destructor
// aborts if blocks are still out).
#ifndef CKPTD_COMMON_URING_ENV_H_
#define CKPTD_COMMON_URING_ENV_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/env.h"

namespace ckptd {

namespace uring_internal {
class BlockPool;
}  // namespace uring_internal

struct UringEnvOptions {
  // Writes in flight per file, 1..1024.
  int queue_depth = 4;
  // Bytes per write request: a positive multiple of 4096, at most 1 GiB.
  size_t block_bytes = size_t{4} << 20;
  // All write buffers of this Env together (rounded down to whole blocks; at
  // least one block); allocated and pre-faulted once in Create.
  size_t pool_bytes = size_t{32} << 20;
  // O_DIRECT data files: the page cache is bypassed; the final partial block
  // is written padded to 4096 bytes and the file ftruncate'd to its true
  // size in Sync()/Close().
  bool direct = false;
  // A file whose writes or fsync see no completion for this long fails with
  // DEADLINE_EXCEEDED (see "Hung storage" above); zero: wait for ever.
  absl::Duration write_timeout = absl::ZeroDuration();
};

// A snapshot of the pool, for metrics and tests.
struct UringEnvStats {
  size_t pool_blocks = 0;  // blocks in the pool
  size_t free_blocks = 0;  // blocks not held by any file now
  uint64_t waits = 0;      // times a file waited for the pool (rule 2)
  uint64_t reclaims = 0;   // idle files whose blocks were reclaimed (rule 3)
  uint64_t timeouts = 0;   // files that gave up on hung storage
  // Blocks still owned by the kernel for writes given up on (out of the
  // pool until their completions arrive).
  size_t abandoned_blocks = 0;
};

// An Env whose NewWritableFile returns an io_uring-backed file; every other
// operation forwards to `base`. Thread-safe; each WritableFile is used by
// one thread at a time.
class UringEnv final : public EnvWrapper {
 public:
  // Validates `options` (INVALID_ARGUMENT), probes io_uring — ring setup and
  // a real IORING_OP_WRITE + IORING_OP_FSYNC of 4 KiB to an unlinked temp
  // file in `probe_dir`, opened O_DIRECT if options.direct — and allocates
  // the pool. Returns UNAVAILABLE with the reason ("io_uring_queue_init:
  // Operation not permitted", "O_DIRECT is not supported in /dir: ...") if
  // io_uring or O_DIRECT cannot be used, so the caller can fall back to
  // Env::Default(); a probe file that cannot be created at all (missing
  // directory, EACCES) is that error (NOT_FOUND, PERMISSION_DENIED), not
  // UNAVAILABLE. `base` is not owned and must outlive the UringEnv.
  static absl::StatusOr<std::unique_ptr<UringEnv>> Create(
      Env* base, const std::string& probe_dir,
      const UringEnvOptions& options = {});

  // REQUIRES: every WritableFile of this Env has been destroyed. Leaves the
  // pool's memory mapped if writes given up on are still in the kernel.
  ~UringEnv() override;
  UringEnv(const UringEnv&) = delete;
  UringEnv& operator=(const UringEnv&) = delete;

  // Opens `path` (O_WRONLY|O_CREAT, O_TRUNC or with options.exclusive
  // O_EXCL → ALREADY_EXISTS; O_DIRECT in direct mode) and sets up its ring
  // (queue_depth + 1 entries). Errors name the path. The file borrows this
  // Env's pool: destroy it before the Env.
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const WritableFileOptions& options) override;

  // Every other operation is forwarded to `base` (EnvWrapper).

  const UringEnvOptions& options() const { return options_; }
  // Also collects completions of abandoned writes that arrived meanwhile.
  UringEnvStats stats() const;

 private:
  UringEnv(Env* base, const UringEnvOptions& options,
           std::unique_ptr<uring_internal::BlockPool> pool);

  // Constant after construction.
  const UringEnvOptions options_;
  const std::unique_ptr<uring_internal::BlockPool> pool_;
};

}  // namespace ckptd

#endif  // CKPTD_COMMON_URING_ENV_H_
