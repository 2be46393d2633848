// Copyright 2026 The ckptd Authors.
//
// Multi-node checkpoints in one process (tests/testing/multinode_fixture.h:
// N CheckpointManagers with their own PeerServers on 127.0.0.1:0, real gRPC
// with the token or TLS, one shared checkpoint root). Covers the plan round
// (dedup across nodes), the commit round, the plan cache, overwrite, a bad
// token, TLS, conflicting cluster specs, malformed and oversized peer
// calls, daemons without a peer service, and that the next checkpoint
// succeeds after each failure. Aborts, cancels and lost answers:
// multinode_abort_test.cc; DCP's StorageWriter and zstd across nodes:
// multinode_external_test.cc; killed / SIGSTOPped daemon processes:
// tests/python/test_multinode.py and tests/netns/.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "ckptd/v1/peer.grpc.pb.h"
#include "common/env.h"
#include "daemon/cluster/peer_codec.h"
#include "daemon/cluster/peer_service.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/save/checkpoint_manager.h"
#include "fmt/format.h"
#include "format/checkpoint/checkpoint_reader.h"
#include "format/checkpoint/verify.h"
#include "format/metadata/metadata.h"
#include "format/pickle/py_value.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "shm/arena.h"
#include "tests/testing/multinode_fixture.h"
#include "tests/testing/raw_grpc.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kToken = ::ckptd::testing::kMultiNodeToken;
using ::ckptd::testing::RankOptions;

class MultiNodeTest : public ::ckptd::testing::MultiNodeFixture {
 protected:
  void Configure(int n, DaemonOptions& o, PeerServerOptions& po,
                 PeerClientOptions& pc) override {
    po.tls = server_tls_;
    po.max_message_bytes = peer_max_message_bytes_;
    pc.tls =
        n < static_cast<int>(client_tls_.size()) ? client_tls_[n] : server_tls_;
  }

  using MultiNodeFixture::MakeRank;
  using MultiNodeFixture::SaveAll;
  SaveBatch MakeRank(const std::string& id, int rank, bool overwrite) {
    return MakeRank(id, rank, RankOptions{.overwrite = overwrite});
  }
  std::vector<absl::StatusOr<CheckpointInfo>> SaveAll(const std::string& id,
                                                      bool overwrite) {
    return SaveAll(id, RankOptions{.overwrite = overwrite});
  }

  // Whether node n's metrics show `line` within 10 s (a peer call is
  // counted when its answer arrives, which may be after the checkpoint
  // ended); the metrics text otherwise, as the failure's message.
  ::testing::AssertionResult CountedSoon(int n, const std::string& line) {
    std::string text;
    for (int tries = 0; tries < 1000; ++tries) {
      text = nodes_[n]->metrics->Render();
      if (text.find(line) != std::string::npos)
        return ::testing::AssertionSuccess();
      absl::SleepFor(absl::Milliseconds(10));
    }
    return ::testing::AssertionFailure()
           << "node " << n << " never counted " << line << " in:\n"
           << text;
  }

  // Makes a CA and one certificate for 127.0.0.1 signed by it (server and
  // client use) with openssl; false if openssl is missing.
  bool MakeCerts(const std::string& prefix, PeerTls* tls) {
    const std::string d = dir_.path();
    const std::string cmd = fmt::format(
        "cd {0} && openssl req -x509 -newkey rsa:2048 -nodes -keyout {1}ca.key "
        "-out {1}ca.pem "
        "-days 2 -subj /CN={1}ckptd-test-ca && "
        "openssl req -newkey rsa:2048 -nodes -keyout {1}node.key -out "
        "{1}node.csr "
        "-subj /CN=127.0.0.1 && "
        "printf "
        "'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,"
        "clientAuth\n' > "
        "{1}ext.cnf && "
        "openssl x509 -req -in {1}node.csr -CA {1}ca.pem -CAkey {1}ca.key "
        "-CAcreateserial "
        "-out {1}node.pem -days 2 -extfile {1}ext.cnf",
        d, prefix);
    std::string out;
    if (::ckptd::testing::RunCommand(cmd, &out) != 0) {
      ADD_FAILURE() << "openssl failed: " << out;
      return false;
    }
    auto read = [&](const std::string& name) {
      return ReadFileToString(Env::Default(), dir_.Join(prefix + name), 1 << 20)
          .value_or("");
    };
    tls->cert_pem = read("node.pem");
    tls->key_pem = read("node.key");
    tls->ca_pem = read("ca.pem");
    return !tls->cert_pem.empty();
  }

