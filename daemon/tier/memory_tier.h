// Copyright 2026 The ckptd Authors.
//
// The memory tier (memory_tier_bytes, docs/restore.md "Memory tier"): the
// bytes of this node's newest committed checkpoints, kept in the daemon's
// memory so that a trainer restarted after a crash restores them without
// reading storage.
//
//   Begin(dir, job)        a save's capture (null when the tier is off)
//   capture->Tee(file)     a rank writer's data file: every byte appended
//                          is also kept, exactly as written (zip archives,
//                          zstd frames), while the budget allows
//   Commit(capture, ...)   after step 6: the files' identities (device,
//                          inode, size, mtime, ctime) and .metadata's are
//                          recorded and the checkpoint is held
//   Find(identity)         a restore decoding the checkpoint whose .metadata
//                          has `identity` gets what is held of it; OpenFile
//                          serves a held data file from memory if the file
//                          on disk still has its recorded identity
//   Drop(dir)              retention deleted it, or it was overwritten
//   Open()                 at start-up, with memory_tier_dir: adopts what
//                          the previous daemon held there (below)
//
// The staged bytes themselves live in the trainers' arenas, which the
// trainers reuse for their next save and which end with them: the tier
// keeps its own copy, made by the rank writer as it writes (one memcpy per
// byte, off the trainer's path; nothing when the tier is off).
//
// Budget: held checkpoints and captures in progress together stay within
// `budget` bytes. A capture that needs room evicts held checkpoints, first
// those that are not their job's newest, oldest first, then the oldest
// newest ones; a capture that still does not fit is dropped (its checkpoint
// is simply not held). An evicted checkpoint's memory is freed once no read
// uses it; a reader that had it open reads the file from storage instead.
//
// Across a daemon restart (memory_tier_dir, tier_store.h): the held files
// are then files on tmpfs instead of memfds, named with a manifest at the
// commit, so that they outlive the process. Open() re-adopts each entry
// whose .metadata and data files still have their recorded identities and
// whose held bytes still match their CRC-32s, within the budget; it
// removes the rest, with a log line each. Eviction and Drop remove an
// entry; the destructor (a shutdown) leaves the store as it is.
//
// Takes: the rank writers' appended bytes; hands on: TierCheckpoint to the
// restore path (checkpoint_cache.h). Thread-safe.
#ifndef CKPTD_DAEMON_TIER_MEMORY_TIER_H_
#define CKPTD_DAEMON_TIER_MEMORY_TIER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/env.h"
#include "shm/fd_passing.h"
#include "shm/huge_pages.h"

namespace ckptd::daemon {

class MemoryTier;
class TierStore;

// One data file's bytes, as written, in a memfd of its own: appended (pwrite)
// as the save writes and sealed against writing and resizing at the commit.
// Being a memfd, a held file can be lent to the ranks of a restore
// (group_buffers.h, Lend): they map it read-only and copy their tensors
// straight out of it. The budget is reserved in blocks that double from
// kFirstBlockBytes up to kBlockBytes (`capacity`): a small file takes little
// of it.
//
// Huge pages: each kHugeBytes extent of the file is collapsed into one
// transparent huge page (madvise MADV_COLLAPSE, Linux 6.1+; it needs no
// system setting short of shmem_enabled=deny) as soon as the writes have
// filled it, so that a rank mapping the file later faults once per 2 MiB
// instead of once per 4 KiB page. Where faults are expensive (a VM with
// shadow paging: 2-10 us each) that is what makes a restarted trainer's
// restore from memory run at memcpy speed. A file whose collapse fails (an
// older kernel, no huge page to be had) keeps its small pages.
//
// CRC-32s: the collapse reads each extent once through a mapping, and takes
// the CRC-32 of each kCrcPieceBytes piece of it as it does (`piece_crcs`).
// A restore checking a held record's CRC (the rule of checkpoint_reader.h)
// combines them and reads only the record's ends that are not whole
// pieces: the first restore after a commit does not read every held byte
// a second time. The CRCs are of the bytes in the memfd, taken after they
// were written; nothing writes an extent once it is full, and the seal
// keeps it so.
struct TierFileBytes {
  static constexpr uint64_t kFirstBlockBytes = uint64_t{64} << 10;
  static constexpr uint64_t kBlockBytes = uint64_t{4} << 20;
  static constexpr uint64_t kHugeBytes = shm::kHugePageBytes;
  static constexpr uint64_t kCrcPieceBytes = uint64_t{64} << 10;
  TierFileBytes() = default;
  ~TierFileBytes();  // unmaps Mapping()'s mapping
  TierFileBytes(const TierFileBytes&) = delete;
  TierFileBytes& operator=(const TierFileBytes&) = delete;

