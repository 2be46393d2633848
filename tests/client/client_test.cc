// Copyright 2026 The ckptd Authors.
//
// libckptd_client's C++ API (client/ckptd_client.h) against a fake daemon
// that implements the protocol's checks (tests/testing/fake_daemon.h: arena
// mapping, sequence, extent order, batch limit): connecting, local
// validation before any call, saves in one batch and streamed through the
// arena, multi-node specs and status, the arena's reuse, registration by
// memfd or by name, Reserve, status/list/cancel/wait and waits that end.
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "ckptd/v1/daemon.grpc.pb.h"
#include "client/ckptd_c.h"
#include "client/ckptd_client.h"
#include "gtest/gtest.h"
#include "tests/testing/fake_daemon.h"
#include "tests/testing/save_items.h"
#include "tests/testing/test_util.h"

namespace ckptd::client {
namespace {

namespace pb = ::ckptd::v1;
using ::ckptd::testing::Bytes;
using ::ckptd::testing::ClientTest;
using ::ckptd::testing::COrderBytes;
using ::ckptd::testing::kMiB;
using ::ckptd::testing::TempDir;
using ::ckptd::testing::Tensor;

// A daemon older than the arena socket: arenas go by name in its shm_dir.
class LegacyDaemonClientTest : public ClientTest {
 protected:
  LegacyDaemonClientTest() { legacy_daemon_ = true; }
};

TEST(ConnectTest, MissingSocketIsUnavailable) {
  TempDir dir;
  const std::string sock = dir.Join("no-daemon.sock");
  ClientOptions options;
  options.socket_path = sock;
  auto c = Client::Connect(options);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable) << c.status();
  EXPECT_NE(c.status().message().find(sock), absl::string_view::npos)
      << c.status();
}

TEST(ConnectTest, DefaultSocketPath) {
  const char* old = std::getenv("CKPTD_SOCKET");
  const std::string saved = old ? old : "";
  ::setenv("CKPTD_SOCKET", "/x/y.sock", 1);
  EXPECT_EQ(DefaultSocketPath(), "/x/y.sock");
  ::setenv("CKPTD_SOCKET", "", 1);
  EXPECT_EQ(DefaultSocketPath(), "/run/ckptd/ckptd.sock");
  if (old) {
    ::setenv("CKPTD_SOCKET", saved.c_str(), 1);
  } else {
    ::unsetenv("CKPTD_SOCKET");
  }
}

TEST_F(ClientTest, ConnectFetchesInfo) {
  fake_->set_peer_address("node7.example:7070");
  ClientOptions options;
  options.socket_path = "unix:" + socket_;  // an explicit URI works too
  ASSERT_OK_AND_ASSIGN(auto c, Client::Connect(options));
  EXPECT_EQ(c->info().version, "0.0.0-fake");
  EXPECT_EQ(c->info().shm_dir, shm_dir_);
  EXPECT_EQ(c->info().max_batch_bytes, kMaxBatch);
  EXPECT_EQ(c->info().checkpoint_roots, std::vector<std::string>{"/ckpt"});
  EXPECT_EQ(c->info().pid, ::getpid());
  EXPECT_EQ(c->info().peer_address, "node7.example:7070");
  fake_->set_peer_address("");
  ASSERT_OK_AND_ASSIGN(auto c2, Client::Connect(options));
  EXPECT_EQ(c2->info().peer_address, "") << "peer service off";
}

// A Wait without a timeout against a daemon that stopped answering ends
// (it looped forever: its own deadline looked like "not finished yet").
TEST_F(ClientTest, WaitEndsWhenTheDaemonStopsAnswering) {
  ClientOptions options;
  options.rpc_timeout = absl::Milliseconds(100);
  auto c = Connect(options);
  ASSERT_NE(c, nullptr);
  fake_->hang_waits_ = true;
  const absl::Time start = absl::Now();
  absl::StatusOr<CheckpointInfo> info =
      c->Wait("job/x", absl::InfiniteDuration());
  fake_->hang_waits_ = false;
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDeadlineExceeded)
      << info.status();
  EXPECT_TRUE(absl::StrContains(
      info.status().message(),
      absl::StrCat("the daemon at ", socket_,
                   " did not answer a Wait for checkpoint job/x within 10.1s")))
      << info.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // With a timeout too: the same message, not gRPC's bare "Deadline
  // Exceeded".
  fake_->hang_waits_ = true;
  info = c->Wait("job/x", absl::Seconds(30));
  fake_->hang_waits_ = false;
  EXPECT_TRUE(
      absl::StrContains(info.status().message(), "did not answer a Wait"))
      << info.status();
}