  PeerTls server_tls_;
  std::vector<PeerTls> client_tls_;       // per node; default: server_tls_
  int peer_max_message_bytes_ = 1 << 30;  // Plan, Prepare
};

TEST_F(MultiNodeTest, ThreeNodesCommitOneCheckpointWithDedupAcrossNodes) {
  StartNodes(3, 2);
  auto infos = SaveAll("job/step1");
  for (size_t n = 0; n < infos.size(); ++n) {
    ASSERT_TRUE(infos[n].ok()) << infos[n].status();
    EXPECT_EQ(infos[n]->state, State::kCommitted)
        << "node " << n << ": " << infos[n]->error;
    EXPECT_EQ(infos[n]->num_nodes, 3);
    EXPECT_EQ(infos[n]->local_ranks, 2);
    EXPECT_EQ(infos[n]->is_coordinator, n == 0);
  }
  ExpectCommitted("job/step1");
  // The global view on a participant: all 6 ranks' bytes.
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info,
                       nodes_[2]->manager->GetStatus("job/step1"));
  EXPECT_EQ(info.nodes_prepared, 3);
  EXPECT_GT(info.total_bytes, info.local_total_bytes);
  // Same items again: the coordinator's plan cache, digest-only plan calls.
  auto again = SaveAll("job/step2");
  for (auto& i : again) {
    ASSERT_TRUE(i.ok()) << i.status();
    EXPECT_EQ(i->state, State::kCommitted) << i->error;
  }
  ExpectCommitted("job/step2");
}

TEST_F(MultiNodeTest, OverwriteAndRefusal) {
  StartNodes(2, 1);
  for (auto& i : SaveAll("job/same"))
    ASSERT_EQ(i->state, State::kCommitted) << i->error;
  // Without overwrite: refused by the coordinator, on every node; the
  // committed checkpoint stays intact.
  for (auto& i : SaveAll("job/same")) {
    ASSERT_TRUE(i.ok());
    EXPECT_EQ(i->state, State::kFailed);
    EXPECT_THAT(std::string(i->error.message()),
                HasSubstr("already holds a committed"));
  }
  ExpectCommitted("job/same");
  for (auto& i : SaveAll("job/same", /*overwrite=*/true)) {
    EXPECT_EQ(i->state, State::kCommitted) << i->error;
  }
  ExpectCommitted("job/same");
}

TEST_F(MultiNodeTest, BadTokenFailsEveryNodeAndTheNextSaveSucceeds) {
  StartNodes(3, 1, {kToken, kToken, "not-the-token-at-all-000000"});
  auto infos = SaveAll("job/t");
  ASSERT_TRUE(infos[2].ok());
  EXPECT_EQ(infos[2]->state, State::kFailed);
  EXPECT_EQ(infos[2]->error.code(), absl::StatusCode::kUnauthenticated)
      << infos[2]->error;
  EXPECT_THAT(std::string(infos[2]->error.message()), HasSubstr("peer token"));
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(infos[n].ok());
    EXPECT_EQ(infos[n]->state, State::kFailed) << "node " << n;
  }
  ExpectNoMetadata("job/t");
  // The refusal is counted on both sides: the coordinator's peer service
  // answered UNAUTHENTICATED, node 2's call got it; node 1's calls went
  // through. (A node may learn its checkpoint's end from a heartbeat before
  // its Plan or Prepare call returns and is counted: each count is awaited.)
  EXPECT_TRUE(CountedSoon(0,
                          "\nckptd_peer_requests_total{method=\"Plan\","
                          "code=\"UNAUTHENTICATED\"} 1\n"));
  EXPECT_TRUE(CountedSoon(2,
                          "\nckptd_peer_calls_total{method=\"Plan\","
                          "code=\"UNAUTHENTICATED\"} 1\n"));
  EXPECT_TRUE(CountedSoon(1, "ckptd_peer_calls_total{method=\"Plan\""));
  EXPECT_THAT(nodes_[1]->metrics->Render(),
              Not(HasSubstr("code=\"UNAUTHENTICATED\"")));
  // Fixed configuration: the next checkpoint commits.
  StartNodes(3, 1);
  for (auto& i : SaveAll("job/t2"))
    EXPECT_EQ(i->state, State::kCommitted) << i->error;
  ExpectCommitted("job/t2");
  for (int n : {1, 2}) {
    EXPECT_TRUE(CountedSoon(n,
                            "\nckptd_peer_calls_total{method=\"Plan\","
                            "code=\"OK\"} 1\n"));
    EXPECT_TRUE(CountedSoon(n,
                            "\nckptd_peer_calls_total{method=\"Prepare\","
                            "code=\"OK\"} 1\n"));
  }
  EXPECT_TRUE(CountedSoon(0,
                          "\nckptd_peer_requests_total{method=\"Prepare\","
                          "code=\"OK\"} 2\n"));
}

