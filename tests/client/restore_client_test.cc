// Copyright 2026 The ckptd Authors.
//
// Client::GetRestoreIndex / Client::Restore and their C ABI against a fake
// daemon that serves the restore protocol from tensors held in memory: the
// calls' fields (batch numbers, last, group, identity, arena id), boxes
// split and copied back into strided destinations, bytes items, the daemon's
// errors named with the checkpoint, and local validation before any call.
// The real daemon is covered by tests/python/test_restore.py.
#include <grpcpp/grpcpp.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/ckptd_c.h"
#include "client/ckptd_client.h"
#include "daemon/service/arena_listener.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/test_util.h"

namespace ckptd::client {
namespace {

namespace pb = ::ckptd::v1;
using ::ckptd::testing::TempDir;

constexpr char kDir[] = "/ckpt/run/step_1";

// A saved tensor of the fake checkpoint: C-order float64 values i * 0.5
// (stored as the dtype's bytes for float32 / int64 / float64).
struct Saved {
  std::string dtype;
  std::vector<int64_t> shape;
};

size_t ElemSize(const std::string& dtype) { return dtype == "float32" ? 4 : 8; }

void StoreValue(const std::string& dtype, uint64_t i, char* out) {
  if (dtype == "float32") {
    const float v = static_cast<float>(i) * 0.5f;
    std::memcpy(out, &v, 4);
  } else if (dtype == "int64") {
    const int64_t v = static_cast<int64_t>(i) * 3 - 7;
    std::memcpy(out, &v, 8);
  } else {
    const double v = static_cast<double>(i) * 0.5;
    std::memcpy(out, &v, 8);
  }
}

class FakeRestoreDaemon final : public pb::CheckpointDaemon::Service {
 public:
  explicit FakeRestoreDaemon(bool restore) : restore_(restore) {
    saved_["w"] = {"float32", {20, 30}};
    saved_["v"] = {"int64", {7}};
    saved_["s"] = {"float64", {}};
    payloads_["step"] = "12345";
    payloads_["big"] = std::string(1000, 'x');
  }
  ~FakeRestoreDaemon() override {
    for (auto& [id, a] : arenas_) ::munmap(a.base, a.size);
  }

  void SetArenaSocket(std::string path) {
    absl::MutexLock lock(&mu_);
    arena_socket_ = std::move(path);
  }
  void FailBatch(int batch) {
    absl::MutexLock lock(&mu_);
    fail_batch_ = batch;
  }
  std::vector<pb::RestoreRequest> Requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }
  void ClearRequests() {
    absl::MutexLock lock(&mu_);
    requests_.clear();
  }
  uint64_t IndexArenaId() {
    absl::MutexLock lock(&mu_);
    return index_arena_id_;
  }

  absl::StatusOr<uint64_t> RegisterFd(daemon::ArenaRegistration reg) {
    void* p = ::mmap(nullptr, reg.size, PROT_READ | PROT_WRITE, MAP_SHARED,
                     reg.fd.get(), 0);
    if (p == MAP_FAILED) return absl::InternalError("mmap of the arena");
    absl::MutexLock lock(&mu_);
    const uint64_t id = next_arena_++;
    arenas_[id] = Arena{static_cast<char*>(p), reg.size};
    return id;
  }

  grpc::Status GetInfo(grpc::ServerContext*, const pb::GetInfoRequest*,
                       pb::GetInfoResponse* resp) override {
    absl::MutexLock lock(&mu_);
    resp->set_version("0.0.0-fake");
    resp->add_checkpoint_roots("/ckpt");
    resp->set_arena_socket(arena_socket_);
    resp->set_restore(restore_);
    resp->set_restore_gather_timeout_ms(1234);
    return grpc::Status::OK;
  }
  grpc::Status ReleaseArena(grpc::ServerContext*,
                            const pb::ReleaseArenaRequest*,
                            pb::ReleaseArenaResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status WaitArenaIdle(grpc::ServerContext*,
                             const pb::WaitArenaIdleRequest*,
                             pb::WaitArenaIdleResponse*) override {
    return grpc::Status::OK;
  }

  grpc::Status GetRestoreIndex(grpc::ServerContext*,
                               const pb::RestoreIndexRequest* req,
                               pb::RestoreIndexResponse* resp) override {
    absl::MutexLock lock(&mu_);
    index_arena_id_ = req->arena_id();
    if (req->checkpoint_id() != kDir && req->checkpoint_id() != "run/step_1") {
      return grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("no .metadata in ", req->checkpoint_id()));
    }
    resp->set_checkpoint_id(kDir);
    resp->set_index_json(R"({"dir":"/ckpt/run/step_1","entries":[]})");
    resp->set_identity("dev:ino:size:mtime");
    return grpc::Status::OK;
  }