TEST_F(ClientTest, LocalValidationBeforeAnyRpc) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const int before = fake_->TotalCalls();
  float f[4] = {};
  std::vector<SaveItem> bad_dtype = {Tensor("w", {4}, f, "float33")};
  EXPECT_EQ(c->Save("a", "j", 0, 1, bad_dtype).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SaveItem> null_data = {Tensor("w", {4}, nullptr)};
  EXPECT_EQ(c->Save("a", "j", 0, 1, null_data).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SaveItem> mismatch = {Tensor("w", {2, 2}, f)};
  mismatch[0].strides = {2, 1, 1};
  EXPECT_EQ(c->Save("a", "j", 0, 1, mismatch).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SaveItem> shape = {Tensor("w", {2, 2}, f)};
  shape[0].chunk_sizes = {2};
  EXPECT_EQ(c->Save("a", "j", 0, 1, shape).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SaveItem> good = {Tensor("w", {4}, f)};
  EXPECT_EQ(c->Save("a", "j", 1, 1, good).status().code(),
            absl::StatusCode::kInvalidArgument);  // rank >= world_size
  EXPECT_EQ(c->Save("", "j", 0, 1, good).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Names that are not UTF-8 (the daemon refuses them too, naming the
  // field: ArenaListenerTest.UnparsableGrpcRequestsAreInvalidArgument) or
  // hold control characters.
  EXPECT_EQ(c->Save("a\xff\xfe", "j", 0, 1, good).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c->Save("a", "j\nk", 0, 1, good).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(fake_->TotalCalls(), before)
      << "validation must not talk to the daemon";
  EXPECT_EQ(ShmEntries(), 0u);
}

TEST_F(ClientTest, ClusterValidationBeforeAnyRpc) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  const int before = fake_->TotalCalls();
  float f[4] = {};
  const std::vector<SaveItem> items = {Tensor("w", {4}, f)};
  auto save = [&](ClusterSpec cluster, int rank = 1, int world = 4) {
    SaveOptions options;
    options.cluster = std::move(cluster);
    return c->Save("multi", "j", rank, world, items, options).status();
  };
  const std::vector<std::pair<ClusterSpec, std::string>> cases = {
      {{.num_nodes = 0}, "num_nodes 0 must be >= 1"},
      {{.coordinator = "n0:1", .local_ranks = {1}, .num_nodes = 9},
       "num_nodes 9 exceeds world_size 4"},
      {{.local_ranks = {0, 1}, .num_nodes = 2}, "coordinator is empty"},
      {{.coordinator = "n0:1", .num_nodes = 2}, "local_ranks is empty"},
      {{.coordinator = "n0:1", .local_ranks = {1, 1}, .num_nodes = 2},
       "local rank 1 appears more than once"},
      {{.coordinator = "n0:1", .local_ranks = {1, 7}, .num_nodes = 2},
       "local rank 7 is not in [0, world_size)"},
      {{.coordinator = "n0:1", .local_ranks = {2, 3}, .num_nodes = 2},
       "does not hold this rank (1)"},
  };
  for (const auto& [cluster, needle] : cases) {
    const absl::Status s = save(cluster);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(needle), absl::string_view::npos) << s;
  }
  EXPECT_EQ(fake_->TotalCalls(), before)
      << "cluster validation must not talk to the daemon";
  EXPECT_EQ(ShmEntries(), 0u);
  EXPECT_EQ(fake_->LiveArenas(), 0u) << "no arena was registered";
}

TEST_F(ClientTest, MaxItemsFromDaemon) {
  fake_->set_max_items(2);
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  float f[4] = {};
  std::vector<SaveItem> items(3, Tensor("w", {4}, f));
  EXPECT_EQ(c->Save("a", "j", 0, 1, items).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fake_->Calls("Save"), 0);
}

TEST_F(ClientTest, SmallSaveIsOneBatch) {
  ClientOptions options;
  options.owner = "job/rank0";
  auto c = Connect(options);
  ASSERT_NE(c, nullptr);
  std::vector<int32_t> a(1000);
  std::iota(a.begin(), a.end(), 0);
  double scalar = 3.5;
  std::vector<SaveItem> items = {Tensor("a", {1000}, a.data(), "int32"),
                                 Bytes("extra", "pickled-bytes"),
                                 Tensor("nothing", {0}, nullptr),
                                 Tensor("scalar", {}, &scalar, "float64")};
  items[0].path = {std::string("model"), int64_t{3}, std::string("a")};
  SaveStats stats;
  ASSERT_OK_AND_ASSIGN(std::string id, c->Save("small", "job", 0, 1, items,
                                               {.overwrite = true}, &stats));
  EXPECT_EQ(id, "/ckpt/small");
  EXPECT_EQ(stats.batches, 1);
  EXPECT_EQ(stats.bytes, 4000u + 13 + 8);
  EXPECT_GE(stats.total_seconds, stats.copy_seconds);
  EXPECT_EQ(fake_->Calls("Save"), 1);
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1);
  EXPECT_EQ(fake_->Calls("WaitArenaIdle"), 0) << "a new arena needs no wait";
  EXPECT_EQ(fake_->ArenaSize(), 2 * kMiB);
  EXPECT_EQ(fake_->Owners(), std::vector<std::string>{"job/rank0"});
  EXPECT_EQ(fake_->RegistrationsByFd(), 1) << "a memfd over the arena socket";
  EXPECT_EQ(fake_->RegistrationsByName(), 0);
  EXPECT_EQ(ShmEntries(), 0u) << "nothing was created in shm_dir";

  EXPECT_EQ(fake_->Data(id, 0, "a"),
            std::string(reinterpret_cast<char*>(a.data()), 4000));
  EXPECT_EQ(fake_->Data(id, 0, "extra"), "pickled-bytes");
  EXPECT_EQ(fake_->Data(id, 0, "nothing"), "");
  EXPECT_EQ(fake_->Data(id, 0, "scalar"),
            std::string(reinterpret_cast<char*>(&scalar), 8));
  const auto index = fake_->Items(id, 0);
  ASSERT_EQ(index.size(), 4u);
  EXPECT_EQ(index[0].type(), pb::ITEM_TYPE_TENSOR);
  EXPECT_EQ(index[0].dtype(), "int32");
  EXPECT_EQ(index[0].nbytes(), 4000u);
  ASSERT_EQ(index[0].path_size(), 3);
  EXPECT_EQ(index[0].path(0).key(), "model");
  EXPECT_EQ(index[0].path(1).index(), 3);
  EXPECT_EQ(index[1].type(), pb::ITEM_TYPE_BYTES);
  EXPECT_EQ(index[1].nbytes(), 13u);
  EXPECT_EQ(index[3].global_shape_size(), 0);
  EXPECT_TRUE(fake_->Options(id, 0).overwrite());
  EXPECT_FALSE(fake_->Options(id, 0).dedup_save_to_lowest_rank());

  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, c->Wait(id, absl::Seconds(5)));
  EXPECT_EQ(info.state, "COMMITTED");
  EXPECT_TRUE(info.is_final());
  EXPECT_EQ(info.total_bytes, 4021u);
}

TEST_F(ClientTest, LargeSaveStreamsThroughTheArena) {
  ClientOptions options;
  options.copy_threads = 3;
  auto c = Connect(options);
  ASSERT_NE(c, nullptr);
  // 4 MiB contiguous, a 2 MiB transposed view, a 1.5 MiB bytes item, zero
  // and scalar items: 7.5 MiB through a 3 MiB batch limit.
  std::vector<float> big(kMiB);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i) * 0.5f;
  const int64_t r = 512, k = 1024;
  std::vector<float> m(static_cast<size_t>(r * k));
  for (size_t i = 0; i < m.size(); ++i) m[i] = static_cast<float>(i);
  std::string payload(3 * kMiB / 2 + 7, '\0');
  for (size_t i = 0; i < payload.size(); ++i)
    payload[i] = static_cast<char>(i % 253);
  int64_t one = 42;
  std::vector<SaveItem> items = {
      Tensor("big", {static_cast<int64_t>(big.size())}, big.data()),
      Tensor("zero", {4, 0}, nullptr), Tensor("mt", {k, r}, m.data()),
      Bytes("payload", payload), Tensor("one", {1}, &one, "int64")};
  items[2].strides = {1, k};
  // A sharded chunk: rows [256, 512) of a [512, 1024] tensor.
  items.push_back(Tensor("shard", {r, k}, m.data() + 256 * k));
  items.back().chunk_offsets = {256, 0};
  items.back().chunk_sizes = {256, k};

  SaveStats stats;
  ASSERT_OK_AND_ASSIGN(std::string id,
                       c->Save("/ckpt/big", "", 0, 1, items, {}, &stats));
  EXPECT_EQ(id, "/ckpt/big");
  const uint64_t total = 4 * kMiB + 2 * kMiB + payload.size() + 8 + kMiB;
  EXPECT_EQ(stats.bytes, total);
  EXPECT_GE(stats.batches, 3);
  EXPECT_EQ(fake_->Calls("Save"), stats.batches);
  EXPECT_EQ(fake_->ArenaSize(), 4 * kMiB)
      << "3 MiB batch limit, rounded to 2 MiB";
  uint64_t sum = 0;
  for (uint64_t b : fake_->BatchBytes()) {
    EXPECT_LE(b, kMaxBatch);
    sum += b;
  }
  EXPECT_EQ(sum, total);

  EXPECT_EQ(fake_->Data(id, 0, "big"),
            std::string(reinterpret_cast<const char*>(big.data()), 4 * kMiB));
  EXPECT_EQ(fake_->Data(id, 0, "mt"), COrderBytes(items[2], 4));
  EXPECT_EQ(fake_->Data(id, 0, "payload"), payload);
  EXPECT_EQ(fake_->Data(id, 0, "one"),
            std::string(reinterpret_cast<char*>(&one), 8));
  EXPECT_EQ(
      fake_->Data(id, 0, "shard"),
      std::string(reinterpret_cast<const char*>(m.data() + 256 * k), kMiB));
  EXPECT_EQ(fake_->Data(id, 0, "zero"), "");
}

TEST_F(ClientTest, ClusterIsSentWithTheFirstBatchOnly) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  // 5 MiB through the 3 MiB batch limit: several batches; the fake daemon
  // refuses a ClusterSpec after sequence 0.
  std::vector<float> big(5 * kMiB / 4, 1.0f);
  const std::vector<SaveItem> items = {
      Tensor("big", {static_cast<int64_t>(big.size())}, big.data())};
  SaveOptions options;
  options.cluster = {.coordinator = "node0.example:7070",
                     .local_ranks = {3, 2},
                     .num_nodes = 2};
  SaveStats stats;
  ASSERT_OK_AND_ASSIGN(std::string id,
                       c->Save("multi", "j", 2, 4, items, options, &stats));
  EXPECT_GE(stats.batches, 2);
  const std::optional<pb::ClusterSpec> sent = fake_->Cluster(id, 2);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->coordinator(), "node0.example:7070");
  EXPECT_EQ(
      std::vector<int>(sent->local_ranks().begin(), sent->local_ranks().end()),
      (std::vector<int>{3, 2}))
      << "sent as given";
  EXPECT_EQ(sent->num_nodes(), 2);

  // The default (single node) sends no ClusterSpec at all.
  ASSERT_OK_AND_ASSIGN(std::string single, c->Save("single", "j", 0, 1, items));
  EXPECT_FALSE(fake_->Cluster(single, 0).has_value());
}

