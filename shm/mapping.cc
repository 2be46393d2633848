// Copyright 2026 The ckptd Authors.
#include "shm/mapping.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tsan_annotations.h"
#include "shm/arena.h"
#include "spdlog/spdlog.h"

namespace ckptd::shm {
namespace {

const char* FileTypeName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

uint64_t PageSize() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

// INVALID_ARGUMENT naming `where` unless claimed_size is positive and fits
// both size_t and off_t.
absl::Status CheckClaimedSize(const std::string& where, uint64_t claimed_size) {
  if (claimed_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": claimed size must be positive"));
  }
  if (claimed_size > std::numeric_limits<size_t>::max() ||
      claimed_size > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": claimed size ", claimed_size, " is too large"));
  }
  return absl::OkStatus();
}

// Opens segment `name` of `dir_fd` read-only without following a symbolic
// link or blocking on a FIFO; each errno a client's bad name causes becomes
// its own code.
absl::StatusOr<int> OpenSegment(int dir_fd, const std::string& name,
                                const std::string& where) {
  const int fd = ::openat(dir_fd, name.c_str(),
                          O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd >= 0) return fd;
  const int err = errno;
  if (err == ELOOP) {
    return absl::PermissionDeniedError(
        absl::StrCat(where, " is a symbolic link; refused"));
  }
  if (err == ENOENT) {
    return absl::NotFoundError(absl::StrCat(where, " does not exist"));
  }
  if (err == EACCES || err == EPERM) {
    return absl::PermissionDeniedError(
        absl::StrCat("open ", where, ": ", strerror(err)));
  }
  if (err == ENXIO || err == ENODEV || err == EISDIR || err == ENOTDIR) {
    // A socket, a device or a directory: the caller's bad name.
    return absl::InvalidArgumentError(
        absl::StrCat(where, " is not a regular file (", strerror(err), ")"));
  }
  return absl::ErrnoToStatus(err, absl::StrCat("open ", where));
}

// Unlinks `name` of `dir_fd`, but only if it still names the file `mapped`
// (a client could have replaced it in between; then the name is not ours).
// OK when the name is gone already or names another file.
absl::Status UnlinkIfStillMapped(int dir_fd, const std::string& name,
                                 const std::string& where,
                                 const struct stat& mapped) {
  struct stat now;
  if (::fstatat(dir_fd, name.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return absl::OkStatus();  // removed by someone
    return absl::ErrnoToStatus(errno, absl::StrCat("stat ", where));
  }
  if (now.st_dev != mapped.st_dev || now.st_ino != mapped.st_ino) {
    return absl::OkStatus();
  }
  if (::unlinkat(dir_fd, name.c_str(), 0) != 0) {
    const int err = errno;
    if (err == ENOENT) return absl::OkStatus();
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(absl::StrCat(
          "unlink ", where, ": ", strerror(err),
          " (the daemon needs write permission on the shm directory, and "
          "ownership of the file if the directory is sticky)"));
    }
    return absl::ErrnoToStatus(err, absl::StrCat("unlink ", where));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Mapping>> Mapping::Open(
    int dir_fd, std::string_view dir_for_messages, std::string_view name,
    uint64_t claimed_size) {
  const std::string n(name);
  const std::string where =
      absl::StrCat("shm segment '", n, "' in ", std::string(dir_for_messages));
  if (!IsValidArenaName(name)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "invalid shm segment name '", n,
        "': must be 1..200 bytes of [A-Za-z0-9._-] without a leading '.'"));
  }
  RETURN_IF_ERROR(CheckClaimedSize(where, claimed_size));
  ASSIGN_OR_RETURN(const int fd, OpenSegment(dir_fd, n, where));
  auto fail = [fd](absl::Status s) {
    ::close(fd);
    return s;
  };

  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return fail(absl::ErrnoToStatus(errno, absl::StrCat("fstat ", where)));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        where, " is ", FileTypeName(st.st_mode), ", not a regular file")));
  }
  if (static_cast<uint64_t>(st.st_size) < claimed_size) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("shm segment '", n, "' is ", st.st_size,
                     " bytes, smaller than the claimed ", claimed_size)));
  }

  void* p = ::mmap(nullptr, static_cast<size_t>(claimed_size), PROT_READ,
                   MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return fail(absl::ErrnoToStatus(
        errno, absl::StrCat("mmap ", claimed_size, " bytes of ", where)));
  }
  // Owned from here: the destructor unmaps and closes (also when the
  // unlink fails: the mapping is dropped and the error returned).
  std::unique_ptr<Mapping> mapping(
      new Mapping(static_cast<const char*>(p), claimed_size, fd, n,
                  static_cast<uint32_t>(st.st_uid)));
  RETURN_IF_ERROR(UnlinkIfStillMapped(dir_fd, n, where, st));
  return mapping;
}

