// Copyright 2026 The ckptd Authors.
//
// ckptctl gc ROOT: housekeeping of a checkpoint root.
//
//   * unfinished directories (data files or .metadata.tmp, no .metadata)
//     that no daemon is writing: not in the local daemon's list of
//     checkpoints still in progress, and untouched for --min-age (default
//     1 h: another node's daemon may be writing into a shared file system);
//   * with --keep-last N: committed checkpoints beyond the newest N of each
//     parent directory, ordered by the step number their name ends with
//     (step_1200), else by commit time; --keep-every K also keeps every
//     checkpoint whose step is a multiple of K. The newest committed
//     checkpoint of a directory is never removed.
//
// A committed checkpoint loses its commit marker first (.metadata removed,
// the directory fsynced), so a crash midway leaves an unfinished directory,
// never a committed one with missing data. Only the files DCP checkpoints
// consist of (.metadata, .metadata.tmp, __R_K.distcp) are removed; a
// directory left with other files stays (reported). --dry-run only reports.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "cli/ckptctl.h"
#include "client/ckptd_client.h"
#include "common/absl_fmt.h"
#include "common/env.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ckptd::cli {
namespace {

struct Found {
  std::string dir;
  bool committed = false;
  std::optional<int64_t> step;     // from the name's trailing digits
  int64_t mtime = 0;               // .metadata (committed) or newest file
  uint64_t bytes = 0;              // of the files gc would remove
  std::vector<std::string> files;  // the checkpoint's own files
  size_t other_files = 0;
  std::string action = "keep";
  std::string reason;
};

bool IsDataFile(const std::string& name) {
  static const std::regex kData(R"(__\d+_\d+\.distcp)");
  return std::regex_match(name, kData);
}

// The directory's checkpoint files, if it is one (committed or not).
std::optional<Found> Inspect(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return std::nullopt;
  Found f;
  f.dir = dir;
  bool any = false;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(::dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      continue;
    }
    const bool own =
        S_ISREG(st.st_mode) &&
        (name == ".metadata" || name == ".metadata.tmp" || IsDataFile(name));
    if (!own) {
      f.other_files++;
      continue;
    }
    any = true;
    f.files.push_back(name);
    f.bytes += static_cast<uint64_t>(st.st_size);
    if (name == ".metadata") {
      f.committed = true;
      f.mtime = st.st_mtime;
    } else if (!f.committed) {
      f.mtime = std::max<int64_t>(f.mtime, st.st_mtime);
    }
  }
  ::closedir(d);
  if (!any) return std::nullopt;
  f.step = StepOf(dir);
  return f;
}

// Every checkpoint directory below `root` (not descending into one, not
// following symlinks), depth-first in name order.
void Scan(const std::string& root, int depth, std::vector<Found>* out) {
  if (depth > 16) return;
  if (std::optional<Found> f = Inspect(root)) {
    out->push_back(*std::move(f));
    return;
  }
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return;
  std::vector<std::string> subdirs;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (::fstatat(::dirfd(d), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode)) {
      subdirs.push_back(root + "/" + name);
    }
  }
  ::closedir(d);
  std::sort(subdirs.begin(), subdirs.end());
  for (const std::string& s : subdirs) Scan(s, depth + 1, out);
}

std::optional<int64_t> ParseAge(const std::string& s) {
  if (s.empty()) return std::nullopt;
  size_t n = 0;
  while (n < s.size() && std::isdigit(static_cast<unsigned char>(s[n]))) ++n;
  if (n == 0 || n > 12) return std::nullopt;
  const int64_t v = std::stoll(s.substr(0, n));
  const std::string unit = s.substr(n);
  if (unit.empty() || unit == "s") return v;
  if (unit == "m") return v * 60;
  if (unit == "h") return v * 3600;
  if (unit == "d") return v * 86400;
  return std::nullopt;
}