  grpc::Status Restore(grpc::ServerContext*, const pb::RestoreRequest* req,
                       pb::RestoreResponse* resp) override {
    absl::MutexLock lock(&mu_);
    requests_.push_back(*req);
    auto it = arenas_.find(req->arena_id());
    if (it == arenas_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such arena");
    }
    if (static_cast<int>(req->batch()) == fail_batch_) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          "payload CRC-32 mismatch in __0_0.distcp at 4096 "
                          "(item 'w')");
    }
    const Arena& arena = it->second;
    uint64_t copied = 0;
    for (const pb::RestoreBox& box : req->boxes()) {
      grpc::Status s = FillBox(box, arena, &copied);
      if (!s.ok()) return s;
    }
    for (const pb::RestoreBytes& b : req->bytes_items()) {
      const std::string& raw = payloads_.at(b.fqn());
      if (raw.size() > b.capacity() || b.arena_offset() > arena.size ||
          b.capacity() > arena.size - b.arena_offset()) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bytes slot");
      }
      std::memcpy(arena.base + b.arena_offset(), raw.data(), raw.size());
      resp->add_bytes_lengths(raw.size());
      copied += raw.size();
    }
    resp->set_storage_bytes(copied);
    resp->set_copied_bytes(copied);
    resp->set_group_ranks(1);
    return grpc::Status::OK;
  }

 private:
  struct Arena {
    char* base = nullptr;
    uint64_t size = 0;
  };

  grpc::Status FillBox(const pb::RestoreBox& box, const Arena& arena,
                       uint64_t* copied) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = saved_.find(box.fqn());
    if (it == saved_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("no item '", box.fqn(), "' in ", kDir));
    }
    const Saved& t = it->second;
    if (box.dtype() != t.dtype ||
        box.sizes_size() != static_cast<int>(t.shape.size())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          absl::StrCat("'", box.fqn(), "': dtype or rank"));
    }
    const size_t n = t.shape.size(), es = ElemSize(t.dtype);
    uint64_t numel = 1;
    for (size_t k = 0; k < n; ++k) {
      if (box.offsets(k) + box.sizes(k) > t.shape[k]) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                            absl::StrCat("'", box.fqn(), "': outside"));
      }
      numel *= static_cast<uint64_t>(box.sizes(k));
    }
    if (box.arena_offset() > arena.size ||
        numel * es > arena.size - box.arena_offset()) {
      return grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "box outside arena");
    }
    for (uint64_t e = 0; e < numel; ++e) {
      uint64_t rem = e, flat = 0, stride = 1;
      std::vector<int64_t> idx(n);
      for (size_t k = n; k-- > 0;) {
        idx[k] =
            static_cast<int64_t>(rem % static_cast<uint64_t>(box.sizes(k)));
        rem /= static_cast<uint64_t>(box.sizes(k));
      }
      for (size_t k = n; k-- > 0;) {
        flat += static_cast<uint64_t>(box.offsets(k) + idx[k]) * stride;
        stride *= static_cast<uint64_t>(t.shape[k]);
      }
      StoreValue(t.dtype, flat, arena.base + box.arena_offset() + e * es);
    }
    *copied += numel * es;
    return grpc::Status::OK;
  }

  const bool restore_;
  std::map<std::string, Saved> saved_;
  std::map<std::string, std::string> payloads_;
  absl::Mutex mu_;
  std::map<uint64_t, Arena> arenas_ ABSL_GUARDED_BY(mu_);
  uint64_t next_arena_ ABSL_GUARDED_BY(mu_) = 1;
  std::string arena_socket_ ABSL_GUARDED_BY(mu_);
  std::vector<pb::RestoreRequest> requests_ ABSL_GUARDED_BY(mu_);
  int fail_batch_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t index_arena_id_ ABSL_GUARDED_BY(mu_) = 0;
};