absl::StatusOr<std::unique_ptr<Mapping>> Mapping::FromFd(
    int fd, uint64_t claimed_size, std::string_view label) {
  const std::string where(label);
  auto fail = [fd](absl::Status s) {
    ::close(fd);
    return s;
  };
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": no file descriptor"));
  }
  if (absl::Status s = CheckClaimedSize(where, claimed_size); !s.ok()) {
    return fail(std::move(s));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return fail(absl::ErrnoToStatus(errno, absl::StrCat("fstat ", where)));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(where, " is ", FileTypeName(st.st_mode),
                     ", not a regular file (send a memfd)")));
  }
  struct statfs sf;
  if (::fstatfs(fd, &sf) != 0) {
    return fail(absl::ErrnoToStatus(errno, absl::StrCat("fstatfs ", where)));
  }
  if (sf.f_type != TMPFS_MAGIC) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        where, " is not a memfd or tmpfs file (file system magic 0x",
        absl::Hex(static_cast<uint64_t>(sf.f_type)), "); send a memfd")));
  }
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        where,
        " is not sealed against shrinking: create it with "
        "memfd_create(MFD_ALLOW_SEALING) and add F_SEAL_SHRINK (fcntl "
        "F_ADD_SEALS) before registering")));
  }
  if (static_cast<uint64_t>(st.st_size) < claimed_size) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(where, " is ", st.st_size,
                     " bytes, smaller than the claimed ", claimed_size)));
  }
  void* p = ::mmap(nullptr, static_cast<size_t>(claimed_size), PROT_READ,
                   MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    if (err == EACCES) {
      return fail(absl::PermissionDeniedError(absl::StrCat(
          "mmap ", where, ": the descriptor is not open for reading")));
    }
    return fail(absl::ErrnoToStatus(
        err, absl::StrCat("mmap ", claimed_size, " bytes of ", where)));
  }
  return std::unique_ptr<Mapping>(
      new Mapping(static_cast<const char*>(p), claimed_size, fd, where,
                  static_cast<uint32_t>(st.st_uid)));
}

Mapping::~Mapping() {
  if (char* w = writable_.load()) ::munmap(w, static_cast<size_t>(size_));
  ::munmap(const_cast<char*>(data_), static_cast<size_t>(size_));
  ::close(fd_);
}

absl::StatusOr<absl::Span<const char>> Mapping::Slice(uint64_t offset,
                                                      uint64_t length) const {
  if (!InRange(offset, length)) {
    return absl::OutOfRangeError(absl::StrCat(
        "range [", offset, ", ", offset, "+", length,
        ") is outside shm segment '", name_, "' of ", size_, " bytes"));
  }
  return absl::Span<const char>(data_ + offset, static_cast<size_t>(length));
}

absl::StatusOr<char*> Mapping::MapWritable() const {
  CallOnce(writable_once_, [this] {
    void* p = ::mmap(nullptr, static_cast<size_t>(size_),
                     PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      writable_error_ = absl::FailedPreconditionError(absl::StrCat(
          "arena '", name_,
          "' cannot be written by the daemon (mmap "
          "PROT_WRITE: ",
          std::strerror(err),
          "); restores need an arena passed over the arena socket"));
      return;
    }
    writable_.store(static_cast<char*>(p));
  });
  char* w = writable_.load();
  if (w == nullptr) return writable_error_;
  return w;
}

absl::StatusOr<absl::Span<char>> Mapping::WritableSlice(uint64_t offset,
                                                        uint64_t length) const {
  if (!InRange(offset, length)) {
    return absl::OutOfRangeError(absl::StrCat(
        "range [", offset, ", ", offset, "+", length,
        ") is outside shm segment '", name_, "' of ", size_, " bytes"));
  }
  absl::StatusOr<char*> base = MapWritable();
  if (!base.ok()) return base.status();
  return absl::Span<char>(*base + offset, static_cast<size_t>(length));
}

void Mapping::DropPages(uint64_t offset, uint64_t length) const {
  if (!InRange(offset, length)) {
    spdlog::error(
        "DropPages: range [{}, {}+{}) is outside shm segment '{}' of {} bytes",
        offset, offset, length, name_, size_);
    return;
  }
  const uint64_t page = PageSize();
  const uint64_t begin = (offset + page - 1) / page * page;
  const uint64_t end_byte = offset + length;
  // The mapping's last page belongs to no other range: drop it whole.
  const uint64_t end = end_byte == size_ ? (end_byte + page - 1) / page * page
                                         : end_byte / page * page;
  if (end <= begin) return;
  ::madvise(const_cast<char*>(data_) + begin, static_cast<size_t>(end - begin),
            MADV_DONTNEED);
  // writable_ is set once and never changes; a racing first WritableSlice
  // only means its fresh mapping has no pages to drop yet.
  if (char* w = writable_.load()) {
    ::madvise(w + begin, static_cast<size_t>(end - begin), MADV_DONTNEED);
  }
}

}  // namespace ckptd::shm
