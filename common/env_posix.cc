// Copyright 2026 The ckptd Authors.
//
// POSIX implementation of Env.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/call_once.h"
#include "common/crc32.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "fmt/format.h"

namespace ckptd {
namespace {

absl::Status PosixError(std::string_view op, const std::string& path, int err) {
  return ErrnoToEnvStatus(err, fmt::format("{} {}", op, path));
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd)
      : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) (void)Close();
  }

  absl::Status Append(std::string_view data) override {
    std::string_view one[1] = {data};
    return AppendV(one);
  }

  absl::Status AppendV(absl::Span<const std::string_view> parts) override {
    if (fd_ < 0) return Closed("append to");
    RETURN_IF_ERROR(error_);
    // writev in batches of IOV_MAX; short writes advance through the iovecs.
    std::vector<iovec> iov;
    iov.reserve(std::min<size_t>(parts.size(), IOV_MAX));
    size_t i = 0;
    while (i < parts.size()) {
      iov.clear();
      for (; i < parts.size() && iov.size() < IOV_MAX; ++i) {
        if (parts[i].empty()) continue;
        iov.push_back({const_cast<char*>(parts[i].data()), parts[i].size()});
      }
      size_t first = 0;
      while (first < iov.size()) {
        ssize_t n = ::writev(fd_, iov.data() + first,
                             static_cast<int>(iov.size() - first));
        if (n < 0) {
          if (errno == EINTR) continue;
          error_ = ErrnoToEnvStatus(
              errno, fmt::format("write {} at offset {}", path_, size_));
          return error_;
        }
        size_ += static_cast<uint64_t>(n);
        size_t left = static_cast<size_t>(n);
        while (first < iov.size() && left >= iov[first].iov_len) {
          left -= iov[first].iov_len;
          ++first;
        }
        if (left > 0) {
          iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + left;
          iov[first].iov_len -= left;
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fd_ < 0) return Closed("sync of");
    RETURN_IF_ERROR(error_);
    if (::fdatasync(fd_) != 0) error_ = PosixError("fsync", path_, errno);
    return error_;
  }

  absl::Status Close() override {
    if (fd_ < 0) return error_;
    int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0 && error_.ok())
      error_ = PosixError("close", path_, errno);
    return error_;
  }

  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  absl::Status Closed(std::string_view what) const {
    if (!error_.ok()) return error_;
    return absl::FailedPreconditionError(
        fmt::format("{} closed file {}", what, path_));
  }

  const std::string path_;
  int fd_;
  uint64_t size_ = 0;
  absl::Status error_;  // the first error; returned by every later call
};

// The alignment O_DIRECT reads of `fd` need (statx's STATX_DIOALIGN where
// the kernel reports it, else the page size, which every file system that
// allows O_DIRECT accepts), or 0 if it is larger than a page.
uint64_t DirectIoAlignment(int fd) {
  uint64_t align = 4096;
#ifdef STATX_DIOALIGN
  struct statx stx;
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
      (stx.stx_mask & STATX_DIOALIGN) != 0) {
    if (stx.stx_dio_offset_align == 0) return 0;  // no O_DIRECT here
    align = std::max<uint64_t>(
        {stx.stx_dio_offset_align, stx.stx_dio_mem_align, 512});
  }
#endif
  return align <= 4096 && (align & (align - 1)) == 0 ? align : 0;
}

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd, uint64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}
  ~PosixRandomAccessFile() override {
    ::close(fd_);
    if (direct_fd_ >= 0) ::close(direct_fd_);
  }

  uint64_t DirectAlignment() const override {
    absl::call_once(direct_once_, [this] { OpenDirect(); });
    return direct_align_;
  }

  absl::Status ReadDirect(uint64_t offset, size_t n, char* dst) const override {
    const uint64_t a = DirectAlignment();
    if (a == 0) return RandomAccessFile::ReadDirect(offset, n, dst);
    if (offset % a != 0 || n % a != 0 ||
        reinterpret_cast<uintptr_t>(dst) % a != 0) {
      return absl::InvalidArgumentError(fmt::format(
          "direct read {}: range [{}, +{}) into {} is not aligned to {} bytes",
          path_, offset, n, static_cast<const void*>(dst), a));
    }
    return PreadAll(direct_fd_, offset, n, dst);
  }

  absl::Status ReadExact(uint64_t offset, size_t n,
                         char* scratch) const override {
    return PreadAll(fd_, offset, n, scratch);
  }
  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  absl::Status PreadAll(int fd, uint64_t offset, size_t n,
                        char* scratch) const {
    if (offset > size_ || n > size_ - offset) {
      return absl::OutOfRangeError(fmt::format(
          "read {}: range [{}, +{}) is past the end of the file (size {})",
          path_, offset, n, size_));
    }
    const PreadResult r = PreadFull(fd, offset, n, scratch);
    if (r.error != 0) {
      return PosixError(fmt::format("read at offset {}", offset + r.done),
                        path_, r.error);
    }
    if (r.done < n) {
      return absl::OutOfRangeError(
          fmt::format("read {}: unexpected end of file at offset {}", path_,
                      offset + r.done));
    }
    return absl::OkStatus();
  }

  // A second descriptor of the same file (reopened through /proc/self/fd,
  // so never another file that took the path since), with O_DIRECT; none
  // where the file system refuses it.
  void OpenDirect() const {
    const std::string self = fmt::format("/proc/self/fd/{}", fd_);
    const int fd = ::open(self.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0) return;
    const uint64_t align = DirectIoAlignment(fd);
    if (align == 0) {
      ::close(fd);
      return;
    }
    direct_fd_ = fd;
    direct_align_ = align;
  }

  const std::string path_;
  const int fd_;
  const uint64_t size_;
  mutable absl::once_flag direct_once_;
  mutable int direct_fd_ = -1;         // set once, under direct_once_
  mutable uint64_t direct_align_ = 0;  // likewise
};