TEST_F(MultiNodeTest, ConflictingClusterSpecsAreRefused) {
  StartNodes(2, 2);
  // Node 1's ranks claim rank 1, which node 0 holds.
  SaveBatch b0 = MakeRank("job/x", 0);
  SaveBatch b1 = MakeRank("job/x", 1);
  SaveBatch b2 = MakeRank("job/x", 2);
  SaveBatch b3 = MakeRank("job/x", 3);
  b2.cluster.local_ranks = b3.cluster.local_ranks = {1, 2, 3};
  b2.cluster.num_nodes = b3.cluster.num_nodes = 2;
  (void)SaveSync(0, b0);
  (void)SaveSync(0, b1);
  // Rank 2's local ranks do not start at node 1's own id: refused by the
  // node (rank 1 is listed but never sends) — the coordinator names it.
  (void)SaveSync(1, b2);
  (void)SaveSync(1, b3);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo i0, WaitFinal(0, "job/x"));
  EXPECT_EQ(i0.state, State::kFailed);
  ExpectNoMetadata("job/x");
}

TEST_F(MultiNodeTest, MismatchedClusterWithinANodeIsRefused) {
  StartNodes(2, 2);
  SaveBatch b0 = MakeRank("job/m", 0);
  SaveBatch b1 = MakeRank("job/m", 1);
  b1.cluster.coordinator = "127.0.0.1:1";
  ASSERT_OK(SaveSync(0, b0));
  absl::StatusOr<SaveReply> r = SaveSync(0, b1);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("cluster"));
}

TEST_F(MultiNodeTest, MutualTlsBetweenNodes) {
  if (::ckptd::testing::RunCommand("command -v openssl") != 0) {
    GTEST_SKIP() << "openssl is not installed (scripts/setup.sh installs it)";
  }
  PeerTls other;
  ASSERT_TRUE(MakeCerts("a-", &server_tls_));
  ASSERT_TRUE(MakeCerts("b-", &other));  // a second, unrelated CA
  // Node 2 presents a certificate of another CA: its TLS handshake fails.
  client_tls_ = {server_tls_, server_tls_, other};
  StartNodes(3, 1);
  auto infos = SaveAll("job/tls-bad");
  ASSERT_TRUE(infos[2].ok());
  EXPECT_EQ(infos[2]->state, State::kFailed);
  EXPECT_EQ(infos[2]->error.code(), absl::StatusCode::kUnavailable)
      << infos[2]->error;
  ExpectNoMetadata("job/tls-bad");
  // Every node with the cluster's CA: committed over mutual TLS.
  client_tls_.clear();
  StartNodes(3, 1);
  for (auto& i : SaveAll("job/tls"))
    EXPECT_EQ(i->state, State::kCommitted) << i->error;
  ExpectCommitted("job/tls");
}

