// Copyright 2026 The ckptd Authors.
#include "daemon/commit/retention.h"

#include <algorithm>

#include "common/absl_fmt.h"
#include "common/hash.h"
#include "common/status_macros.h"
#include "daemon/commit/checkpoint_dir.h"
#include "fmt/format.h"
#include "format/metadata/metadata.h"
#include "format/plan/commit_protocol.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

bool IsDataFileName(std::string_view name) {
  return name.starts_with("__") && name.ends_with(".distcp");
}

// The rank of a data file name "__{rank}_{k}.distcp", or -1.
int DataFileRank(std::string_view name) {
  if (!IsDataFileName(name)) return -1;
  int rank = 0;
  size_t i = 2;
  for (;
       i < name.size() && name[i] >= '0' && name[i] <= '9' && rank < (1 << 24);
       ++i) {
    rank = rank * 10 + (name[i] - '0');
  }
  return i > 2 && i < name.size() && name[i] == '_' ? rank : -1;
}

}  // namespace

void History::Load(HistoryRecord record) {
  std::vector<Entry>& list = dirs_[Key(record.uid, record.job)];
  list.clear();
  for (size_t i = 0; i < record.dirs.size(); ++i) {
    list.push_back({std::move(record.dirs[i]),
                    i < record.started_ms.size() ? record.started_ms[i] : 0});
  }
}

History::Recorded History::Record(const std::string& job, int64_t uid,
                                  const std::string& dir, int64_t started_ms,
                                  int keep_last_n, int64_t keep_every) {
  Recorded out;
  std::vector<Entry>& list = dirs_[Key(uid, job)];
  list.erase(std::remove_if(list.begin(), list.end(),
                            [&](const Entry& e) { return e.dir == dir; }),
             list.end());
  // After every save that started no later (stable for equal times).
  auto pos = std::upper_bound(
      list.begin(), list.end(), started_ms,
      [](int64_t t, const Entry& e) { return t < e.started_ms; });
  list.insert(pos, {dir, started_ms});
  if (keep_last_n > 0 && uid >= 0) {
    const std::string parent = DirName(dir);
    size_t siblings = 0;
    for (const Entry& e : list) siblings += DirName(e.dir) == parent;
    // Never the one just committed, nor any save newer than it; beyond the
    // newest keep_last_n, the steps keep_every keeps.
    auto kept_for_its_step = [&](const std::string& d) {
      const std::optional<int64_t> step = StepOf(d);
      return keep_every > 0 && step.has_value() && *step % keep_every == 0;
    };
    size_t newer = siblings;  // siblings from this one to the newest
    for (auto it = list.begin(); newer > static_cast<size_t>(keep_last_n) &&
                                 it != list.end() && it->dir != dir;) {
      if (DirName(it->dir) != parent) {
        ++it;
        continue;
      }
      --newer;
      if (kept_for_its_step(it->dir)) {
        ++it;
        continue;
      }
      out.doomed.push_back(it->dir);
      it = list.erase(it);
    }
  }
  out.record.job = job;
  out.record.uid = uid;
  for (const Entry& e : list) {
    out.record.dirs.push_back(e.dir);
    out.record.started_ms.push_back(e.started_ms);
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> History::Committed(
    std::string_view job) const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, entries] : dirs_) {
    if (!job.empty() && key.second != job) continue;
    for (const Entry& e : entries) out.emplace_back(key.second, e.dir);
  }
  return out;
}

std::vector<HistoryRecord> LoadHistoryRecords(Env* env,
                                              const std::string& history_dir) {
  std::vector<HistoryRecord> out;
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(history_dir);
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    if (!n.ends_with(".history")) continue;
    const std::string path = JoinPath(history_dir, n);
    absl::StatusOr<std::string> text = ReadFileToString(env, path, 64 << 20);
    if (!text.ok()) continue;
    absl::StatusOr<HistoryRecord> rec = DecodeHistory(*text, path);
    if (!rec.ok()) {
      spdlog::error("history ignored (its checkpoints will not be pruned): {}",
                    rec.status());
      continue;
    }
    out.push_back(*std::move(rec));
  }
  return out;
}

absl::Status WriteHistory(Env* env, const std::string& history_dir,
                          const HistoryRecord& record) {
  const std::string path = JoinPath(
      history_dir,
      fmt::format("{:016x}.history",
                  Fnv1aHash(fmt::format("{}\n{}", record.uid, record.job))));
  return WriteFileAtomic(env, path, EncodeHistory(record));
}

absl::Status DeleteCheckpointFiles(Env* env,
                                   const std::vector<std::string>& roots,
                                   const std::string& dir,
                                   const std::vector<int>* ranks) {
  absl::StatusOr<std::unique_ptr<CheckpointDir>> opened =
      CheckpointDir::Open(env, roots, dir, /*create=*/false);
  if (absl::IsNotFound(opened.status())) return absl::OkStatus();
  if (!opened.ok()) return opened.status();
  const std::string io = (*opened)->io_path();
  if (ranks == nullptr) {
    // The marker first, durably: never a marker without its data.
    RETURN_IF_ERROR(format::UnpublishMetadata({env, /*sync=*/true}, io));
  }
  ASSIGN_OR_RETURN(std::vector<std::string> names, env->ListDir(io));
  for (const std::string& n : names) {
    const bool mine =
        ranks == nullptr
            ? IsDataFileName(n)
            : std::binary_search(ranks->begin(), ranks->end(), DataFileRank(n));
    if (!mine) continue;
    if (absl::Status s = env->RemoveFile(JoinPath(io, n));
        !s.ok() && !absl::IsNotFound(s)) {
      return s;
    }
  }
  RETURN_IF_ERROR(env->SyncDir(io));  // the removals, durably
  (void)(*opened)->RemoveIfEmpty();   // fails harmlessly if other files remain
  return absl::OkStatus();
}

absl::Status DeleteCommitted(Env* env, Journal& journal,
                             const std::vector<std::string>& roots,
                             const std::string& dir, const std::string& job,
                             int64_t uid) {
  ASSIGN_OR_RETURN(std::string entry, journal.Add({dir, job, uid, std::nullopt,
                                                   /*deleting=*/true}));
  RETURN_IF_ERROR(DeleteCheckpointFiles(env, roots, dir));
  journal.Remove(entry);
  return absl::OkStatus();
}

}  // namespace ckptd::daemon
