// Copyright 2026 The ckptd Authors.
//
// A fake ckptd for the client's tests, and the fixture that serves it.
// FakeDaemon implements the CheckpointDaemon protocol's client-facing
// checks with in-memory state; ClientTest serves one on a Unix socket in a
// per-test directory, with a real daemon::ArenaListener as its arena socket.
// Header-only: only the tests that link gRPC (ckptd_proto) include it.
#ifndef CKPTD_TESTS_TESTING_FAKE_DAEMON_H_
#define CKPTD_TESTS_TESTING_FAKE_DAEMON_H_

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/ckptd_client.h"
#include "daemon/service/arena_listener.h"
#include "gtest/gtest.h"
#include "shm/mapping.h"
#include "tests/testing/save_items.h"
#include "tests/testing/test_util.h"

namespace ckptd::testing {

// Implements the protocol's client-facing checks with in-memory state:
// arenas are mapped with shm::Mapping (so names are unlinked), Save checks
// sequence numbers, extent order and the batch limit and copies the bytes
// out of the arena; a checkpoint commits as soon as every rank is staged
// (unless hold_commit).
class FakeDaemon final : public v1::CheckpointDaemon::Service {
 public:
  FakeDaemon(std::string shm_dir, uint64_t max_batch_bytes)
      : shm_dir_(std::move(shm_dir)), max_batch_bytes_(max_batch_bytes) {
    dir_fd_ = ::open(shm_dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
  ~FakeDaemon() override { ::close(dir_fd_); }

  grpc::Status GetInfo(grpc::ServerContext*, const v1::GetInfoRequest*,
                       v1::GetInfoResponse* resp) override {
    Count("GetInfo");
    resp->set_version("0.0.0-fake");
    resp->set_shm_dir(shm_dir_);
    resp->set_staging_budget_bytes(0);
    resp->set_max_batch_bytes(max_batch_bytes_);
    resp->set_max_items(max_items_);
    resp->add_checkpoint_roots("/ckpt");
    resp->set_io_backend("pwrite");
    resp->set_pid(::getpid());
    absl::MutexLock lock(&mu_);
    resp->set_peer_address(peer_address_);
    resp->set_arena_socket(arena_socket_);
    return grpc::Status::OK;
  }

  // The daemon's arena socket (served by a real daemon::ArenaListener whose
  // handler is RegisterFd); empty: an older daemon that only takes arenas
  // by name.
  void SetArenaSocket(std::string path) {
    absl::MutexLock lock(&mu_);
    arena_socket_ = std::move(path);
  }

  // A registration over the arena socket (a sealed memfd). Counted as
  // "RegisterArena" like the name-based call: one registration each.
  absl::StatusOr<uint64_t> RegisterFd(daemon::ArenaRegistration reg) {
    Count("RegisterArena");
    {
      absl::MutexLock lock(&mu_);
      ++registrations_by_fd_;
    }
    auto m = shm::Mapping::FromFd(reg.fd.Release(), reg.size, "fake arena");
    if (!m.ok()) return m.status();
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_arena_++;
    arenas_[id] = *std::move(m);
    owners_.push_back(reg.owner);
    return id;
  }

  grpc::Status RegisterArena(grpc::ServerContext*,
                             const v1::RegisterArenaRequest* req,
                             v1::RegisterArenaResponse* resp) override {
    Count("RegisterArena");
    {
      absl::MutexLock lock(&mu_);
      ++registrations_by_name_;
    }
    auto m =
        shm::Mapping::Open(dir_fd_, shm_dir_, req->name(), req->size_bytes());
    if (!m.ok()) return ToGrpc(m.status());
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_arena_++;
    arenas_[id] = *std::move(m);
    owners_.push_back(req->owner());
    resp->set_arena_id(id);
    return grpc::Status::OK;
  }

  grpc::Status ReleaseArena(grpc::ServerContext*,
                            const v1::ReleaseArenaRequest* req,
                            v1::ReleaseArenaResponse*) override {
    Count("ReleaseArena");
    absl::MutexLock lock(&mu_);
    arenas_.erase(req->arena_id());
    return grpc::Status::OK;
  }

  grpc::Status WaitArenaIdle(grpc::ServerContext*,
                             const v1::WaitArenaIdleRequest* req,
                             v1::WaitArenaIdleResponse*) override {
    Count("WaitArenaIdle");
    absl::MutexLock lock(&mu_);
    if (!arenas_.contains(req->arena_id())) {
      return grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("arena ", req->arena_id(), " not found"));
    }
    return grpc::Status::OK;
  }

  grpc::Status Save(grpc::ServerContext*, const v1::SaveRequest* req,
                    v1::SaveResponse* resp) override {
    Count("Save");
    absl::MutexLock lock(&mu_);
    auto bad = [](std::string msg) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, msg);
    };
    auto arena_it = arenas_.find(req->arena_id());
    if (arena_it == arenas_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such arena");
    }
    const shm::Mapping& arena = *arena_it->second;
    const std::string id = req->checkpoint_id()[0] == '/'
                               ? req->checkpoint_id()
                               : "/ckpt/" + req->checkpoint_id();
    Ckpt& c = ckpts_[id];
    if (c.status.checkpoint_id().empty()) {
      if (req->sequence() != 0)
        return bad("unknown checkpoint after sequence 0");
      c.status.set_checkpoint_id(id);
      c.status.set_job(req->job());
      c.status.set_world_size(req->world_size());
      c.status.set_state(v1::PENDING);
      c.status.set_created_unix_ms(absl::ToUnixMillis(absl::Now()));
    }
    Rank& r = c.ranks[req->rank()];
    if (req->sequence() != r.next_seq) {
      return bad(absl::StrCat("rank ", req->rank(), ": sequence ",
                              req->sequence(), ", expected ", r.next_seq));
    }
    if (req->sequence() == 0) {
      r.items.assign(req->items().begin(), req->items().end());
      r.options = req->options();
      r.has_cluster = req->has_cluster();
      r.cluster = req->cluster();
      for (const auto& item : r.items) {
        r.data[item.fqn()].assign(item.nbytes(), '\0');
        c.status.set_total_bytes(c.status.total_bytes() + item.nbytes());
        c.status.set_items(c.status.items() + 1);
      }
    } else if (req->items_size() != 0) {
      return bad("items after sequence 0");
    } else if (req->has_cluster()) {
      return bad("cluster after sequence 0");
    }
    uint64_t batch_bytes = 0, prev_end = 0;
    for (const v1::Extent& e : req->extents()) {
      while (r.cur_item < r.items.size() &&
             r.cur_off == r.items[r.cur_item].nbytes()) {
        ++r.cur_item;
        r.cur_off = 0;
      }
      if (r.cur_item >= r.items.size() || e.item() != r.cur_item ||
          e.item_offset() != r.cur_off || e.length() == 0 ||
          e.length() > r.items[r.cur_item].nbytes() - r.cur_off) {
        return bad(absl::StrCat("extent (item ", e.item(), ", offset ",
                                e.item_offset(), ", length ", e.length(),
                                ") out of order; expected item ", r.cur_item,
                                " offset ", r.cur_off));
      }
      if (e.arena_offset() < prev_end)
        return bad("extents overlap in the arena");
      auto bytes = arena.Slice(e.arena_offset(), e.length());
      if (!bytes.ok()) return ToGrpc(bytes.status());
      std::memcpy(r.data[r.items[r.cur_item].fqn()].data() + r.cur_off,
                  bytes->data(), bytes->size());
      r.cur_off += e.length();
      prev_end = e.arena_offset() + e.length();
      batch_bytes += e.length();
      c.status.set_staged_bytes(c.status.staged_bytes() + e.length());
    }
    if (batch_bytes > max_batch_bytes_) {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          absl::StrCat("batch of ", batch_bytes, " bytes"));
    }
    batch_bytes_.push_back(batch_bytes);
    ++r.next_seq;
    if (req->last()) {
      while (r.cur_item < r.items.size() &&
             r.cur_off == r.items[r.cur_item].nbytes()) {
        ++r.cur_item;
        r.cur_off = 0;
      }
      if (r.cur_item != r.items.size())
        return bad("last batch before all bytes");
      r.staged = true;
      c.status.set_ranks_staged(c.status.ranks_staged() + 1);
      if (c.status.ranks_staged() == c.status.world_size()) {
        c.status.set_state(hold_commit_ ? v1::WRITING : v1::COMMITTED);
        c.status.set_staged_unix_ms(absl::ToUnixMillis(absl::Now()));
        if (!hold_commit_) Finish(c, v1::COMMITTED);
      } else {
        c.status.set_state(v1::STAGING);
      }
    }
    resp->set_checkpoint_id(id);
    resp->set_state(c.status.state());
    resp->set_staged_bytes(c.status.staged_bytes());
    return grpc::Status::OK;
  }

  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest* req,
                         v1::CheckpointStatus* resp) override {
    Count("GetStatus");
    absl::MutexLock lock(&mu_);
    const Ckpt* c = Find(req->checkpoint_id());
    if (c == nullptr) return NotFound(req->checkpoint_id());
    *resp = c->status;
    return grpc::Status::OK;
  }

  grpc::Status List(grpc::ServerContext*, const v1::ListRequest* req,
                    v1::ListResponse* resp) override {
    Count("List");
    absl::MutexLock lock(&mu_);
    for (const auto& [id, c] : ckpts_) {
      if (req->job().empty() || req->job() == c.status.job()) {
        *resp->add_checkpoints() = c.status;
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelRequest* req,
                      v1::CancelResponse* resp) override {
    Count("Cancel");
    absl::MutexLock lock(&mu_);
    Ckpt* c = Find(req->checkpoint_id());
    if (c == nullptr) return NotFound(req->checkpoint_id());
    if (IsFinal(c->status.state())) {
      return grpc::Status(
          grpc::StatusCode::FAILED_PRECONDITION,
          absl::StrCat("checkpoint ", c->status.checkpoint_id(), " is already ",
                       v1::CheckpointState_Name(c->status.state())));
    }
    c->status.set_error(req->reason().empty() ? "cancelled" : req->reason());
    c->status.set_error_code(static_cast<int>(absl::StatusCode::kCancelled));
    Finish(*c, v1::CANCELLED);
    resp->set_state(v1::CANCELLED);
    return grpc::Status::OK;
  }

  grpc::Status Wait(grpc::ServerContext* ctx, const v1::WaitRequest* req,
                    v1::CheckpointStatus* resp) override {
    Count("Wait");
    // A daemon that stopped answering (SIGSTOP, a hung host).
    while (hang_waits_.load() && !ctx->IsCancelled())
      absl::SleepFor(absl::Milliseconds(10));
    if (hang_waits_.load()) return grpc::Status::CANCELLED;
    const absl::Time end = absl::Now() + absl::Milliseconds(req->timeout_ms());
    absl::MutexLock lock(&mu_);
    while (true) {
      const Ckpt* c = Find(req->checkpoint_id());
      if (c == nullptr) return NotFound(req->checkpoint_id());
      if (IsFinal(c->status.state())) {
        *resp = c->status;
        return grpc::Status::OK;
      }
      if (absl::Now() >= end) {
        return grpc::Status(
            grpc::StatusCode::DEADLINE_EXCEEDED,
            absl::StrCat("checkpoint ", c->status.checkpoint_id(), " is still ",
                         v1::CheckpointState_Name(c->status.state())));
      }
      cv_.WaitWithDeadline(&mu_, end);
    }
  }

  // Test hooks.
  int Calls(const std::string& method) {
    absl::MutexLock lock(&mu_);
    return calls_[method];
  }
  // Of Calls("RegisterArena"): over the arena socket / by name (gRPC).
  int RegistrationsByFd() {
    absl::MutexLock lock(&mu_);
    return registrations_by_fd_;
  }
  int RegistrationsByName() {
    absl::MutexLock lock(&mu_);
    return registrations_by_name_;
  }
  int TotalCalls() {
    absl::MutexLock lock(&mu_);
    int n = 0;
    for (const auto& [m, k] : calls_) n += k;
    return n;
  }
  std::string Data(const std::string& id, int rank, const std::string& fqn) {
    absl::MutexLock lock(&mu_);
    return ckpts_[id].ranks[rank].data[fqn];
  }
  std::vector<v1::Item> Items(const std::string& id, int rank) {
    absl::MutexLock lock(&mu_);
    return ckpts_[id].ranks[rank].items;
  }
  v1::SaveOptions Options(const std::string& id, int rank) {
    absl::MutexLock lock(&mu_);
    return ckpts_[id].ranks[rank].options;
  }
  // The ClusterSpec of the rank's sequence 0; nullopt when it had none.
  std::optional<v1::ClusterSpec> Cluster(const std::string& id, int rank) {
    absl::MutexLock lock(&mu_);
    const Rank& r = ckpts_[id].ranks[rank];
    if (!r.has_cluster) return std::nullopt;
    return r.cluster;
  }
  std::vector<uint64_t> BatchBytes() {
    absl::MutexLock lock(&mu_);
    return batch_bytes_;
  }
  std::vector<std::string> Owners() {
    absl::MutexLock lock(&mu_);
    return owners_;
  }
  size_t LiveArenas() {
    absl::MutexLock lock(&mu_);
    return arenas_.size();
  }
  uint64_t ArenaSize() {
    absl::MutexLock lock(&mu_);
    return arenas_.empty() ? 0 : arenas_.rbegin()->second->size();
  }
  void ForgetArenas() {  // the daemon's idle timeout
    absl::MutexLock lock(&mu_);
    arenas_.clear();
  }
  void set_hold_commit(bool hold) {
    absl::MutexLock lock(&mu_);
    hold_commit_ = hold;
  }
  void set_max_items(uint32_t n) { max_items_ = n; }
  std::atomic<bool> hang_waits_{false};
  void set_peer_address(std::string address) {
    absl::MutexLock lock(&mu_);
    peer_address_ = std::move(address);
  }
  // Makes a known checkpoint a multi-node one as this node sees it.
  void SetMultiNode(const std::string& id, int num_nodes, int planned,
                    int prepared, const std::string& coordinator,
                    int local_ranks, uint64_t local_total,
                    uint64_t local_written) {
    absl::MutexLock lock(&mu_);
    Ckpt* c = Find(id);
    ASSERT_NE(c, nullptr);
    c->status.set_num_nodes(num_nodes);
    c->status.set_nodes_planned(planned);
    c->status.set_nodes_prepared(prepared);
    c->status.set_coordinator(coordinator);
    c->status.set_is_coordinator(coordinator.empty());
    c->status.set_local_ranks(local_ranks);
    c->status.set_local_total_bytes(local_total);
    c->status.set_local_written_bytes(local_written);
  }
  void FinishCheckpoint(const std::string& id, v1::CheckpointState state,
                        std::string error = "") {
    absl::MutexLock lock(&mu_);
    Ckpt* c = Find(id);
    ASSERT_NE(c, nullptr);
    c->status.set_error(error);
    if (!error.empty())
      c->status.set_error_code(static_cast<int>(absl::StatusCode::kDataLoss));
    Finish(*c, state);
  }
  // Adds a checkpoint as if found on disk.
  void AddCheckpoint(const std::string& id, const std::string& job,
                     v1::CheckpointState state, uint64_t bytes) {
    absl::MutexLock lock(&mu_);
    Ckpt& c = ckpts_[id];
    c.status.set_checkpoint_id(id);
    c.status.set_job(job);
    c.status.set_state(state);
    c.status.set_world_size(2);
    c.status.set_ranks_staged(state == v1::STAGING ? 1 : 2);
    c.status.set_total_bytes(bytes);
    c.status.set_staged_bytes(state == v1::STAGING ? bytes / 2 : bytes);
    c.status.set_file_bytes(bytes + 4096);
    c.status.set_written_bytes(state == v1::COMMITTED ? bytes + 4096
                                                      : bytes / 4);
    c.status.set_created_unix_ms(
        absl::ToUnixMillis(absl::Now() - absl::Minutes(5)));
    if (IsFinal(state))
      c.status.set_finished_unix_ms(absl::ToUnixMillis(absl::Now()));
  }

 private:
  struct Rank {
    uint32_t next_seq = 0;
    std::vector<v1::Item> items;
    v1::SaveOptions options;
    bool has_cluster = false;
    v1::ClusterSpec cluster;
    std::map<std::string, std::string> data;
    uint32_t cur_item = 0;
    uint64_t cur_off = 0;
    bool staged = false;
  };
  struct Ckpt {
    v1::CheckpointStatus status;
    std::map<int, Rank> ranks;
  };

  static bool IsFinal(v1::CheckpointState s) {
    return s == v1::COMMITTED || s == v1::FAILED || s == v1::CANCELLED;
  }
  static grpc::Status ToGrpc(const absl::Status& s) {
    return grpc::Status(static_cast<grpc::StatusCode>(s.code()),
                        std::string(s.message()));
  }
  static grpc::Status NotFound(const std::string& id) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no checkpoint '", id, "'"));
  }
  Ckpt* Find(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = ckpts_.find(id);
    if (it == ckpts_.end()) it = ckpts_.find("/ckpt/" + id);
    return it == ckpts_.end() ? nullptr : &it->second;
  }
  void Finish(Ckpt& c, v1::CheckpointState state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    c.status.set_state(state);
    c.status.set_finished_unix_ms(absl::ToUnixMillis(absl::Now()));
    if (state == v1::COMMITTED) {
      c.status.set_file_bytes(c.status.total_bytes() + 1024);
      c.status.set_written_bytes(c.status.file_bytes());
      c.status.set_files(static_cast<uint32_t>(c.ranks.size()));
    }
    cv_.SignalAll();
  }
  void Count(const std::string& method) {
    absl::MutexLock lock(&mu_);
    ++calls_[method];
  }

  const std::string shm_dir_;
  const uint64_t max_batch_bytes_;
  std::atomic<uint32_t> max_items_{100000};
  int dir_fd_ = -1;
  absl::Mutex mu_;
  absl::CondVar cv_;
  uint64_t next_arena_ ABSL_GUARDED_BY(mu_) = 1;
  std::map<uint64_t, std::unique_ptr<shm::Mapping>> arenas_
      ABSL_GUARDED_BY(mu_);
  std::map<std::string, Ckpt> ckpts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> calls_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> batch_bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> owners_ ABSL_GUARDED_BY(mu_);
  bool hold_commit_ ABSL_GUARDED_BY(mu_) = false;
  std::string peer_address_ ABSL_GUARDED_BY(mu_);
  std::string arena_socket_ ABSL_GUARDED_BY(mu_);
  int registrations_by_fd_ ABSL_GUARDED_BY(mu_) = 0;
  int registrations_by_name_ ABSL_GUARDED_BY(mu_) = 0;
};

