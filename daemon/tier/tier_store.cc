// Copyright 2026 The ckptd Authors.
#include "daemon/tier/tier_store.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "common/absl_fmt.h"
#include "common/checksummed_record.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

constexpr char kManifest[] = "manifest";
constexpr char kManifestTmp[] = "manifest.tmp";
constexpr char kLock[] = ".lock";
constexpr size_t kMaxManifest = size_t{16} << 20;

absl::Status Errno(int err, const std::string& what) {
  return absl::ErrnoToStatus(err, what);
}

// Writes all of `text` to a new file `name` in `dir_fd`.
absl::Status WriteNew(int dir_fd, const char* name, const std::string& text,
                      const std::string& what) {
  shm::OwnedFd fd(
      ::openat(dir_fd, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0400));
  if (!fd.valid()) return Errno(errno, fmt::format("create {}", what));
  size_t at = 0;
  while (at < text.size()) {
    const ssize_t n = ::write(fd.get(), text.data() + at, text.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Errno(n < 0 ? errno : ENOSPC, fmt::format("write {}", what));
    }
    at += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Field `key` of `j` as a T (std::string, uint64_t or int64_t).
template <typename T>
absl::StatusOr<T> Field(const nlohmann::json& j, const char* key,
                        std::string_view what) {
  auto it = j.find(key);
  bool ok = it != j.end();
  if constexpr (std::is_same_v<T, std::string>) {
    ok = ok && it->is_string();
  } else if constexpr (std::is_unsigned_v<T>) {
    ok = ok && it->is_number_unsigned();
  } else {
    ok = ok && it->is_number_integer();
  }
  if (!ok) {
    return absl::DataLossError(
        fmt::format("{}: field '{}' missing or of the wrong type", what, key));
  }
  return it->get<T>();
}

}  // namespace

std::string EncodeTierManifest(const TierManifest& m) {
  nlohmann::json files = nlohmann::json::array();
  for (const TierManifest::File& f : m.files) {
    files.push_back({{"name", f.name},
                     {"stored", f.stored},
                     {"identity", f.identity},
                     {"size", f.size},
                     {"capacity", f.capacity},
                     {"crc32", f.crc32}});
  }
  const nlohmann::json j = {{"dir", m.dir},
                            {"job", m.job},
                            {"metadata_identity", m.metadata_identity},
                            {"committed_ms", m.committed_ms},
                            {"files", std::move(files)}};
  return WrapChecksummed(j.dump());
}

absl::StatusOr<TierManifest> DecodeTierManifest(std::string_view text,
                                                std::string_view what) {
  ASSIGN_OR_RETURN(std::optional<std::string_view> body,
                   UnwrapChecksummed(text, what));
  if (!body.has_value()) {
    return absl::DataLossError(fmt::format("{}: not a state record", what));
  }
  const nlohmann::json j =
      nlohmann::json::parse(*body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::DataLossError(fmt::format("{}: not a JSON object", what));
  }
  TierManifest m;
  ASSIGN_OR_RETURN(m.dir, Field<std::string>(j, "dir", what));
  ASSIGN_OR_RETURN(m.job, Field<std::string>(j, "job", what));
  ASSIGN_OR_RETURN(m.metadata_identity,
                   Field<std::string>(j, "metadata_identity", what));
  ASSIGN_OR_RETURN(m.committed_ms, Field<int64_t>(j, "committed_ms", what));
  auto files = j.find("files");
  if (files == j.end() || !files->is_array()) {
    return absl::DataLossError(
        fmt::format("{}: 'files' missing or not a list", what));
  }
  for (const nlohmann::json& f : *files) {
    if (!f.is_object()) {
      return absl::DataLossError(
          fmt::format("{}: 'files' holds a non-object", what));
    }
    TierManifest::File out;
    ASSIGN_OR_RETURN(out.name, Field<std::string>(f, "name", what));
    ASSIGN_OR_RETURN(out.stored, Field<std::string>(f, "stored", what));
    ASSIGN_OR_RETURN(out.identity, Field<std::string>(f, "identity", what));
    ASSIGN_OR_RETURN(out.size, Field<uint64_t>(f, "size", what));
    ASSIGN_OR_RETURN(out.capacity, Field<uint64_t>(f, "capacity", what));
    ASSIGN_OR_RETURN(const uint64_t crc, Field<uint64_t>(f, "crc32", what));
    if (crc > 0xffffffffu) {
      return absl::DataLossError(fmt::format("{}: crc32 out of range", what));
    }
    out.crc32 = static_cast<uint32_t>(crc);
    m.files.push_back(std::move(out));
  }
  return m;
}

absl::StatusOr<std::unique_ptr<TierStore>> TierStore::Open(std::string dir) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(
        fmt::format("memory_tier_dir '{}' must be an absolute path", dir));
  }
  // Its parents as they are; the directory itself only for this daemon.
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return Errno(errno, fmt::format("create memory_tier_dir {}", dir));
  }
  shm::OwnedFd dir_fd(
      ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!dir_fd.valid()) {
    return Errno(errno, fmt::format("open memory_tier_dir {}", dir));
  }
  struct statfs fs;
  if (::fstatfs(dir_fd.get(), &fs) != 0) {
    return Errno(errno, fmt::format("statfs memory_tier_dir {}", dir));
  }
  if (static_cast<uint64_t>(fs.f_type) != TMPFS_MAGIC) {
    return absl::FailedPreconditionError(fmt::format(
        "memory_tier_dir {} is not on tmpfs (file system type {:#x}): held "
        "checkpoints there would sit on a disk; use a tmpfs mount such as "
        "/dev/shm (a Kubernetes emptyDir with medium: Memory)",
        dir, static_cast<uint64_t>(fs.f_type)));
  }
  if (::fchmod(dir_fd.get(), 0700) != 0) {
    return Errno(errno, fmt::format("chmod memory_tier_dir {}", dir));
  }
  shm::OwnedFd lock(::openat(dir_fd.get(), kLock,
                             O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock.valid()) {
    return Errno(errno, fmt::format("open {}/{}", dir, kLock));
  }
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return absl::FailedPreconditionError(fmt::format(
          "memory_tier_dir {} is in use by another process (its {} is "
          "locked): give each daemon a directory of its own",
          dir, kLock));
    }
    return Errno(errno, fmt::format("lock {}/{}", dir, kLock));
  }
  return std::unique_ptr<TierStore>(
      new TierStore(std::move(dir), std::move(dir_fd), std::move(lock)));
}

