// Copyright 2026 The ckptd Authors.
#include "shm/arena.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace ckptd::shm {

bool IsValidArenaName(std::string_view name) {
  if (name.empty() || name.size() > kMaxArenaNameBytes) return false;
  if (name[0] == '.') return false;  // also rules out "." and ".."
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

namespace {

// Allocates the file's blocks now. tmpfs supports fallocate; a file system
// that does not gets a sparse ftruncate instead.
absl::Status Allocate(int fd, uint64_t size, const std::string& path) {
  int rc;
  do {
    rc = ::fallocate(fd, 0, 0, static_cast<off_t>(size));
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return absl::OkStatus();
  if (errno != EOPNOTSUPP && errno != ENOSYS) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("allocate ", size, " bytes for shm arena ", path));
  }
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("ftruncate shm arena ", path, " to ", size));
  }
  return absl::OkStatus();
}

// An arena size both mmap and the file system take.
absl::Status CheckArenaSize(uint64_t size) {
  if (size == 0) {
    return absl::InvalidArgumentError("shm arena size must be positive");
  }
  if (size > static_cast<uint64_t>(std::numeric_limits<off_t>::max()) ||
      size > std::numeric_limits<size_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shm arena size ", size, " is too large"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Arena>> Arena::Create(
    const std::string& dir, uint64_t size, std::string_view name_prefix) {
  RETURN_IF_ERROR(CheckArenaSize(size));
  absl::BitGen gen;
  int fd = -1;
  std::string name, path;
  for (int attempt = 0;; ++attempt) {
    name = absl::StrFormat("%s-%d-%016x", std::string(name_prefix), ::getpid(),
                           absl::Uniform<uint64_t>(gen));
    if (!IsValidArenaName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shm arena name prefix '", std::string(name_prefix),
          "' does not make a valid file name (1..200 bytes of [A-Za-z0-9._-], "
          "no leading '.')"));
    }
    path = absl::StrCat(dir, dir.empty() || dir.back() == '/' ? "" : "/", name);
    fd = ::open(path.c_str(),
                O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) break;
    if (errno == EEXIST && attempt < 8) continue;  // name clash: new name
    return absl::ErrnoToStatus(errno, absl::StrCat("create shm arena ", path));
  }
  // From here on, failure removes the file again.
  auto fail = [&](absl::Status s) {
    ::close(fd);
    ::unlink(path.c_str());
    return s;
  };
  if (absl::Status s = Allocate(fd, size, path); !s.ok()) return fail(s);
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    return fail(absl::ErrnoToStatus(
        errno, absl::StrCat("mmap ", size, " bytes of shm arena ", path)));
  }
  ::close(fd);  // the mapping keeps the file open
  return std::unique_ptr<Arena>(new Arena(static_cast<char*>(p), size,
                                          std::move(name), std::move(path),
                                          /*fd=*/-1));
}

absl::StatusOr<std::unique_ptr<Arena>> Arena::CreateMemfd(
    uint64_t size, std::string_view name_prefix, bool prefault) {
  RETURN_IF_ERROR(CheckArenaSize(size));
  if (name_prefix.size() > kMaxArenaNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm arena name prefix of ", name_prefix.size(), " bytes is too long"));
  }
  // memfd names are for /proc/PID/fd and logs only (at most 249 bytes).
  std::string name =
      absl::StrFormat("%s-%d", std::string(name_prefix), ::getpid());
  name.resize(std::min<size_t>(name.size(), 240));
  const int fd = ::memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOSYS) {
      return absl::UnimplementedError(
          "memfd_create is not supported by this kernel");
    }
    if (err == EMFILE || err == ENFILE || err == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat("memfd_create for a shm arena: ", strerror(err)));
    }
    return absl::ErrnoToStatus(err, "memfd_create for a shm arena");
  }
  auto fail = [fd](absl::Status s) {
    ::close(fd);
    return s;
  };
  const std::string what = absl::StrCat("memfd shm arena '", name, "'");
  if (absl::Status s = Allocate(fd, size, absl::StrCat("memfd:", name));
      !s.ok()) {
    return fail(s);
  }
  // fallocate may round nothing, but be exact: the size is sealed next.
  if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    return fail(absl::ErrnoToStatus(
        errno, absl::StrCat("ftruncate ", what, " to ", size)));
  }
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) !=
      0) {
    const int err = errno;
    if (err == EINVAL) {
      return fail(absl::UnimplementedError(absl::StrCat(
          "sealing ", what, ": file sealing is not supported by this kernel")));
    }
    return fail(absl::ErrnoToStatus(err, absl::StrCat("seal ", what)));
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE,
                   MAP_SHARED | (prefault ? MAP_POPULATE : 0), fd, 0);
  if (p == MAP_FAILED) {
    return fail(absl::ErrnoToStatus(
        errno, absl::StrCat("mmap ", size, " bytes of ", what)));
  }
  return std::unique_ptr<Arena>(new Arena(static_cast<char*>(p), size,
                                          std::move(name), std::string(), fd));
}

absl::Status Arena::Populate() const {
#ifdef MADV_POPULATE_WRITE
  if (::madvise(data_, static_cast<size_t>(size_), MADV_POPULATE_WRITE) == 0) {
    return absl::OkStatus();
  }
  if (errno != EINVAL) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("pre-faulting ", size_, " bytes of shm arena '",
                            name_, "'"));
  }
#endif
  // A kernel without MADV_POPULATE_WRITE: read one byte of each page.
  const long page = ::sysconf(_SC_PAGESIZE);
  const uint64_t step = page > 0 ? static_cast<uint64_t>(page) : 4096;
  for (uint64_t off = 0; off < size_; off += step) {
    (void)*static_cast<volatile const char*>(data_ + off);
  }
  return absl::OkStatus();
}

Arena::~Arena() {
  ::munmap(data_, static_cast<size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
  // Legacy: normally gone already (the daemon unlinks on RegisterArena).
  if (!path_.empty()) ::unlink(path_.c_str());
}

}  // namespace ckptd::shm
