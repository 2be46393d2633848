// Copyright 2026 The ckptd Authors.
#include "common/fault_injection_env.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "common/status_macros.h"
#include "fmt/format.h"

namespace ckptd {
namespace {

// Largest `to` file a rename backs up for crash recovery (test files only).
constexpr uint64_t kMaxRenameBackup = uint64_t{1} << 30;

std::string_view OpName(FaultOp op) {
  switch (op) {
    case FaultOp::kOpenWrite:
      return "open for write";
    case FaultOp::kAppend:
      return "append";
    case FaultOp::kSync:
      return "sync";
    case FaultOp::kClose:
      return "close";
    case FaultOp::kOpenRead:
      return "open";
    case FaultOp::kRead:
      return "read";
    case FaultOp::kRename:
      return "rename";
    case FaultOp::kSyncDir:
      return "sync dir";
    case FaultOp::kRemove:
      return "remove";
    case FaultOp::kCreateDirs:
      return "create dirs";
    case FaultOp::kRealPath:
      return "realpath";
  }
  return "unknown op";
}

// "/proc/self/fd/N/rest" (a path anchored to a directory fd, as the daemon
// uses them) → the directory's current path + "/rest", so that tracking
// follows real paths; other paths unchanged.
std::string Canonical(const std::string& path) {
  constexpr std::string_view kFd = "/proc/self/fd/";
  if (!std::string_view(path).starts_with(kFd)) return path;
  const size_t slash = path.find('/', kFd.size());
  const std::string link = path.substr(0, slash);
  char buf[4096];
  const ssize_t n = ::readlink(link.c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return path;
  return std::string(buf, n) +
         (slash == std::string::npos ? "" : path.substr(slash));
}

// `dir` without trailing slashes ("/" stays "/"), to compare with DirName().
std::string NormalizeDir(std::string_view dir) {
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  return std::string(dir);
}

// Replaces `path`'s content by `data`, durably, on `env`.
absl::Status WriteAndSync(Env* env, const std::string& path,
                          std::string_view data) {
  ASSIGN_OR_RETURN(auto file, env->NewWritableFile(path, {}));
  RETURN_IF_ERROR(file->Append(data));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

// Shrinks `path` to `size` bytes if it is longer; a missing file is fine.
absl::Status TruncateTo(Env* env, const std::string& path, uint64_t size) {
  absl::StatusOr<uint64_t> current = env->GetFileSize(path);
  if (absl::IsNotFound(current.status())) return absl::OkStatus();
  RETURN_IF_ERROR(current.status());
  if (*current <= size) return absl::OkStatus();
  std::string prefix(size, '\0');
  {
    ASSIGN_OR_RETURN(auto file, env->NewRandomAccessFile(path));
    RETURN_IF_ERROR(file->ReadExact(0, prefix.size(), prefix.data()));
  }
  return WriteAndSync(env, path, prefix);
}

class FaultWritableFile final : public WritableFile {
 public:
  FaultWritableFile(FaultInjectionEnv* env, std::unique_ptr<WritableFile> base)
      : env_(env), base_(std::move(base)) {}

  absl::Status Append(std::string_view data) override {
    RETURN_IF_ERROR(env_->MaybeFail(FaultOp::kAppend, path()));
    absl::Status s = base_->Append(data);
    env_->RecordAppend(path(), base_->Size());
    return s;
  }

  absl::Status AppendV(absl::Span<const std::string_view> parts) override {
    RETURN_IF_ERROR(env_->MaybeFail(FaultOp::kAppend, path()));
    absl::Status s = base_->AppendV(parts);
    env_->RecordAppend(path(), base_->Size());
    return s;
  }

  absl::Status Sync() override {
    RETURN_IF_ERROR(env_->MaybeFail(FaultOp::kSync, path()));
    RETURN_IF_ERROR(base_->Sync());
    env_->RecordSync(path(), base_->Size());
    return absl::OkStatus();
  }

  absl::Status Close() override {
    // A failed close(2) still releases the descriptor, so always close.
    absl::Status injected = env_->MaybeFail(FaultOp::kClose, path());
    absl::Status s = base_->Close();
    return injected.ok() ? s : injected;
  }

  uint64_t Size() const override { return base_->Size(); }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultInjectionEnv* const env_;
  const std::unique_ptr<WritableFile> base_;
};

class FaultRandomAccessFile final : public RandomAccessFile {
 public:
  FaultRandomAccessFile(FaultInjectionEnv* env,
                        std::unique_ptr<RandomAccessFile> base)
      : env_(env), base_(std::move(base)) {}

  absl::Status ReadExact(uint64_t offset, size_t n,
                         char* scratch) const override {
    RETURN_IF_ERROR(env_->MaybeFail(FaultOp::kRead, path()));
    return base_->ReadExact(offset, n, scratch);
  }
  uint64_t DirectAlignment() const override { return base_->DirectAlignment(); }
  absl::Status ReadDirect(uint64_t offset, size_t n, char* dst) const override {
    RETURN_IF_ERROR(env_->MaybeFail(FaultOp::kRead, path()));
    return base_->ReadDirect(offset, n, dst);
  }
  uint64_t Size() const override { return base_->Size(); }
  const std::string& path() const override { return base_->path(); }

 private:
  FaultInjectionEnv* const env_;
  const std::unique_ptr<RandomAccessFile> base_;
};

}  // namespace

FaultInjectionEnv::FaultInjectionEnv(Env* base) : base_(base) {}
FaultInjectionEnv::~FaultInjectionEnv() = default;

void FaultInjectionEnv::AddRule(const FaultRule& rule) {
  absl::MutexLock lock(&mu_);
  rules_.push_back(rule);
  rule_hits_.push_back(0);
}

void FaultInjectionEnv::ClearRules() {
  absl::MutexLock lock(&mu_);
  rules_.clear();
  rule_hits_.clear();
}

int FaultInjectionEnv::faults_injected() const {
  absl::MutexLock lock(&mu_);
  return faults_injected_;
}

absl::Status FaultInjectionEnv::InjectFault(FaultOp op, std::string_view path,
                                            std::string_view other_path,
                                            const std::string& what) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < rules_.size(); ++i) {
    const FaultRule& rule = rules_[i];
    if (rule.op != op) continue;
    if (path.find(rule.path_substring) == std::string_view::npos &&
        other_path.find(rule.path_substring) == std::string_view::npos) {
      continue;
    }
    const int hit = rule_hits_[i]++;
    if (hit < rule.skip) continue;
    if (rule.times >= 0 && hit - rule.skip >= rule.times) continue;
    ++faults_injected_;
    return ErrnoToEnvStatus(rule.error_number, what);
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::MaybeFail(FaultOp op, const std::string& path) {
  return InjectFault(op, path, path, fmt::format("{} {}", OpName(op), path));
}

void FaultInjectionEnv::RecordAppend(const std::string& path,
                                     uint64_t new_size) {
  // Nothing to record: unsynced bytes are whatever lies past synced_size
  // when the crash happens.
}

void FaultInjectionEnv::RecordSync(const std::string& path,
                                   uint64_t synced_size) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  // Untracked: durable already, or opened before the last crash.
  if (it != files_.end()) it->second.synced_size = synced_size;
}

void FaultInjectionEnv::CommitRenamesLocked(size_t n) {
  renames_.erase(renames_.begin(), renames_.begin() + n);
}

absl::Status FaultInjectionEnv::UndoRenameLocked(const PendingRename& r) {
  absl::Status s = base_->FileExists(r.to);
  if (s.ok()) {
    RETURN_IF_ERROR(base_->RenameFile(r.to, r.from));
  } else if (!absl::IsNotFound(s)) {
    return s;
  }
  files_.erase(r.to);
  if (r.from_state.has_value()) {
    files_[r.from] = *r.from_state;
  } else {
    files_.erase(r.from);
  }
  if (r.to_existed) {
    RETURN_IF_ERROR(WriteAndSync(base_, r.to, r.to_backup));
    if (r.to_state.has_value()) files_[r.to] = *r.to_state;
  }
  return absl::OkStatus();
}

namespace {
// Removes `dir` and everything below it through `env`.
absl::Status RemoveTree(Env* env, const std::string& dir) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(dir));
  for (const std::string& n : names) {
    const std::string p = JoinPath(dir, n);
    if (!env->RemoveFile(p).ok()) RETURN_IF_ERROR(RemoveTree(env, p));
  }
  return env->RemoveDir(dir);
}
}  // namespace