TEST_F(MultiNodeTest, MalformedPeerCallsGetPreciseErrorsAndChangeNothing) {
  StartNodes(2, 1);
  namespace pb = ::ckptd::v1;
  auto stub = pb::PeerDaemon::NewStub(grpc::CreateChannel(
      nodes_[0]->address, grpc::InsecureChannelCredentials()));
  auto call = [&](auto method, const auto& req, auto* resp, bool token = true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(5));
    if (token)
      ctx.AddMetadata("authorization", std::string("Bearer ") + kToken);
    return ((*stub).*method)(&ctx, req, resp);
  };
  pb::PlanRequest plan;
  plan.mutable_call()->set_checkpoint_id("job/bad");
  plan.mutable_call()->set_node(1);
  plan.set_world_size(2);
  plan.set_num_nodes(2);
  plan.add_ranks(1);
  pb::RankIndex* ri = plan.mutable_index()->add_ranks();
  ri->set_rank(1);
  ri->add_kind(7);  // no such kind
  ri->add_nbytes(4);
  pb::PlanResponse pr;
  grpc::Status st =
      call(&pb::PeerDaemon::Stub::Plan, plan, &pr, /*token=*/false);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << st.error_message();
  st = call(&pb::PeerDaemon::Stub::Plan, plan, &pr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("bad kind"));
  pb::ItemKind* k = plan.mutable_index()->add_kinds();
  k->set_fqn("w");
  k->set_type(pb::ITEM_TYPE_TENSOR);
  k->set_dtype("float32");
  k->add_global_shape(4);
  ri->set_kind(0, 0);  // a 1-d tensor, but no box values follow
  st = call(&pb::PeerDaemon::Stub::Plan, plan, &pr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("boxes run short"));
  ri->add_offsets(0);
  ri->add_sizes(1);
  plan.set_ranks(0, 0);  // the node's ranks must start with its id
  st = call(&pb::PeerDaemon::Stub::Plan, plan, &pr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("node's id"));
  k->set_dtype("float128");
  plan.set_ranks(0, 1);
  st = call(&pb::PeerDaemon::Stub::Plan, plan, &pr);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("unknown dtype"));
  pb::PrepareRequest prep;
  prep.mutable_call()->set_checkpoint_id("job/never");
  pb::PrepareResponse pres;
  st = call(&pb::PeerDaemon::Stub::Prepare, prep, &pres);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  pb::HeartbeatRequest hb;
  hb.mutable_call()->set_checkpoint_id("../../etc");
  pb::HeartbeatResponse hres;
  st = call(&pb::PeerDaemon::Stub::Heartbeat, hb, &hres);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  pb::AbortRequest ab;
  ab.mutable_call()->set_checkpoint_id("job/never");
  ab.set_code(99);
  pb::AbortResponse ares;
  st = call(&pb::PeerDaemon::Stub::Abort, ab, &ares);
  EXPECT_TRUE(st.ok() || st.error_code() == grpc::StatusCode::NOT_FOUND)
      << st.error_message();
  // Requests that do not parse (past the stub's serializer): the method,
  // the message and the field are named; without the token, refused first.
  const auto channel = grpc::CreateChannel(nodes_[0]->address,
                                           grpc::InsecureChannelCredentials());
  const std::vector<std::pair<std::string, std::string>> auth = {
      {"authorization", std::string("Bearer ") + kToken}};
  pb::PlanRequest bad_plan = plan;
  bad_plan.mutable_call()->set_job(ckptd::testing::kBadUtf8Placeholder);
  st = ckptd::testing::RawUnaryCall(channel, "/ckptd.v1.PeerDaemon/Plan",
                                    ckptd::testing::PoisonUtf8(bad_plan), auth);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(),
              HasSubstr("peer Plan: ckptd.v1.PlanRequest: call.job (at byte "
                        "2) is not valid UTF-8"));
  st = ckptd::testing::RawUnaryCall(channel, "/ckptd.v1.PeerDaemon/Heartbeat",
                                    std::string("\xff\xff\xff", 3), auth);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(),
              HasSubstr("peer Heartbeat: the 3-byte request is not a valid "
                        "ckptd.v1.HeartbeatRequest"));
  st = ckptd::testing::RawUnaryCall(channel, "/ckptd.v1.PeerDaemon/Heartbeat",
                                    std::string("\xff\xff\xff", 3));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << st.error_message();
  // The daemons go on: a real checkpoint commits.
  for (auto& i : SaveAll("job/good"))
    EXPECT_EQ(i->state, State::kCommitted) << i->error;
  ExpectCommitted("job/good");
}

// This process's /proc/self/status figure `key` ("VmHWM:"), in bytes.
int64_t ProcStatusBytes(std::string_view key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0)
      return std::atoll(line.c_str() + key.size()) << 10;
  }
  return -1;
}

// Sets VmHWM (peak resident memory) to the current resident memory.
bool ResetPeakMemory() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.close();
  return f.good();
}

