// Copyright 2026 The ckptd Authors.
//
// Env: the small semantic storage interface every ckptd component writes and
// reads checkpoints through (leveldb's Env, reduced to what a checkpoint
// needs). Implementations: POSIX (Env::Default()); UringEnv (uring_env.h,
// the daemon's io_uring data-file writer); WriteTimeoutEnv
// (write_timeout_env.h: writes that hang give up); FaultInjectionEnv
// (fault_injection_env.h: injects ENOSPC/EIO and simulates a crash that
// loses everything not yet fsynced). tests/common/env_conformance_test.cc runs
// one suite against every one of them: what it checks is the contract.
//
// Thread-safety: Env implementations are thread-safe. WritableFile and
// RandomAccessFile objects are not shared between threads unless stated.
#ifndef CKPTD_COMMON_ENV_H_
#define CKPTD_COMMON_ENV_H_

#include <sys/uio.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckptd {

// A file opened for sequential writing (created or truncated). Errors name
// the path (and the offset where there is one). After an error the file
// returns that error from every later call; Close still releases the file.
// A writer may report an error of earlier appended bytes only at a later
// call, but by Close at the latest. Calls after Close are
// FAILED_PRECONDITION (or the earlier error); a second Close returns what
// the first did.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends all bytes of `data` (short writes are retried internally).
  virtual absl::Status Append(std::string_view data) = 0;
  // Appends the concatenation of `parts` (one gathered write where possible).
  virtual absl::Status AppendV(absl::Span<const std::string_view> parts);
  // Makes every byte appended so far durable (fdatasync/fsync).
  virtual absl::Status Sync() = 0;
  // Closes the file. Called by the destructor if not called before, with the
  // status dropped; call it explicitly to see close errors.
  virtual absl::Status Close() = 0;
  // Bytes appended so far.
  virtual uint64_t Size() const = 0;
  virtual const std::string& path() const = 0;
};

// A file opened for positional reads. Thread-safe (pread).
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads exactly n bytes at `offset` into `scratch`; an error (OUT_OF_RANGE)
  // names the file and offset if the file ends first.
  virtual absl::Status ReadExact(uint64_t offset, size_t n,
                                 char* scratch) const = 0;
  virtual uint64_t Size() const = 0;
  virtual const std::string& path() const = 0;

  // Direct reads: bytes read once, not kept in the page cache (O_DIRECT),
  // for a reader that hands them on itself (the daemon's restore).
  // DirectAlignment() is what ReadDirect needs `offset`, `n` and `dst` to
  // be multiples of (a power of two, at most 4096), or 0 where the file
  // cannot be read so (the default; file systems without O_DIRECT).
  virtual uint64_t DirectAlignment() const { return 0; }
  // Reads exactly n bytes at `offset` into `dst`, bypassing the page cache.
  // INVALID_ARGUMENT for a range or address not aligned to
  // DirectAlignment() (UNIMPLEMENTED where that is 0), OUT_OF_RANGE for
  // one past the end of the file; other errors name the file and offset.
  virtual absl::Status ReadDirect(uint64_t offset, size_t n, char* dst) const;

  // The CRC-32 (common/crc32.h) of [offset, offset + n), errors as for
  // ReadExact. The default reads the range in 1 MiB blocks; a file that
  // keeps CRCs of its parts (the daemon's memory tier) combines them and
  // reads only what they do not cover.
  virtual absl::StatusOr<uint32_t> Crc32(uint64_t offset, uint64_t n) const;
};

// A RandomAccessFile over bytes in memory (tests, fuzzers, payloads already
// read). The string is owned; reads past the end are OUT_OF_RANGE.
class InMemoryFile : public RandomAccessFile {
 public:
  explicit InMemoryFile(std::string data, std::string path = "<memory>")
      : data_(std::move(data)), path_(std::move(path)) {}
  absl::Status ReadExact(uint64_t offset, size_t n,
                         char* scratch) const override;
  uint64_t Size() const override { return data_.size(); }
  const std::string& path() const override { return path_; }
  const std::string& data() const { return data_; }

 private:
  const std::string data_;
  const std::string path_;
};

struct WritableFileOptions {
  // Fail with ALREADY_EXISTS instead of truncating an existing file.
  bool exclusive = false;
};

class Env {
 public:
  virtual ~Env() = default;