  std::string name;         // relative path in the checkpoint directory
  shm::OwnedFd fd;          // the memfd; invalid before the first byte
  uint64_t capacity = 0;    // bytes of the budget reserved for it
  uint64_t last_block = 0;  // the last reservation's size
  uint64_t size = 0;
  // Bytes [0, huge_bytes) are in huge pages; collapsing stopped for good
  // once `small_pages` is set (the first failure, logged once per daemon).
  uint64_t huge_bytes = 0;
  bool small_pages = false;
  // The CRC-32 of each piece of the extents in huge pages:
  // [i * kCrcPieceBytes, +kCrcPieceBytes) for i < huge_bytes / that.
  std::vector<uint32_t> piece_crcs;
  // Set by Seal: the bytes can no longer change and may be lent.
  bool sealed = false;
  // A file of the tier's store (memory_tier_dir), not a memfd: it cannot
  // be sealed, and nothing writes it after the commit (tier_store.h).
  bool in_store = false;
  // "dev:ino:size:mtime_ns:ctime_ns" of the file at commit (FileIdentity).
  std::string identity;

  // Appends `bytes` to the memfd (made on the first call), collapsing the
  // extents they complete into huge pages.
  absl::Status Write(std::string_view bytes);
  // Seals the memfd (F_SEAL_WRITE, _GROW, _SHRINK, _SEAL); a store file is
  // only marked sealed.
  absl::Status Seal();
  // Copies [offset, offset + n) into `dst` with pread(2), not through a
  // mapping of its own: the first user access to each page of a new mapping
  // costs a fault (4 KiB pages: 4 CPU-s per GiB on the build VM, where the
  // copy itself takes 0.1 s; huge pages, measured: still 0.4 s per GiB at
  // the first restore, against 0.2 s for the pread). REQUIRES: Seal()
  // succeeded, offset + n <= size.
  absl::Status CopyOut(uint64_t offset, size_t n, char* dst) const;
  // The CRC-32 of [offset, offset + n): `piece_crcs` combined for the
  // whole pieces in it, CopyOut for the rest. REQUIRES: as for CopyOut.
  absl::StatusOr<uint32_t> Crc32(uint64_t offset, uint64_t n) const;
  // The whole file mapped read-only at a huge-page-aligned address, made
  // on the first call and kept while the bytes are: what the peer service
  // hands gRPC to send without a copy (one fault per 2 MiB where the file
  // is in huge pages). UNIMPLEMENTED for a file in small pages (a copy is
  // cheaper than a fault per 4 KiB) or an empty one. REQUIRES: Seal()
  // succeeded.
  absl::StatusOr<const char*> Mapping() const;

 private:
  mutable absl::Mutex map_mu_;
  mutable const char* mapped_ ABSL_GUARDED_BY(map_mu_) = nullptr;
};

// A committed checkpoint held in memory.
struct TierCheckpoint {
  std::string dir;  // as the save named it
  std::string job;
  std::string metadata_identity;  // MetadataIdentity() at commit
  absl::Time committed;
  uint64_t bytes = 0;
  absl::flat_hash_map<std::string, std::shared_ptr<const TierFileBytes>>
      files;  // by name
  // Its entry in the store (memory_tier_dir); empty if it has none.
  std::string entry;
  // A replica (peer_replicas): the share of node `replica_node` (peer
  // address `replica_of`), pushed here by that node's daemon; the files'
  // identities are as that node saw them. Empty: this node's own files.
  std::string replica_of;
  int replica_node = -1;
};

// "size:mtime_ns" of a .metadata identity ("dev:ino:size:mtime_ns"), the
// same for every node that sees the file; for a data file's identity
// ("dev:ino:size:mtime_ns:ctime_ns") "size:mtime_ns:ctime_ns". Empty for
// anything else.
std::string PortableIdentity(std::string_view identity);

// A save's files being captured. Created by MemoryTier::Begin; each rank
// writer fills its own file (one thread per file); must not outlive the
// tier.
class TierCapture : public std::enable_shared_from_this<TierCapture> {
 public:
  ~TierCapture();  // gives back what it reserved, unless committed
  // `file` (created at `name`, relative to the checkpoint directory) with
  // its appended bytes also kept here.
  std::unique_ptr<WritableFile> Tee(std::string name,
                                    std::unique_ptr<WritableFile> file);
  // Whether the capture was given up (no room).
  bool dropped() const { return dropped_.load(); }
  // A replica's file (BeginReplica), in a memfd: filled with Append.
  std::shared_ptr<TierFileBytes> NewFile(std::string name);
  // Appends to `file` (owned by the calling writer) within the budget;
  // false once dropped.
  bool Append(TierFileBytes& file, std::string_view data);