constexpr char kFloodTarget[] = "CKPTD_TEST_PEER_FLOOD_TARGET";

// Runs PeerFloodChild.SendsUnauthenticatedPlans in a child process (so the
// requests it builds and sends are not in this process's memory); returns
// its exit status.
int RunFloodChild(const std::string& address, int calls, int mib) {
  std::vector<std::string> env = {
      fmt::format("{}={}", kFloodTarget, address),
      fmt::format("CKPTD_TEST_PEER_FLOOD_CALLS={}", calls),
      fmt::format("CKPTD_TEST_PEER_FLOOD_MIB={}", mib)};
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "GTEST_", 6) != 0) env.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "multinode_test";
  std::string filter =
      "--gtest_filter=PeerFloodChild.SendsUnauthenticatedPlans";
  char* argv[] = {self.data(), filter.data(), nullptr};
  pid_t pid;
  if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, argv,
                  envp.data()) != 0) {
    return -1;
  }
  int status = 0;
  if (::waitpid(pid, &status, 0) != pid) return -1;
  return status;
}

// Three unauthenticated 229 MB Plan calls once took the daemon from 62 to 906
// MiB: gRPC received (and parsed) each request before the handler checked its
// token. Now the token is checked on the call's metadata and the request is
// never read.
TEST_F(MultiNodeTest, UnauthenticatedCallsAreRefusedBeforeTheirBodiesAreRead) {
  StartNodes(2, 1);
  if (!ResetPeakMemory()) {
    GTEST_SKIP() << "cannot reset VmHWM (/proc/self/clear_refs)";
  }
  const int64_t before = ProcStatusBytes("VmRSS:");
  constexpr int kCalls = 3, kMiB = 128;
  const int status = RunFloodChild(nodes_[0]->address, kCalls, kMiB);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the flood child failed (status " << status << "); see its output";
  const int64_t growth = ProcStatusBytes("VmHWM:") - before;
  std::cout << "peak memory grew by " << (growth >> 10) << " KiB while "
            << kCalls << " unauthenticated Plan calls sent " << kMiB
            << " MiB each\n";
  // Refused calls cost what HTTP/2 flow control lets a caller send ahead (a
  // few MiB measured); reading the bodies costs at least kCalls * kMiB.
  EXPECT_LT(growth, 48 << 20)
      << "peak memory grew by " << (growth >> 20) << " MiB while " << kCalls
      << " unauthenticated calls sent " << kMiB << " MiB each";
  EXPECT_THAT(nodes_[0]->metrics->Render(),
              HasSubstr("\nckptd_peer_requests_total{method=\"Plan\","
                        "code=\"UNAUTHENTICATED\"} 3\n"));
  // Authenticated calls go on working.
  for (auto& i : SaveAll("job/after-flood"))
    EXPECT_EQ(i->state, State::kCommitted) << i->error;
  ExpectCommitted("job/after-flood");
}

