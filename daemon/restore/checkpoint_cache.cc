// Copyright 2026 The ckptd Authors.
#include "daemon/restore/checkpoint_cache.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/status_macros.h"
#include "daemon/restore/counting_env.h"
#include "daemon/restore/peer_env.h"
#include "daemon/restore/restore_types.h"
#include "fmt/format.h"
#include "format/metadata/metadata_json.h"

namespace ckptd::daemon {
namespace {

absl::StatusOr<FileAccess> Lstat(const std::string& path, bool want_dir) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT)
      return absl::NotFoundError(fmt::format("{}: missing", path));
    return absl::ErrnoToStatus(err, fmt::format("lstat {}", path));
  }
  if (S_ISLNK(st.st_mode) ||
      (want_dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))) {
    return absl::PermissionDeniedError(fmt::format(
        "{} is {}: the daemon restores only from regular files in a real "
        "directory (no symbolic links)",
        path, S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file"));
  }
  return FileAccess{path, st.st_uid, st.st_gid,
                    static_cast<uint32_t>(st.st_mode & 07777)};
}

}  // namespace

absl::StatusOr<std::string> MetadataIdentity(const std::string& dir) {
  // The identity the memory tier records at commit (memory_tier.h).
  absl::StatusOr<std::string> id =
      StatIdentity(dir + "/.metadata", /*with_ctime=*/false);
  if (absl::IsNotFound(id.status()) ||
      absl::IsFailedPrecondition(id.status())) {
    return absl::NotFoundError(
        fmt::format("checkpoint {} has no .metadata (not committed, or not a "
                    "checkpoint)",
                    dir));
  }
  return id;
}

std::vector<uint32_t> GroupsOf(uint32_t uid) {
  std::vector<char> buf(16384);
  struct passwd pw, *result = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &result) != 0 ||
      result == nullptr) {
    return {};
  }
  int n = 64;
  std::vector<gid_t> groups(n);
  if (::getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    groups.resize(n);
    if (::getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) return {};
  }
  return std::vector<uint32_t>(groups.begin(), groups.begin() + n);
}

absl::Status MayRead(const CachedCheckpoint& ckpt, uint32_t uid,
                     const std::vector<uint32_t>& groups) {
  if (uid == 0) return absl::OkStatus();
  for (const FileAccess& f : ckpt.files) {
    bool ok;
    if (f.uid == uid) {
      ok = (f.mode & S_IRUSR) != 0;
    } else if (std::find(groups.begin(), groups.end(), f.gid) != groups.end()) {
      ok = (f.mode & S_IRGRP) != 0;
    } else {
      ok = (f.mode & S_IROTH) != 0;
    }
    if (!ok) {
      return absl::PermissionDeniedError(fmt::format(
          "uid {} may not read {} (owner {}:{}, mode {:04o}): the daemon "
          "restores only what the caller could read itself",
          uid, f.path, f.uid, f.gid, f.mode));
    }
  }
  return absl::OkStatus();
}

// The Envs the reader opens `ckpt`'s data files through, bottom up: the
// counting Env (bytes read from storage), other daemons' memory, this
// daemon's memory tier.
void CheckpointCache::StackEnvs(CachedCheckpoint& ckpt,
                                format::CheckpointReaderOptions& ro) const {
  if (options_.observer != nullptr) {
    ckpt.counting_env = NewFileReadCountingEnv(
        ro.env != nullptr ? ro.env : Env::Default(), options_.observer);
    ro.env = ckpt.counting_env.get();
  }
  const std::string metadata = PortableIdentity(ckpt.identity);
  if (options_.peers != nullptr) {
    // What other daemons hold in memory: read from them, not storage.
    std::vector<PeerHeldFile> shared =
        options_.peers->Locate(ckpt.dir, metadata);
    if (!shared.empty()) {
      ckpt.peer_files = shared.size();
      ckpt.peer_env = NewPeerEnv(ro.env != nullptr ? ro.env : Env::Default(),
                                 {.source = options_.peers,
                                  .dir = ckpt.dir,
                                  .metadata = metadata,
                                  .files = std::move(shared),
                                  .only_missing = options_.peers_only_missing,
                                  .observer = options_.observer,
                                  .fetched = &ckpt.peer_bytes});
      ro.env = ckpt.peer_env.get();
    }
  }
  if (options_.tier != nullptr) {
    // This node's own files of it, and replicas it holds of other nodes'.
    std::vector<std::shared_ptr<const TierCheckpoint>> held;
    if (std::shared_ptr<const TierCheckpoint> own =
            options_.tier->Find(ckpt.identity)) {
      held.push_back(std::move(own));
    }
    for (auto& h : options_.tier->FindShares(ckpt.dir, metadata)) {
      if (!h->replica_of.empty()) held.push_back(std::move(h));
    }
    if (!held.empty()) {
      // Its data files read from memory (while held and unchanged).
      ckpt.tier_env = NewTierEnv(ro.env != nullptr ? ro.env : Env::Default(),
                                 options_.tier, held, ckpt.dir);
      ro.env = ckpt.tier_env.get();
      for (const auto& h : held) ckpt.tier_bytes += h->bytes;
      ckpt.tier = options_.tier;
    }
  }
}