absl::Status FaultInjectionEnv::SimulateCrash() {
  absl::MutexLock lock(&mu_);
  absl::Status result;
  for (auto it = renames_.rbegin(); it != renames_.rend(); ++it) {
    result.Update(UndoRenameLocked(*it));
  }
  std::vector<std::string> paths;
  paths.reserve(files_.size());
  for (const auto& [path, state] : files_) paths.push_back(path);
  std::sort(paths.begin(), paths.end());
  for (const std::string& path : paths) {
    const FileState& state = files_[path];
    if (!state.durable_entry) {
      absl::Status s = base_->RemoveFile(path);
      if (!absl::IsNotFound(s)) result.Update(s);
    } else {
      result.Update(TruncateTo(base_, path, state.synced_size));
    }
  }
  files_.clear();
  renames_.clear();
  // Directories whose entry never became durable vanish with their content,
  // outermost first.
  std::vector<std::string> dirs(new_dirs_.begin(), new_dirs_.end());
  std::sort(dirs.begin(), dirs.end());
  std::string last_removed;
  for (const std::string& d : dirs) {
    if (!last_removed.empty() && d.starts_with(last_removed + "/")) continue;
    absl::Status s = RemoveTree(base_, d);
    if (!absl::IsNotFound(s)) result.Update(s);
    last_removed = d;
  }
  new_dirs_.clear();
  return result;
}

