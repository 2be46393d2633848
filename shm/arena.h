// Copyright 2026 The ckptd Authors.
//
// The client side of a shared-memory arena: a file the trainer creates in the
// daemon's shm directory (a tmpfs), maps read-write and fills with tensor
// bytes. The daemon maps the same file read-only (shm/mapping.h) and unlinks
// its name on RegisterArena, so the memory goes away when both processes
// have unmapped it, whoever dies first.
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

// A file created in `dir`, sized and mapped MAP_SHARED read-write.
//
// Ownership: the Arena owns the mapping and, until someone unlinks it, the
// file name. Thread-safety: the object is immutable after Create; writing
// into data() from several threads is the caller's business (disjoint
// ranges are fine).
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

  // munmap; unlinks the name if it is still present (the daemon normally
  // unlinks it on registration, so ENOENT is expected and ignored).
  ~Arena();

  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // `size()` writable bytes, page-aligned, valid for the Arena's lifetime.
  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  // The file name inside `dir` (what RegisterArena takes).
  const std::string& name() const { return name_; }
  // dir + "/" + name.
  const std::string& path() const { return path_; }

 private:
  Arena(char* data, uint64_t size, std::string name, std::string path)
      : data_(data),
        size_(size),
        name_(std::move(name)),
        path_(std::move(path)) {}

  char* const data_;
  const uint64_t size_;
  const std::string name_;
  const std::string path_;
};

}  // namespace ckptd::shm

#endif  // CKPTD_SHM_ARENA_H_