TEST_F(ClientTest, MultiNodeStatus) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  fake_->AddCheckpoint("/ckpt/mn", "job", pb::WRITING, 4000);
  fake_->SetMultiNode("/ckpt/mn", 3, 3, 2, "node0.example:7070", 4, 1000, 250);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo st, c->GetStatus("/ckpt/mn"));
  EXPECT_EQ(st.num_nodes, 3);
  EXPECT_EQ(st.nodes_planned, 3);
  EXPECT_EQ(st.nodes_prepared, 2);
  EXPECT_EQ(st.coordinator, "node0.example:7070");
  EXPECT_FALSE(st.is_coordinator);
  EXPECT_EQ(st.local_ranks, 4);
  EXPECT_EQ(st.local_total_bytes, 1000u);
  EXPECT_EQ(st.local_written_bytes, 250u);
  fake_->SetMultiNode("/ckpt/mn", 3, 3, 3, "", 4, 1000, 1000);
  ASSERT_OK_AND_ASSIGN(auto list, c->List());
  ASSERT_EQ(list.size(), 1u);
  EXPECT_TRUE(list[0].is_coordinator);
  EXPECT_EQ(list[0].nodes_prepared, 3);
}

TEST_F(ClientTest, ArenaIsReusedGrownAndRecreated) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<float> small(1000), large(kMiB);  // 4 KB, then 4 MiB
  std::vector<SaveItem> s = {Tensor("w", {1000}, small.data())};
  std::vector<SaveItem> l = {
      Tensor("w", {static_cast<int64_t>(kMiB)}, large.data())};
  ASSERT_OK(c->Save("c1", "j", 0, 1, s));
  ASSERT_OK(c->Save("c2", "j", 0, 1, s));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1);
  EXPECT_EQ(fake_->Calls("WaitArenaIdle"), 1)
      << "reuse waits for the arena to be idle";
  // Larger: release the 2 MiB arena, register a 4 MiB one.
  ASSERT_OK(c->Save("c3", "j", 0, 1, l));
  EXPECT_EQ(fake_->Calls("ReleaseArena"), 1);
  EXPECT_EQ(fake_->Calls("RegisterArena"), 2);
  EXPECT_EQ(fake_->ArenaSize(), 4 * kMiB);
  EXPECT_EQ(fake_->LiveArenas(), 1u);
  // Smaller again: the big arena is kept.
  ASSERT_OK(c->Save("c4", "j", 0, 1, s));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 2);
  // The daemon dropped the idle arena: WaitArenaIdle is NOT_FOUND, and the
  // client registers a new one.
  fake_->ForgetArenas();
  ASSERT_OK(c->Save("c5", "j", 0, 1, s));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 3);
  EXPECT_EQ(ShmEntries(), 0u);
  c.reset();
  EXPECT_EQ(fake_->Calls("ReleaseArena"), 2)
      << "the destructor releases the arena";
  EXPECT_EQ(fake_->LiveArenas(), 0u);
}

