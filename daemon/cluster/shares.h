// Copyright 2026 The ckptd Authors.
//
// Shares: peer replicas of committed multi-node checkpoints (peer_replicas,
// docs/restore.md "Peer replicas"), on every daemon, in three parts:
//
//   pushing    Committed(): once this node committed a multi-node checkpoint
//              whose files its memory tier holds, its share goes to the
//              nodes placement.h names, off the trainers' path: one thread,
//              chunks of kChunkBytes read from the held files, each with
//              its CRC-32 and the whole file's at its end, under
//              replica_rate_limit, paused while this node's trainers
//              stage a save (trainers_staging). A newer commit of the job
//              supersedes a push still going. A holder that is not ready (it
//              has not committed the checkpoint yet) or unreachable is retried
//              until push_timeout.
//   holding    Push() (the peer service's PushShare): a chunk is accepted
//              only from a node of a checkpoint this node committed too,
//              in order, with a matching CRC; the share is held in the
//              memory tier (HoldReplica, within memory_tier_bytes) once its
//              last file's CRC matches. Intakes idle for push_timeout are
//              dropped.
//   serving    List() / Read() (ListShares / FetchShare) answer what this
//              node holds of a checkpoint, own files and replicas; as a
//              ShareSource, Locate() / Fetch() ask the other daemons this
//              one knows (restore_peers, and the nodes of the checkpoints
//              it committed) for a restore.
//
// Takes: the commit's node list (cluster.h ClusterNode) and the held
// TierCheckpoint; hands on: replicas to the memory tier, PeerHeldFile to
// the restore path. The outgoing calls go through ShareLink (gRPC in
// share_link.cc; tests may inject their own). Thread-safe.
#ifndef CKPTD_DAEMON_CLUSTER_SHARES_H_
#define CKPTD_DAEMON_CLUSTER_SHARES_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/rate_limiter.h"
#include "common/tasks.h"
#include "daemon/cluster/cluster.h"
#include "daemon/tier/memory_tier.h"
#include "daemon/tier/share_source.h"

namespace ckptd::daemon {

// One chunk of a share (peer.proto PushShareRequest).
struct ShareChunk {
  PeerCallId id;  // the sending node
  uint32_t file_index = 0;
  uint32_t num_files = 0;
  std::string file;
  uint64_t file_size = 0;
  std::string file_identity;
  uint64_t offset = 0;
  std::string data;
  uint32_t crc32 = 0;
  uint32_t file_crc32 = 0;
};

// A file a daemon holds (ListShares).
struct ShareFile {
  std::string file;
  uint64_t size = 0;
  int node = -1;
  std::string identity;  // PortableIdentity
};

// The calls to one other daemon. Blocking, each within `deadline`.
class ShareLink {
 public:
  virtual ~ShareLink() = default;
  // OK(true): the whole share is held.
  virtual absl::StatusOr<bool> Push(const ShareChunk& chunk,
                                    absl::Duration deadline) = 0;
  virtual absl::StatusOr<std::vector<ShareFile>> List(
      const std::string& dir, const std::string& metadata,
      absl::Duration deadline) = 0;
  // [offset, offset + n) into `dst`, in pieces of at most kChunkBytes
  // fetched a few at a time, each CRC-checked.
  virtual absl::Status Fetch(const std::string& dir,
                             const std::string& metadata,
                             const std::string& file, uint64_t offset,
                             uint64_t n, char* dst,
                             absl::Duration deadline) = 0;
};
using ShareLinkFactory =
    std::function<absl::StatusOr<std::shared_ptr<ShareLink>>(
        const std::string& address)>;

struct SharesOptions {
  static constexpr uint64_t kChunkBytes = uint64_t{4} << 20;
  int replicas = 0;         // peer_replicas (0: push nothing)
  uint64_t rate_limit = 0;  // replica_rate_limit, bytes/s; 0: none
  std::string self;         // this daemon's peer address
  // restore_peers: other daemons to ask for what they hold ("host:port";
  // a host name that resolves to several addresses names each).
  std::vector<std::string> restore_peers;
  absl::Duration push_timeout = absl::Seconds(30);  // peer_timeout
  absl::Duration call_deadline = absl::Seconds(15);
  absl::Duration locate_deadline = absl::Seconds(3);
  MemoryTier* tier = nullptr;  // not owned; must outlive Shares
  ShareLinkFactory links;
  // True while this node's trainers are held by a save (a checkpoint
  // staging): pushing pauses, chunk by chunk, so that replicas never slow
  // the trainers' stall (on a small host the push's copies compete with
  // theirs). Empty: never.
  std::function<bool()> trainers_staging;
  Clock* clock = Clock::Real();
};

// A multi-node checkpoint this node committed, as Committed() takes it.
struct CommittedShare {
  PeerCallId id;  // this node's
  std::string dir;
  std::vector<ClusterNode> nodes;  // the coordinator's answer
  // What this node's tier holds of it (null: nothing to push).
  std::shared_ptr<const TierCheckpoint> held;
};

class Shares : public ShareSource {
 public:
  explicit Shares(SharesOptions options);
  ~Shares() override;  // Shutdown()
  // Stops pushing (a push in progress ends at its next chunk).
  void Shutdown();