class RestoreClientTest : public ::testing::Test {
 protected:
  void Start(bool restore = true) {
    socket_ = dir_.Join("ckptd.sock");
    fake_ = std::make_unique<FakeRestoreDaemon>(restore);
    daemon::ArenaListenerOptions ao;
    ao.socket_path = socket_ + ".arena";
    FakeRestoreDaemon* fake = fake_.get();
    ao.handler = [fake](daemon::ArenaRegistration reg) {
      return fake->RegisterFd(std::move(reg));
    };
    auto listener = daemon::ArenaListener::Start(std::move(ao));
    ASSERT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    fake_->SetArenaSocket(socket_ + ".arena");
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_,
                             grpc::InsecureServerCredentials());
    builder.RegisterService(fake_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void SetUp() override { Start(); }
  void TearDown() override {
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(1));
    }
    listener_.reset();
  }

  std::unique_ptr<Client> Connect(int copy_threads = 2) {
    ClientOptions options;
    options.socket_path = socket_;
    options.copy_threads = copy_threads;
    auto c = Client::Connect(options);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  TempDir dir_;
  std::string socket_;
  std::unique_ptr<FakeRestoreDaemon> fake_;
  std::unique_ptr<daemon::ArenaListener> listener_;
  std::unique_ptr<grpc::Server> server_;
};

float W(int64_t r, int64_t c) { return static_cast<float>(r * 30 + c) * 0.5f; }

TEST_F(RestoreClientTest, InfoAndIndex) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->info().restore);
  EXPECT_EQ(c->info().restore_gather_timeout_ms, 1234u);
  ASSERT_OK_AND_ASSIGN(RestoreIndex index, c->GetRestoreIndex("run/step_1"));
  EXPECT_EQ(index.checkpoint_id, kDir);
  EXPECT_EQ(index.identity, "dev:ino:size:mtime");
  EXPECT_TRUE(absl::StrContains(index.index_json, "\"entries\""));
  EXPECT_NE(fake_->IndexArenaId(), 0u) << "the arena names the caller";
  auto missing = c->GetRestoreIndex("/ckpt/absent");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_TRUE(absl::IsInvalidArgument(c->GetRestoreIndex("").status()));
}

TEST_F(RestoreClientTest, StridedBoxesAndBytesThroughManyBatches) {
  auto c = Connect(/*copy_threads=*/3);
  ASSERT_NE(c, nullptr);
  // Rows [3, 13) x columns [5, 25) of w into a column-major buffer; v
  // whole; the scalar s; an empty box of w; two bytes items, one larger
  // than a batch.
  std::vector<float> wt(10 * 20, -1.0f);
  std::vector<int64_t> v(7, 0);
  double s = -1;
  std::vector<RestoreTensor> tensors(4);
  tensors[0] = {"w", "float32", {3, 5}, {10, 20}, {1, 10}, wt.data()};
  tensors[1] = {"v", "int64", {0}, {7}, {}, v.data()};
  tensors[2] = {"s", "double", {}, {}, {}, &s};
  tensors[3] = {"w", "float32", {0, 0}, {0, 30}, {}, nullptr};
  std::vector<RestoreBytesItem> items = {{"step", 5, ""}, {"big", 1000, ""}};
  RestoreOptions options;
  options.group = "/ckpt/run/step_1#0";
  options.local_rank = 1;
  options.local_world_size = 2;
  options.identity = "dev:ino:size:mtime";
  options.verify_crc = false;
  options.batch_bytes = 256;
  ASSERT_OK_AND_ASSIGN(RestoreStats stats, c->Restore(kDir, options, tensors,
                                                      absl::MakeSpan(items)));
  for (int64_t r = 0; r < 10; ++r) {
    for (int64_t col = 0; col < 20; ++col) {
      ASSERT_EQ(wt[static_cast<size_t>(r + col * 10)], W(r + 3, col + 5))
          << r << "," << col;
    }
  }
  for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(v[i], i * 3 - 7);
  EXPECT_EQ(s, 0.0);
  EXPECT_EQ(items[0].value, "12345");
  EXPECT_EQ(items[1].value, std::string(1000, 'x'));

  const std::vector<pb::RestoreRequest> reqs = fake_->Requests();
  ASSERT_EQ(stats.batches, static_cast<int>(reqs.size()));
  EXPECT_GE(reqs.size(), 800u / 256 + 2);
  EXPECT_EQ(stats.bytes, 800u + 56 + 8 + 5 + 1000);
  EXPECT_EQ(stats.copied_bytes, stats.bytes);
  EXPECT_EQ(stats.group_ranks, 1);
  for (size_t b = 0; b < reqs.size(); ++b) {
    const pb::RestoreRequest& r = reqs[b];
    EXPECT_EQ(r.batch(), b);
    EXPECT_EQ(r.last(), b + 1 == reqs.size());
    EXPECT_EQ(r.checkpoint_id(), kDir);
    EXPECT_EQ(r.group(), "/ckpt/run/step_1#0");
    EXPECT_EQ(r.local_rank(), 1);
    EXPECT_EQ(r.local_world_size(), 2);
    EXPECT_EQ(r.identity(), "dev:ino:size:mtime");
    EXPECT_TRUE(r.skip_crc());
    for (const pb::RestoreBox& box : r.boxes()) {
      EXPECT_EQ(box.arena_offset() % 64, 0u);
      uint64_t numel = box.dtype() == "float32" ? 4 : 8;
      for (int64_t size : box.sizes()) numel *= static_cast<uint64_t>(size);
      EXPECT_LE(numel, 256u) << "boxes are split to fit a batch";
    }
  }
}

