// Copyright 2026 The ckptd Authors.
#include "daemon/tier/memory_tier.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "common/absl_fmt.h"
#include "common/crc32.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/tier/tier_store.h"
#include "fmt/format.h"
#include "shm/huge_pages.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

constexpr uint64_t kBlock = TierFileBytes::kBlockBytes;

// The key of `h` in held_: its .metadata identity, and for a replica the
// node whose share it is (a node holds its own files and replicas of the
// same checkpoint side by side).
std::string HeldKey(const TierCheckpoint& h) {
  if (h.replica_of.empty()) return h.metadata_identity;
  return fmt::format("{}#replica-of-{}", h.metadata_identity, h.replica_node);
}

// `held` in the order eviction takes them: those that are not of their
// job's newest checkpoint, oldest first (replicas before this node's own
// files, at equal age), then those of the newest, oldest first, this
// node's own files before replicas (a replica of a job's newest is evicted
// last: it may be the only copy in memory of a lost node's share). Ties by
// key. Evicting one never makes another its job's newest before the newest
// ones are reached. Adoption keeps them in the reverse order.
std::vector<const TierCheckpoint*> EvictionOrder(
    std::vector<const TierCheckpoint*> held) {
  // A job's newest: of this node's own checkpoints (a replica can arrive
  // late), of its replicas where it has none.
  absl::flat_hash_map<std::string_view, const TierCheckpoint*> newest;
  for (bool replicas : {false, true}) {
    absl::flat_hash_map<std::string_view, const TierCheckpoint*> pass;
    for (const TierCheckpoint* h : held) {
      if (h->replica_of.empty() == replicas || newest.contains(h->job))
        continue;
      auto [it, fresh] = pass.try_emplace(h->job, h);
      if (!fresh && h->committed > it->second->committed) it->second = h;
    }
    newest.insert(pass.begin(), pass.end());
  }
  auto key = [&](const TierCheckpoint* h) {
    const bool of_newest = newest[h->job]->dir == h->dir;
    const bool replica = !h->replica_of.empty();
    return std::make_tuple(of_newest, of_newest == replica, h->committed,
                           HeldKey(*h));
  };
  std::sort(held.begin(), held.end(),
            [&](const TierCheckpoint* a, const TierCheckpoint* b) {
              return key(a) < key(b);
            });
  return held;
}

}  // namespace

absl::StatusOr<std::string> StatIdentity(const std::string& path,
                                         bool with_ctime, uint64_t* size) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    return absl::ErrnoToStatus(err, fmt::format("stat {}", path));
  }
  if (size != nullptr) *size = static_cast<uint64_t>(st.st_size);
  std::string id =
      fmt::format("{}:{}:{}:{}", st.st_dev, st.st_ino, st.st_size,
                  int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec);
  if (with_ctime) {
    id += fmt::format(
        ":{}", int64_t{st.st_ctim.tv_sec} * 1000000000 + st.st_ctim.tv_nsec);
  }
  return id;
}

std::string PortableIdentity(std::string_view identity) {
  // Drops "dev:ino:" (which differ between the nodes of a shared file
  // system), keeps the rest.
  const size_t first = identity.find(':');
  if (first == std::string_view::npos) return "";
  const size_t second = identity.find(':', first + 1);
  if (second == std::string_view::npos) return "";
  return std::string(identity.substr(second + 1));
}

absl::StatusOr<std::string> FileIdentity(const std::string& path,
                                         uint64_t* size) {
  return StatIdentity(path, /*with_ctime=*/true, size);
}