// Serves a fresh FakeDaemon (batch limit kMaxBatch, arenas in shm_dir_) at
// socket_ in a per-test directory, with a real daemon::ArenaListener at
// socket_ + ".arena" unless legacy_daemon_ is set before SetUp. Connect()
// gives a client of it.
class ClientTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kMaxBatch = 3 * kMiB;

  void SetUp() override {
    shm_dir_ = dir_.Join("shm");
    ASSERT_EQ(::mkdir(shm_dir_.c_str(), 0700), 0);
    socket_ = dir_.Join("ckptd.sock");
    fake_ = std::make_unique<FakeDaemon>(shm_dir_, kMaxBatch);
    if (!legacy_daemon_) {
      daemon::ArenaListenerOptions ao;
      ao.socket_path = socket_ + ".arena";
      FakeDaemon* fake = fake_.get();
      ao.handler = [fake](daemon::ArenaRegistration reg) {
        return fake->RegisterFd(std::move(reg));
      };
      auto listener = daemon::ArenaListener::Start(std::move(ao));
      ASSERT_TRUE(listener.ok()) << listener.status();
      arena_listener_ = *std::move(listener);
      fake_->SetArenaSocket(socket_ + ".arena");
    }
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_,
                             grpc::InsecureServerCredentials());
    builder.RegisterService(fake_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_)
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(1));
    arena_listener_.reset();
  }

  std::unique_ptr<client::Client> Connect(client::ClientOptions options = {}) {
    options.socket_path = socket_;
    auto c = client::Client::Connect(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // Shm directory is empty: every arena name was unlinked.
  size_t ShmEntries() {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e :
         std::filesystem::directory_iterator(shm_dir_))
      ++n;
    return n;
  }

  TempDir dir_;
  std::string shm_dir_, socket_;
  // true (set before SetUp): a daemon without the arena socket.
  bool legacy_daemon_ = false;
  std::unique_ptr<FakeDaemon> fake_;
  std::unique_ptr<daemon::ArenaListener> arena_listener_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace ckptd::testing

#endif  // CKPTD_TESTS_TESTING_FAKE_DAEMON_H_
