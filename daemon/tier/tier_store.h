// Copyright 2026 The ckptd Authors.
//
// Where the memory tier keeps its held files so that they outlive the
// daemon process (memory_tier_dir, docs/restore.md "Memory tier across a
// daemon restart"): a directory on tmpfs that only this daemon uses.
//
//   memory_tier_dir/.lock               flock(LOCK_EX) while a daemon uses it
//   memory_tier_dir/<entry>/f<i>        the bytes of a held data file, 0400
//   memory_tier_dir/<entry>/manifest    a TierManifest (below): what the
//                                       entry holds, written last
//
// A capture's bytes go into unnamed files (O_TMPFILE) that a crash takes
// with it; Persist gives a committed checkpoint's files their names and
// then writes the manifest (tmp + rename), so an entry either has a whole
// manifest or is a leftover that the next start removes. Remove takes the
// manifest first. Nothing here is fsynced: tmpfs has no disk to reach, and
// the store only has to outlive the process, not the machine.
//
// The files are plain tmpfs files, not memfds: they cannot be sealed. They
// are written only by this daemon, before Persist, and are read-only after
// (mode 0400 in a 0700 directory); the next daemon re-checks every byte
// against the manifest's CRC-32 before it serves them.
//
// Thread-safe (every call works on files of its own).
#ifndef CKPTD_DAEMON_TIER_TIER_STORE_H_
#define CKPTD_DAEMON_TIER_TIER_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "shm/fd_passing.h"

namespace ckptd::daemon {

// memory_tier_dir/<entry>/manifest: a committed checkpoint an entry holds,
// for the next daemon to adopt after checking every field against what is
// on disk. A checksummed JSON record (common/checksummed_record.h).
struct TierManifest {
  struct File {
    std::string name;       // the data file, relative to `dir`
    std::string stored;     // its bytes: the file of that name in the entry
    std::string identity;   // FileIdentity of the data file at commit
    uint64_t size = 0;      // bytes
    uint64_t capacity = 0;  // of the tier's budget it takes
    uint32_t crc32 = 0;     // of all its bytes
  };
  std::string dir;  // the checkpoint directory, as the save named it
  std::string job;
  std::string metadata_identity;  // StatIdentity of .metadata at commit
  int64_t committed_ms = 0;       // the tier's clock at commit
  std::vector<File> files;
};

std::string EncodeTierManifest(const TierManifest& m);
// DATA_LOSS naming `what` for anything but a whole record with every field.
absl::StatusOr<TierManifest> DecodeTierManifest(std::string_view text,
                                                std::string_view what);

class TierStore {
 public:
  // Creates `dir` (0700) if needed and takes its lock. FAILED_PRECONDITION
  // if it is not on tmpfs (held bytes there would sit on a disk) or another
  // process holds its lock.
  static absl::StatusOr<std::unique_ptr<TierStore>> Open(std::string dir);
  ~TierStore();

  const std::string& dir() const { return dir_; }

  // A new unnamed file (O_TMPFILE, read-write) for a capture's bytes.
  absl::StatusOr<shm::OwnedFd> NewFile() const;

  // Names `fds[i]` `manifest.files[i].stored` (set here: "f<i>") in a new
  // entry and then writes `manifest` there. Returns the entry's path.
  absl::StatusOr<std::string> Persist(TierManifest& manifest,
                                      const std::vector<int>& fds);

  // The entries found in the store: each with its manifest, or why it has
  // none that can be read (a leftover of a crash, a torn or edited file).
  struct Entry {
    std::string path;
    absl::StatusOr<TierManifest> manifest;
  };
  std::vector<Entry> Scan() const;

  // A stored file of an entry, opened read-only; its size in `*size`.
  absl::StatusOr<shm::OwnedFd> OpenStored(const std::string& entry,
                                          const std::string& stored,
                                          uint64_t* size) const;

  // Removes an entry: its manifest first (a crash half-way leaves a
  // leftover, never a manifest naming missing files). Failures are logged.
  static void Remove(const std::string& entry);

 private:
  TierStore(std::string dir, shm::OwnedFd dir_fd, shm::OwnedFd lock)
      : dir_(std::move(dir)),
        dir_fd_(std::move(dir_fd)),
        lock_(std::move(lock)) {}

  const std::string dir_;
  const shm::OwnedFd dir_fd_;
  const shm::OwnedFd lock_;
  std::atomic<uint64_t> counter_{0};
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_TIER_TIER_STORE_H_
