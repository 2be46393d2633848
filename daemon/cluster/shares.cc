// Copyright 2026 The ckptd Authors.
#include "daemon/cluster/shares.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <future>
#include <set>
#include <utility>

#include "common/absl_fmt.h"
#include "common/crc32.h"
#include "common/names.h"
#include "common/status_macros.h"
#include "daemon/cluster/placement.h"
#include "fmt/format.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

constexpr uint64_t kChunk = SharesOptions::kChunkBytes;
constexpr uint32_t kMaxFiles = 65536;
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 40;

// Every address `peer` ("host:port") names: each address its host resolves
// to (a headless service names every daemon), or `peer` itself.
std::vector<std::string> Expand(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  if (colon == std::string::npos || colon == 0) return {peer};
  std::string host = peer.substr(0, colon);
  const std::string port = peer.substr(colon + 1);
  if (host.front() == '[') return {peer};  // an IPv6 literal
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) {
    return {peer};
  }
  std::vector<std::string> out;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    char ip[NI_MAXHOST];
    if (::getnameinfo(a->ai_addr, a->ai_addrlen, ip, sizeof ip, nullptr, 0,
                      NI_NUMERICHOST) != 0) {
      continue;
    }
    const std::string s = a->ai_family == AF_INET6
                              ? fmt::format("[{}]:{}", ip, port)
                              : fmt::format("{}:{}", ip, port);
    if (std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
  }
  ::freeaddrinfo(res);
  if (out.empty()) out.push_back(peer);
  return out;
}

}  // namespace

// One push of this node's share of a checkpoint to its holders.
struct Shares::Outgoing {
  CommittedShare share;
  std::vector<ClusterNode> targets;
  std::atomic<bool> cancelled{false};
  std::vector<std::string> state;  // per target; guarded by Shares::mu_
};

Shares::Shares(SharesOptions options)
    : options_(std::move(options)),
      limiter_(options_.rate_limit, options_.clock),
      pool_(std::make_unique<ThreadPool>(2)) {
  pusher_ = std::thread([this] { RunPushes(); });
}

Shares::~Shares() { Shutdown(); }

void Shares::Shutdown() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_ && !pusher_.joinable()) return;
    stopping_ = true;
    for (auto& [dir, p] : pushes_) p->cancelled.store(true);
  }
  if (pusher_.joinable()) pusher_.join();
  pool_->Join();
}

// ---------------------------------------------------------------------------
// Pushing
// ---------------------------------------------------------------------------

void Shares::Committed(CommittedShare c) {
  const std::string job = c.id.job;
  std::string md;
  if (c.held != nullptr) {
    md = c.held->metadata_identity;
  } else if (absl::StatusOr<std::string> id =
                 StatIdentity(c.dir + "/.metadata", /*with_ctime=*/false);
             id.ok()) {
    md = *std::move(id);
  }
  std::shared_ptr<Outgoing> push;
  if (options_.replicas > 0 && c.held != nullptr && !c.held->files.empty()) {
    push = std::make_shared<Outgoing>();
    push->targets = ReplicaHolders(c.nodes, c.id.node, options_.replicas);
    push->state.assign(push->targets.size(), "queued");
    if (static_cast<int>(push->targets.size()) < options_.replicas) {
      spdlog::warn(
          "checkpoint {}: {} of the peer_replicas={} replicas of this node's "
          "share can be placed ({} nodes, failure domains considered)",
          c.dir, push->targets.size(), options_.replicas, c.nodes.size());
    }
    if (push->targets.empty()) push.reset();
  }
  absl::MutexLock l(&mu_);
  if (stopping_) return;
  registered_[job] = {c.id, c.dir, md, c.nodes};
  for (const ClusterNode& n : c.nodes) {
    if (n.address == options_.self || n.address.empty()) continue;
    if (std::find(known_.begin(), known_.end(), n.address) == known_.end() &&
        known_.size() < 4096) {
      known_.push_back(n.address);
    }
  }
  // Intakes of this job's older checkpoints are no longer wanted (one
  // being taken ends with its chunk).
  for (auto it = intakes_.begin(); it != intakes_.end();) {
    if (it->first.first != c.dir && it->second->job == job) {
      intakes_.erase(it++);
    } else {
      ++it;
    }
  }
  DropIdleLocked(options_.clock->Now());
  if (push == nullptr) return;
  for (auto it = pushes_.begin(); it != pushes_.end();) {
    if (it->second->share.id.job == job) {
      it->second->cancelled.store(true);  // superseded
      pushes_.erase(it++);
    } else {
      ++it;
    }
  }
  push->share = std::move(c);
  pushes_[push->share.dir] = push;
  queue_.push_back(push);
}