 private:
  friend class MemoryTier;
  friend class TeeFile;
  TierCapture(MemoryTier* tier, std::string dir, std::string job)
      : tier_(tier), dir_(std::move(dir)), job_(std::move(job)) {}

  MemoryTier* const tier_;
  const std::string dir_;
  const std::string job_;
  std::atomic<bool> dropped_{false};
  absl::Mutex mu_;
  std::vector<std::shared_ptr<TierFileBytes>> files_ ABSL_GUARDED_BY(mu_);
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  bool committed_ ABSL_GUARDED_BY(mu_) = false;
};

struct MemoryTierOptions {
  uint64_t budget = 0;  // memory_tier_bytes; 0: off
  // memory_tier_dir: a tmpfs directory where held files outlive the
  // daemon; empty: memfds, gone with the process.
  std::string dir;
  // Threads that check adopted entries' bytes at Open.
  int adopt_threads = 4;
  Env* env = Env::Default();
  Clock* clock = Clock::Real();
};

// What `ckptctl list` and the metrics show of one held checkpoint.
struct TierHeld {
  std::string dir;
  std::string job;
  uint64_t bytes = 0;
  std::string replica_of;  // TierCheckpoint::replica_of
  int replica_node = -1;
};

// Whose share a replica is (MemoryTier::HoldReplica).
struct ReplicaOf {
  std::string metadata_identity;  // of the checkpoint, as this node sees it
  int node = 0;                   // the sending node
  std::string node_name;          // its peer address
};

class MemoryTier {
 public:
  explicit MemoryTier(MemoryTierOptions options);
  ~MemoryTier();
  MemoryTier(const MemoryTier&) = delete;
  MemoryTier& operator=(const MemoryTier&) = delete;

  // At start-up, before any Begin: with a `dir`, opens the store (an error
  // if it is not on tmpfs or another daemon uses it) and adopts what it
  // holds (see above); with the tier off, empties it. OK without a dir.
  absl::Status Open();

  bool enabled() const { return options_.budget > 0; }

  // A capture for a save of `dir` by `job`; null when the tier is off.
  std::shared_ptr<TierCapture> Begin(const std::string& dir,
                                     const std::string& job);
  // After step 6 of the save whose files lie in `io_dir` (the directory's
  // fd-anchored path): records the identities and holds the checkpoint
  // (replacing what was held of `dir`). A dropped capture, or files that
  // differ from what was captured (size), hold nothing. Returns what is
  // held (null: nothing).
  std::shared_ptr<const TierCheckpoint> Commit(
      std::shared_ptr<TierCapture> capture, const std::string& io_dir);
  // Frees what is held of `dir` (replicas included).
  void Drop(const std::string& dir);

  // Replicas (peer_replicas): a capture for another node's share of `dir`,
  // filled with NewFile / Append (each file's `identity` set by the
  // caller); null when the tier is off. HoldReplica holds it, sealed, in
  // place of an earlier replica of the same node's share of the job;
  // FAILED_PRECONDITION if the capture was dropped (no room).
  std::shared_ptr<TierCapture> BeginReplica(const std::string& dir,
                                            const std::string& job);
  absl::Status HoldReplica(std::shared_ptr<TierCapture> capture,
                           const ReplicaOf& of);
  // Everything held of `dir` (own files and replicas) whose .metadata's
  // PortableIdentity is `metadata`.
  std::vector<std::shared_ptr<const TierCheckpoint>> FindShares(
      const std::string& dir, std::string_view metadata) const;

