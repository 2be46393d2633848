// Copyright 2026 The ckptd Authors.
#include "daemon/restore/group_buffers.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "fmt/format.h"

namespace ckptd::daemon {
namespace {

// 128 random bits from the kernel, as 32 hex digits.
std::string NewToken() {
  char raw[16];
  size_t got = 0;
  while (got < sizeof(raw)) {
    const ssize_t n = ::getrandom(raw + got, sizeof(raw) - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(raw, sizeof(raw)));
}

}  // namespace

std::shared_ptr<shm::Arena> GroupBuffers::TakePrevious(
    const RestoreKey& group) {
  auto l = latest_.find(group);
  if (l == latest_.end() || l->second.size() < 2) return nullptr;
  auto it = published_.find(l->second.front());
  l->second.pop_front();
  if (it == published_.end()) return nullptr;
  std::shared_ptr<shm::Arena> memory = std::move(it->second.memory);
  published_.erase(it);
  return memory;
}

absl::StatusOr<FilledBuffer> GroupBuffers::Create(uint64_t size,
                                                  const RestoreKey& group) {
  std::shared_ptr<shm::Arena> previous;  // released after the lock
  {
    absl::MutexLock l(&mu_);
    previous = TakePrevious(group);
    if (previous != nullptr && previous->size() >= size) {
      return FilledBuffer{std::move(previous)};  // still counted
    }
    if (previous != nullptr) bytes_alive_ -= previous->size();
    if (bytes_alive_ + size > options_.max_bytes) {
      return absl::ResourceExhaustedError(
          fmt::format("group buffers: {} bytes alive, {} more would exceed "
                      "restore_buffer_bytes ({})",
                      bytes_alive_, size, options_.max_bytes));
    }
    bytes_alive_ += size;
  }
  previous.reset();
  // Not pre-faulted: the read writes every page right after.
  absl::StatusOr<std::unique_ptr<shm::Arena>> memory =
      shm::Arena::CreateMemfd(size, "ckptd-restore", /*prefault=*/false);
  if (!memory.ok()) {
    absl::MutexLock l(&mu_);
    bytes_alive_ -= size;
    return memory.status();
  }
  return FilledBuffer{std::shared_ptr<shm::Arena>(*std::move(memory))};
}

void GroupBuffers::Discard(FilledBuffer buffer) {
  if (buffer.memory == nullptr) return;
  absl::MutexLock l(&mu_);
  bytes_alive_ -= buffer.memory->size();
}

std::string GroupBuffers::Publish(FilledBuffer buffer, const RestoreKey& group,
                                  int fetches, bool final, absl::Time now) {
  std::string token = NewToken();
  absl::MutexLock l(&mu_);
  published_[token] = Published{std::move(buffer.memory), group,
                                std::max(fetches, 1), final, now};
  std::deque<std::string>& tokens = latest_[group];
  tokens.push_back(token);
  while (tokens.size() > 2) {  // a buffer too small to take over, dropped
    auto it = published_.find(tokens.front());
    if (it != published_.end()) {
      bytes_alive_ -= it->second.memory->size();
      published_.erase(it);  // unmapped here: rare, and fast
    }
    tokens.pop_front();
  }
  return token;
}

std::string GroupBuffers::Lend(LentMemory memory, const RestoreKey& group,
                               int fetches, absl::Time now) {
  std::string token = NewToken();
  absl::MutexLock l(&mu_);
  lent_[token] = Lent{std::move(memory), group, std::max(fetches, 1), now};
  return token;
}

absl::StatusOr<shm::FetchedFd> GroupBuffers::Fetch(const std::string& token,
                                                   uint32_t uid) {
  // Released after the lock.
  std::shared_ptr<const void> keep;
  std::vector<std::shared_ptr<shm::Arena>> dropped;
  int fd = -1;
  uint64_t size = 0;
  {
    absl::MutexLock l(&mu_);
    auto it = published_.find(token);
    auto lent = lent_.find(token);
    const RestoreKey* group = nullptr;
    int left = 0;
    if (lent != lent_.end()) {
      group = &lent->second.group;
      left = lent->second.fetches_left;
    } else if (it != published_.end()) {
      group = &it->second.group;
      left = it->second.fetches_left;
    }
    if (group == nullptr || left == 0) {
      return absl::NotFoundError(fmt::format(
          "no group buffer {} (fetched by every rank already, taken over by "
          "the group's next batch, or expired after {})",
          token, absl::FormatDuration(options_.ttl)));
    }
    const uint32_t owner = std::get<0>(*group);
    if (uid != 0 && uid != owner) {
      return absl::PermissionDeniedError(fmt::format(
          "group buffer {} belongs to uid {}, not {}", token, owner, uid));
    }
    if (lent != lent_.end()) {
      Lent& m = lent->second;
      fd = m.memory.fd;
      size = m.memory.size;
      keep = m.memory.owner;
      if (--m.fetches_left == 0) lent_.erase(lent);
    } else {
      Published& p = it->second;
      fd = p.memory->fd();
      size = p.memory->size();
      keep = p.memory;
      // The last fetch of a group's final batch drops the group's buffers;
      // otherwise they stay for its later batches to take over.
      if (--p.fetches_left == 0 && p.final) {
        const RestoreKey g = p.group;  // `p` goes with the group
        DropGroup(g, &dropped);
      }
    }
  }
  // A read-only descriptor of the same memfd: the rank can map and read
  // it, not write or resize it.
  const std::string path = fmt::format("/proc/self/fd/{}", fd);
  shm::OwnedFd ro(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ro.valid()) {
    return absl::ErrnoToStatus(errno, "reopening a group buffer read-only");
  }
  return shm::FetchedFd{std::move(ro), size};
}

void GroupBuffers::DropGroup(const RestoreKey& group,
                             std::vector<std::shared_ptr<shm::Arena>>* out) {
  auto l = latest_.find(group);
  if (l == latest_.end()) return;
  for (const std::string& token : l->second) {
    auto it = published_.find(token);
    if (it == published_.end()) continue;
    bytes_alive_ -= it->second.memory->size();
    out->push_back(std::move(it->second.memory));
    published_.erase(it);
  }
  latest_.erase(l);
}

void GroupBuffers::Expire(absl::Time now) {
  // Declared first: destroyed (unmapped) after the lock is released.
  std::vector<std::shared_ptr<shm::Arena>> dropped;
  std::vector<std::shared_ptr<const void>> lent;
  absl::MutexLock l(&mu_);
  for (auto it = lent_.begin(); it != lent_.end();) {
    if (now - it->second.created >= options_.ttl) {
      lent.push_back(std::move(it->second.memory.owner));
      lent_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto it = published_.begin(); it != published_.end();) {
    Published& p = it->second;
    if (now - p.created >= options_.ttl) {
      bytes_alive_ -= p.memory->size();
      auto latest = latest_.find(p.group);
      if (latest != latest_.end()) {
        std::deque<std::string>& tokens = latest->second;
        tokens.erase(std::remove(tokens.begin(), tokens.end(), it->first),
                     tokens.end());
        if (tokens.empty()) latest_.erase(latest);
      }
      dropped.push_back(std::move(p.memory));
      published_.erase(it++);
    } else {
      ++it;
    }
  }
}

uint64_t GroupBuffers::bytes_alive() const {
  absl::MutexLock l(&mu_);
  return bytes_alive_;
}

size_t GroupBuffers::published() const {
  absl::MutexLock l(&mu_);
  return published_.size() + lent_.size();
}

}  // namespace ckptd::daemon