class PosixEnv final : public Env {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path, const WritableFileOptions& options) override {
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC;
    flags |= options.exclusive ? O_EXCL : O_TRUNC;
    int fd = ::open(path.c_str(), flags, 0644);
    if (fd < 0) return PosixError("open for write", path, errno);
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError("open", path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return PosixError("stat", path, err);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      return absl::InvalidArgumentError(
          fmt::format("{} is not a regular file", path));
    }
    return std::make_unique<PosixRandomAccessFile>(path, fd, st.st_size);
  }

  absl::Status CreateDirs(const std::string& dir) override {
    if (dir.empty()) return absl::InvalidArgumentError("empty directory path");
    std::string prefix;
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      prefix = dir.substr(0, pos);
      if (prefix.empty()) continue;
      if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
        return PosixError("mkdir", prefix, errno);
      }
    }
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) return PosixError("stat", dir, errno);
    if (!S_ISDIR(st.st_mode)) {
      return absl::FailedPreconditionError(dir +
                                           " exists and is not a directory");
    }
    return absl::OkStatus();
  }

  absl::Status RenameFile(const std::string& from,
                          const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError("rename " + from + " to", to, errno);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDir(const std::string& dir) override {
    int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return PosixError("open directory", dir, errno);
    absl::Status s;
    if (::fsync(fd) != 0) s = PosixError("fsync directory", dir, errno);
    ::close(fd);
    return s;
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError("unlink", path, errno);
    return absl::OkStatus();
  }

  absl::Status RemoveDir(const std::string& dir) override {
    if (::rmdir(dir.c_str()) != 0) return PosixError("rmdir", dir, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError("opendir", dir, errno);
    std::vector<std::string> names;
    errno = 0;
    while (struct dirent* e = ::readdir(d)) {
      std::string_view name(e->d_name);
      if (name == "." || name == "..") continue;
      names.emplace_back(name);
    }
    int err = errno;
    ::closedir(d);
    if (err != 0) return PosixError("readdir", dir, err);
    return names;
  }

  absl::StatusOr<uint64_t> GetFileSize(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError("stat", path, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  absl::Status FileExists(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) == 0) return absl::OkStatus();
    return PosixError("stat", path, errno);
  }

  absl::StatusOr<std::string> RealPath(const std::string& path) override {
    if (path.empty())
      return absl::InvalidArgumentError("realpath of an empty path");
    char* resolved = ::realpath(path.c_str(), nullptr);
    if (resolved == nullptr) return PosixError("realpath", path, errno);
    std::string out(resolved);
    ::free(resolved);
    return out;
  }
};

}  // namespace

absl::Status InMemoryFile::ReadExact(uint64_t offset, size_t n,
                                     char* scratch) const {
  if (offset > data_.size() || n > data_.size() - offset) {
    return absl::OutOfRangeError(
        fmt::format("read {}: range [{}, +{}) is past the end ({} bytes)",
                    path_, offset, n, data_.size()));
  }
  if (n > 0) std::memcpy(scratch, data_.data() + offset, n);
  return absl::OkStatus();
}

absl::Status RandomAccessFile::ReadDirect(uint64_t offset, size_t n,
                                          char* dst) const {
  (void)dst;
  return absl::UnimplementedError(
      fmt::format("direct read {} [{}, +{}): this file cannot be read "
                  "without the page cache",
                  path(), offset, n));
}