  void Committed(CommittedShare c);

  // The peer service's side. Push runs `done` on a thread of its own pool
  // (the chunk's copy into memory is not done on a gRPC thread).
  void Push(ShareChunk chunk,
            absl::AnyInvocable<void(absl::StatusOr<bool>)> done);
  std::vector<ShareFile> List(const std::string& dir,
                              const std::string& metadata) const;
  // The bytes and their CRC-32 (combined from the held file's piece CRCs,
  // taken when it was written: a byte changed in memory since is caught by
  // the reader).
  struct Bytes {
    // The bytes: [data, data + size) in `file`'s mapping (kept alive by
    // `file`, sent without a copy), or, with `file` null, `copy`.
    std::shared_ptr<const TierFileBytes> file;
    const char* data = nullptr;
    uint64_t size = 0;
    std::string copy;
    uint32_t crc32 = 0;
  };
  void Read(std::string dir, std::string metadata, std::string file,
            uint64_t offset, uint64_t length,
            absl::AnyInvocable<void(absl::StatusOr<Bytes>)> done);

  // ShareSource.
  std::vector<PeerHeldFile> Locate(const std::string& dir,
                                   const std::string& metadata) override;
  absl::Status Fetch(const std::string& holder, const std::string& dir,
                     const std::string& metadata, const std::string& file,
                     uint64_t offset, uint64_t n, char* dst) override;

  // ckptctl list: where this node's share of `dir` went ("addr held",
  // "addr pushing", "addr failed: why").
  std::vector<std::string> HoldersOf(const std::string& dir) const;

 private:
  struct Outgoing;
  struct Registered {
    PeerCallId id;
    std::string dir;
    std::string metadata_identity;
    std::vector<ClusterNode> nodes;
  };
  // A share coming in. Taken by one chunk at a time (`busy`, under mu_):
  // its bytes are copied into the tier without mu_ held.
  struct Intake {
    std::shared_ptr<TierCapture> capture;
    std::string job;
    std::vector<std::shared_ptr<TierFileBytes>> files;
    uint32_t num_files = 0;
    absl::Time last;
    bool busy = false;
  };
  absl::StatusOr<bool> Accept(const ShareChunk& chunk);
  // The checkpoint `chunk` belongs to, if this node committed it and the
  // chunk's sender is another node of it.
  absl::StatusOr<Registered> RegisteredFor(const ShareChunk& chunk) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The chunk into `in` (which the caller holds busy), mu_ not held.
  absl::StatusOr<bool> Take(const ShareChunk& chunk, const Registered& reg,
                            Intake& in) ABSL_LOCKS_EXCLUDED(mu_);
  // Drops the intakes no chunk came for in push_timeout x 2 (a sender that
  // died), giving their memory back.
  void DropIdleLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RunPushes();
  void PushTo(const std::shared_ptr<Outgoing>& p, size_t target);
  absl::Status PushFile(const std::shared_ptr<Outgoing>& p, ShareLink& link,
                        const ClusterNode& target, uint32_t index,
                        const TierFileBytes& f);
  absl::StatusOr<bool> SendChunk(const std::shared_ptr<Outgoing>& p,
                                 ShareLink& link, const ClusterNode& target,
                                 const ShareChunk& chunk);
  std::vector<std::string> Candidates() const;
  void SetHolderState(const std::shared_ptr<Outgoing>& p, size_t target,
                      std::string state);

  const SharesOptions options_;
  RateLimiter limiter_;
  std::unique_ptr<ThreadPool> pool_;  // Push, Read
  std::thread pusher_;
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The newest committed multi-node checkpoint of each job here.
  absl::flat_hash_map<std::string, Registered> registered_ ABSL_GUARDED_BY(mu_);
  // (dir, sending node) → its share coming in.
  std::map<std::pair<std::string, int>, std::shared_ptr<Intake>> intakes_
      ABSL_GUARDED_BY(mu_);
  std::deque<std::shared_ptr<Outgoing>> queue_ ABSL_GUARDED_BY(mu_);
  // dir → this node's pushes of it (the newest of each job).
  absl::flat_hash_map<std::string, std::shared_ptr<Outgoing>> pushes_
      ABSL_GUARDED_BY(mu_);
  // Peer addresses of the nodes of checkpoints committed here.
  std::vector<std::string> known_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_CLUSTER_SHARES_H_
