// Copyright 2026 The ckptd Authors.
#include "daemon/restore/peer_env.h"

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/tier/memory_tier.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

struct Shared {
  PeerEnvOptions options;
};

// One data file read from its holders; `disk` (null: not on storage) takes
// over from the first failure on.
class PeerFile : public RandomAccessFile {
 public:
  PeerFile(std::shared_ptr<const Shared> shared, const PeerHeldFile* held,
           std::string path, std::unique_ptr<RandomAccessFile> disk)
      : shared_(std::move(shared)),
        held_(held),
        path_(std::move(path)),
        disk_(std::move(disk)) {}

  absl::Status ReadExact(uint64_t offset, size_t n,
                         char* scratch) const override {
    if (offset + n > held_->size) {
      return absl::OutOfRangeError(
          fmt::format("{}: [{}, +{}) is past its end ({} bytes)", path_, offset,
                      n, held_->size));
    }
    const PeerEnvOptions& o = shared_->options;
    absl::Status last;
    for (size_t i = Start(); i < held_->holders.size(); ++i) {
      const std::string& holder = held_->holders[i];
      last = o.source->Fetch(holder, o.dir, o.metadata, held_->file, offset, n,
                             scratch);
      if (last.ok()) {
        if (o.observer != nullptr) o.observer->RestorePeerBytesRead(n);
        if (o.fetched != nullptr) o.fetched->fetch_add(n);
        return absl::OkStatus();
      }
      Failed(i, holder, last);
    }
    if (disk_ != nullptr) return disk_->ReadExact(offset, n, scratch);
    return absl::DataLossError(fmt::format(
        "{} is not on storage and no daemon holding it in memory could "
        "serve it (tried {}; last: {})",
        path_, absl::StrJoin(held_->holders, ", "), last.message()));
  }
  uint64_t Size() const override { return held_->size; }
  const std::string& path() const override { return path_; }

 private:
  // The first holder not yet failed.
  size_t Start() const {
    absl::MutexLock l(&mu_);
    return failed_;
  }
  void Failed(size_t i, const std::string& holder,
              const absl::Status& s) const {
    absl::MutexLock l(&mu_);
    if (i < failed_) return;
    failed_ = i + 1;
    spdlog::warn("restore of {}: {} failed to serve {} ({}); {}",
                 shared_->options.dir, holder, held_->file, s,
                 failed_ < held_->holders.size()
                     ? fmt::format("trying {}", held_->holders[failed_])
                 : disk_ != nullptr ? std::string("reading it from storage")
                                    : std::string("no other copy"));
  }

  const std::shared_ptr<const Shared> shared_;
  const PeerHeldFile* const held_;  // in shared_
  const std::string path_;
  const std::unique_ptr<RandomAccessFile> disk_;
  mutable absl::Mutex mu_;
  mutable size_t failed_ ABSL_GUARDED_BY(mu_) = 0;  // holders given up on
};

class PeerEnv : public EnvWrapper {
 public:
  PeerEnv(Env* base, PeerEnvOptions options)
      : EnvWrapper(base), shared_(std::make_shared<Shared>()) {
    auto& s = const_cast<Shared&>(*shared_);
    s.options = std::move(options);
    for (const PeerHeldFile& f : s.options.files) by_path_[f.file] = &f;
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    const std::string& dir = shared_->options.dir;
    const PeerHeldFile* held = nullptr;
    if (path.size() > dir.size() + 1 && path.compare(0, dir.size(), dir) == 0 &&
        path[dir.size()] == '/') {
      auto it = by_path_.find(path.substr(dir.size() + 1));
      if (it != by_path_.end()) held = it->second;
    }
    if (held == nullptr) return base()->NewRandomAccessFile(path);
    absl::StatusOr<std::string> id = FileIdentity(path);
    if (absl::IsNotFound(id.status())) {
      return std::unique_ptr<RandomAccessFile>(
          std::make_unique<PeerFile>(shared_, held, path, nullptr));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> disk,
                     base()->NewRandomAccessFile(path));
    if (shared_->options.only_missing || !id.ok() ||
        PortableIdentity(*id) != held->identity) {
      if (id.ok() && PortableIdentity(*id) != held->identity) {
        spdlog::warn(
            "restore of {}: {} on storage is not the file its holders hold "
            "in memory (it changed since the commit); reading it from "
            "storage",
            dir, path);
      }
      return disk;
    }
    return std::unique_ptr<RandomAccessFile>(
        std::make_unique<PeerFile>(shared_, held, path, std::move(disk)));
  }

 private:
  const std::shared_ptr<const Shared> shared_;
  absl::flat_hash_map<std::string, const PeerHeldFile*> by_path_;
};

}  // namespace

std::unique_ptr<Env> NewPeerEnv(Env* base, PeerEnvOptions options) {
  return std::make_unique<PeerEnv>(base, std::move(options));
}

}  // namespace ckptd::daemon
