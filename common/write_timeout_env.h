// Copyright 2026 The ckptd Authors.
//
// WriteTimeoutEnv: an Env whose writable files give up on hung storage. The
// daemon wraps the POSIX Env in it when it writes with pwrite (io_backend
// pwrite, or io_uring unusable); UringEnv bounds its own waits
// (uring_env.h).
//
// Why a thread per file: a write(2) or fsync(2) blocked in the kernel on a
// frozen or dead file system (fsfreeze, an NFS server gone, a disk that no
// longer answers) cannot be interrupted: not by a signal (the sleep is
// uninterruptible), not by closing the descriptor. The only way to answer
// the caller is not to make the call in the caller's thread. So every file
// has a writer thread that makes the base file's calls, and the caller waits
// for it with a deadline:
//   Append → in chunks of buffer_bytes: waits for the writer thread's
//            previous write, hands it the chunk and waits while the thread
//            copies it into its own buffer (a memcpy: no storage call), then
//            returns or goes on with the next chunk while the thread writes
//            the copy. The caller's memory is never read after the call.
//   Sync   → waits for the last write, then for the base file's Sync.
//   Close  → waits for the last write, then for the base file's Close;
//            joins the thread.
// The copy is made by the writer thread, on its own core, just before it
// writes: the kernel then reads it from that core's cache (a copy made by
// the caller's thread measured slower, bench/uring_bench.cc).
//
// A write, sync or close that the writer thread started and has not
// finished write_timeout later fails the caller's call with
// DEADLINE_EXCEEDED "write of /d/__0_0.distcp at offset 8388608 made no
// progress for 5m (write_timeout)" ("fsync of ...", "close of ..."); every
// later call on the file returns the same error, and the destructor does not
// wait. The writer thread is then abandoned (detached): it owns its buffer
// and the base file, so when the storage answers it finishes its call from
// memory nobody else uses, closes the base file and exits; until then it is
// counted in stats().stuck_threads and its file descriptor stays open. A
// late write therefore only ever lands in the file it was meant for, at its
// offset (a failed checkpoint's file, which its cleanup removes).
//
// Not bounded: NewWritableFile's open(2) (a writer thread that outlived a
// timed-out open could create the file after its cleanup ran) and every
// other Env operation (forwarded to `base`). Reads are not wrapped.
//
// Thread-safety: thread-safe; each WritableFile is used by one thread at a
// time. Ownership: `base` must outlive the WriteTimeoutEnv; the base Env's
// WritableFiles must not need their Env after it is gone (true of the POSIX
// Env), since an abandoned writer thread may close its file later.
#ifndef CKPTD_COMMON_WRITE_TIMEOUT_ENV_H_
#define CKPTD_COMMON_WRITE_TIMEOUT_ENV_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/env.h"

namespace ckptd {

struct WriteTimeoutEnvOptions {
  // A base-file call (write, fsync, close) unfinished this long fails the
  // file with DEADLINE_EXCEEDED. Must be > 0.
  absl::Duration write_timeout = absl::Minutes(5);
  // Bytes the writer thread copies and writes at a time (its buffer; one per
  // open file). 4 KiB .. 1 GiB.
  size_t buffer_bytes = size_t{1} << 20;
};

struct WriteTimeoutEnvStats {
  uint64_t timeouts = 0;      // files failed with DEADLINE_EXCEEDED, ever
  int64_t stuck_threads = 0;  // abandoned writer threads still in a call
};

class WriteTimeoutEnv final : public EnvWrapper {
 public:
  // INVALID_ARGUMENT for options out of range. `base` is not owned.
  static absl::StatusOr<std::unique_ptr<WriteTimeoutEnv>> Create(
      Env* base, const WriteTimeoutEnvOptions& options = {});

  // Opens the base file (on the caller's thread) and starts its writer
  // thread.
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const WritableFileOptions& options) override;

  const WriteTimeoutEnvOptions& options() const { return options_; }
  WriteTimeoutEnvStats stats() const;

  // Shared with the writer threads, which may outlive the Env.
  struct Counters {
    std::atomic<uint64_t> timeouts{0};
    std::atomic<int64_t> stuck_threads{0};
  };

 private:
  WriteTimeoutEnv(Env* base, const WriteTimeoutEnvOptions& options);

  const WriteTimeoutEnvOptions options_;
  const std::shared_ptr<Counters> counters_;
};

}  // namespace ckptd

#endif  // CKPTD_COMMON_WRITE_TIMEOUT_ENV_H_