  // What is held of the checkpoint whose .metadata has `identity` (null:
  // nothing).
  std::shared_ptr<const TierCheckpoint> Find(const std::string& identity) const;

  std::vector<TierHeld> List() const;
  // Of this node's own files of `dir` (not replicas).
  uint64_t HeldBytes(const std::string& dir) const;
  uint64_t used() const;
  uint64_t budget() const { return options_.budget; }
  // Bytes restores read from memory through the held files (NewTierEnv).
  uint64_t served() const { return served_.load(); }
  void CountServed(uint64_t n) { served_.fetch_add(n); }
  // Bytes restores did not read at all: the ranks copied them straight out
  // of a held file lent to them (HeldBytesOf), each distinct box once.
  uint64_t lent() const { return lent_.load(); }
  void CountLent(uint64_t n) { lent_.fetch_add(n); }

 private:
  friend class TierCapture;
  // Room for `n` more bytes, evicting held checkpoints; false if it cannot
  // be made. Evicted checkpoints are moved to `freed` (freed by the caller
  // after unlocking).
  bool ReserveLocked(uint64_t n,
                     std::vector<std::shared_ptr<const TierCheckpoint>>& freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves what is held of `dir` to `freed` (freed by the caller after
  // unlocking).
  void DropLocked(const std::string& dir,
                  std::vector<std::shared_ptr<const TierCheckpoint>>& freed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Reserve(uint64_t n);
  void Unreserve(uint64_t n);
  // Removes the store entries of `freed` (after unlocking) and empties it.
  void Forget(std::vector<std::shared_ptr<const TierCheckpoint>>& freed);
  // Gives the files of a committed `held` their names in the store and
  // sets its entry; where it cannot (logged), the checkpoint is held all
  // the same, until the daemon ends.
  void Persist(TierCheckpoint& held,
               const std::vector<std::shared_ptr<TierFileBytes>>& files);
  // Open's adoption of the store's entries.
  void Adopt();

  const MemoryTierOptions options_;
  std::unique_ptr<TierStore> store_;  // set by Open, with a dir
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  // Held checkpoints by .metadata identity (replicas: HeldKey).
  absl::flat_hash_map<std::string, std::shared_ptr<const TierCheckpoint>> held_
      ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> served_{0};
  std::atomic<uint64_t> lent_{0};
};

// "dev:ino:size:mtime_ns" of `path` (stat), with ":ctime_ns" appended if
// `with_ctime` (a file changed in place and its mtime set back still
// differs); its size in `*size` if not null.
absl::StatusOr<std::string> StatIdentity(const std::string& path,
                                         bool with_ctime,
                                         uint64_t* size = nullptr);
// StatIdentity with ctime: what identifies a held data file.
absl::StatusOr<std::string> FileIdentity(const std::string& path,
                                         uint64_t* size = nullptr);

// An Env that opens the data files of `held` (a checkpoint in directory
// `dir`) from memory while the file on disk keeps its recorded identity,
// and passes everything else to `base`. The files it opens read from
// storage once the tier has evicted the checkpoint.
// The held bytes behind `file` when a tier Env (below) opened it from
// memory and the tier still holds them; null otherwise (a file read from
// storage, or one the tier evicted).
std::shared_ptr<const TierFileBytes> HeldBytesOf(const RandomAccessFile* file);

std::unique_ptr<Env> NewTierEnv(Env* base, MemoryTier* tier,
                                std::shared_ptr<const TierCheckpoint> held,
                                std::string dir);
// The same over several held checkpoints of `dir` (FindShares): this
// node's own files and replicas of other nodes'. A replica's file is
// served while the file on disk has its PortableIdentity, or is missing
// (a node's local storage lost with it).
std::unique_ptr<Env> NewTierEnv(
    Env* base, MemoryTier* tier,
    const std::vector<std::shared_ptr<const TierCheckpoint>>& held,
    std::string dir);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_TIER_MEMORY_TIER_H_