TEST_F(RestoreClientTest, BatchesDoNotDependOnTheArena) {
  // A client whose arena is already large must send the same batches as a
  // fresh one: the group's ranks gather batch k of each other.
  std::vector<float> a(20 * 30), b(20 * 30);
  RestoreOptions options;
  options.batch_bytes = 1000;
  auto fresh = Connect();
  ASSERT_NE(fresh, nullptr);
  std::vector<RestoreTensor> ta = {
      {"w", "float32", {0, 0}, {20, 30}, {}, a.data()}};
  ASSERT_OK(fresh->Restore(kDir, options, ta, {}));
  const auto first = fake_->Requests();
  fake_->ClearRequests();
  auto big = Connect();
  ASSERT_NE(big, nullptr);
  ASSERT_OK(big->Reserve(64 << 20));
  std::vector<RestoreTensor> tb = {
      {"w", "float32", {0, 0}, {20, 30}, {}, b.data()}};
  ASSERT_OK(big->Restore(kDir, options, tb, {}));
  const auto second = fake_->Requests();
  ASSERT_EQ(first.size(), second.size());
  // A rank alone double-buffers: 2400 bytes in batches of half the 1000
  // (4 rows of 120 each), odd batches in the arena's second half (from 512:
  // 480 rounded up to 64), so batch k+1 is filled while k is copied out.
  ASSERT_EQ(first.size(), 5u);
  for (size_t k = 0; k < first.size(); ++k) {
    ASSERT_GT(first[k].boxes_size(), 0);
    EXPECT_EQ(first[k].boxes(0).arena_offset(), k % 2 == 0 ? 0u : 512u) << k;
  }
  for (size_t k = 0; k < first.size(); ++k) {
    ASSERT_EQ(first[k].boxes_size(), second[k].boxes_size());
    for (int j = 0; j < first[k].boxes_size(); ++j) {
      EXPECT_EQ(first[k].boxes(j).SerializeAsString(),
                second[k].boxes(j).SerializeAsString());
    }
  }
  EXPECT_EQ(a, b);
}

TEST_F(RestoreClientTest, RankWithNothingSendsOneLastBatch) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_OK_AND_ASSIGN(RestoreStats stats, c->Restore(kDir, {}, {}, {}));
  EXPECT_EQ(stats.batches, 1);
  EXPECT_EQ(stats.bytes, 0u);
  const auto reqs = fake_->Requests();
  ASSERT_EQ(reqs.size(), 1u);
  EXPECT_TRUE(reqs[0].last());
  EXPECT_EQ(reqs[0].boxes_size(), 0);
  EXPECT_NE(reqs[0].arena_id(), 0u);
  EXPECT_FALSE(reqs[0].skip_crc());
}

TEST_F(RestoreClientTest, DaemonErrorsNameTheCheckpoint) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  float x = 0;
  std::vector<RestoreTensor> missing = {{"nope", "float32", {}, {}, {}, &x}};
  auto r = c->Restore(kDir, {}, missing, {});
  EXPECT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(
      r.status().message(),
      absl::StrCat("restore of checkpoint ", kDir, ": no item 'nope'")))
      << r.status();
  // A damaged file in the second of five batches (a rank alone: batches of
  // half of batch_bytes, double-buffered).
  fake_->FailBatch(1);
  std::vector<float> w(600);
  std::vector<RestoreTensor> whole = {
      {"w", "float32", {0, 0}, {20, 30}, {}, w.data()}};
  RestoreOptions options;
  options.batch_bytes = 1000;
  r = c->Restore(kDir, options, whole, {});
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "(batch 2 of 5)"))
      << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "__0_0.distcp"));
}

