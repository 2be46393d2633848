// Copyright 2026 The ckptd Authors.
#include "daemon/staging/staging_pool.h"

#include <algorithm>

#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {

absl::Status StagingPool::CheckRoom() const {
  if (queue_.size() >= options_.max_waiting) {
    return absl::ResourceExhaustedError(fmt::format(
        "{} Save calls already wait for staging memory (max_pending_saves)",
        queue_.size()));
  }
  return absl::OkStatus();
}

void StagingPool::Enqueue(uint64_t token, uint64_t arena_bytes) {
  queue_.push_back({token, arena_bytes});
}

std::vector<uint64_t> StagingPool::Admit() {
  std::vector<uint64_t> admitted;
  while (!queue_.empty()) {
    const Waiting& w = queue_.front();
    if (used_ != 0 && w.arena_bytes != 0 &&
        used_ + w.arena_bytes > options_.budget)
      break;
    used_ += w.arena_bytes;
    admitted.push_back(w.token);
    queue_.pop_front();
  }
  return admitted;
}

bool StagingPool::Remove(uint64_t token) {
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](const Waiting& w) { return w.token == token; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  return true;
}

void StagingPool::Release(uint64_t bytes) {
  if (bytes > used_) {
    // A broken invariant: log loudly, never wrap around.
    spdlog::critical("staging pool: releasing {} bytes but only {} are charged",
                     bytes, used_);
    bytes = used_;
  }
  used_ -= bytes;
}

}  // namespace ckptd::daemon