std::string Age(int64_t secs) {
  if (secs < 120) return fmt::format("{} s", secs);
  if (secs < 7200) return fmt::format("{} min", secs / 60);
  if (secs < 172800) return fmt::format("{:.1f} h", secs / 3600.0);
  return fmt::format("{:.1f} d", secs / 86400.0);
}

// Directories the local daemon has in progress (nullopt: no daemon
// answered, `why` says so).
std::optional<absl::flat_hash_set<std::string>> InProgress(
    const DaemonArgs& args, std::string* why) {
  auto c = Connect(args);
  if (!c.ok()) {
    *why = std::string(c.status().message());
    return std::nullopt;
  }
  auto list = (*c)->List();
  if (!list.ok()) {
    *why = std::string(list.status().message());
    return std::nullopt;
  }
  absl::flat_hash_set<std::string> dirs;
  for (const client::CheckpointInfo& i : *list) {
    if (i.state != "COMMITTED" && i.state != "FAILED" &&
        i.state != "CANCELLED") {
      char* real = ::realpath(i.checkpoint_id.c_str(), nullptr);
      dirs.insert(real != nullptr ? std::string(real) : i.checkpoint_id);
      std::free(real);
    }
  }
  return dirs;
}

// Removes the checkpoint's own files, the commit marker first and durably.
absl::Status Remove(const Found& f) {
  auto unlink = [&](const std::string& name) -> absl::Status {
    const std::string p = f.dir + "/" + name;
    if (::unlink(p.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(
          fmt::format("remove {}: {}", p, std::strerror(errno)));
    }
    return absl::OkStatus();
  };
  if (f.committed) {
    if (absl::Status s = unlink(".metadata"); !s.ok()) return s;
    if (absl::Status s = Env::Default()->SyncDir(f.dir); !s.ok()) return s;
  }
  for (const std::string& name : f.files) {
    if (name == ".metadata") continue;
    if (absl::Status s = unlink(name); !s.ok()) return s;
  }
  if (f.other_files == 0 && ::rmdir(f.dir.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(
        fmt::format("remove {}: {}", f.dir, std::strerror(errno)));
  }
  const std::string parent = f.dir.substr(0, f.dir.find_last_of('/'));
  return Env::Default()->SyncDir(parent.empty() ? "/" : parent);
}

// Marks the committed checkpoints retention lets go.
void ApplyRetention(const GcArgs& args, std::vector<Found>* found) {
  std::map<std::string, std::vector<Found*>> groups;  // parent → committed
  for (Found& f : *found) {
    if (f.committed)
      groups[f.dir.substr(0, f.dir.find_last_of('/'))].push_back(&f);
  }
  for (auto& [parent, list] : groups) {
    std::sort(list.begin(), list.end(), [](const Found* a, const Found* b) {
      return std::pair(a->step.value_or(-1), a->mtime) <
             std::pair(b->step.value_or(-1), b->mtime);
    });
    const size_t n = list.size();
    for (size_t i = 0; i < n; ++i) {
      Found& f = *list[i];
      if (i + 1 == n) {
        f.reason = "the newest committed checkpoint of its directory";
      } else if (n - i <= static_cast<size_t>(args.keep_last)) {
        f.reason = fmt::format("within --keep-last {}", args.keep_last);
      } else if (args.keep_every > 0 && f.step.has_value() &&
                 *f.step % args.keep_every == 0) {
        f.reason = fmt::format("step {} is a multiple of --keep-every {}",
                               *f.step, args.keep_every);
      } else {
        f.action = "remove";
        f.reason =
            fmt::format("beyond --keep-last {}{}", args.keep_last,
                        f.step.has_value() ? fmt::format(" (step {})", *f.step)
                                           : std::string());
      }
    }
  }
}

void Report(const GcArgs& args, const std::vector<Found>& found,
            const std::string& daemon_note) {
  uint64_t freed = 0;
  size_t removed = 0;
  if (args.daemon.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const Found& f : found) {
      out.push_back({{"dir", f.dir},
                     {"committed", f.committed},
                     {"step", f.step.has_value() ? nlohmann::json(*f.step)
                                                 : nlohmann::json(nullptr)},
                     {"action", f.action},
                     {"reason", f.reason},
                     {"bytes", f.bytes},
                     {"other_files", f.other_files}});
    }
    std::printf("%s\n", out.dump(-1, ' ', false,
                                 nlohmann::json::error_handler_t::replace)
                            .c_str());
    return;
  }
  if (!daemon_note.empty()) std::printf("%s\n", daemon_note.c_str());
  const char* verb = args.dry_run ? "would remove" : "removed";
  for (const Found& f : found) {
    std::printf(
        "%-12s %s  (%s, %s: %s; %.1f MiB)%s\n",
        f.action == "remove" ? verb : "keep", f.dir.c_str(),
        f.committed ? "committed" : "unfinished",
        f.action == "remove" ? "why" : "because", f.reason.c_str(),
        f.bytes / 1048576.0,
        f.other_files > 0 && f.action == "remove"
            ? fmt::format(" [{} other files stay]", f.other_files).c_str()
            : "");
    if (f.action == "remove") {
      freed += f.bytes;
      ++removed;
    }
  }
  std::printf("gc %s: %zu checkpoint directories, %zu %s (%.1f MiB)\n",
              args.root.c_str(), found.size(), removed,
              args.dry_run ? "to remove (dry run)" : "removed",
              freed / 1048576.0);
}

}  // namespace