absl::StatusOr<std::shared_ptr<const CachedCheckpoint>> CheckpointCache::Load(
    const std::string& dir, const std::string& identity) {
  auto ckpt = std::make_shared<CachedCheckpoint>();
  ckpt->dir = dir;
  ckpt->identity = identity;
  ASSIGN_OR_RETURN(FileAccess d, Lstat(dir, /*want_dir=*/true));
  ckpt->files.push_back(std::move(d));
  ASSIGN_OR_RETURN(FileAccess m, Lstat(dir + "/.metadata", false));
  ckpt->files.push_back(std::move(m));
  format::CheckpointReaderOptions ro = options_.reader;
  StackEnvs(*ckpt, ro);
  ASSIGN_OR_RETURN(ckpt->reader, format::CheckpointReader::Open(dir, ro));
  const format::CompactMetadata& md = ckpt->reader->compact();
  absl::flat_hash_set<std::string_view> seen;
  for (const auto& s : md.storage_entries()) {
    const std::string_view rel = md.relative_path(s);
    if (!seen.insert(rel).second) continue;
    if (!format::IsSafeRelativePath(rel)) continue;  // the reader refuses it
    absl::StatusOr<FileAccess> f = Lstat(dir + "/" + std::string(rel), false);
    if (absl::IsNotFound(f.status())) continue;  // DATA_LOSS when read
    RETURN_IF_ERROR(f.status());
    ckpt->files.push_back(*std::move(f));
    // Opened now, right after the check (the reader keeps it open).
    absl::StatusOr<const RandomAccessFile*> opened =
        ckpt->reader->OpenFile(std::string(rel));
    if (!opened.ok() && !absl::IsNotFound(opened.status())) {
      return opened.status();
    }
  }
  // Bytes items stored with a transform (zstd): their size is what they
  // decode to (the ranks' slots are sized from it).
  absl::flat_hash_map<size_t, int64_t> decoded;
  for (size_t i = 0; i < md.num_items(); ++i) {
    const format::CompactMetadata::Storage* s = md.bytes_storage(i);
    if (md.item(i).tensor || s == nullptr ||
        s->transforms == format::CompactMetadata::kNone) {
      continue;
    }
    ASSIGN_OR_RETURN(std::string bytes,
                     ckpt->reader->ReadBytesItem(md.fqn(i), false));
    decoded[i] = static_cast<int64_t>(bytes.size());
  }
  std::string index = format::MetadataJson(dir, md, /*chunks=*/false,
                                           /*bytes_sizes=*/true, &decoded);
  if (ckpt->tier_bytes > 0) {
    // What the tier held of it at the decode: a client may then cut smaller
    // batches (its whole records are lent, not read into its arena).
    index.pop_back();  // the closing brace
    index += fmt::format(",\"memory_tier_bytes\":{}}}", ckpt->tier_bytes);
  }
  ckpt->index_json = std::make_shared<const std::string>(std::move(index));
  return std::shared_ptr<const CachedCheckpoint>(std::move(ckpt));
}

void CheckpointCache::TouchLocked(const std::string& dir) {
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    if (it->first == dir) {
      lru_.splice(lru_.begin(), lru_, it);
      return;
    }
  }
}

void CheckpointCache::Get(const std::string& dir, Callback done) {
  absl::StatusOr<std::string> identity = MetadataIdentity(dir);
  if (!identity.ok()) {
    std::move(done)(std::move(identity).status());
    return;
  }
  std::shared_ptr<const CachedCheckpoint> hit;
  {
    absl::MutexLock l(&mu_);
    TouchLocked(dir);
    Entry* e = !lru_.empty() && lru_.front().first == dir ? &lru_.front().second
                                                          : nullptr;
    if (e != nullptr && e->ckpt == nullptr) {  // being decoded: wait for it
      e->waiters.push_back(std::move(done));
      return;
    }
    if (e != nullptr && e->identity == *identity) {
      hit = e->ckpt;
    } else {
      // Not cached, or cached with another identity: decode it here.
      if (e != nullptr) lru_.pop_front();
      lru_.emplace_front(dir, Entry{*identity, nullptr, {}});
      lru_.front().second.waiters.push_back(std::move(done));
      while (static_cast<int>(lru_.size()) > std::max(1, options_.capacity) &&
             lru_.back().second.ckpt != nullptr) {
        lru_.pop_back();
      }
    }
  }
  if (hit != nullptr) {
    std::move(done)(std::move(hit));
    return;
  }
  absl::StatusOr<std::shared_ptr<const CachedCheckpoint>> loaded =
      Load(dir, *identity);
  std::vector<Callback> waiters;
  {
    absl::MutexLock l(&mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->first != dir || it->second.identity != *identity ||
          it->second.ckpt != nullptr) {
        continue;
      }
      waiters.swap(it->second.waiters);
      if (loaded.ok()) {
        it->second.ckpt = *loaded;
      } else {
        lru_.erase(it);  // the next request tries again
      }
      break;
    }
  }
  for (Callback& w : waiters) {
    if (loaded.ok()) {
      w(*loaded);
    } else {
      w(OwnStatus(loaded.status()));
    }
  }
}

int CheckpointCache::size() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(lru_.size());
}

}  // namespace ckptd::daemon