absl::StatusOr<std::unique_ptr<WritableFile>>
FaultInjectionEnv::NewWritableFile(const std::string& path_in,
                                   const WritableFileOptions& options) {
  const std::string path = Canonical(path_in);
  RETURN_IF_ERROR(MaybeFail(FaultOp::kOpenWrite, path));
  absl::MutexLock lock(&mu_);
  const bool existed = base_->FileExists(path).ok();
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   base_->NewWritableFile(path, options));
  if (existed) {
    // Truncated in place: the entry keeps its durability.
    auto [it, inserted] = files_.try_emplace(path, FileState{0, true});
    it->second.synced_size = 0;
  } else {
    files_[path] = FileState{0, false};
  }
  return std::unique_ptr<WritableFile>(
      std::make_unique<FaultWritableFile>(this, std::move(file)));
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>>
FaultInjectionEnv::NewRandomAccessFile(const std::string& path_in) {
  const std::string path = Canonical(path_in);
  RETURN_IF_ERROR(MaybeFail(FaultOp::kOpenRead, path));
  ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file,
                   base_->NewRandomAccessFile(path));
  return std::unique_ptr<RandomAccessFile>(
      std::make_unique<FaultRandomAccessFile>(this, std::move(file)));
}

absl::Status FaultInjectionEnv::CreateDirs(const std::string& dir_in) {
  const std::string dir = Canonical(dir_in);
  RETURN_IF_ERROR(MaybeFail(FaultOp::kCreateDirs, dir));
  absl::MutexLock lock(&mu_);
  std::vector<std::string> missing;
  for (std::string p = NormalizeDir(dir); p != "/" && !p.empty() && p != ".";) {
    if (base_->FileExists(p).ok()) break;
    missing.push_back(p);
    std::string parent = DirName(p);
    if (parent == p) break;
    p = std::move(parent);
  }
  RETURN_IF_ERROR(base_->CreateDirs(dir));
  for (std::string& p : missing) new_dirs_.insert(std::move(p));
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::RenameFile(const std::string& from_in,
                                           const std::string& to_in) {
  const std::string from = Canonical(from_in);
  const std::string to = Canonical(to_in);
  RETURN_IF_ERROR(InjectFault(FaultOp::kRename, from, to,
                              fmt::format("rename {} to {}", from, to)));
  absl::MutexLock lock(&mu_);
  if (from == to) return base_->RenameFile(from, to);
  if (base_->ListDir(from).ok()) {
    // A directory: durable at once; tracked files inside follow it.
    RETURN_IF_ERROR(base_->RenameFile(from, to));
    const std::string prefix = from + "/";
    std::vector<std::pair<std::string, FileState>> moved;
    for (auto it = files_.begin(); it != files_.end();) {
      if (it->first.starts_with(prefix)) {
        moved.emplace_back(JoinPath(to, it->first.substr(prefix.size())),
                           it->second);
        files_.erase(it++);
      } else {
        ++it;
      }
    }
    for (auto& [path, state] : moved) files_[path] = state;
    return absl::OkStatus();
  }
  PendingRename r;
  r.from = from;
  r.to = to;
  absl::Status to_exists = base_->FileExists(to);
  if (to_exists.ok()) {
    r.to_existed = true;
    ASSIGN_OR_RETURN(r.to_backup,
                     ReadFileToString(base_, to, kMaxRenameBackup));
  } else if (!absl::IsNotFound(to_exists)) {
    return to_exists;
  }
  RETURN_IF_ERROR(base_->RenameFile(from, to));
  if (auto it = files_.find(from); it != files_.end()) {
    r.from_state = it->second;
    files_.erase(it);
  }
  if (auto it = files_.find(to); it != files_.end()) {
    r.to_state = it->second;
    files_.erase(it);
  }
  // Tracked as if committed; UndoRenameLocked restores the states above.
  if (r.from_state.has_value()) {
    files_[to] = FileState{r.from_state->synced_size, true};
  }
  renames_.push_back(std::move(r));
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::SyncDir(const std::string& dir_in) {
  const std::string dir = Canonical(dir_in);
  RETURN_IF_ERROR(MaybeFail(FaultOp::kSyncDir, dir));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(base_->SyncDir(dir));
  const std::string d = NormalizeDir(dir);
  for (auto& [path, state] : files_) {
    if (DirName(path) == d) state.durable_entry = true;
  }
  for (auto it = new_dirs_.begin(); it != new_dirs_.end();) {
    if (DirName(*it) == d) {
      new_dirs_.erase(it++);
    } else {
      ++it;
    }
  }
  size_t commit = 0;
  for (size_t i = 0; i < renames_.size(); ++i) {
    if (DirName(renames_[i].to) == d) commit = i + 1;
  }
  CommitRenamesLocked(commit);
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::RemoveFile(const std::string& path_in) {
  const std::string path = Canonical(path_in);
  RETURN_IF_ERROR(MaybeFail(FaultOp::kRemove, path));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(base_->RemoveFile(path));
  size_t commit = 0;
  for (size_t i = 0; i < renames_.size(); ++i) {
    if (renames_[i].from == path || renames_[i].to == path) commit = i + 1;
  }
  CommitRenamesLocked(commit);
  files_.erase(path);
  return absl::OkStatus();
}

absl::Status FaultInjectionEnv::RemoveDir(const std::string& dir_in) {
  const std::string dir = Canonical(dir_in);
  RETURN_IF_ERROR(MaybeFail(FaultOp::kRemove, dir));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(base_->RemoveDir(dir));
  new_dirs_.erase(NormalizeDir(dir));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FaultInjectionEnv::ListDir(
    const std::string& dir_in) {
  const std::string dir = Canonical(dir_in);
  return base_->ListDir(dir);
}

absl::StatusOr<uint64_t> FaultInjectionEnv::GetFileSize(
    const std::string& path_in) {
  const std::string path = Canonical(path_in);
  return base_->GetFileSize(path);
}

absl::Status FaultInjectionEnv::FileExists(const std::string& path_in) {
  const std::string path = Canonical(path_in);
  return base_->FileExists(path);
}

absl::StatusOr<std::string> FaultInjectionEnv::RealPath(
    const std::string& path) {
  // Resolved by the base Env as spelled (realpath follows /proc/self/fd/N
  // itself); rules match the canonical spelling, like every other op.
  RETURN_IF_ERROR(MaybeFail(FaultOp::kRealPath, Canonical(path)));
  return base_->RealPath(path);
}

}  // namespace ckptd