// The other half of the test above, run in a child process by it.
TEST(PeerFloodChild, SendsUnauthenticatedPlans) {
  const char* target = std::getenv(kFloodTarget);
  if (target == nullptr) {
    GTEST_SKIP() << "run by MultiNodeTest."
                    "UnauthenticatedCallsAreRefusedBeforeTheirBodiesAreRead";
  }
  const int calls = std::atoi(std::getenv("CKPTD_TEST_PEER_FLOOD_CALLS"));
  const int mib = std::atoi(std::getenv("CKPTD_TEST_PEER_FLOOD_MIB"));
  namespace pb = ::ckptd::v1;
  auto stub = pb::PeerDaemon::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  pb::PlanRequest plan;
  plan.mutable_call()->set_checkpoint_id("job/flood");
  plan.mutable_index()->add_kinds()->set_fqn(
      std::string(static_cast<size_t>(mib) << 20, 'x'));
  std::vector<std::thread> threads;
  for (int i = 0; i < calls; ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
      if (i % 2 == 1) {  // a wrong token, or none
        ctx.AddMetadata("authorization", "Bearer not-the-token-0000000000");
      }
      pb::PlanResponse resp;
      grpc::Status st = stub->Plan(&ctx, plan, &resp);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << st.error_message();
      EXPECT_THAT(st.error_message(), HasSubstr("peer token"));
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST_F(MultiNodeTest, OversizedPeerRequestsAreRefusedNamingMethodAndLimit) {
  peer_max_message_bytes_ = 1 << 20;  // Plan, Prepare; Heartbeat, Abort: 64 KiB
  StartNodes(2, 1);
  namespace pb = ::ckptd::v1;
  auto stub = pb::PeerDaemon::NewStub(grpc::CreateChannel(
      nodes_[0]->address, grpc::InsecureChannelCredentials()));
  auto call = [&](auto method, const auto& req, auto* resp) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(10));
    ctx.AddMetadata("authorization", std::string("Bearer ") + kToken);
    return ((*stub).*method)(&ctx, req, resp);
  };
  auto expect_refused = [](const grpc::Status& st, const std::string& method,
                           int limit) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << method << ": " << st.error_message();
    EXPECT_THAT(st.error_message(),
                AllOf(HasSubstr("peer " + method + ":"),
                      HasSubstr(fmt::format("the {} bytes", limit))));
  };
  const std::string big(100 << 10, 'x');  // over 64 KiB
  pb::HeartbeatRequest hb;
  hb.mutable_call()->set_checkpoint_id(big);
  pb::HeartbeatResponse hres;
  expect_refused(call(&pb::PeerDaemon::Stub::Heartbeat, hb, &hres), "Heartbeat",
                 64 << 10);
  pb::AbortRequest ab;
  ab.mutable_call()->set_checkpoint_id("job/never");
  ab.set_reason(big);
  pb::AbortResponse ares;
  expect_refused(call(&pb::PeerDaemon::Stub::Abort, ab, &ares), "Abort",
                 64 << 10);
  const std::string huge((1 << 20) + 1, 'x');  // over 1 MiB
  pb::PlanRequest plan;
  plan.mutable_call()->set_checkpoint_id("job/big");
  plan.mutable_index()->add_kinds()->set_fqn(huge);
  pb::PlanResponse pr;
  expect_refused(call(&pb::PeerDaemon::Stub::Plan, plan, &pr), "Plan", 1 << 20);
  pb::PrepareRequest prep;
  prep.mutable_call()->set_checkpoint_id("job/big");
  prep.add_ranks()->mutable_offset()->Resize(150000, ~uint64_t{0});  // 1.5 MB
  pb::PrepareResponse pres;
  expect_refused(call(&pb::PeerDaemon::Stub::Prepare, prep, &pres), "Prepare",
                 1 << 20);
  // Under the limits: answered (the coordinator knows no such checkpoint).
  hb.mutable_call()->set_checkpoint_id("job/never");
  grpc::Status st = call(&pb::PeerDaemon::Stub::Heartbeat, hb, &hres);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  const std::string metrics = nodes_[0]->metrics->Render();
  for (const char* m : {"Plan", "Prepare", "Heartbeat", "Abort"}) {
    EXPECT_THAT(metrics,
                HasSubstr(fmt::format("\nckptd_peer_requests_total{{method=\"{}"
                                      "\",code=\"RESOURCE_EXHAUSTED\"}} 1\n",
                                      m)));
  }
  // A daemon's own Abort carries at most 4096 bytes of its reason.
  PeerClientOptions pc;
  pc.token = kToken;
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<CoordinatorLink> link,
                       MakeLinkFactory(pc)(nodes_[0]->address));
  absl::Notification done;
  absl::Status abort_status;
  link->Abort(PeerCallId{"job/never", "job", 1, 7, "n1"},
              absl::CancelledError(std::string(100 << 10, 'y')),
              [&](absl::Status s) {
                abort_status = s;
                done.Notify();
              });
  done.WaitForNotification();
  EXPECT_NE(abort_status.code(), absl::StatusCode::kResourceExhausted)
      << abort_status;
  // The daemons go on: a real checkpoint commits.
  for (auto& i : SaveAll("job/small"))
    EXPECT_EQ(i->state, State::kCommitted) << i->error;
  ExpectCommitted("job/small");
}