void Shares::RunPushes() {
  for (;;) {
    std::shared_ptr<Outgoing> p;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](Shares* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
            return s->stopping_ || !s->queue_.empty();
          },
          this));
      if (stopping_) return;
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    for (size_t t = 0; t < p->targets.size() && !p->cancelled.load(); ++t) {
      PushTo(p, t);
    }
  }
}

void Shares::SetHolderState(const std::shared_ptr<Outgoing>& p, size_t target,
                            std::string state) {
  absl::MutexLock l(&mu_);
  p->state[target] = std::move(state);
}

void Shares::PushTo(const std::shared_ptr<Outgoing>& p, size_t t) {
  const ClusterNode& target = p->targets[t];
  const TierCheckpoint& held = *p->share.held;
  SetHolderState(p, t, "pushing");
  const absl::Time start = options_.clock->Now();
  absl::Status s;
  absl::StatusOr<std::shared_ptr<ShareLink>> link =
      options_.links(target.address);
  if (!link.ok()) s = link.status();
  std::vector<const TierFileBytes*> files;
  for (const auto& [name, f] : held.files) files.push_back(f.get());
  std::sort(files.begin(), files.end(),
            [](const TierFileBytes* a, const TierFileBytes* b) {
              return a->name < b->name;
            });
  uint64_t bytes = 0;
  for (uint32_t i = 0; s.ok() && i < files.size(); ++i) {
    s = PushFile(p, **link, target, i, *files[i]);
    bytes += files[i]->size;
  }
  if (p->cancelled.load()) {
    spdlog::info(
        "checkpoint {}: the push of this node's share to node {} ({}) "
        "stopped: superseded by a newer checkpoint of the job, or the daemon "
        "is stopping",
        held.dir, target.node, target.address);
    SetHolderState(p, t, "superseded");
    return;
  }
  const absl::Duration took = options_.clock->Now() - start;
  // The state first: what the log says, `ckptctl list` shows already.
  if (s.ok()) {
    SetHolderState(p, t, "held");
    spdlog::info(
        "checkpoint {}: this node's share ({} bytes in {} files) is held in "
        "the memory of node {} ({}), pushed in {}",
        held.dir, bytes, files.size(), target.node, target.address,
        absl::FormatDuration(took));
  } else {
    SetHolderState(p, t, fmt::format("failed: {}", s.message()));
    spdlog::warn(
        "checkpoint {}: no replica of this node's share at node {} ({}): {}",
        held.dir, target.node, target.address, s);
  }
}

absl::Status Shares::PushFile(const std::shared_ptr<Outgoing>& p,
                              ShareLink& link, const ClusterNode& target,
                              uint32_t index, const TierFileBytes& f) {
  ShareChunk chunk;
  chunk.id = p->share.id;
  chunk.file_index = index;
  chunk.num_files = static_cast<uint32_t>(p->share.held->files.size());
  chunk.file = f.name;
  chunk.file_size = f.size;
  chunk.file_identity = f.identity;
  absl::StatusOr<uint32_t> file_crc = f.Crc32(0, f.size);
  if (!file_crc.ok()) return file_crc.status();
  chunk.file_crc32 = *file_crc;
  uint64_t offset = 0;
  do {
    if (p->cancelled.load()) return absl::OkStatus();
    const uint64_t n = std::min(kChunk, f.size - offset);
    chunk.offset = offset;
    chunk.data.resize(n);
    if (n > 0) {
      if (absl::Status s = f.CopyOut(offset, n, chunk.data.data()); !s.ok())
        return s;
    }
    chunk.crc32 = Crc32(0, chunk.data.data(), n);
    limiter_.Acquire(n, p->cancelled);
    while (options_.trainers_staging && options_.trainers_staging() &&
           !p->cancelled.load()) {
      options_.clock->SleepFor(absl::Milliseconds(2));
    }
    absl::StatusOr<bool> sent = SendChunk(p, link, target, chunk);
    if (!sent.ok()) return sent.status();
    offset += n;
  } while (offset < f.size);
  return absl::OkStatus();
}

