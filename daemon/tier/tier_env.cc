// Copyright 2026 The ckptd Authors.
//
// Serving held checkpoints: an Env whose held data files read from memory
// (memory_tier.h NewTierEnv, HeldBytesOf).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "common/absl_fmt.h"
#include "common/status_macros.h"
#include "daemon/tier/memory_tier.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

// The part of `path` after "`dir`/"; empty if `path` is not below `dir`.
std::string RelativeTo(const std::string& dir, const std::string& path) {
  if (path.size() <= dir.size() + 1 || path.compare(0, dir.size(), dir) != 0 ||
      path[dir.size()] != '/') {
    return "";
  }
  return path.substr(dir.size() + 1);
}

class HeldFile : public RandomAccessFile {
 public:
  std::shared_ptr<const TierFileBytes> bytes() const { return bytes_.lock(); }

  // `disk` null: the file is not on storage (a replica of a file that went
  // with its node); then the held bytes are the only copy.
  HeldFile(MemoryTier* tier, std::weak_ptr<const TierFileBytes> bytes,
           std::unique_ptr<RandomAccessFile> disk, std::string path,
           uint64_t size)
      : tier_(tier),
        bytes_(std::move(bytes)),
        disk_(std::move(disk)),
        path_(std::move(path)),
        size_(size) {}

  absl::Status ReadExact(uint64_t offset, size_t n,
                         char* scratch) const override {
    if (std::shared_ptr<const TierFileBytes> b = bytes_.lock();
        b != nullptr && offset + n <= b->size) {
      RETURN_IF_ERROR(b->CopyOut(offset, n, scratch));
      tier_->CountServed(n);
      return absl::OkStatus();
    }
    if (disk_ == nullptr) return Gone(offset, n);
    return disk_->ReadExact(offset, n, scratch);  // evicted
  }
  absl::StatusOr<uint32_t> Crc32(uint64_t offset, uint64_t n) const override {
    if (std::shared_ptr<const TierFileBytes> b = bytes_.lock();
        b != nullptr && offset + n <= b->size) {
      ASSIGN_OR_RETURN(const uint32_t crc, b->Crc32(offset, n));
      tier_->CountServed(n);  // checked from memory, not read from storage
      return crc;
    }
    if (disk_ == nullptr) return Gone(offset, n);
    return disk_->Crc32(offset, n);  // evicted
  }
  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  absl::Status Gone(uint64_t offset, uint64_t n) const {
    if (bytes_.lock() != nullptr) {
      return absl::OutOfRangeError(fmt::format(
          "{}: [{}, +{}) is past its end ({} bytes)", path_, offset, n, size_));
    }
    return absl::DataLossError(fmt::format(
        "{} is not on storage, and the memory tier no longer holds its "
        "replica",
        path_));
  }
  MemoryTier* const tier_;
  const std::weak_ptr<const TierFileBytes> bytes_;
  const std::unique_ptr<RandomAccessFile> disk_;
  const std::string path_;
  const uint64_t size_;
};

class TierEnv : public EnvWrapper {
 public:
  struct Held {
    std::string identity;  // replica: PortableIdentity
    bool replica = false;
    uint64_t size = 0;
    std::weak_ptr<const TierFileBytes> bytes;
  };
  TierEnv(Env* base, MemoryTier* tier,
          absl::flat_hash_map<std::string, Held> files, std::string dir)
      : EnvWrapper(base),
        tier_(tier),
        files_(std::move(files)),
        dir_(std::move(dir)) {}

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    auto it = files_.find(RelativeTo(dir_, path));
    if (it == files_.end()) return base()->NewRandomAccessFile(path);
    const Held& h = it->second;
    // The identity before and after opening: the file opened is the one
    // the tier holds (written by this daemon, or by the node whose replica
    // it is, and unchanged since the commit).
    absl::StatusOr<std::string> before = FileIdentity(path);
    if (h.replica && absl::IsNotFound(before.status())) {
      // Gone from storage with its node: the replica is the copy.
      return std::unique_ptr<RandomAccessFile>(
          std::make_unique<HeldFile>(tier_, h.bytes, nullptr, path, h.size));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> disk,
                     base()->NewRandomAccessFile(path));
    absl::StatusOr<std::string> after = FileIdentity(path);
    auto same = [&](const absl::StatusOr<std::string>& id) {
      return id.ok() && (h.replica ? PortableIdentity(*id) : *id) == h.identity;
    };
    if (!same(before) || !same(after)) {
      spdlog::warn(
          "memory tier: {} changed since its commit; reading it from storage",
          path);
      return disk;
    }
    const uint64_t size = disk->Size();
    return std::unique_ptr<RandomAccessFile>(std::make_unique<HeldFile>(
        tier_, h.bytes, std::move(disk), path, size));
  }

 private:
  MemoryTier* const tier_;
  const absl::flat_hash_map<std::string, Held> files_;
  const std::string dir_;
};

}  // namespace

std::shared_ptr<const TierFileBytes> HeldBytesOf(const RandomAccessFile* file) {
  const auto* held = dynamic_cast<const HeldFile*>(file);
  return held == nullptr ? nullptr : held->bytes();
}

std::unique_ptr<Env> NewTierEnv(Env* base, MemoryTier* tier,
                                std::shared_ptr<const TierCheckpoint> held,
                                std::string dir) {
  std::vector<std::shared_ptr<const TierCheckpoint>> all;
  all.push_back(std::move(held));
  return NewTierEnv(base, tier, all, std::move(dir));
}

std::unique_ptr<Env> NewTierEnv(
    Env* base, MemoryTier* tier,
    const std::vector<std::shared_ptr<const TierCheckpoint>>& held,
    std::string dir) {
  // Only weak references: what the tier evicts is freed even while a
  // decoded checkpoint keeps this Env. This node's own files first: a
  // replica never stands in for a file this node holds itself.
  absl::flat_hash_map<std::string, TierEnv::Held> files;
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& h : held) {
      const bool replica = !h->replica_of.empty();
      if (replica != (pass == 1)) continue;
      for (const auto& [name, f] : h->files) {
        files.try_emplace(
            name,
            TierEnv::Held{replica ? PortableIdentity(f->identity) : f->identity,
                          replica, f->size, f});
      }
    }
  }
  return std::make_unique<TierEnv>(base, tier, std::move(files),
                                   std::move(dir));
}

}  // namespace ckptd::daemon