TEST_F(LegacyDaemonClientTest, ArenasGoByNameWithoutAnArenaSocket) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->info().arena_socket, "");
  std::vector<float> small(1000);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<float>(i);
  std::vector<SaveItem> s = {Tensor("w", {1000}, small.data())};
  ASSERT_OK_AND_ASSIGN(std::string id, c->Save("old1", "j", 0, 1, s));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1);
  EXPECT_EQ(fake_->RegistrationsByName(), 1);
  EXPECT_EQ(fake_->RegistrationsByFd(), 0);
  EXPECT_EQ(ShmEntries(), 0u) << "the daemon unlinked the arena";
  EXPECT_EQ(fake_->Data(id, 0, "w"),
            std::string(reinterpret_cast<const char*>(small.data()), 4000));
}

TEST_F(ClientTest, ArenaSocketRegistrationErrorsKeepTheirCode) {
  // The arena socket is gone (daemon restarting): UNAVAILABLE naming it.
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->info().arena_socket, socket_ + ".arena");
  arena_listener_.reset();
  std::vector<float> small(1000);
  std::vector<SaveItem> s = {Tensor("w", {1000}, small.data())};
  absl::StatusOr<std::string> r = c->Save("gone", "j", 0, 1, s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find(socket_ + ".arena"),
            absl::string_view::npos)
      << r.status();
  EXPECT_EQ(fake_->Calls("RegisterArena"), 0);
  EXPECT_EQ(fake_->Calls("Save"), 0);
}

