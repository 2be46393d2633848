// Copyright 2026 The ckptd Authors.
#include "common/failpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/absl_fmt.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::failpoint {
namespace internal {
std::atomic<bool> armed{false};
}  // namespace internal

namespace {

enum class Action { kOff, kPause, kSleep };

struct Point {
  Action action = Action::kOff;
  absl::Duration sleep;
  int64_t budget = -1;  // hits that still fire; -1: every hit
  int hits = 0;
};

struct Table {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, Point> points ABSL_GUARDED_BY(mu);
  std::string dir ABSL_GUARDED_BY(mu);
  absl::Duration max_pause ABSL_GUARDED_BY(mu) = absl::Seconds(60);
};

Table& table() {
  static Table* t = new Table;  // never destroyed: hits may race exit
  return *t;
}

absl::Status ParseAction(absl::string_view entry, absl::string_view text,
                         Point& p) {
  if (size_t star = text.find('*'); star != absl::string_view::npos) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(text.substr(0, star), &n) || n < 0) {
      return absl::InvalidArgumentError(fmt::format(
          "failpoint '{}': '{}' is not a count", entry, text.substr(0, star)));
    }
    p.budget = n;
    text = text.substr(star + 1);
  }
  int64_t ms = 0;
  if (text == "pause") {
    p.action = Action::kPause;
  } else if (text == "off") {
    p.action = Action::kOff;
  } else if (absl::ConsumePrefix(&text, "sleep(") &&
             absl::ConsumeSuffix(&text, ")") && absl::SimpleAtoi(text, &ms) &&
             ms >= 0) {
    p.action = Action::kSleep;
    p.sleep = absl::Milliseconds(ms);
  } else {
    return absl::InvalidArgumentError(fmt::format(
        "failpoint '{}': unknown action (pause, sleep(MS), off, with an "
        "optional N* before it)",
        entry));
  }
  return absl::OkStatus();
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// <dir>/<name>.hit, replaced atomically (a reader sees all of it or none).
void WriteHit(const std::string& dir, absl::string_view name,
              absl::string_view detail, int hits) {
  const std::string path = fmt::format("{}/{}.hit", dir, name);
  const std::string tmp = fmt::format("{}.{}.tmp", path, ::getpid());
  const std::string body =
      fmt::format("pid={} id={} hits={}\n", ::getpid(), detail, hits);
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, body.data(), body.size()) ==
                           static_cast<ssize_t>(body.size());
  if (fd >= 0) ok = ::close(fd) == 0 && ok;
  if (ok) ok = ::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    spdlog::error("failpoint {}: cannot write {}: {}", name, path,
                  std::strerror(errno));
  }
}

void Pause(const std::string& dir, absl::string_view name,
           absl::string_view detail, int hits, absl::Duration max_pause) {
  const std::string release = fmt::format("{}/{}.release", dir, name);
  if (Exists(release)) {
    WriteHit(dir, name, detail, hits);
    return;
  }
  spdlog::warn("failpoint {}: paused ({}), waiting for {} (at most {})", name,
               detail, release, absl::FormatDuration(max_pause));
  WriteHit(dir, name, detail, hits);
  const absl::Time deadline = absl::Now() + max_pause;
  while (!Exists(release)) {
    if (absl::Now() >= deadline) {
      spdlog::error("failpoint {}: {} did not appear within {}; going on", name,
                    release, absl::FormatDuration(max_pause));
      return;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  spdlog::warn("failpoint {}: released ({})", name, detail);
}

}  // namespace

namespace internal {

void Hit(absl::string_view name, absl::string_view detail) {
  Table& t = table();
  Point p;
  std::string dir;
  absl::Duration max_pause;
  {
    absl::MutexLock l(&t.mu);
    auto it = t.points.find(std::string(name));
    if (it == t.points.end()) return;
    Point& armed_point = it->second;
    ++armed_point.hits;
    if (armed_point.budget == 0) return;
    if (armed_point.budget > 0) --armed_point.budget;
    p = armed_point;
    dir = t.dir;
    max_pause = t.max_pause;
  }
  // No lock from here on: the action blocks.
  switch (p.action) {
    case Action::kOff:
      return;
    case Action::kSleep:
      absl::SleepFor(p.sleep);
      return;
    case Action::kPause:
      Pause(dir, name, detail, p.hits, max_pause);
      return;
  }
}

}  // namespace internal

absl::Status Arm(const Options& options) {
  absl::flat_hash_map<std::string, Point> points;
  bool pauses = false;
  for (absl::string_view entry :
       absl::StrSplit(options.spec, ',', absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      return absl::InvalidArgumentError(
          fmt::format("failpoint entry '{}' is not NAME=ACTION", entry));
    }
    Point p;
    if (absl::Status s = ParseAction(entry, entry.substr(eq + 1), p); !s.ok()) {
      return s;
    }
    pauses |= p.action == Action::kPause;
    points[std::string(entry.substr(0, eq))] = p;
  }
  if (pauses && options.dir.empty()) {
    return absl::InvalidArgumentError(
        "failpoints with `pause` need a directory (CKPTD_FAILPOINT_DIR) for "
        "their .hit and .release files");
  }
  Table& t = table();
  absl::MutexLock l(&t.mu);
  t.points = std::move(points);
  t.dir = options.dir;
  t.max_pause = options.max_pause;
  internal::armed.store(!t.points.empty(), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status ArmFromEnvironment() {
  const char* spec = std::getenv("CKPTD_FAILPOINTS");
  if (spec == nullptr || *spec == '\0') return absl::OkStatus();
  Options o;
  o.spec = spec;
  if (const char* dir = std::getenv("CKPTD_FAILPOINT_DIR")) o.dir = dir;
  if (const char* ms = std::getenv("CKPTD_FAILPOINT_TIMEOUT_MS")) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(ms, &v) || v < 0) {
      return absl::InvalidArgumentError(fmt::format(
          "CKPTD_FAILPOINT_TIMEOUT_MS '{}' is not a number of milliseconds",
          ms));
    }
    o.max_pause = absl::Milliseconds(v);
  }
  if (absl::Status s = Arm(o); !s.ok()) return s;
  spdlog::warn("failpoints armed (test only): {} (dir '{}', pauses at most {})",
               o.spec, o.dir, absl::FormatDuration(o.max_pause));
  return absl::OkStatus();
}

void DisarmAll() { (void)Arm(Options{}); }

int HitCount(absl::string_view name) {
  Table& t = table();
  absl::MutexLock l(&t.mu);
  auto it = t.points.find(std::string(name));
  return it == t.points.end() ? 0 : it->second.hits;
}

}  // namespace ckptd::failpoint