PreadResult PreadFull(int fd, uint64_t offset, size_t n, char* dst) {
  PreadResult r;
  while (r.done < n) {
    const ssize_t got = ::pread(fd, dst + r.done, n - r.done,
                                static_cast<off_t>(offset + r.done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      r.error = errno;
      break;
    }
    if (got == 0) break;  // the end of the file
    r.done += static_cast<size_t>(got);
  }
  return r;
}

absl::StatusOr<uint32_t> RandomAccessFile::Crc32(uint64_t offset,
                                                 uint64_t n) const {
  constexpr uint64_t kBlock = uint64_t{1} << 20;
  std::unique_ptr<char[]> buf(new char[std::min(n, kBlock)]);
  uint32_t crc = 0;
  for (uint64_t done = 0; done < n;) {
    const size_t len = std::min(n - done, kBlock);
    RETURN_IF_ERROR(ReadExact(offset + done, len, buf.get()));
    crc = ckptd::Crc32(crc, buf.get(), len);
    done += len;
  }
  return crc;
}

absl::Status WritableFile::AppendV(absl::Span<const std::string_view> parts) {
  for (std::string_view p : parts) RETURN_IF_ERROR(Append(p));
  return absl::OkStatus();
}

absl::Status ErrnoToEnvStatus(int err, std::string_view what) {
  if (err == ELOOP) {
    return absl::InvalidArgumentError(
        fmt::format("{}: {}", what, std::strerror(err)));
  }
  return absl::ErrnoToStatus(err, absl::string_view(what.data(), what.size()));
}

Env* Env::Default() {
  static Env* env = new PosixEnv();
  return env;
}

absl::StatusOr<std::string> ReadFileToString(Env* env, const std::string& path,
                                             uint64_t max_bytes) {
  ASSIGN_OR_RETURN(auto file, env->NewRandomAccessFile(path));
  if (file->Size() > max_bytes) {
    return absl::ResourceExhaustedError(
        fmt::format("{} is {} bytes, more than the limit of {}", path,
                    file->Size(), max_bytes));
  }
  std::string data(file->Size(), '\0');
  RETURN_IF_ERROR(file->ReadExact(0, data.size(), data.data()));
  return data;
}

absl::Status WriteFileAtomic(Env* env, const std::string& path,
                             std::string_view data) {
  const std::string tmp = path + ".tmp";
  // 1. Write the temporary file.
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(tmp));
  absl::Status s = file->Append(data);
  // 2. Make its contents durable.
  if (s.ok()) s = file->Sync();
  if (s.ok()) s = file->Close();
  if (!s.ok()) {
    (void)env->RemoveFile(tmp);
    return s;
  }
  // 3. Atomically publish it under its final name.
  s = env->RenameFile(tmp, path);
  if (!s.ok()) {
    (void)env->RemoveFile(tmp);
    return s;
  }
  // 4. Make the rename durable.
  return env->SyncDir(DirName(path));
}

absl::Status CreateDirsDurably(Env* env, const std::string& dir,
                               bool* created) {
  // The missing tail of the path, deepest first.
  std::vector<std::string> missing;
  for (std::string p = dir; !p.empty() && p != "/" && p != ".";) {
    absl::Status e = env->FileExists(p);
    if (e.ok()) break;
    if (!absl::IsNotFound(e)) return e;
    missing.push_back(p);
    std::string parent = DirName(p);
    if (parent == p) break;
    p = std::move(parent);
  }
  if (created != nullptr) *created = !missing.empty();
  if (missing.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(env->CreateDirs(dir));
  // Parents first: each new entry durable in a directory that is durable.
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    RETURN_IF_ERROR(env->SyncDir(DirName(*it)));
  }
  return absl::OkStatus();
}

std::string DisplayPath(const std::string& path) {
  constexpr std::string_view kFd = "/proc/self/fd/";
  if (!std::string_view(path).starts_with(kFd)) return path;
  const size_t slash = path.find('/', kFd.size());
  const std::string link = path.substr(0, slash);
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return path;
  return std::string(buf, static_cast<size_t>(n)) +
         (slash == std::string::npos ? "" : path.substr(slash));
}

std::string JoinPath(std::string_view a, std::string_view b) {
  if (a.empty()) return std::string(b);
  if (b.empty()) return std::string(a);
  std::string out(a);
  while (!out.empty() && out.back() == '/' && out.size() > 1) out.pop_back();
  while (!b.empty() && b.front() == '/') b.remove_prefix(1);
  if (out.back() != '/') out += '/';
  out += b;
  return out;
}

std::string DirName(std::string_view path) {
  size_t pos = path.rfind('/');
  if (pos == std::string_view::npos) return ".";
  if (pos == 0) return "/";
  return std::string(path.substr(0, pos));
}

std::optional<int64_t> StepOf(std::string_view dir) {
  const size_t slash = dir.rfind('/');
  const std::string_view name =
      slash == std::string_view::npos ? dir : dir.substr(slash + 1);
  size_t i = name.size();
  while (i > 0 && name[i - 1] >= '0' && name[i - 1] <= '9') --i;
  if (i == name.size() || name.size() - i > 18) return std::nullopt;
  int64_t step = 0;
  for (size_t k = i; k < name.size(); ++k) step = step * 10 + (name[k] - '0');
  return step;
}

}  // namespace ckptd