int Gc(const GcArgs& args) {
  if (args.keep_every > 0 && args.keep_last <= 0) {
    std::fprintf(stderr, "ckptctl: gc: --keep-every needs --keep-last\n");
    return kExitUsage;
  }
  const std::optional<int64_t> min_age = ParseAge(args.min_age);
  if (!min_age.has_value()) {
    std::fprintf(stderr,
                 "ckptctl: gc: --min-age '%s': use e.g. 90s, 30m, 1h, 2d\n",
                 args.min_age.c_str());
    return kExitUsage;
  }
  char* real = ::realpath(args.root.c_str(), nullptr);
  struct stat st;
  if (real == nullptr || ::stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::free(real);
    std::fprintf(stderr, "ckptctl: gc: %s is not a directory\n",
                 args.root.c_str());
    return kExitUnreadable;
  }
  const std::string root = real;
  std::free(real);
  std::vector<Found> found;
  Scan(root, 0, &found);
  std::string why;
  const auto active = InProgress(args.daemon, &why);
  const std::string note =
      active.has_value()
          ? std::string()
          : fmt::format(
                "note: no daemon answered ({}); unfinished directories "
                "untouched for --min-age {} are removed",
                why, args.min_age);
  const int64_t now = std::time(nullptr);
  for (Found& f : found) {
    if (f.committed) continue;
    const int64_t age = now - f.mtime;
    if (active.has_value() && active->contains(f.dir)) {
      f.reason = "the daemon is writing it";
    } else if (age < *min_age) {
      f.reason = fmt::format("touched {} ago, within --min-age {}", Age(age),
                             args.min_age);
    } else {
      f.action = "remove";
      f.reason =
          fmt::format("no daemon writing it, untouched for {}", Age(age));
    }
  }
  if (args.keep_last > 0) ApplyRetention(args, &found);
  int rc = kExitOk;
  if (!args.dry_run) {
    for (Found& f : found) {
      if (f.action != "remove") continue;
      if (absl::Status s = Remove(f); !s.ok()) {
        std::fprintf(stderr, "ckptctl: gc: %s\n",
                     std::string(s.message()).c_str());
        f.action = "keep";
        f.reason = "removal failed: " + std::string(s.message());
        rc = kExitInvalid;
      }
    }
  }
  Report(args, found, note);
  return rc;
}

}  // namespace ckptd::cli