absl::StatusOr<bool> Shares::SendChunk(const std::shared_ptr<Outgoing>& p,
                                       ShareLink& link,
                                       const ClusterNode& target,
                                       const ShareChunk& chunk) {
  // Retried while the holder is not ready (it has not committed the
  // checkpoint yet: UNAVAILABLE) or unreachable, up to push_timeout; a
  // chunk damaged on the way (DATA_LOSS) is sent again, three times at
  // most. The holder takes a chunk it has again as done.
  const absl::Time until = options_.clock->Now() + options_.push_timeout;
  absl::Duration backoff = absl::Milliseconds(50);
  int damaged = 0;
  for (;;) {
    // A chunk's call is short: a silent holder does not hold the pusher
    // (or a shutdown) for long.
    absl::StatusOr<bool> r =
        link.Push(chunk, std::min(options_.call_deadline, absl::Seconds(10)));
    if (r.ok()) return r;
    const absl::StatusCode code = r.status().code();
    const bool retry = code == absl::StatusCode::kUnavailable ||
                       code == absl::StatusCode::kDeadlineExceeded ||
                       (code == absl::StatusCode::kDataLoss && ++damaged <= 3);
    if (!retry || p->cancelled.load() || options_.clock->Now() >= until) {
      return absl::Status(
          code, fmt::format("pushing {} at {} to node {}: {}", chunk.file,
                            chunk.offset, target.node, r.status().message()));
    }
    options_.clock->SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
}

std::vector<std::string> Shares::HoldersOf(const std::string& dir) const {
  std::vector<std::string> out;
  absl::MutexLock l(&mu_);
  auto it = pushes_.find(dir);
  if (it == pushes_.end()) return out;
  for (size_t i = 0; i < it->second->targets.size(); ++i) {
    out.push_back(fmt::format("node {} ({}) {}", it->second->targets[i].node,
                              it->second->targets[i].address,
                              it->second->state[i]));
  }
  return out;
}

// ---------------------------------------------------------------------------
// Holding
// ---------------------------------------------------------------------------

void Shares::Push(ShareChunk chunk,
                  absl::AnyInvocable<void(absl::StatusOr<bool>)> done) {
  auto task = std::make_shared<std::pair<ShareChunk, decltype(done)>>(
      std::move(chunk), std::move(done));
  if (!pool_->Submit(
          [this, task] { std::move(task->second)(Accept(task->first)); })) {
    std::move(task->second)(absl::UnavailableError("the daemon is stopping"));
  }
}

absl::StatusOr<bool> Shares::Accept(const ShareChunk& c) {
  if (!IsSafeRelativePath(c.file) || c.num_files == 0 ||
      c.num_files > kMaxFiles || c.file_index >= c.num_files ||
      c.file_size > kMaxFileBytes || c.data.size() > kChunk ||
      c.offset > c.file_size || c.data.size() > c.file_size - c.offset) {
    return absl::InvalidArgumentError(fmt::format(
        "PushShare: chunk of file {} ({} of {}) at [{}, +{}) of {} bytes is "
        "malformed",
        c.file, c.file_index, c.num_files, c.offset, c.data.size(),
        c.file_size));
  }
  if (Crc32(0, c.data.data(), c.data.size()) != c.crc32) {
    return absl::DataLossError(
        fmt::format("PushShare: chunk of {} at {} arrived damaged (CRC-32 "
                    "mismatch)",
                    c.file, c.offset));
  }
  Registered r;
  std::shared_ptr<Intake> in;
  const absl::Time now = options_.clock->Now();
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return absl::UnavailableError("the daemon is stopping");
    ASSIGN_OR_RETURN(r, RegisteredFor(c));
    DropIdleLocked(now);
    std::shared_ptr<Intake>& slot = intakes_[{r.dir, c.id.node}];
    if (slot == nullptr) slot = std::make_shared<Intake>();
    if (slot->busy) {
      return absl::UnavailableError(fmt::format(
          "a chunk of node {}'s share of {} is being taken; send again",
          c.id.node, r.dir));
    }
    slot->busy = true;
    slot->last = now;
    in = slot;
  }
  absl::StatusOr<bool> held = Take(c, r, *in);
  absl::MutexLock l(&mu_);
  in->busy = false;
  auto it = intakes_.find({r.dir, c.id.node});
  if ((!held.ok() || *held) && it != intakes_.end() && it->second == in)
    intakes_.erase(it);
  return held;
}

absl::StatusOr<Shares::Registered> Shares::RegisteredFor(
    const ShareChunk& c) const {
  auto reg = registered_.find(c.id.job);
  if (reg == registered_.end() ||
      reg->second.id.checkpoint_id != c.id.checkpoint_id) {
    return absl::UnavailableError(fmt::format(
        "checkpoint {} of job '{}' is not committed on this node (yet){}",
        c.id.checkpoint_id, c.id.job,
        reg == registered_.end() ? std::string()
                                 : fmt::format("; the job's newest here is {}",
                                               reg->second.id.checkpoint_id)));
  }
  const Registered& r = reg->second;
  const bool member =
      std::any_of(r.nodes.begin(), r.nodes.end(), [&](const ClusterNode& n) {
        return n.node == c.id.node && n.address == c.id.node_name;
      });
  if (!member || c.id.node == r.id.node) {
    spdlog::warn("PushShare from node {} ({}) refused: not a node of {}",
                 c.id.node, c.id.node_name, r.dir);
    return absl::PermissionDeniedError(fmt::format(
        "node {} ({}) is not another node of checkpoint {}: its replicas are "
        "not accepted here",
        c.id.node, c.id.node_name, r.dir));
  }
  return r;
}

