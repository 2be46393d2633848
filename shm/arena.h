// Copyright 2026 The ckptd Authors.
//
// The client side of a shared-memory arena: memory the trainer maps
// read-write and fills with tensor bytes, and the daemon maps read-only
// (shm/mapping.h).
//
// The normal arena is a memfd (CreateMemfd) sealed against shrinking and
// growing, passed to the daemon as a file descriptor over the arena socket
// (shm/fd_passing.h): the daemon can rely on every mapped byte staying
// there (no SIGBUS whatever the client does) and maps only what the client
// itself handed over. The memory goes away when both processes have
// unmapped it and closed their fds, whoever dies first.
//
// The legacy arena (Create) is a named file in the daemon's shm directory
// that the daemon opens by name; it is kept for in-process users (tests,
// benchmarks) and for daemons older than the arena socket. It is not
// sealed: whoever can ftruncate it can make the mapper fault.
#ifndef CKPTD_SHM_ARENA_H_
#define CKPTD_SHM_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ckptd::shm {

// Longest arena file name (RegisterArenaRequest.name).
inline constexpr size_t kMaxArenaNameBytes = 200;

// True for a valid arena file name: 1..200 bytes of [A-Za-z0-9._-], not "."
// or "..", no leading '.'. Such a name has no '/' and cannot escape the shm
// directory.
bool IsValidArenaName(std::string_view name);

// Memory sized and mapped MAP_SHARED read-write: a sealed memfd, or a legacy
// file created in a directory.
//
// Ownership: the Arena owns the mapping, the memfd's descriptor and, until
// someone unlinks it, a legacy arena's file name. Thread-safety: the object is
// immutable after Create; writing into data() from several threads is the
// caller's business (disjoint ranges are fine).
class Arena {
 public:
  // Creates "<dir>/<name_prefix>-<pid>-<random hex>" (O_CREAT|O_EXCL|
  // O_NOFOLLOW, mode 0600), allocates `size` bytes with fallocate (so a full
  // tmpfs fails here with RESOURCE_EXHAUSTED rather than as SIGBUS on a
  // later write), maps it read-write MAP_SHARED and pre-faults it
  // (MAP_POPULATE). On failure nothing is left behind.
  //
  // Errors: INVALID_ARGUMENT for size 0 or a prefix that does not make a
  // valid name (IsValidArenaName); RESOURCE_EXHAUSTED for ENOSPC/ENOMEM; the
  // errno's code (with the path) otherwise.
  static absl::StatusOr<std::unique_ptr<Arena>> Create(
      const std::string& dir, uint64_t size,
      std::string_view name_prefix = "arena");

  // memfd_create("<name_prefix>-<pid>", MFD_CLOEXEC | MFD_ALLOW_SEALING),
  // `size` bytes allocated with fallocate (so ENOSPC/ENOMEM fail here as
  // RESOURCE_EXHAUSTED, not as SIGBUS on a later write), then sealed with
  // F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL (the size can never change
  // again, for anyone), mapped read-write MAP_SHARED and pre-faulted. The
  // descriptor stays open (fd()) to be passed to the daemon.
  //
  // Errors: INVALID_ARGUMENT for size 0 or too large, or a prefix longer than
  // 200 bytes; RESOURCE_EXHAUSTED for ENOSPC/ENOMEM/EMFILE; UNIMPLEMENTED if
  // the kernel has no memfd_create or sealing; the errno's code otherwise.
  //
  // `prefault` false: the mapping is not pre-faulted (MAP_POPULATE); the
  // pages are allocated all the same. For memory the caller writes through
  // at once (the daemon's restore group buffers, read into right after):
  // populating a large shared mapping in a busy multi-threaded process was
  // seen to take 0.8 s per 256 MiB where faulting it in took 0.1 s.
  static absl::StatusOr<std::unique_ptr<Arena>> CreateMemfd(
      uint64_t size, std::string_view name_prefix = "arena",
      bool prefault = true);

  // munmap and close; a legacy arena's name is unlinked if it is still
  // present (the daemon normally unlinks it on registration, so ENOENT is
  // expected and ignored).
  ~Arena();

  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `size()` writable bytes, page-aligned, valid for the Arena's lifetime.
  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // Legacy: the file name inside `dir` (what RegisterArena takes). Memfd:
  // the memfd's name (for logs only).
  const std::string& name() const { return name_; }
  // Legacy: dir + "/" + name. Memfd: empty.
  const std::string& path() const { return path_; }
  // Memfd: the sealed memfd's descriptor (O_RDWR, close-on-exec), owned by
  // the Arena; what the arena socket passes. Legacy: -1.
  int fd() const { return fd_; }
  bool is_memfd() const { return fd_ >= 0; }

  // Faults every page of the mapping in now, writable (what MAP_POPULATE
  // does at creation): for an arena made with `prefault` false that is about
  // to be written in a latency-sensitive path. madvise(MADV_POPULATE_WRITE)
  // (Linux 5.14); on an older kernel, a read of each page. No byte changes,
  // so the daemon may be reading the arena meanwhile.
  absl::Status Populate() const;

 private:
  Arena(char* data, uint64_t size, std::string name, std::string path, int fd)
      : data_(data),
        size_(size),
        name_(std::move(name)),
        path_(std::move(path)),
        fd_(fd) {}

  char* const data_;
  const uint64_t size_;
  const std::string name_;
  const std::string path_;
  const int fd_;
};

}  // namespace ckptd::shm

#endif  // CKPTD_SHM_ARENA_H_