  // The process-wide POSIX Env. Never deleted.
  static Env* Default();

  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const WritableFileOptions& options = {}) = 0;
  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) = 0;

  // Creates `dir` and any missing parents (mkdir -p).
  virtual absl::Status CreateDirs(const std::string& dir) = 0;
  // Atomically renames `from` to `to`, replacing `to`.
  virtual absl::Status RenameFile(const std::string& from,
                                  const std::string& to) = 0;
  // fsyncs the directory so that entries created/renamed in it are durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Removes an empty directory.
  virtual absl::Status RemoveDir(const std::string& dir) = 0;
  // Names (not paths) of the entries of `dir`, excluding "." and "..".
  virtual absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) = 0;
  virtual absl::StatusOr<uint64_t> GetFileSize(const std::string& path) = 0;
  // OK if it exists, NOT_FOUND if not, another error otherwise.
  virtual absl::Status FileExists(const std::string& path) = 0;
  // The canonical absolute path of the existing `path` (realpath(3):
  // symlinks, ".", ".." and repeated slashes resolved). NOT_FOUND if a
  // component does not exist; other errors as ErrnoToEnvStatus.
  virtual absl::StatusOr<std::string> RealPath(const std::string& path) = 0;
};

// An Env that forwards every call to another (leveldb's EnvWrapper): derive
// from it and override only the operations that differ. `base` must outlive
// the wrapper.
class EnvWrapper : public Env {
 public:
  explicit EnvWrapper(Env* base) : base_(base) {}
  Env* base() const { return base_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const WritableFileOptions& options) override {
    return base_->NewWritableFile(path, options);
  }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    return base_->NewRandomAccessFile(path);
  }
  absl::Status CreateDirs(const std::string& dir) override {
    return base_->CreateDirs(dir);
  }
  absl::Status RenameFile(const std::string& from,
                          const std::string& to) override {
    return base_->RenameFile(from, to);
  }
  absl::Status SyncDir(const std::string& dir) override {
    return base_->SyncDir(dir);
  }
  absl::Status RemoveFile(const std::string& path) override {
    return base_->RemoveFile(path);
  }
  absl::Status RemoveDir(const std::string& dir) override {
    return base_->RemoveDir(dir);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override {
    return base_->ListDir(dir);
  }
  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    return base_->GetFileSize(path);
  }
  absl::Status FileExists(const std::string& path) override {
    return base_->FileExists(path);
  }
  absl::StatusOr<std::string> RealPath(const std::string& path) override {
    return base_->RealPath(path);
  }

 private:
  Env* const base_;
};

// The one errno → Status mapping of every Env, applied once where a system
// call fails: absl::ErrnoToStatus (ENOENT → NOT_FOUND, EEXIST →
// ALREADY_EXISTS, EACCES/EPERM/EROFS → PERMISSION_DENIED, ENOSPC/EDQUOT →
// RESOURCE_EXHAUSTED, ENOTDIR/EISDIR/ENOTEMPTY → FAILED_PRECONDITION,
// ENAMETOOLONG/EINVAL → INVALID_ARGUMENT, EIO → UNKNOWN, ...), except ELOOP
// → INVALID_ARGUMENT (a symlink loop is a bad path, not a storage failure;
// absl says UNKNOWN, like EIO). The message is "<what>: <strerror>", where
// `what` names the operation and the path ("unlink /d/__0_0.distcp").
absl::Status ErrnoToEnvStatus(int err, std::string_view what);

// pread(2) of [offset, offset + n) of `fd` into `dst`, retried on EINTR and
// short reads. `done` is the bytes read: n, or fewer where the file ended
// first (error 0) or a read failed (`error`, its errno).
struct PreadResult {
  size_t done = 0;
  int error = 0;
};
PreadResult PreadFull(int fd, uint64_t offset, size_t n, char* dst);

// Reads a whole file (bounded by max_bytes; larger files give
// RESOURCE_EXHAUSTED).
absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path,
                                             uint64_t max_bytes);

// Writes `data` to `path` durably and atomically:
//   1. write path + ".tmp", 2. fsync it, 3. rename over `path`,
//   4. fsync the parent directory.
absl::Status WriteFileAtomic(Env* env, const std::string& path,
                             std::string_view data);

// Creates `dir` and its missing parents durably: each directory created is
// made durable by a SyncDir of its parent (a power cut after this returns
// cannot lose it). Sets *created (if given) to whether `dir` itself was
// created.
absl::Status CreateDirsDurably(Env* env, const std::string& dir,
                               bool* created = nullptr);

// `path` as an operator knows it, for log lines: a path anchored to a
// directory descriptor ("/proc/self/fd/N/rest", as the daemon uses them)
// becomes the directory's current path + "/rest"; other paths are returned
// as they are (so is this one if the descriptor is gone).
std::string DisplayPath(const std::string& path);

// Joins path components with exactly one '/'.
std::string JoinPath(std::string_view a, std::string_view b);
// The directory part of a path ("." if none).
std::string DirName(std::string_view path);
// The step number a checkpoint directory's name ends with ("step_1200",
// "/ck/run/1200": 1200); nullopt without trailing digits or with more
// than 18 of them.
std::optional<int64_t> StepOf(std::string_view dir);

}  // namespace ckptd

#endif  // CKPTD_COMMON_ENV_H_
