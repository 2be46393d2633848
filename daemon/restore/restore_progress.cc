// Copyright 2026 The ckptd Authors.
#include "daemon/restore/restore_progress.h"

#include <algorithm>
#include <utility>

#include "fmt/format.h"

namespace ckptd::daemon {

absl::Status RestoreProgress::Admissible(const RestoreKey& key,
                                         uint32_t batch) const {
  auto it = entries_.find(key);
  if (it != entries_.end() && it->second.info.state == "CANCELLED" &&
      batch > 0) {
    return it->second.cancel->status();
  }
  return absl::OkStatus();
}

absl::Status RestoreProgress::Admit(const RestoreKey& key, int local_world_size,
                                    uint32_t batch, absl::Time now,
                                    bool starts_anew) {
  if (absl::Status s = Admissible(key, batch); !s.ok()) return s;
  auto it = entries_.find(key);
  if (it == entries_.end() || !Running(it->second) || starts_anew) {
    Entry e;
    e.seq = next_id_++;
    e.info.id = fmt::format("r{}", e.seq);
    e.info.uid = std::get<0>(key);
    e.info.dir = std::get<1>(key);
    e.info.group = std::get<2>(key);
    e.info.local_world_size = local_world_size;
    e.info.state = "RUNNING";
    e.info.started = now;
    it = entries_.insert_or_assign(key, std::move(e)).first;
  }
  it->second.info.last_active = now;
  Trim();
  return absl::OkStatus();
}

void RestoreProgress::Served(const RestoreKey& key, const ServedBatch& batch,
                             absl::Time now) {
  auto it = entries_.find(key);
  if (it == entries_.end() || !Running(it->second)) return;
  RestoreProgressInfo& info = it->second.info;
  ++info.batches;
  info.copied_bytes += batch.copied_bytes;
  info.storage_bytes += batch.storage_bytes;
  info.peer_bytes += batch.peer_bytes;
  info.ranks_done += batch.ranks_last;
  info.last_active = now;
  if (!batch.first_error.ok() && info.error.empty()) {
    info.error = batch.first_error.ToString();
  }
  // A group ends when each of its ranks was served its last batch; ranks
  // alone share an entry that ends with each load.
  const int ranks = info.group.empty() ? 1 : info.local_world_size;
  if (info.ranks_done >= ranks) {
    Finish(it->second, now);
    Trim();
  }
}

void RestoreProgress::Finish(Entry& e, absl::Time now) {
  e.info.state = e.info.error.empty() ? "DONE" : "FAILED";
  e.info.last_active = now;
}

absl::StatusOr<RestoreKey> RestoreProgress::Cancel(const std::string& id,
                                                   const std::string& reason,
                                                   absl::Time now) {
  for (auto& [key, e] : entries_) {
    if (e.info.id != id) continue;
    if (!Running(e)) {
      return absl::FailedPreconditionError(
          fmt::format("restore {} has ended ({})", id, e.info.state));
    }
    e.info.state = "CANCELLED";
    e.info.error = reason.empty() ? "cancelled by an operator" : reason;
    e.info.last_active = now;
    e.cancel->Cancel(
        fmt::format("restore {} was cancelled: {}", id, e.info.error));
    return key;
  }
  return absl::NotFoundError(fmt::format(
      "no restore {} (ids are listed by `ckptctl restores`; ended restores "
      "are kept for the last {})",
      id, options_.history));
}

std::shared_ptr<const Cancellation> RestoreProgress::CancellationOf(
    const RestoreKey& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : it->second.cancel;
}

void RestoreProgress::Expire(absl::Time now) {
  for (auto& [key, e] : entries_) {
    if (Running(e) && now - e.info.last_active >= options_.idle_timeout) {
      e.info.state = "ABANDONED";
      if (e.info.error.empty()) {
        e.info.error = fmt::format(
            "no batch for {} ({} of {} ranks had sent their last batch)",
            absl::FormatDuration(now - e.info.last_active), e.info.ranks_done,
            e.info.group.empty() ? 1 : e.info.local_world_size);
      }
    }
  }
  Trim();
}

// Forgets the oldest finished restores beyond `history`, then, beyond
// `max_tracked`, the least recently active of any state.
void RestoreProgress::Trim() {
  auto oldest = [&](bool finished_only) {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (finished_only && Running(it->second)) continue;
      if (victim == entries_.end() ||
          it->second.info.last_active < victim->second.info.last_active) {
        victim = it;
      }
    }
    return victim;
  };
  size_t finished = 0;
  for (const auto& [key, e] : entries_) finished += Running(e) ? 0 : 1;
  while (finished > options_.history) {
    entries_.erase(oldest(true));
    --finished;
  }
  while (entries_.size() > options_.max_tracked) {
    entries_.erase(oldest(false));
  }
}

std::vector<RestoreProgressInfo> RestoreProgress::List() const {
  std::vector<const Entry*> order;
  for (const auto& [key, e] : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    if (Running(*a) != Running(*b)) return Running(*a);
    return a->seq > b->seq;
  });
  std::vector<RestoreProgressInfo> out;
  out.reserve(order.size());
  for (const Entry* e : order) out.push_back(e->info);
  return out;
}

std::optional<RestoreProgressInfo> RestoreProgress::Find(
    const std::string& id) const {
  for (const auto& [key, e] : entries_) {
    if (e.info.id == id) return e.info;
  }
  return std::nullopt;
}

}  // namespace ckptd::daemon