TEST_F(RestoreClientTest, FailedRankLeavesItsGroup) {
  // A rank whose batch fails sends an empty last batch, so the other ranks
  // of its group do not wait for it at each of their later batches.
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  fake_->FailBatch(1);
  std::vector<float> w(600);
  std::vector<RestoreTensor> whole = {
      {"w", "float32", {0, 0}, {20, 30}, {}, w.data()}};
  RestoreOptions options;
  options.batch_bytes = 1000;
  options.group = "g";
  options.local_rank = 1;
  options.local_world_size = 2;
  auto r = c->Restore(kDir, options, whole, {});
  EXPECT_TRUE(absl::IsDataLoss(r.status())) << r.status();
  const auto reqs = fake_->Requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[1].batch(), 1u);
  EXPECT_FALSE(reqs[1].last());
  EXPECT_EQ(reqs[2].batch(), 2u);
  EXPECT_TRUE(reqs[2].last());
  EXPECT_EQ(reqs[2].boxes_size(), 0);
  EXPECT_EQ(reqs[2].group(), "g");
  EXPECT_EQ(reqs[2].local_rank(), 1);
  // Alone (no group), nothing is sent after the failure.
  fake_->ClearRequests();
  options.group = "";
  options.local_rank = 0;
  options.local_world_size = 1;
  EXPECT_TRUE(absl::IsDataLoss(c->Restore(kDir, options, whole, {}).status()));
  EXPECT_EQ(fake_->Requests().size(), 2u);
}

TEST_F(RestoreClientTest, LocalValidationBeforeAnyCall) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  float x = 0;
  std::vector<RestoreTensor> ok = {{"s", "float64", {}, {}, {}, &x}};
  RestoreOptions bad;
  bad.local_rank = 2;
  bad.local_world_size = 2;
  auto r = c->Restore(kDir, bad, ok, {});
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(absl::StrContains(r.status().message(), "local_rank 2"));
  bad = {};
  bad.batch_bytes = 8;
  EXPECT_TRUE(absl::IsInvalidArgument(c->Restore(kDir, bad, ok, {}).status()));
  bad = {};
  bad.group = std::string(1025, 'g');
  EXPECT_TRUE(absl::IsInvalidArgument(c->Restore(kDir, bad, ok, {}).status()));
  std::vector<RestoreTensor> wrong = {{"s", "float99", {}, {}, {}, &x}};
  r = c->Restore(kDir, {}, wrong, {});
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_TRUE(absl::StrContains(
      r.status().message(),
      absl::StrCat("restore of checkpoint ", kDir,
                   ": tensor 0 ('s'): unknown dtype 'float99'")))
      << r.status();
  EXPECT_TRUE(fake_->Requests().empty());
}

TEST(RestoreOlderDaemonTest, RefusedWithoutACall) {
  TempDir dir;
  const std::string socket = dir.Join("ckptd.sock");
  FakeRestoreDaemon fake(/*restore=*/false);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket, grpc::InsecureServerCredentials());
  builder.RegisterService(&fake);
  auto server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.socket_path = socket;
  ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(options));
  EXPECT_FALSE(c->info().restore);
  auto index = c->GetRestoreIndex(kDir);
  EXPECT_TRUE(absl::IsFailedPrecondition(index.status())) << index.status();
  EXPECT_TRUE(
      absl::StrContains(index.status().message(), "does not serve restores"));
  EXPECT_TRUE(
      absl::IsFailedPrecondition(c->Restore(kDir, {}, {}, {}).status()));
  EXPECT_TRUE(fake.Requests().empty());
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