TEST_F(ClientTest, ReserveRegistersTheArenaBeforeTheFirstSave) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  ASSERT_OK(c->Reserve(0));
  EXPECT_EQ(fake_->TotalCalls(), 1) << "Reserve(0) is a no-op (GetInfo only)";
  EXPECT_EQ(ShmEntries(), 0u);
  // Sized as Save sizes it: 5 MiB capped at the 3 MiB batch limit, rounded
  // up to 2 MiB.
  ASSERT_OK(c->Reserve(5 * kMiB));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1);
  EXPECT_EQ(fake_->Calls("WaitArenaIdle"), 0);
  EXPECT_EQ(fake_->Calls("Save"), 0);
  EXPECT_EQ(fake_->LiveArenas(), 1u);
  EXPECT_EQ(fake_->ArenaSize(), 4 * kMiB);
  // A smaller reservation keeps the arena, without a call.
  const int calls = fake_->TotalCalls();
  ASSERT_OK(c->Reserve(kMiB));
  EXPECT_EQ(fake_->TotalCalls(), calls);
  // The first Save (4 MiB, streamed in batches) uses the reserved arena.
  std::vector<float> data(kMiB);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  std::vector<SaveItem> items = {
      Tensor("w", {static_cast<int64_t>(kMiB)}, data.data())};
  ASSERT_OK_AND_ASSIGN(std::string id, c->Save("r1", "j", 0, 1, items));
  EXPECT_EQ(fake_->Calls("RegisterArena"), 1) << "no second RegisterArena";
  EXPECT_EQ(fake_->Calls("ReleaseArena"), 0);
  EXPECT_EQ(fake_->LiveArenas(), 1u);
  EXPECT_EQ(fake_->Data(id, 0, "w"),
            std::string(reinterpret_cast<const char*>(data.data()), 4 * kMiB));
  c.reset();
  EXPECT_EQ(fake_->LiveArenas(), 0u);
  EXPECT_EQ(ShmEntries(), 0u);

  // The same through the C ABI: a 2 MiB arena for 1000 bytes, reused by the
  // first ckptd_save.
  ckptd_client* cc = nullptr;
  ASSERT_EQ(ckptd_connect(socket_.c_str(), 1, &cc), CKPTD_OK)
      << ckptd_last_error();
  ASSERT_EQ(ckptd_reserve(cc, 1000), CKPTD_OK) << ckptd_last_error();
  EXPECT_STREQ(ckptd_last_error(), "");
  EXPECT_EQ(fake_->Calls("RegisterArena"), 2);
  EXPECT_EQ(fake_->ArenaSize(), 2 * kMiB);
  EXPECT_EQ(ckptd_reserve(cc, 0), CKPTD_OK);
  int64_t shape[1] = {250};
  ckptd_item item = {};
  item.fqn = "w";
  item.ndim = 1;
  item.global_shape = shape;
  item.data = data.data();
  ASSERT_EQ(ckptd_save(cc, "r2", "j", 0, 1, &item, 1, 0, nullptr), CKPTD_OK)
      << ckptd_last_error();
  EXPECT_EQ(fake_->Calls("RegisterArena"), 2) << "no second RegisterArena";
  EXPECT_EQ(fake_->Data("/ckpt/r2", 0, "w"),
            std::string(reinterpret_cast<const char*>(data.data()), 1000));
  EXPECT_EQ(ckptd_reserve(nullptr, 1), CKPTD_INVALID_ARGUMENT);
  EXPECT_NE(std::string(ckptd_last_error()).find("client is NULL"),
            std::string::npos);
  ckptd_close(cc);
  EXPECT_EQ(fake_->LiveArenas(), 0u);
}