absl::Status TierFileBytes::Write(std::string_view bytes) {
  if (!fd.valid()) {
    fd = shm::OwnedFd(::memfd_create(fmt::format("ckptd-tier:{}", name).c_str(),
                                     MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!fd.valid()) return absl::ErrnoToStatus(errno, "memfd_create");
  }
  while (!bytes.empty()) {
    const ssize_t n = ::pwrite(fd.get(), bytes.data(), bytes.size(),
                               static_cast<off_t>(size));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::ErrnoToStatus(n < 0 ? errno : ENOSPC,
                                 fmt::format("writing {} to memory", name));
    }
    size += static_cast<uint64_t>(n);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  while (!small_pages && size - huge_bytes >= kHugeBytes) {
    absl::Status s =
        shm::CollapseToHugePage(fd.get(), huge_bytes, [&](const char* page) {
          for (uint64_t at = 0; at < kHugeBytes; at += kCrcPieceBytes) {
            piece_crcs.push_back(ckptd::Crc32(0, page + at, kCrcPieceBytes));
          }
        });
    if (!s.ok()) {
      small_pages = true;
      static std::once_flag logged;
      std::call_once(logged, [&] {
        spdlog::info(
            "memory tier: held files stay in 4 KiB pages ({}); restores "
            "from memory fault once per page",
            s);
      });
      break;
    }
    huge_bytes += kHugeBytes;
  }
  return absl::OkStatus();
}

absl::Status TierFileBytes::Seal() {
  if (!fd.valid() || size == 0) return absl::OkStatus();
  if (in_store) {
    sealed = true;  // written by nothing after the commit (tier_store.h)
    return absl::OkStatus();
  }
  if (::fcntl(fd.get(), F_ADD_SEALS,
              F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) != 0) {
    return absl::ErrnoToStatus(errno, fmt::format("sealing {}", name));
  }
  sealed = true;
  return absl::OkStatus();
}

TierFileBytes::~TierFileBytes() {
  absl::MutexLock l(&map_mu_);
  if (mapped_ != nullptr) ::munmap(const_cast<char*>(mapped_), size);
}

absl::StatusOr<const char*> TierFileBytes::Mapping() const {
  if (small_pages || huge_bytes == 0 || !fd.valid() || size == 0) {
    return absl::UnimplementedError(
        fmt::format("{} is not held in huge pages", name));
  }
  absl::MutexLock l(&map_mu_);
  if (mapped_ == nullptr) {
    ASSIGN_OR_RETURN(mapped_, shm::MapReadOnlyAligned(fd.get(), 0, size));
  }
  return mapped_;
}

absl::Status TierFileBytes::CopyOut(uint64_t offset, size_t n,
                                    char* dst) const {
  const PreadResult r = PreadFull(fd.get(), offset, n, dst);
  if (r.done < n) {
    return absl::ErrnoToStatus(r.error != 0 ? r.error : EIO,
                               fmt::format("reading {} from memory", name));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> TierFileBytes::Crc32(uint64_t offset,
                                              uint64_t n) const {
  constexpr size_t kBuffer = size_t{256} << 10;
  std::unique_ptr<char[]> buf;
  uint32_t crc = 0;
  // Extends `crc` over [at, at + len), read with CopyOut.
  auto read = [&](uint64_t at, uint64_t len) -> absl::Status {
    if (len > 0 && buf == nullptr) buf.reset(new char[kBuffer]);
    while (len > 0) {
      const size_t piece = std::min<uint64_t>(len, kBuffer);
      RETURN_IF_ERROR(CopyOut(at, piece, buf.get()));
      crc = ckptd::Crc32(crc, buf.get(), piece);
      at += piece;
      len -= piece;
    }
    return absl::OkStatus();
  };
  const uint64_t end = offset + n;
  // The whole pieces in the range with a CRC: [first, last) in pieces.
  constexpr uint64_t kPiece = kCrcPieceBytes;
  const uint64_t first = (offset + kPiece - 1) / kPiece;
  const uint64_t last = std::min<uint64_t>(end / kPiece, piece_crcs.size());
  if (first >= last) {
    RETURN_IF_ERROR(read(offset, n));
    return crc;
  }
  RETURN_IF_ERROR(read(offset, first * kPiece - offset));
  const uint32_t shift = Crc32ShiftFor(kPiece);
  for (uint64_t i = first; i < last; ++i) {
    crc = Crc32Shift(crc, shift) ^ piece_crcs[i];
  }
  RETURN_IF_ERROR(read(last * kPiece, end - last * kPiece));
  return crc;
}

// ---------------------------------------------------------------------------
// Capture: a tee in front of a rank writer's file
// ---------------------------------------------------------------------------

class TeeFile : public WritableFile {
 public:
  TeeFile(std::shared_ptr<TierCapture> capture,
          std::shared_ptr<TierFileBytes> bytes,
          std::unique_ptr<WritableFile> file)
      : capture_(std::move(capture)),
        bytes_(std::move(bytes)),
        file_(std::move(file)) {}

  absl::Status Append(std::string_view data) override {
    RETURN_IF_ERROR(file_->Append(data));
    Keep(data);
    return absl::OkStatus();
  }
  absl::Status AppendV(absl::Span<const std::string_view> parts) override {
    RETURN_IF_ERROR(file_->AppendV(parts));
    for (std::string_view p : parts) Keep(p);
    return absl::OkStatus();
  }
  absl::Status Sync() override { return file_->Sync(); }
  absl::Status Close() override { return file_->Close(); }
  uint64_t Size() const override { return file_->Size(); }
  const std::string& path() const override { return file_->path(); }

 private:
  void Keep(std::string_view data) {
    if (keeping_) keeping_ = capture_->Append(*bytes_, data);
  }
  const std::shared_ptr<TierCapture> capture_;
  const std::shared_ptr<TierFileBytes> bytes_;  // filled by this file only
  const std::unique_ptr<WritableFile> file_;
  bool keeping_ = true;
};

TierCapture::~TierCapture() {
  uint64_t give_back = 0;
  {
    absl::MutexLock l(&mu_);
    if (!committed_) give_back = reserved_;
  }
  if (give_back > 0) tier_->Unreserve(give_back);
}

std::unique_ptr<WritableFile> TierCapture::Tee(
    std::string name, std::unique_ptr<WritableFile> file) {
  if (dropped()) return file;
  auto bytes = std::make_shared<TierFileBytes>();
  bytes->name = std::move(name);
  if (tier_->store_ != nullptr) {
    absl::StatusOr<shm::OwnedFd> fd = tier_->store_->NewFile();
    if (!fd.ok()) {
      dropped_.store(true);
      spdlog::warn("memory tier: {} is not kept in memory: {}", dir_,
                   fd.status());
      return file;
    }
    bytes->fd = *std::move(fd);
    bytes->in_store = true;
  }
  {
    absl::MutexLock l(&mu_);
    files_.push_back(bytes);
  }
  // The tee shares the capture: a writer outliving its checkpoint's
  // capture keeps it (and its reservation) until the file is gone.
  return std::make_unique<TeeFile>(shared_from_this(), bytes, std::move(file));
}

std::shared_ptr<TierFileBytes> TierCapture::NewFile(std::string name) {
  auto bytes = std::make_shared<TierFileBytes>();
  bytes->name = std::move(name);
  absl::MutexLock l(&mu_);
  files_.push_back(bytes);
  return bytes;
}

bool TierCapture::Append(TierFileBytes& file, std::string_view data) {
  if (dropped()) return false;
  // Budget for the file's new size, in blocks doubling up to kBlock.
  while (file.capacity < file.size + data.size()) {
    const uint64_t block = file.last_block == 0
                               ? TierFileBytes::kFirstBlockBytes
                               : std::min(kBlock, 2 * file.last_block);
    if (!tier_->Reserve(block)) {
      dropped_.store(true);
      spdlog::info(
          "memory tier: {} is not kept in memory (memory_tier_bytes {} is "
          "taken)",
          dir_, tier_->budget());
      return false;
    }
    {
      absl::MutexLock l(&mu_);
      reserved_ += block;
    }
    file.capacity += block;
    file.last_block = block;
  }
  if (absl::Status s = file.Write(data); !s.ok()) {
    dropped_.store(true);
    spdlog::warn("memory tier: {} is not kept in memory: {}", dir_, s);
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------
// The tier
// ---------------------------------------------------------------------------

MemoryTier::MemoryTier(MemoryTierOptions options)
    : options_(std::move(options)) {}

// The store stays as it is: the next daemon adopts it.
MemoryTier::~MemoryTier() = default;

std::shared_ptr<TierCapture> MemoryTier::Begin(const std::string& dir,
                                               const std::string& job) {
  if (!enabled()) return nullptr;
  return std::shared_ptr<TierCapture>(new TierCapture(this, dir, job));
}

bool MemoryTier::Reserve(uint64_t n) {
  std::vector<std::shared_ptr<const TierCheckpoint>> freed;
  bool ok;
  {
    absl::MutexLock l(&mu_);
    ok = ReserveLocked(n, freed);
  }
  for (const auto& f : freed) {
    spdlog::info("memory tier: evicted {} ({} bytes)", f->dir, f->bytes);
  }
  Forget(freed);  // outside the lock
  return ok;
}

void MemoryTier::Forget(
    std::vector<std::shared_ptr<const TierCheckpoint>>& freed) {
  for (const auto& f : freed) {
    if (!f->entry.empty()) TierStore::Remove(f->entry);
  }
  freed.clear();
}

bool MemoryTier::ReserveLocked(
    uint64_t n, std::vector<std::shared_ptr<const TierCheckpoint>>& freed) {
  if (n > options_.budget) return false;
  if (used_ + n > options_.budget) {
    std::vector<const TierCheckpoint*> all;
    all.reserve(held_.size());
    for (const auto& [id, h] : held_) all.push_back(h.get());
    for (const TierCheckpoint* victim : EvictionOrder(std::move(all))) {
      if (used_ + n <= options_.budget) break;
      auto it = held_.find(HeldKey(*victim));
      used_ -= it->second->bytes;
      freed.push_back(std::move(it->second));
      held_.erase(it);
    }
    // Only captures still use the budget.
    if (used_ + n > options_.budget) return false;
  }
  used_ += n;
  return true;
}

void MemoryTier::Unreserve(uint64_t n) {
  absl::MutexLock l(&mu_);
  used_ -= std::min(used_, n);
}

std::shared_ptr<const TierCheckpoint> MemoryTier::Commit(
    std::shared_ptr<TierCapture> capture, const std::string& io_dir) {
  if (capture == nullptr) return nullptr;
  auto held = std::make_shared<TierCheckpoint>();
  held->dir = capture->dir_;
  held->job = capture->job_;
  held->committed = options_.clock->Now();
  std::vector<std::shared_ptr<TierFileBytes>> files;
  {
    absl::MutexLock l(&capture->mu_);
    files = capture->files_;
  }
  absl::Status s = capture->dropped() ? absl::ResourceExhaustedError("no room")
                                      : absl::OkStatus();
  if (s.ok()) {
    absl::StatusOr<std::string> md = StatIdentity(io_dir + "/.metadata",
                                                  /*with_ctime=*/false);
    s = md.status();
    if (md.ok()) held->metadata_identity = *std::move(md);
  }
  for (const auto& f : files) {
    if (!s.ok()) break;
    uint64_t size = 0;
    absl::StatusOr<std::string> id =
        FileIdentity(io_dir + "/" + f->name, &size);
    if (!id.ok()) {
      s = id.status();
    } else if (size != f->size) {
      s = absl::InternalError(fmt::format("{}: {} bytes kept, the file has {}",
                                          f->name, f->size, size));
    } else if (absl::Status sealed = f->Seal(); !sealed.ok()) {
      s = sealed;
    } else {
      f->identity = *std::move(id);
      held->bytes += f->capacity;
      held->files.emplace(f->name, f);
    }
  }
  if (s.ok() && store_ != nullptr) Persist(*held, files);
  std::vector<std::shared_ptr<const TierCheckpoint>> freed;
  {
    absl::MutexLock l(&mu_);
    absl::MutexLock cl(&capture->mu_);
    capture->committed_ = true;
    used_ -= std::min(used_, capture->reserved_);
    DropLocked(held->dir, freed);
    if (s.ok()) {
      used_ += held->bytes;
      held_[held->metadata_identity] = held;
    }
  }
  Forget(freed);
  if (s.ok()) {
    spdlog::info("memory tier: holding {} ({} bytes in {} files)", held->dir,
                 held->bytes, held->files.size());
    return held;
  }
  if (!capture->dropped()) {
    spdlog::warn("memory tier: not holding {}: {}", held->dir, s);
  }
  return nullptr;
}

void MemoryTier::Persist(
    TierCheckpoint& held,
    const std::vector<std::shared_ptr<TierFileBytes>>& files) {
  TierManifest m;
  m.dir = held.dir;
  m.job = held.job;
  m.metadata_identity = held.metadata_identity;
  m.committed_ms = absl::ToUnixMillis(held.committed);
  std::vector<int> fds;
  absl::Status s;
  for (const auto& f : files) {
    if (!f->fd.valid()) continue;  // an empty file: nothing to hold
    absl::StatusOr<uint32_t> crc = f->Crc32(0, f->size);
    if (!crc.ok()) {
      s = crc.status();
      break;
    }
    m.files.push_back({f->name, "", f->identity, f->size, f->capacity, *crc});
    fds.push_back(f->fd.get());
  }
  absl::StatusOr<std::string> entry =
      s.ok() ? store_->Persist(m, fds) : absl::StatusOr<std::string>(s);
  if (!entry.ok()) {
    spdlog::warn(
        "memory tier: {} is held, but not in a form the next daemon can "
        "adopt: {}",
        held.dir, entry.status());
    return;
  }
  held.entry = *std::move(entry);
}

void MemoryTier::Drop(const std::string& dir) {
  std::vector<std::shared_ptr<const TierCheckpoint>> freed;
  {
    absl::MutexLock l(&mu_);
    DropLocked(dir, freed);
  }
  Forget(freed);
}

std::shared_ptr<TierCapture> MemoryTier::BeginReplica(const std::string& dir,
                                                      const std::string& job) {
  return Begin(dir, job);  // its files are memfds (NewFile), never stored
}

absl::Status MemoryTier::HoldReplica(std::shared_ptr<TierCapture> capture,
                                     const ReplicaOf& of) {
  auto held = std::make_shared<TierCheckpoint>();
  held->dir = capture->dir_;
  held->job = capture->job_;
  held->committed = options_.clock->Now();
  if (std::shared_ptr<const TierCheckpoint> own = Find(of.metadata_identity))
    held->committed = own->committed;  // as old as the checkpoint here
  held->metadata_identity = of.metadata_identity;
  held->replica_of = of.node_name;
  held->replica_node = of.node;
  std::vector<std::shared_ptr<TierFileBytes>> files;
  {
    absl::MutexLock l(&capture->mu_);
    files = capture->files_;
  }
  absl::Status s = capture->dropped()
                       ? absl::FailedPreconditionError(fmt::format(
                             "no room in memory_tier_bytes ({}) for the "
                             "replica of node {}'s share of {}",
                             options_.budget, of.node, held->dir))
                       : absl::OkStatus();
  for (const auto& f : files) {
    if (!s.ok()) break;
    s = f->Seal();
    held->bytes += f->capacity;
    held->files.emplace(f->name, f);
  }
  std::vector<std::shared_ptr<const TierCheckpoint>> freed;
  {
    absl::MutexLock l(&mu_);
    absl::MutexLock cl(&capture->mu_);
    capture->committed_ = true;
    used_ -= std::min(used_, capture->reserved_);
    if (s.ok()) {
      // Only the newest replica of a node's share of a job is worth its
      // memory: earlier ones (and one of the same checkpoint) go.
      for (auto it = held_.begin(); it != held_.end();) {
        const TierCheckpoint& h = *it->second;
        if (h.job == held->job && h.replica_node == of.node &&
            !h.replica_of.empty()) {
          used_ -= std::min(used_, h.bytes);
          freed.push_back(std::move(it->second));
          held_.erase(it++);
        } else {
          ++it;
        }
      }
      used_ += held->bytes;
      held_[HeldKey(*held)] = held;
    }
  }
  Forget(freed);
  if (!s.ok()) return s;
  spdlog::info(
      "memory tier: holding a replica of node {}'s share of {} ({} bytes in "
      "{} files, from {})",
      of.node, held->dir, held->bytes, held->files.size(), of.node_name);
  return absl::OkStatus();
}

std::vector<std::shared_ptr<const TierCheckpoint>> MemoryTier::FindShares(
    const std::string& dir, std::string_view metadata) const {
  std::vector<std::shared_ptr<const TierCheckpoint>> out;
  absl::MutexLock l(&mu_);
  for (const auto& [key, h] : held_) {
    if (h->dir == dir && PortableIdentity(h->metadata_identity) == metadata)
      out.push_back(h);
  }
  return out;
}

void MemoryTier::DropLocked(
    const std::string& dir,
    std::vector<std::shared_ptr<const TierCheckpoint>>& freed) {
  for (auto it = held_.begin(); it != held_.end();) {
    if (it->second->dir == dir) {
      used_ -= it->second->bytes;
      freed.push_back(std::move(it->second));
      held_.erase(it++);
    } else {
      ++it;
    }
  }
}

// ---------------------------------------------------------------------------
// Across a restart: the store's entries adopted at start-up
// ---------------------------------------------------------------------------

namespace {

// The held file `f` of `entry` with every byte checked against the
// manifest's CRC-32 (and its piece CRCs made again as it is read).
absl::StatusOr<std::shared_ptr<TierFileBytes>> AdoptFile(
    const TierStore& store, const std::string& entry,
    const TierManifest::File& f) {
  auto bytes = std::make_shared<TierFileBytes>();
  bytes->name = f.name;
  ASSIGN_OR_RETURN(bytes->fd, store.OpenStored(entry, f.stored, &bytes->size));
  if (bytes->size != f.size) {
    return absl::DataLossError(
        fmt::format("{}/{} (the bytes of {}) has {} bytes, the manifest {}",
                    entry, f.stored, f.name, bytes->size, f.size));
  }
  constexpr uint64_t kChunk = TierFileBytes::kHugeBytes;
  constexpr uint64_t kPiece = TierFileBytes::kCrcPieceBytes;
  std::unique_ptr<char[]> buf(new char[kChunk]);
  uint32_t crc = 0;
  for (uint64_t at = 0; at < bytes->size; at += kChunk) {
    const size_t n = std::min<uint64_t>(kChunk, bytes->size - at);
    RETURN_IF_ERROR(bytes->CopyOut(at, n, buf.get()));
    crc = ckptd::Crc32(crc, buf.get(), n);
    if (n == kChunk) {
      for (uint64_t p = 0; p < kChunk; p += kPiece) {
        bytes->piece_crcs.push_back(ckptd::Crc32(0, buf.get() + p, kPiece));
      }
      bytes->huge_bytes += kChunk;
    }
  }
  if (crc != f.crc32) {
    return absl::DataLossError(fmt::format(
        "{}/{} (the bytes of {}) does not match its CRC-32 ({:08x}, the "
        "manifest {:08x})",
        entry, f.stored, f.name, crc, f.crc32));
  }
  bytes->capacity = f.capacity;
  bytes->last_block = TierFileBytes::kBlockBytes;
  bytes->identity = f.identity;
  bytes->in_store = true;
  bytes->sealed = true;
  return bytes;
}

// The checkpoint of `m` (in `entry`), if the checkpoint on disk is still
// the one it held and its bytes are whole.
absl::StatusOr<std::shared_ptr<TierCheckpoint>> AdoptEntry(
    const TierStore& store, const std::string& entry, const TierManifest& m) {
  auto held = std::make_shared<TierCheckpoint>();
  held->dir = m.dir;
  held->job = m.job;
  held->metadata_identity = m.metadata_identity;
  held->committed = absl::FromUnixMillis(m.committed_ms);
  held->entry = entry;
  if (m.dir.empty() || m.dir[0] != '/') {
    return absl::DataLossError(fmt::format("bad directory '{}'", m.dir));
  }
  ASSIGN_OR_RETURN(const std::string md,
                   StatIdentity(m.dir + "/.metadata", /*with_ctime=*/false));
  if (md != m.metadata_identity) {
    return absl::FailedPreconditionError(
        fmt::format("{}/.metadata changed since the commit", m.dir));
  }
  for (const TierManifest::File& f : m.files) {
    if (!IsSafeRelativePath(f.name)) {
      return absl::DataLossError(fmt::format("bad file name '{}'", f.name));
    }
    const std::string path = m.dir + "/" + f.name;
    ASSIGN_OR_RETURN(const std::string id, FileIdentity(path));
    if (id != f.identity) {
      return absl::FailedPreconditionError(
          fmt::format("{} changed since the commit", path));
    }
    ASSIGN_OR_RETURN(std::shared_ptr<TierFileBytes> bytes,
                     AdoptFile(store, entry, f));
    held->bytes += bytes->capacity;
    held->files.emplace(f.name, std::move(bytes));
  }
  return held;
}

}  // namespace

absl::Status MemoryTier::Open() {
  if (options_.dir.empty()) return absl::OkStatus();
  ASSIGN_OR_RETURN(store_, TierStore::Open(options_.dir));
  if (!enabled()) {
    const std::vector<TierStore::Entry> entries = store_->Scan();
    for (const TierStore::Entry& e : entries) TierStore::Remove(e.path);
    if (!entries.empty()) {
      spdlog::info(
          "memory tier: off (memory_tier_bytes 0): removed {} entries of "
          "memory_tier_dir {}",
          entries.size(), options_.dir);
    }
    store_.reset();
    return absl::OkStatus();
  }
  Adopt();
  return absl::OkStatus();
}

void MemoryTier::Adopt() {
  const absl::Time start = options_.clock->Now();
  std::vector<TierStore::Entry> entries = store_->Scan();
  std::vector<absl::StatusOr<std::shared_ptr<TierCheckpoint>>> adopted(
      entries.size(), absl::UnknownError("not checked"));
  // Each entry's bytes read once, on up to adopt_threads threads.
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < entries.size();) {
      adopted[i] =
          entries[i].manifest.ok()
              ? AdoptEntry(*store_, entries[i].path, *entries[i].manifest)
              : entries[i].manifest.status();
    }
  };
  std::vector<std::thread> threads;
  const size_t n_threads = std::clamp<size_t>(
      static_cast<size_t>(std::max(1, options_.adopt_threads)), 1,
      std::max<size_t>(1, entries.size()));
  for (size_t t = 1; t < n_threads; ++t) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  // What fits, in the order eviction spares (EvictionOrder reversed), and
  // of one directory only its newest entry.
  absl::flat_hash_map<const TierCheckpoint*, std::shared_ptr<TierCheckpoint>>
      ok;
  std::vector<const TierCheckpoint*> order;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (adopted[i].ok()) {
      order.push_back(adopted[i]->get());
      ok.emplace(order.back(), *std::move(adopted[i]));
    } else {
      spdlog::warn("memory tier: not adopting {}: {}", entries[i].path,
                   adopted[i].status());
      TierStore::Remove(entries[i].path);
    }
  }
  order = EvictionOrder(std::move(order));
  uint64_t held_bytes = 0;
  size_t held_count = 0;
  std::vector<std::shared_ptr<const TierCheckpoint>> dropped;
  {
    absl::MutexLock l(&mu_);
    absl::flat_hash_set<std::string> dirs;
    for (auto it = order.rbegin(); it != order.rend(); ++it) {
      std::shared_ptr<TierCheckpoint>& h = ok[*it];
      if (!dirs.insert(h->dir).second || used_ + h->bytes > options_.budget) {
        dropped.push_back(std::move(h));
        continue;
      }
      used_ += h->bytes;
      held_bytes += h->bytes;
      ++held_count;
      held_[HeldKey(*h)] = h;
    }
  }
  for (const auto& h : dropped) {
    spdlog::info(
        "memory tier: not adopting {} (of {}): no room in memory_tier_bytes "
        "{}, or an older entry of the same directory",
        h->entry, h->dir, options_.budget);
  }
  Forget(dropped);
  if (!entries.empty()) {
    spdlog::info(
        "memory tier: adopted {} of {} entries of memory_tier_dir {} ({} "
        "bytes, checked in {})",
        held_count, entries.size(), options_.dir, held_bytes,
        absl::FormatDuration(options_.clock->Now() - start));
  }
}

std::shared_ptr<const TierCheckpoint> MemoryTier::Find(
    const std::string& identity) const {
  absl::MutexLock l(&mu_);
  auto it = held_.find(identity);
  return it == held_.end() ? nullptr : it->second;
}

std::vector<TierHeld> MemoryTier::List() const {
  std::vector<TierHeld> out;
  absl::MutexLock l(&mu_);
  for (const auto& [id, h] : held_) {
    out.push_back({h->dir, h->job, h->bytes, h->replica_of, h->replica_node});
  }
  std::sort(out.begin(), out.end(),
            [](const TierHeld& a, const TierHeld& b) { return a.dir < b.dir; });
  return out;
}

uint64_t MemoryTier::HeldBytes(const std::string& dir) const {
  absl::MutexLock l(&mu_);
  for (const auto& [id, h] : held_) {
    if (h->dir == dir && h->replica_of.empty()) return h->bytes;
  }
  return 0;
}

uint64_t MemoryTier::used() const {
  absl::MutexLock l(&mu_);
  return used_;
}

}  // namespace ckptd::daemon
