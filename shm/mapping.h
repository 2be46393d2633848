// Copyright 2026 The ckptd Authors.
//
// The daemon side of a shared-memory arena, mapped read-only: a sealed memfd
// the client passed over the arena socket (FromFd, the normal way), or a
// legacy file opened by name in the configured shm directory and unlinked
// (Open). Every byte range the client names is bounds-checked here before
// the daemon touches it.
#ifndef CKPTD_SHM_MAPPING_H_
#define CKPTD_SHM_MAPPING_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/call_once.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace ckptd::shm {

// A read-only MAP_SHARED mapping of an arena file (plus, for restores, a
// writable one made on demand: WritableSlice).
//
// Ownership: owns the mapping and the open file descriptor. Thread-safety:
// immutable after Open; all methods may be called concurrently.
class Mapping {
 public:
  // Opens `name` relative to the directory `dir_fd` (openat with O_RDONLY |
  // O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, so a FIFO cannot block and a
  // symbolic link is refused), checks with fstat that it is a regular file
  // of at least `claimed_size` bytes, maps `claimed_size` bytes PROT_READ
  // MAP_SHARED and finally unlinks the name (unlinkat), so nothing is left
  // in the directory. `dir_for_messages` is only used in error messages.
  // `dir_fd` is not retained.
  //
  // Errors (all name the segment and the directory):
  //   INVALID_ARGUMENT   name not valid (IsValidArenaName), claimed_size 0 or
  //                      too large for this process, not a regular file
  //                      (directory, FIFO, device, socket), or "shm segment
  //                      'x' is 4096 bytes, smaller than the claimed 1048576"
  //   PERMISSION_DENIED  a symbolic link (ELOOP), or EACCES/EPERM on open or
  //                      unlink
  //   NOT_FOUND          no such file
  //   other              from errno
  // If unlinking fails (other than ENOENT: someone removed it already) the
  // mapping is dropped and the error returned.
  static absl::StatusOr<std::unique_ptr<Mapping>> Open(
      int dir_fd, std::string_view dir_for_messages, std::string_view name,
      uint64_t claimed_size);

  // Maps an arena a client passed as a file descriptor. Takes `fd` (closed on
  // failure as well). The mapping must be safe to read whatever the client
  // does with its own copy of the descriptor afterwards, so the file must be
  // a regular file on tmpfs (a memfd; hugetlbfs and disk files are refused:
  // their pages can fail to appear on a fault), sealed against shrinking
  // (F_SEAL_SHRINK: the size can never go down again, so no mapped page can
  // vanish and no read can SIGBUS), and at least `claimed_size` bytes long.
  // `label` names the arena in messages ("arena of pid 12 uid 1000").
  //
  // Errors (all name the label):
  //   INVALID_ARGUMENT   claimed_size 0 or too large; not a regular file; not
  //                      on tmpfs; not sealed with F_SEAL_SHRINK ("create it
  //                      with memfd_create(MFD_ALLOW_SEALING) and add
  //                      F_SEAL_SHRINK"); smaller than claimed_size
  //   PERMISSION_DENIED  the descriptor is not open for reading (mmap EACCES)
  //   other              from errno
  static absl::StatusOr<std::unique_ptr<Mapping>> FromFd(
      int fd, uint64_t claimed_size, std::string_view label);

  // munmap + close.
  ~Mapping();

  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // The claimed size: the number of mapped bytes.
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // Owner (st_uid) of the file when it was opened (a memfd: its creator's
  // uid). Informational: the registrant's identity is the arena socket's
  // SO_PEERCRED.
  uint32_t owner_uid() const { return owner_uid_; }

  // Bytes [offset, offset + length) of the mapping. OUT_OF_RANGE "range
  // [offset, offset+length) is outside shm segment 'x' of N bytes" when the
  // range does not lie inside the mapping (uint64 overflow included). A
  // zero-length range at offset <= size() is valid (an empty span).
  // The span is valid for the Mapping's lifetime; the bytes may still be
  // changed by the client that owns the arena.
  absl::StatusOr<absl::Span<const char>> Slice(uint64_t offset,
                                               uint64_t length) const;

  // Bytes [offset, offset + length) for the daemon to write into (a
  // restore, daemon/restore/): the first call maps the arena a second time,
  // PROT_READ | PROT_WRITE MAP_SHARED, from its descriptor. The seals that
  // make reading safe (FromFd) make writing safe too. FAILED_PRECONDITION
  // when the descriptor cannot be mapped writable (a legacy named arena,
  // opened read-only; a memfd sealed against writes); OUT_OF_RANGE as
  // Slice. Thread-safe.
  absl::StatusOr<absl::Span<char>> WritableSlice(uint64_t offset,
                                                 uint64_t length) const;

  // Drops this process's page mappings of the range (madvise MADV_DONTNEED
  // on the page-aligned interior of the range, plus the trailing partial
  // page when the range ends at the end of the mapping) so the daemon's RSS
  // does not keep bytes it has already written; the data stays in the file
  // and a later read faults it back in. madvise errors are ignored.
  // REQUIRES: the range is one Slice() accepts. An invalid range is a caller
  // bug: it is logged and ignored.
  void DropPages(uint64_t offset, uint64_t length) const;

 private:
  Mapping(const char* data, uint64_t size, int fd, std::string name,
          uint32_t owner_uid)
      : data_(data),
        size_(size),
        fd_(fd),
        name_(std::move(name)),
        owner_uid_(owner_uid) {}

  bool InRange(uint64_t offset, uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }

  // The writable mapping of WritableSlice, made on its first call.
  absl::StatusOr<char*> MapWritable() const;

  const char* const data_;
  const uint64_t size_;
  const int fd_;
  const std::string name_;
  const uint32_t owner_uid_;
  mutable absl::once_flag writable_once_;
  mutable std::atomic<char*> writable_{nullptr};  // set once, in call_once
  mutable absl::Status writable_error_;
};

}  // namespace ckptd::shm

#endif  // CKPTD_SHM_MAPPING_H_
