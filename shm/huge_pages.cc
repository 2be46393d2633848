// Copyright 2026 The ckptd Authors.
#include "shm/huge_pages.h"

#include <sys/mman.h>

#include <cerrno>

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack it
#endif

namespace ckptd::shm {
namespace {
constexpr uintptr_t kPage = 4096;
}  // namespace

absl::StatusOr<const char*> MapReadOnlyAligned(int fd, uint64_t offset,
                                               size_t len) {
  // Reserve room for the mapping and one huge page of slack, map into it at
  // the congruent address and give the rest of the room back.
  const size_t span = len + kHugePageBytes;
  void* room = ::mmap(nullptr, span, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (room == MAP_FAILED) return absl::ErrnoToStatus(errno, "mmap");
  const uintptr_t base = reinterpret_cast<uintptr_t>(room);
  const uintptr_t at = base + (offset - base) % kHugePageBytes;
  void* m = ::mmap(reinterpret_cast<void*>(at), len, PROT_READ,
                   MAP_SHARED | MAP_FIXED, fd, static_cast<off_t>(offset));
  if (m == MAP_FAILED) {
    const int err = errno;
    ::munmap(room, span);
    return absl::ErrnoToStatus(err, "mmap");
  }
  const uintptr_t end = (at + len + kPage - 1) & ~(kPage - 1);
  if (at > base) ::munmap(room, at - base);
  if (base + span > end)
    ::munmap(reinterpret_cast<void*>(end), base + span - end);
  return static_cast<const char*>(m);
}

absl::Status CollapseToHugePage(int fd, uint64_t offset,
                                absl::FunctionRef<void(const char*)> read) {
  absl::StatusOr<const char*> m =
      MapReadOnlyAligned(fd, offset, kHugePageBytes);
  if (!m.ok()) return m.status();
  void* page = const_cast<char*>(*m);
  absl::Status status;
  if (::madvise(page, kHugePageBytes, MADV_COLLAPSE) != 0) {
    status = absl::ErrnoToStatus(errno, "madvise(MADV_COLLAPSE)");
  } else {
    read(*m);  // the first user access
  }
  ::munmap(page, kHugePageBytes);
  return status;
}

}  // namespace ckptd::shm
