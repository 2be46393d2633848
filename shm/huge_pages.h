// Copyright 2026 The ckptd Authors.
//
// Huge pages for the shared memory the daemon hands to ranks (the files of
// its memory tier, daemon/tier/memory_tier.h). A process that maps memory
// somebody else filled pays a page fault per page at first touch; on a VM
// with shadow paging each costs 2-10 us, many times the copy of its 4 KiB
// (docs/benchmarks.md, "First touches"). Kept in 2 MiB pages and mapped at
// a matching alignment, such memory faults once per 2 MiB.
#ifndef CKPTD_SHM_HUGE_PAGES_H_
#define CKPTD_SHM_HUGE_PAGES_H_

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ckptd::shm {

inline constexpr uint64_t kHugePageBytes = uint64_t{2} << 20;

// Maps [offset, offset + len) of `fd` (offset: a multiple of 4 KiB, len > 0)
// read-only, MAP_SHARED and not populated, at an address congruent to
// `offset` modulo kHugePageBytes, so that every huge page of the file in the
// range lies on a huge page boundary and is mapped by one fault. Unmap with
// munmap(address, len).
absl::StatusOr<const char*> MapReadOnlyAligned(int fd, uint64_t offset,
                                               size_t len);

// Collapses [offset, offset + kHugePageBytes) of `fd`, a tmpfs file (a
// memfd) whose bytes there are all written, into one transparent huge page:
// madvise(MADV_COLLAPSE), Linux 6.1+, which needs no system setting other
// than shmem_enabled not being "deny"; errors from mmap/madvise (EINVAL on
// an older kernel, EAGAIN/ENOMEM when no huge page can be had). The page is
// then read through a user mapping by `read` (given its kHugePageBytes
// bytes): on a VM with shadow paging that first user access is what maps
// it, and done here the first rank to map the file does not pay it 4 KiB at
// a time.
absl::Status CollapseToHugePage(int fd, uint64_t offset,
                                absl::FunctionRef<void(const char*)> read);

}  // namespace ckptd::shm

#endif  // CKPTD_SHM_HUGE_PAGES_H_