TierStore::~TierStore() = default;  // the lock goes with its fd

absl::StatusOr<shm::OwnedFd> TierStore::NewFile() const {
  shm::OwnedFd fd(
      ::openat(dir_fd_.get(), ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0400));
  if (!fd.valid()) {
    return Errno(errno,
                 fmt::format("create a file in memory_tier_dir {}", dir_));
  }
  return fd;
}

absl::StatusOr<std::string> TierStore::Persist(TierManifest& manifest,
                                               const std::vector<int>& fds) {
  std::string name;
  for (int tries = 0;; ++tries) {
    name = fmt::format("h-{}-{}-{}", manifest.committed_ms, ::getpid(),
                       counter_.fetch_add(1));
    if (::mkdirat(dir_fd_.get(), name.c_str(), 0700) == 0) break;
    if (errno != EEXIST || tries > 100) {
      return Errno(errno, fmt::format("create {}/{}", dir_, name));
    }
  }
  const std::string entry = fmt::format("{}/{}", dir_, name);
  auto fail = [&](absl::Status s) {
    Remove(entry);
    return s;
  };
  shm::OwnedFd entry_fd(::openat(dir_fd_.get(), name.c_str(),
                                 O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!entry_fd.valid()) return fail(Errno(errno, "open " + entry));
  for (size_t i = 0; i < fds.size() && i < manifest.files.size(); ++i) {
    TierManifest::File& f = manifest.files[i];
    f.stored = fmt::format("f{}", i);
    const std::string proc = fmt::format("/proc/self/fd/{}", fds[i]);
    if (::linkat(AT_FDCWD, proc.c_str(), entry_fd.get(), f.stored.c_str(),
                 AT_SYMLINK_FOLLOW) != 0) {
      return fail(Errno(errno, fmt::format("link {}/{} (the bytes of {})",
                                           entry, f.stored, f.name)));
    }
  }
  if (absl::Status s =
          WriteNew(entry_fd.get(), kManifestTmp, EncodeTierManifest(manifest),
                   entry + "/" + kManifestTmp);
      !s.ok()) {
    return fail(s);
  }
  if (::renameat(entry_fd.get(), kManifestTmp, entry_fd.get(), kManifest) !=
      0) {
    return fail(Errno(errno, fmt::format("rename {}/{}", entry, kManifest)));
  }
  return entry;
}

std::vector<TierStore::Entry> TierStore::Scan() const {
  std::vector<Entry> out;
  absl::StatusOr<std::vector<std::string>> names =
      Env::Default()->ListDir(dir_);
  if (!names.ok()) {
    spdlog::error("memory tier: {}", names.status());
    return out;
  }
  for (const std::string& n : *names) {
    if (n == kLock) continue;
    Entry e{fmt::format("{}/{}", dir_, n), absl::UnknownError("")};
    const std::string manifest = e.path + "/" + kManifest;
    absl::StatusOr<std::string> text =
        ReadFileToString(Env::Default(), manifest, kMaxManifest);
    e.manifest = text.ok() ? DecodeTierManifest(*text, manifest)
                           : absl::StatusOr<TierManifest>(text.status());
    out.push_back(std::move(e));
  }
  return out;
}

absl::StatusOr<shm::OwnedFd> TierStore::OpenStored(const std::string& entry,
                                                   const std::string& stored,
                                                   uint64_t* size) const {
  if (stored.empty() || stored.find('/') != std::string::npos ||
      stored[0] == '.') {
    return absl::DataLossError(
        fmt::format("{}: bad stored file name '{}'", entry, stored));
  }
  const std::string path = entry + "/" + stored;
  shm::OwnedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return Errno(errno, "open " + path);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Errno(errno, "stat " + path);
  if (!S_ISREG(st.st_mode)) {
    return absl::DataLossError(fmt::format("{} is not a regular file", path));
  }
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

void TierStore::Remove(const std::string& entry) {
  shm::OwnedFd fd(
      ::open(entry.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) {
    // A stray file where an entry would be.
    if (errno == ENOTDIR && ::unlink(entry.c_str()) == 0) return;
    if (errno != ENOENT) {
      spdlog::warn("memory tier: could not remove {}: {}", entry,
                   Errno(errno, "open"));
    }
    return;
  }
  if (::unlinkat(fd.get(), kManifest, 0) != 0 && errno != ENOENT) {
    spdlog::warn("memory tier: could not remove {}/{}: {}", entry, kManifest,
                 Errno(errno, "unlink"));
    return;
  }
  absl::StatusOr<std::vector<std::string>> names =
      Env::Default()->ListDir(entry);
  if (names.ok()) {
    for (const std::string& n : *names) ::unlinkat(fd.get(), n.c_str(), 0);
  }
  if (::rmdir(entry.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("memory tier: could not remove {}: {}", entry,
                 Errno(errno, "rmdir"));
  }
}

}  // namespace ckptd::daemon