TEST_F(ClientTest, StatusListCancelWait) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  fake_->set_hold_commit(true);
  float f[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<SaveItem> items = {Tensor("w", {8}, f)};
  ASSERT_OK_AND_ASSIGN(std::string id, c->Save("held", "jobA", 0, 1, items));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo st, c->GetStatus(id));
  EXPECT_EQ(st.state, "WRITING");
  EXPECT_EQ(st.job, "jobA");
  EXPECT_EQ(st.total_bytes, 32u);
  EXPECT_EQ(st.ranks_staged, 1);
  EXPECT_FALSE(st.is_final());

  // Wait times out, in several slices when rpc_timeout is short.
  ClientOptions fast;
  fast.rpc_timeout = absl::Milliseconds(100);
  auto c2 = Connect(fast);
  ASSERT_NE(c2, nullptr);
  const int waits = fake_->Calls("Wait");
  const absl::Time t0 = absl::Now();
  auto w = c2->Wait(id, absl::Milliseconds(450));
  EXPECT_EQ(w.status().code(), absl::StatusCode::kDeadlineExceeded)
      << w.status();
  EXPECT_GE(absl::Now() - t0, absl::Milliseconds(400));
  // Several slices (fewer than 450/100 when calls are slow, e.g. under ASan).
  EXPECT_GE(fake_->Calls("Wait") - waits, 2);

  // Wait returns when another thread finishes it.
  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(100));
    fake_->FinishCheckpoint(id, pb::COMMITTED);
  });
  ASSERT_OK_AND_ASSIGN(CheckpointInfo done, c->Wait(id));
  finisher.join();
  EXPECT_EQ(done.state, "COMMITTED");

  // Cancel of a committed checkpoint: the daemon's code and message as is.
  const absl::Status cancel = c->Cancel(id, "operator");
  EXPECT_EQ(cancel.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cancel.message(), "checkpoint /ckpt/held is already COMMITTED");

  fake_->AddCheckpoint("/ckpt/other", "jobB", pb::STAGING, 1000);
  ASSERT_OK(c->Cancel("/ckpt/other", "operator"));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo cancelled,
                       c->Wait("/ckpt/other", absl::Seconds(1)));
  EXPECT_EQ(cancelled.state, "CANCELLED");
  EXPECT_EQ(cancelled.error, "operator");

  ASSERT_OK_AND_ASSIGN(auto all, c->List());
  ASSERT_EQ(all.size(), 2u);
  ASSERT_OK_AND_ASSIGN(auto only_b, c->List("jobB"));
  ASSERT_EQ(only_b.size(), 1u);
  EXPECT_EQ(only_b[0].checkpoint_id, "/ckpt/other");

  auto missing = c->GetStatus("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), "no checkpoint 'nope'");
  EXPECT_EQ(c->Wait("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c->Cancel("nope").code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, ConcurrentStatusDuringSave) {
  auto c = Connect();
  ASSERT_NE(c, nullptr);
  std::vector<float> data(2 * kMiB);
  std::vector<SaveItem> items = {
      Tensor("w", {static_cast<int64_t>(data.size())}, data.data())};
  std::atomic<bool> stop{false};
  std::thread poller([&] {
    while (!stop) (void)c->List();
  });
  for (int i = 0; i < 3; ++i)
    ASSERT_OK(c->Save(absl::StrCat("cc", i), "j", 0, 1, items));
  stop = true;
  poller.join();
}

}  // namespace
}  // namespace ckptd::client