TEST_F(MultiNodeTest, NoPeerServiceRefusesMultiNodeSaves) {
  StartNodes(2, 1);
  DaemonOptions o = nodes_[1]->options;
  o.link_factory = nullptr;
  o.state_dir = dir_.Join("state-nopeer");
  nodes_[1]->manager.reset();
  ASSERT_OK_AND_ASSIGN(nodes_[1]->manager, CheckpointManager::Create(o));
  absl::StatusOr<SaveReply> r = SaveSync(1, MakeRank("job/np", 1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("peer service"));
}

// The index codec (peer_codec.h). EncodeIndex tries each item against the
// previous rank's kind at the same position before its fqn lookup; ranks
// whose items differ there (another order, another dtype or shape, an extra
// item) still get exactly one kind per distinct (fqn, type, dtype, shape,
// path), and the index decodes to what was encoded.
TEST(PeerCodecTest, IndexRoundTripsWhateverTheRanksItemOrder) {
  auto tensor = [](std::string fqn, std::vector<int64_t> shape,
                   std::vector<int64_t> off, std::vector<int64_t> size,
                   format::DType dt = format::DType::kFloat32) {
    format::ItemDesc d;
    d.fqn = std::move(fqn);
    d.dtype = dt;
    d.global_shape = std::move(shape);
    d.chunk_offsets = std::move(off);
    d.chunk_sizes = std::move(size);
    return d;
  };
  auto bytes = [](std::string fqn) {
    format::ItemDesc d;
    d.fqn = std::move(fqn);
    d.type = format::ItemDesc::Type::kBytes;
    return d;
  };
  NodeIndex index;
  index.ranks = {4, 5, 6, 7};
  index.items = {
      {tensor("a", {8, 4}, {0, 0}, {2, 4}), tensor("b", {8}, {0}, {8}),
       bytes("x4")},
      {tensor("a", {8, 4}, {2, 0}, {2, 4}), tensor("b", {8}, {0}, {8}),
       bytes("x5")},
      {bytes("x6"), tensor("b", {8}, {0}, {8}),
       tensor("a", {8, 4}, {4, 0}, {2, 4})},
      {tensor("a", {8, 4}, {6, 0}, {2, 4}, format::DType::kBFloat16),
       tensor("b", {16}, {0}, {16}), bytes("x7"), tensor("c", {2}, {0}, {2})},
  };
  index.items[3][3].path = {std::string("c"), int64_t{1}};
  for (const auto& items : index.items) {
    std::vector<uint64_t>& nb = index.nbytes.emplace_back();
    for (size_t i = 0; i < items.size(); ++i) nb.push_back(100 + i);
  }
  v1::NodeIndex msg;
  EncodeIndex(index, &msg);
  // a f32 [8,4], b [8], x4, x5, x6, a bf16, b [16], x7, c.
  EXPECT_EQ(msg.kinds_size(), 9);
  ASSERT_EQ(msg.ranks_size(), 4);
  EXPECT_EQ(msg.ranks(1).kind(0), msg.ranks(0).kind(0));
  EXPECT_EQ(msg.ranks(2).kind(2), msg.ranks(0).kind(0));
  EXPECT_EQ(msg.ranks(2).kind(1), msg.ranks(0).kind(1));
  EXPECT_NE(msg.ranks(3).kind(0), msg.ranks(0).kind(0));
  EXPECT_NE(msg.ranks(3).kind(1), msg.ranks(0).kind(1));
  ASSERT_OK_AND_ASSIGN(std::shared_ptr<NodeIndex> back, DecodeIndex(msg));
  EXPECT_EQ(back->ranks, index.ranks);
  EXPECT_EQ(back->nbytes, index.nbytes);
  ASSERT_EQ(back->items.size(), index.items.size());
  for (size_t r = 0; r < index.items.size(); ++r) {
    ASSERT_EQ(back->items[r].size(), index.items[r].size()) << r;
    for (size_t i = 0; i < index.items[r].size(); ++i) {
      const format::ItemDesc &a = back->items[r][i], &b = index.items[r][i];
      EXPECT_TRUE(a.fqn == b.fqn && a.type == b.type && a.dtype == b.dtype &&
                  a.global_shape == b.global_shape &&
                  a.chunk_offsets == b.chunk_offsets &&
                  a.chunk_sizes == b.chunk_sizes && a.path == b.path)
          << "rank " << index.ranks[r] << " item " << i << " (" << b.fqn << ")";
    }
  }
  EXPECT_EQ(IndexDigest(*back), IndexDigest(index));
}

}  // namespace
}  // namespace ckptd::daemon