void Shares::DropIdleLocked(absl::Time now) {
  for (auto it = intakes_.begin(); it != intakes_.end();) {
    if (!it->second->busy &&
        now - it->second->last > 2 * options_.push_timeout) {
      spdlog::info("replica of node {}'s share of {}: no chunk for {}; dropped",
                   it->first.second, it->first.first,
                   absl::FormatDuration(now - it->second->last));
      intakes_.erase(it++);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<bool> Shares::Take(const ShareChunk& c, const Registered& r,
                                  Intake& in) {
  // The chunk of a file already in (a resend after a lost answer) is done.
  const bool fresh = c.file_index == 0 && c.offset == 0;
  if (in.capture != nullptr && !in.files.empty()) {
    const size_t cur = in.files.size() - 1;
    const uint64_t have = in.files[cur]->size;
    if (c.file_index < cur ||
        (c.file_index == cur && c.offset + c.data.size() <= have &&
         !(fresh && have != c.data.size()))) {
      in.last = options_.clock->Now();
      return false;
    }
  }
  if (fresh) {
    in.files.clear();
    in.capture.reset();  // an earlier attempt's capture gives its room back
    in.capture = options_.tier->BeginReplica(r.dir, r.id.job);
    if (in.capture == nullptr) {
      return absl::FailedPreconditionError(
          "this daemon's memory tier is off (memory_tier_bytes = 0): it holds "
          "no replicas");
    }
    in.num_files = c.num_files;
    in.job = r.id.job;
  }
  const size_t cur = in.files.empty() ? 0 : in.files.size() - 1;
  const bool next_file =
      !in.files.empty() && c.file_index == cur + 1 && c.offset == 0;
  if (in.capture == nullptr || c.num_files != in.num_files ||
      !(fresh || next_file ||
        (c.file_index == cur && c.offset == in.files[cur]->size))) {
    return absl::FailedPreconditionError(fmt::format(
        "PushShare: chunk of {} at {} is out of order: the share must be "
        "sent again from its start",
        c.file, c.offset));
  }
  if (fresh || next_file) {
    in.files.push_back(in.capture->NewFile(c.file));
    in.files.back()->identity = c.file_identity;
  }
  TierFileBytes& f = *in.files.back();
  if (!c.data.empty() && !in.capture->Append(f, c.data)) {
    return absl::ResourceExhaustedError(fmt::format(
        "no room in this daemon's memory_tier_bytes ({}) for node {}'s "
        "share of {}",
        options_.tier->budget(), c.id.node, r.dir));
  }
  in.last = options_.clock->Now();
  if (f.size < c.file_size) return false;
  absl::StatusOr<uint32_t> crc = f.Crc32(0, f.size);
  if (!crc.ok()) return crc.status();
  if (*crc != c.file_crc32) {
    return absl::DataLossError(fmt::format(
        "PushShare: {} arrived whole but its CRC-32 is {:08x}, not the "
        "sender's {:08x}",
        c.file, *crc, c.file_crc32));
  }
  if (c.file_index + 1 < c.num_files) return false;
  RETURN_IF_ERROR(options_.tier->HoldReplica(
      in.capture, {r.metadata_identity, c.id.node, c.id.node_name}));
  return true;
}

// ---------------------------------------------------------------------------
// Serving
// ---------------------------------------------------------------------------

std::vector<ShareFile> Shares::List(const std::string& dir,
                                    const std::string& metadata) const {
  std::vector<ShareFile> out;
  for (const auto& h : options_.tier->FindShares(dir, metadata)) {
    for (const auto& [name, f] : h->files) {
      out.push_back(
          {name, f->size, h->replica_node, PortableIdentity(f->identity)});
    }
  }
  return out;
}

void Shares::Read(std::string dir, std::string metadata, std::string file,
                  uint64_t offset, uint64_t length,
                  absl::AnyInvocable<void(absl::StatusOr<Bytes>)> done) {
  auto d = std::make_shared<decltype(done)>(std::move(done));
  auto task = [this, dir = std::move(dir), metadata = std::move(metadata),
               file = std::move(file), offset, length,
               d]() -> absl::StatusOr<Bytes> {
    if (length > kChunk) {
      return absl::InvalidArgumentError(
          fmt::format("FetchShare: {} bytes asked for, at most {} per call",
                      length, kChunk));
    }
    for (const auto& h : options_.tier->FindShares(dir, metadata)) {
      auto it = h->files.find(file);
      if (it == h->files.end()) continue;
      const TierFileBytes& f = *it->second;
      if (offset > f.size || length > f.size - offset) {
        return absl::OutOfRangeError(fmt::format(
            "FetchShare: [{}, +{}) is past the end of {} ({} bytes)", offset,
            length, file, f.size));
      }
      Bytes out;
      out.size = length;
      if (length == 0) return out;
      ASSIGN_OR_RETURN(out.crc32, f.Crc32(offset, length));
      if (absl::StatusOr<const char*> m = f.Mapping(); m.ok()) {
        out.file = it->second;
        out.data = *m + offset;
      } else {
        out.copy.resize(length);
        RETURN_IF_ERROR(f.CopyOut(offset, length, out.copy.data()));
        // (`data` stays null: the caller sends `copy`.)
      }
      return out;
    }
    return absl::NotFoundError(fmt::format(
        "{} of checkpoint {} is not held in this daemon's memory", file, dir));
  };
  if (!pool_->Submit(
          [task = std::move(task), d]() mutable { std::move (*d)(task()); })) {
    std::move (*d)(absl::UnavailableError("the daemon is stopping"));
  }
}

std::vector<std::string> Shares::Candidates() const {
  std::vector<std::string> out;
  for (const std::string& p : options_.restore_peers) {
    for (std::string& a : Expand(p)) out.push_back(std::move(a));
  }
  {
    absl::MutexLock l(&mu_);
    out.insert(out.end(), known_.begin(), known_.end());
  }
  std::vector<std::string> unique;
  std::set<std::string> seen;
  for (std::string& a : out) {
    if (a == options_.self || !seen.insert(a).second) continue;
    unique.push_back(std::move(a));
  }
  return unique;
}

std::vector<PeerHeldFile> Shares::Locate(const std::string& dir,
                                         const std::string& metadata) {
  const std::vector<std::string> peers = Candidates();
  if (peers.empty()) return {};
  std::vector<std::future<absl::StatusOr<std::vector<ShareFile>>>> asked;
  for (const std::string& a : peers) {
    asked.push_back(std::async(
        std::launch::async,
        [this, a, &dir, &metadata]() -> absl::StatusOr<std::vector<ShareFile>> {
          ASSIGN_OR_RETURN(std::shared_ptr<ShareLink> link, options_.links(a));
          return link->List(dir, metadata, options_.locate_deadline);
        }));
  }
  std::map<std::string, PeerHeldFile> files;
  std::vector<std::string> holders;
  for (size_t i = 0; i < peers.size(); ++i) {
    absl::StatusOr<std::vector<ShareFile>> got = asked[i].get();
    if (!got.ok()) {
      spdlog::info("restore of {}: peer {} did not say what it holds: {}", dir,
                   peers[i], got.status());
      continue;
    }
    if (!got->empty()) holders.push_back(peers[i]);
    for (const ShareFile& f : *got) {
      auto [it, fresh] =
          files.try_emplace(f.file, PeerHeldFile{f.file, f.size, f.identity});
      if (!fresh &&
          (it->second.size != f.size || it->second.identity != f.identity)) {
        spdlog::warn(
            "restore of {}: {} holds a different {} than {}; not reading it "
            "from there",
            dir, peers[i], f.file, it->second.holders.front());
        continue;
      }
      if (std::find(it->second.holders.begin(), it->second.holders.end(),
                    peers[i]) == it->second.holders.end()) {
        it->second.holders.push_back(peers[i]);
      }
    }
  }
  std::vector<PeerHeldFile> out;
  for (auto& [name, f] : files) out.push_back(std::move(f));
  if (!out.empty()) {
    spdlog::info(
        "restore of {}: {} of its data files are held in the memory of {} "
        "other daemon(s): {}",
        dir, out.size(), holders.size(), fmt::join(holders, ", "));
  }
  return out;
}

absl::Status Shares::Fetch(const std::string& holder, const std::string& dir,
                           const std::string& metadata, const std::string& file,
                           uint64_t offset, uint64_t n, char* dst) {
  ASSIGN_OR_RETURN(std::shared_ptr<ShareLink> link, options_.links(holder));
  return link->Fetch(dir, metadata, file, offset, n, dst,
                     options_.call_deadline);
}

}  // namespace ckptd::daemon