TEST_F(RestoreClientTest, CApi) {
  EXPECT_GE(ckptd_api_version(), 5);  // restore came with version 5
  ckptd_client* c = nullptr;
  ASSERT_EQ(ckptd_connect(socket_.c_str(), 2, &c), CKPTD_OK)
      << ckptd_last_error();
  char* info = nullptr;
  ASSERT_EQ(ckptd_info_json(c, &info), CKPTD_OK);
  const auto ij = nlohmann::json::parse(info);
  EXPECT_EQ(ij["restore"], true);
  EXPECT_EQ(ij["restore_gather_timeout_ms"], 1234);
  ckptd_free_string(info);

  char* json = nullptr;
  char* identity = nullptr;
  ASSERT_EQ(ckptd_restore_index(c, "run/step_1", &json, &identity), CKPTD_OK)
      << ckptd_last_error();
  EXPECT_EQ(nlohmann::json::parse(json)["dir"], kDir);
  EXPECT_STREQ(identity, "dev:ino:size:mtime");
  ckptd_free_string(json);
  ckptd_free_string(identity);
  identity = nullptr;
  EXPECT_EQ(ckptd_restore_index(c, "run/step_1", &json, nullptr), CKPTD_OK);
  ckptd_free_string(json);
  EXPECT_EQ(ckptd_restore_index(c, "absent", &json, &identity),
            CKPTD_NOT_FOUND);
  EXPECT_EQ(json, nullptr);
  EXPECT_EQ(identity, nullptr);
  EXPECT_TRUE(absl::StrContains(ckptd_last_error(), "absent"));

  // Rows 2..4 of w into a transposed 3 x 30 buffer; v[1:4]; two bytes items.
  float wt[90] = {};
  int64_t v[3] = {};
  const int64_t w_off[2] = {2, 0}, w_size[2] = {3, 30}, w_str[2] = {1, 3};
  const int64_t v_off[1] = {1}, v_size[1] = {3};
  ckptd_read_request reqs[2] = {};
  reqs[0] = {"w", "float32", 2, w_off, w_size, w_str, wt};
  reqs[1] = {"v", "int64", 1, v_off, v_size, nullptr, v};
  ckptd_restore_bytes items[2] = {{"step", 5, nullptr, 0},
                                  {"big", 1000, nullptr, 0}};
  ckptd_restore_options opts = {};
  opts.group = "g";
  opts.local_world_size = 0;  // 1
  opts.batch_bytes = 128;
  ckptd_restore_stats stats = {};
  ASSERT_EQ(ckptd_restore(c, kDir, &opts, reqs, 2, items, 2, &stats), CKPTD_OK)
      << ckptd_last_error();
  EXPECT_STREQ(ckptd_last_error(), "");
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t col = 0; col < 30; ++col) {
      ASSERT_EQ(wt[r + col * 3], W(r + 2, col));
    }
  }
  EXPECT_EQ(v[0], -4);
  EXPECT_EQ(v[2], 2);
  ASSERT_NE(items[0].data, nullptr);
  EXPECT_EQ(std::string(items[0].data, items[0].length), "12345");
  EXPECT_EQ(items[0].data[5], '\0');
  EXPECT_EQ(items[1].length, 1000u);
  ckptd_free_string(items[0].data);
  ckptd_free_string(items[1].data);
  EXPECT_EQ(stats.bytes, 360u + 24 + 5 + 1000);
  EXPECT_GT(stats.batches, 3);
  EXPECT_GE(stats.seconds, 0.0);
  const auto sent = fake_->Requests();
  EXPECT_EQ(sent.back().group(), "g");
  EXPECT_EQ(sent.back().local_world_size(), 1);

  // NULL options: defaults. An error leaves every bytes item NULL.
  ckptd_read_request missing = {"nope",  "float32", 0, nullptr,
                                nullptr, nullptr,   wt};
  ckptd_restore_bytes one = {"step", 5, reinterpret_cast<char*>(1), 9};
  EXPECT_EQ(ckptd_restore(c, kDir, nullptr, &missing, 1, &one, 1, nullptr),
            CKPTD_NOT_FOUND);
  EXPECT_EQ(one.data, nullptr);
  EXPECT_EQ(one.length, 0u);
  EXPECT_TRUE(absl::StrContains(ckptd_last_error(), "no item 'nope'"));
  // Bad arguments.
  opts.flags = 2;
  EXPECT_EQ(ckptd_restore(c, kDir, &opts, nullptr, 0, nullptr, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(ckptd_last_error(), "flags"));
  opts.flags = CKPTD_RESTORE_NO_VERIFY_CRC;
  EXPECT_EQ(ckptd_restore(c, kDir, &opts, nullptr, 1, nullptr, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  ckptd_read_request no_fqn = {};
  EXPECT_EQ(ckptd_restore(c, kDir, &opts, &no_fqn, 1, nullptr, 0, nullptr),
            CKPTD_INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(ckptd_last_error(), "request 0: fqn is NULL"));
  EXPECT_EQ(
      ckptd_restore(nullptr, kDir, &opts, nullptr, 0, nullptr, 0, nullptr),
      CKPTD_INVALID_ARGUMENT);
  EXPECT_EQ(ckptd_restore(c, kDir, &opts, nullptr, 0, nullptr, 0, nullptr),
            CKPTD_OK);
  EXPECT_TRUE(fake_->Requests().back().skip_crc());
  ckptd_close(c);
}

}  // namespace
}  // namespace ckptd::client
