// Copyright 2026 The ckptd Authors.
//
// multinode_bench: the coordinator of multi-node checkpoints (daemon/
// coordinator.h) driven over real gRPC on TCP loopback by simulated nodes,
// each figure printed beside a reference measured in the same run. One
// process holds one PeerServer (127.0.0.1, token) forwarding to a
// Coordinator (POSIX Env, fsync on) and N simulated nodes, each with its own
// link factory (MakeLinkFactory), hence its own gRPC channel. gRPC may still
// multiplex the channels over one TCP connection (it shares subchannels of
// equal target and arguments); the run prints how many it opened.
//
//   plan_round_RxT/NxM     Plan round of R ranks × T FSDP tensors on N nodes
//                          of M ranks: every node calls Plan concurrently
//                          from its own thread with its full index (first
//                          round, nothing cached) → every answer in. Reference:
//                          format::PlanSave alone on the same global item set
//                          in the same process. Target: < 1 s at 1024 × 2000.
//     .../codec            the same calls with world_size 0: every index is
//                          encoded, sent and decoded, then refused before any
//                          planning (the transport and codec share of the
//                          round).
//     .../cached           the steady-state round of periodic checkpoints:
//                          the same items to a new checkpoint id of the same
//                          job, every node sending only its index digest (the
//                          coordinator's plan cache). Reference: the same N
//                          nodes' concurrent Heartbeat round trips (RPC floor).
//                          Target: < 100 ms at 1024 × 2000.
//     .../cold             the first uncached round (the process's first for
//                          the first node count: a fresh heap), not in the
//                          median. Reference: the same repetition's
//                          Heartbeat round (an empty RPC round). Target:
//                          < 1 s at 1024 × 2000, like the warm rounds.
//   commit_NxMxT           commit latency: after a plan round, every node
//                          creates its ranks' data files (sparse, the sizes
//                          the coordinator checks; synced before timing), all
//                          nodes but one Prepare, then the last node's Prepare
//                          call → its answer OK (validation, .metadata encode,
//                          .metadata.tmp write + fsync + rename + dir fsync,
//                          the re-check of the data files). Reference: a file
//                          of the .metadata's size written to the same
//                          directory with write + fsync + rename + dir fsync.
//     .../encode_alone     format::EncodeMetadata of an equal Metadata alone
//                          (its repetitions run before the commits, so that
//                          its Metadata is freed before the coordinator's).
//
// Each figure is the median of --reps interleaved repetitions (subject and
// reference alternate), with the range in brackets; the ratio is taken per
// repetition. Set-up (indexes, data files, syncfs) is never timed. Per-figure
// JSON lines on stdout with --json (the table then goes to stderr).
#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/absl_fmt.h"
#include "common/env.h"
#include "common/status_macros.h"
#include "daemon/cluster/cluster.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/peer_service.h"
#include "fmt/format.h"
#include "format/metadata/metadata.h"
#include "format/plan/save_plan.h"
#include "format/tensor/dtype.h"
#include "nlohmann/json.hpp"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

constexpr int kReplicated = 10;            // small tensors on every rank
constexpr uint64_t kBytesItemBytes = 64;   // the per-rank bytes item
constexpr uint64_t kStoredItemBytes = 64;  // bytes per item in the data files
constexpr char kToken[] = "multinode-bench-token-0123456789";
// The digest-only (plan cache) round at 1024 x 2000.
constexpr double kCachedBudgetS = 0.1;

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------

struct CommitConfig {
  int nodes = 0;
  int ranks_per_node = 0;
  int tensors = 0;
  std::string Name() const {
    return fmt::format("{}x{}x{}", nodes, ranks_per_node, tensors);
  }
};

struct BenchOptions {
  int ranks = 1024;
  int tensors = 2000;
  std::vector<int> plan_nodes = {64, 8};
  std::vector<CommitConfig> commits = {
      {4, 8, 200}, {64, 8, 200}, {64, 16, 2000}};
  int reps = 3;
  std::string dir = "/tmp";
  bool json = false;
  bool log = false;
  double budget_s = 1.0;
};

// ---------------------------------------------------------------------------
// Small utilities
// ---------------------------------------------------------------------------

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// User + system CPU of the whole process: how much of a wall-clock figure
// the 2 cores were busy (client, server and coordinator share them here).
double ProcessCpuSeconds() {
  rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  auto s = [](const timeval& t) { return t.tv_sec + 1e-6 * t.tv_usec; };
  return s(ru.ru_utime) + s(ru.ru_stime);
}

// Minor page faults of the whole process so far (fresh heap pages).
int64_t MinorFaults() {
  rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

uint64_t PeakRssBytes() {
  rusage ru;
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<uint64_t>(ru.ru_maxrss) * 1024;
}

// Hands freed heap memory back to the kernel between workloads (untimed),
// so that one workload's leftovers do not add up with the next one's peak.
void ReleaseFreeMemory() { ::malloc_trim(0); }

struct Spread {
  double median = std::nan("");
  double min = std::nan("");
  double max = std::nan("");
};

Spread SpreadOf(std::vector<double> v) {
  Spread s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  s.min = v.front();
  s.max = v.back();
  return s;
}

// "0.812 s [0.790–0.851]" (milliseconds below 0.1 s).
std::string FormatSeconds(const Spread& s) {
  if (s.max < 0.1) {
    return fmt::format("{:.1f} ms [{:.1f}–{:.1f}]", 1e3 * s.median, 1e3 * s.min,
                       1e3 * s.max);
  }
  return fmt::format("{:.3f} s [{:.3f}–{:.3f}]", s.median, s.min, s.max);
}

std::vector<double> Ratios(const std::vector<double>& a,
                           const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    r.push_back(a[i] / b[i]);
  return r;
}

std::string ReadCpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      const size_t begin = colon == std::string::npos
                               ? colon
                               : line.find_first_not_of(' ', colon + 1);
      if (begin != std::string::npos) return line.substr(begin);
    }
  }
  return "unknown";
}

double LoadAverage1() {
  double l = -1;
  std::ifstream in("/proc/loadavg");
  in >> l;
  return l;
}

// Established TCP connections whose remote port is `port` (the clients'
// sockets to the coordinator).
int CountConnectionsTo(int port) {
  int n = 0;
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() < 4 || f[3] != "01") continue;  // ESTABLISHED
      const size_t colon = f[2].rfind(':');
      if (colon != std::string::npos &&
          std::strtol(f[2].c_str() + colon + 1, nullptr, 16) == port) {
        ++n;
      }
    }
  }
  return n;
}

// A temporary directory, removed (recursively) on destruction.
class TempDir {
 public:
  static absl::StatusOr<std::unique_ptr<TempDir>> Create(
      const std::string& base) {
    std::string tmpl = JoinPath(base, "ckptd_multinode_bench.XXXXXX");
    if (::mkdtemp(tmpl.data()) == nullptr) {
      return absl::ErrnoToStatus(errno, fmt::format("mkdtemp {}", tmpl));
    }
    std::error_code ec;
    std::string real = std::filesystem::canonical(tmpl, ec).string();
    auto d = std::unique_ptr<TempDir>(new TempDir());
    d->path_ = ec ? tmpl : real;
    return d;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    if (ec)
      fmt::print(stderr, "warning: could not remove {}: {}\n", path_,
                 ec.message());
  }
  const std::string& path() const { return path_; }

 private:
  TempDir() = default;
  std::string path_;
};

absl::Status RemoveTree(const std::string& dir) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (ec)
    return absl::InternalError(fmt::format("remove {}: {}", dir, ec.message()));
  return absl::OkStatus();
}

// Flushes everything the directory's file system holds dirty, so that the
// timed fsyncs do not also write back the set-up's files.
absl::Status SyncFileSystem(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, fmt::format("open {}", dir));
  const int rc = ::syncfs(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return absl::ErrnoToStatus(err, fmt::format("syncfs {}", dir));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------

struct Result {
  std::string name;
  std::string figure;  // "0.812 s [0.790–0.851]"
  double value = std::nan("");
  std::string unit = "s";
  Spread spread;
  std::string reference;  // "PlanSave alone 0.61 s [...]"
  double ref_value = std::nan("");
  Spread ratio;
  std::string ratio_note;
  std::string target;  // "< 1 s"; empty: informational
  std::optional<bool> pass;
  nlohmann::json extra = nlohmann::json::object();
};

void PrintLine(const Result& r, const BenchOptions& o) {
  std::FILE* out = o.json ? stderr : stdout;
  const std::string ratio =
      std::isnan(r.ratio.median)
          ? "-"
          : fmt::format("{:.2f} [{:.2f}–{:.2f}]", r.ratio.median, r.ratio.min,
                        r.ratio.max);
  const std::string verdict =
      r.target.empty()
          ? "info"
          : fmt::format(
                "{} {}", r.target,
                r.pass.has_value() ? (*r.pass ? "PASS" : "FAIL") : "n/a");
  fmt::print(out, "{:<38} {:<30} | ref {:<44} | ratio {:<18} | {}\n", r.name,
             r.figure, r.reference.empty() ? "-" : r.reference, ratio, verdict);
  std::fflush(out);
  if (o.json) {
    auto num = [](double v) {
      return std::isnan(v) ? nlohmann::json() : nlohmann::json(v);
    };
    nlohmann::json j = {{"bench", "multinode"},
                        {"name", r.name},
                        {"value", num(r.value)},
                        {"unit", r.unit},
                        {"min", num(r.spread.min)},
                        {"max", num(r.spread.max)},
                        {"reference", r.reference},
                        {"ref_value", num(r.ref_value)},
                        {"ratio", num(r.ratio.median)},
                        {"ratio_min", num(r.ratio.min)},
                        {"ratio_max", num(r.ratio.max)},
                        {"ratio_is", r.ratio_note},
                        {"target", r.target},
                        {"pass", r.pass.has_value() ? nlohmann::json(*r.pass)
                                                    : nlohmann::json()},
                        {"extra", r.extra}};
    fmt::print(stdout, "{}\n", j.dump());
    std::fflush(stdout);
  }
}

// ---------------------------------------------------------------------------
// The item set
// ---------------------------------------------------------------------------

// FSDP-like: `tensors` tensors "layers.{i}.w", bf16 and fp32 alternating, of
// global shape [world·k, d] (k in 4..16, d in 64..256), each rank holding
// rows [rank·k, rank·k + k); kReplicated small fp32 tensors whole on every
// rank (deduplicated across ranks and nodes); one bytes item per rank.
std::vector<format::ItemDesc> RankItems(int rank, int world, int tensors) {
  std::vector<format::ItemDesc> items;
  items.reserve(tensors + kReplicated + 1);
  for (int i = 0; i < tensors; ++i) {
    format::ItemDesc& it = items.emplace_back();
    it.fqn = fmt::format("layers.{}.w", i);
    it.type = format::ItemDesc::Type::kTensor;
    it.dtype = i % 2 == 0 ? format::DType::kBFloat16 : format::DType::kFloat32;
    const int64_t k = 4 + i % 13;
    const int64_t d = int64_t{64} << (i % 3);
    it.global_shape = {static_cast<int64_t>(world) * k, d};
    it.chunk_offsets = {static_cast<int64_t>(rank) * k, 0};
    it.chunk_sizes = {k, d};
  }
  for (int j = 0; j < kReplicated; ++j) {
    format::ItemDesc& it = items.emplace_back();
    it.fqn = fmt::format("norm.{}.weight", j);
    it.type = format::ItemDesc::Type::kTensor;
    it.dtype = format::DType::kFloat32;
    it.global_shape = {64 * (j + 1)};
    it.chunk_offsets = {0};
    it.chunk_sizes = {64 * (j + 1)};
  }
  format::ItemDesc& b = items.emplace_back();
  b.fqn = fmt::format("extra_state.rank{}", rank);
  b.type = format::ItemDesc::Type::kBytes;
  return items;
}

uint64_t ItemBytes(const format::ItemDesc& it) {
  if (it.type == format::ItemDesc::Type::kBytes) return kBytesItemBytes;
  uint64_t n = 1;
  for (int64_t s : it.chunk_sizes) n *= static_cast<uint64_t>(s);
  return n * format::ElementSize(it.dtype);
}

// Items the global plan keeps: every sharded chunk and bytes item, one copy
// of each replicated tensor.
uint64_t ExpectedKept(int world, int tensors) {
  return static_cast<uint64_t>(world) * (tensors + 1) + kReplicated;
}

struct SimNode {
  std::vector<int> ranks;
  std::shared_ptr<const NodeIndex> index;
  uint64_t digest = 0;
  std::vector<size_t> item_counts;
};

struct Cluster {
  int world = 0;
  int tensors = 0;
  std::vector<SimNode> nodes;
  double digest_s = 0;  // IndexDigest of one node's index
};

Cluster MakeCluster(int num_nodes, int ranks_per_node, int tensors) {
  Cluster c;
  c.world = num_nodes * ranks_per_node;
  c.tensors = tensors;
  c.nodes.resize(num_nodes);
  for (int n = 0; n < num_nodes; ++n) {
    auto index = std::make_shared<NodeIndex>();
    for (int r = n * ranks_per_node; r < (n + 1) * ranks_per_node; ++r) {
      index->ranks.push_back(r);
      index->items.push_back(RankItems(r, c.world, tensors));
      std::vector<uint64_t>& nb = index->nbytes.emplace_back();
      for (const format::ItemDesc& it : index->items.back())
        nb.push_back(ItemBytes(it));
    }
    SimNode& node = c.nodes[n];
    node.ranks = index->ranks;
    for (const auto& items : index->items)
      node.item_counts.push_back(items.size());
    const auto t0 = Clock::now();
    node.digest = IndexDigest(*index);
    if (n == 0) c.digest_s = SecondsSince(t0);
    node.index = std::move(index);
  }
  return c;
}

// The global item set (rank r's items at [r]), copied out of the nodes.
std::vector<std::vector<format::ItemDesc>> GlobalItems(const Cluster& c) {
  std::vector<std::vector<format::ItemDesc>> all(c.world);
  for (const SimNode& n : c.nodes) {
    for (size_t i = 0; i < n.ranks.size(); ++i)
      all[n.ranks[i]] = n.index->items[i];
  }
  return all;
}

// ---------------------------------------------------------------------------
// The coordinator, its server and the nodes' links
// ---------------------------------------------------------------------------

class Harness {
 public:
  static absl::StatusOr<std::unique_ptr<Harness>> Create(const BenchOptions& o,
                                                         int max_nodes) {
    auto h = std::unique_ptr<Harness>(new Harness());
    ASSIGN_OR_RETURN(h->root_, TempDir::Create(o.dir));
    PeerServerOptions so;
    so.listen = "127.0.0.1:0";
    so.token = kToken;
    ASSIGN_OR_RETURN(h->server_, PeerServer::Start(so));
    RETURN_IF_ERROR(h->ResetCoordinator());
    const std::string address = fmt::format("127.0.0.1:{}", h->server_->port());
    PeerClientOptions co;
    co.token = kToken;
    co.plan_deadline = absl::Seconds(600);
    co.prepare_deadline = absl::Seconds(600);
    co.call_deadline = absl::Seconds(60);
    for (int i = 0; i < max_nodes; ++i) {
      // One factory per node: each node gets its own channel, as on a
      // cluster (a factory caches one link per address).
      LinkFactory factory = MakeLinkFactory(co);
      ASSIGN_OR_RETURN(std::shared_ptr<CoordinatorLink> link, factory(address));
      h->links_.push_back(std::move(link));
    }
    return h;
  }

  ~Harness() {
    if (server_) server_->SetCoordinator(nullptr);
    coordinator_.reset();
    server_.reset();
    links_.clear();
  }

  // A fresh coordinator: no plan cache, no checkpoints (the old one's
  // unfinished checkpoints are aborted by its destructor).
  absl::Status ResetCoordinator() {
    if (server_) server_->SetCoordinator(nullptr);
    coordinator_.reset();
    CoordinatorOptions co;
    co.env = Env::Default();
    co.checkpoint_roots = {root_->path()};
    co.fsync = true;
    co.stage_timeout = absl::Seconds(600);
    co.peer_timeout = absl::Seconds(600);
    co.commit_timeout = absl::Seconds(600);
    ASSIGN_OR_RETURN(coordinator_, Coordinator::Create(std::move(co)));
    server_->SetCoordinator(coordinator_.get());
    return absl::OkStatus();
  }

  Coordinator* coordinator() { return coordinator_.get(); }
  CoordinatorLink* link(int i) { return links_[i].get(); }
  const std::string& root() const { return root_->path(); }
  int port() const { return server_->port(); }

 private:
  Harness() = default;
  std::unique_ptr<TempDir> root_;
  std::unique_ptr<PeerServer> server_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::shared_ptr<CoordinatorLink>> links_;
};

// ---------------------------------------------------------------------------
// Concurrent calls
// ---------------------------------------------------------------------------

struct Timing {
  double wall_s = 0;   // release → the last callback
  double issue_s = 0;  // release → the last call returned to its caller
  double cpu_s = 0;    // process CPU over the wall time
  int64_t faults = 0;  // minor page faults of the process meanwhile
};

// Runs issue(i, finished) for i in [0, n) on n threads released together;
// each call's callback must call finished() as its last action. Returns once
// every finished() ran.
Timing RunConcurrently(
    int n, const std::function<void(int, std::function<void()>)>& issue) {
  struct Sync {
    absl::Mutex mu;
    int pending = 0;
    Clock::time_point end, issued;
  };
  auto sync = std::make_shared<Sync>();
  sync->pending = n;
  std::function<void()> finished = [sync] {
    absl::MutexLock l(&sync->mu);
    if (--sync->pending == 0) sync->end = Clock::now();
  };
  absl::Notification go;
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      go.WaitForNotification();
      issue(i, finished);
      const auto t = Clock::now();
      absl::MutexLock l(&sync->mu);
      sync->issued = std::max(sync->issued, t);
    });
  }
  // Let the threads reach the gate.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  Timing t;
  const double cpu0 = ProcessCpuSeconds();
  const int64_t faults0 = MinorFaults();
  const auto t0 = Clock::now();
  go.Notify();
  for (std::thread& th : threads) th.join();
  {
    absl::MutexLock l(&sync->mu);
    sync->mu.Await(absl::Condition(
        +[](int* p) { return *p == 0; }, &sync->pending));
    t.wall_s = Seconds(t0, sync->end);
    t.issue_s = Seconds(t0, sync->issued);
  }
  t.cpu_s = ProcessCpuSeconds() - cpu0;
  t.faults = MinorFaults() - faults0;
  return t;
}

uint64_t RandomAttempt() {
  static std::mt19937_64 rng{std::random_device{}()};
  static absl::Mutex mu;
  absl::MutexLock l(&mu);
  return rng() | 1;
}

enum class PlanMode {
  kFullIndex,   // first round: the whole index
  kDigestOnly,  // the coordinator's plan cache
  kRefused,     // world_size 0: encoded, sent, decoded, refused unplanned
};

struct PlanRound {
  Timing timing;
  std::vector<PeerCallId> ids;
  std::vector<absl::StatusOr<NodePlan>> plans;
};

PlanRound RunPlanRound(Harness& h, const Cluster& c,
                       const std::string& checkpoint_id, const std::string& job,
                       PlanMode mode) {
  const int n = static_cast<int>(c.nodes.size());
  PlanRound out;
  std::vector<PlanCall> calls(n);
  for (int i = 0; i < n; ++i) {
    const SimNode& node = c.nodes[i];
    PlanCall& call = calls[i];
    call.id = PeerCallId{checkpoint_id, job, node.ranks.front(),
                         RandomAttempt(), fmt::format("sim-node-{}:7070", i)};
    call.world_size = mode == PlanMode::kRefused ? 0 : c.world;
    call.num_nodes = n;
    call.index_digest = node.digest;
    call.started = absl::Now();
    call.ranks = node.ranks;
    call.item_counts = node.item_counts;
    if (mode != PlanMode::kDigestOnly) call.index = node.index;
    out.ids.push_back(call.id);
  }
  out.plans.assign(n, absl::UnknownError("no answer"));
  out.timing = RunConcurrently(n, [&](int i, std::function<void()> finished) {
    h.link(i)->Plan(
        std::move(calls[i]),
        [&out, i, finished = std::move(finished)](absl::StatusOr<NodePlan> p) {
          out.plans[i] = std::move(p);
          finished();
        });
  });
  return out;
}

// N concurrent Heartbeats of an unknown checkpoint: the RPC round-trip floor.
Timing RunHeartbeatRound(Harness& h, int n) {
  return RunConcurrently(n, [&](int i, std::function<void()> finished) {
    h.link(i)->Heartbeat(
        PeerCallId{"no-such-checkpoint", "bench", i, 1, "sim"}, NodeProgress{},
        [finished = std::move(finished)](absl::StatusOr<GlobalStatus>) {
          finished();
        });
  });
}

// Checks the answers of a real plan round: all OK, `cached` as expected,
// and the kept items add up to the global plan's.
absl::Status CheckPlans(const PlanRound& r, const Cluster& c, bool cached) {
  uint64_t kept = 0;
  for (size_t i = 0; i < r.plans.size(); ++i) {
    if (!r.plans[i].ok()) {
      return absl::Status(
          r.plans[i].status().code(),
          fmt::format("node {}: {}", i, r.plans[i].status().message()));
    }
    const NodePlan& p = *r.plans[i];
    if (p.cached != cached || p.ranks.size() != c.nodes[i].ranks.size()) {
      return absl::InternalError(
          fmt::format("node {}: plan cached={} with {} ranks", i, p.cached,
                      p.ranks.size()));
    }
    for (const NodePlan::Rank& rk : p.ranks)
      kept += std::count(rk.keep.begin(), rk.keep.end(), true);
  }
  if (kept != ExpectedKept(c.world, c.tensors)) {
    return absl::InternalError(
        fmt::format("the plan keeps {} items, expected {}", kept,
                    ExpectedKept(c.world, c.tensors)));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// 1. Plan round
// ---------------------------------------------------------------------------

absl::Status RunPlanBench(const BenchOptions& o, Harness& h, int num_nodes,
                          std::vector<Result>* results) {
  if (o.ranks % num_nodes != 0) {
    return absl::InvalidArgumentError(
        fmt::format("{} ranks do not split into {} nodes", o.ranks, num_nodes));
  }
  const int rpn = o.ranks / num_nodes;
  const std::string base =
      fmt::format("plan_round_{}x{}/{}x{}", o.ranks, o.tensors, num_nodes, rpn);
  const auto tb = Clock::now();
  Cluster c = MakeCluster(num_nodes, rpn, o.tensors);
  std::vector<std::vector<format::ItemDesc>> global = GlobalItems(c);
  fmt::print(stderr,
             "  [{}] built {} node indexes ({} items) in {:.2f} s (untimed)\n",
             base, num_nodes,
             static_cast<uint64_t>(c.world) * c.nodes[0].item_counts[0],
             SecondsSince(tb));

  std::vector<double> round_s, issue_s, cpu_s, alone_s, cached_s, floor_s,
      codec_s, codec_issue_s;
  double cold_s = 0, cold_alone_s = 0, cold_cpu_s = 0, cold_floor_s = 0;
  int64_t cold_faults = 0;
  std::vector<double> faults;
  for (int rep = 0; rep <= o.reps;
       ++rep) {  // rep 0: cold (fresh heap), reported apart
    RETURN_IF_ERROR(h.ResetCoordinator());
    const std::string job = fmt::format("plan-{}x{}-r{}", num_nodes, rpn, rep);

    // Reference: PlanSave alone on the same global item set.
    {
      const auto t0 = Clock::now();
      absl::StatusOr<format::SavePlan> plan = format::PlanSave(global);
      alone_s.push_back(SecondsSince(t0));  // (freeing the plan is not timed)
      if (!plan.ok()) return plan.status();
      if (plan->items.size() != ExpectedKept(c.world, c.tensors)) {
        return absl::InternalError(
            "PlanSave kept an unexpected number of items");
      }
    }
    const double alone = alone_s.back();

    PlanRound first =
        RunPlanRound(h, c, job + "/step1", job, PlanMode::kFullIndex);
    RETURN_IF_ERROR(CheckPlans(first, c, /*cached=*/false));
    PlanRound again =
        RunPlanRound(h, c, job + "/step2", job, PlanMode::kDigestOnly);
    RETURN_IF_ERROR(CheckPlans(again, c, /*cached=*/true));
    const Timing floor = RunHeartbeatRound(h, num_nodes);
    PlanRound codec =
        RunPlanRound(h, c, job + "/refused", job, PlanMode::kRefused);
    for (const auto& p : codec.plans) {
      if (!absl::IsInvalidArgument(p.status())) {
        return absl::InternalError(
            fmt::format("refused plan round answered {}", p.status()));
      }
    }
    fmt::print(
        stderr,
        "  [{}] rep {}: round {:.3f} s (issued {:.3f} s, cpu {:.2f} s, {}k "
        "page faults), PlanSave alone "
        "{:.3f} s, cached {:.1f} ms, heartbeats {:.1f} ms, codec {:.3f} s\n",
        base, rep, first.timing.wall_s, first.timing.issue_s,
        first.timing.cpu_s, first.timing.faults / 1000, alone,
        1e3 * again.timing.wall_s, 1e3 * floor.wall_s, codec.timing.wall_s);
    if (rep == 0) {
      cold_s = first.timing.wall_s;
      cold_alone_s = alone;
      cold_cpu_s = first.timing.cpu_s;
      cold_floor_s = floor.wall_s;
      cold_faults = first.timing.faults;
      alone_s.pop_back();
      continue;
    }
    round_s.push_back(first.timing.wall_s);
    issue_s.push_back(first.timing.issue_s);
    cpu_s.push_back(first.timing.cpu_s);
    faults.push_back(static_cast<double>(first.timing.faults));
    cached_s.push_back(again.timing.wall_s);
    floor_s.push_back(floor.wall_s);
    codec_s.push_back(codec.timing.wall_s);
    codec_issue_s.push_back(codec.timing.issue_s);
  }
  RETURN_IF_ERROR(h.ResetCoordinator());  // drops the cached plan

  const bool target_applies = o.ranks == 1024 && o.tensors == 2000;
  const Spread round = SpreadOf(round_s), alone = SpreadOf(alone_s);
  Result r;
  r.name = base;
  r.spread = round;
  r.value = round.median;
  r.figure = FormatSeconds(round);
  r.ref_value = alone.median;
  r.reference = fmt::format("PlanSave alone {}", FormatSeconds(alone));
  r.ratio = SpreadOf(Ratios(round_s, alone_s));
  r.ratio_note = "plan round / PlanSave alone (same run)";
  r.target = fmt::format("< {:g} s{}", o.budget_s,
                         target_applies ? "" : " (at 1024x2000)");
  if (target_applies) r.pass = round.median < o.budget_s;
  const Spread issue = SpreadOf(issue_s), cpu = SpreadOf(cpu_s);
  r.extra = {
      {"plan_save_alone_s", alone.median},
      {"round_over_budget", round.median / o.budget_s},
      {"issue_s", issue.median},
      {"process_cpu_s", cpu.median},
      {"page_faults", SpreadOf(faults).median},
      {"round_minus_plan_save_s", round.median - alone.median},
      {"nodes", num_nodes},
      {"ranks_per_node", rpn},
      {"items", static_cast<uint64_t>(c.world) * c.nodes[0].item_counts[0]},
      {"reps", o.reps}};
  results->push_back(r);
  PrintLine(r, o);

  Result b;
  b.name = base + "/vs_budget";
  b.spread = round;
  b.value = round.median;
  b.figure = FormatSeconds(round);
  b.ref_value = o.budget_s;
  b.reference = fmt::format("budget {:g} s; round − PlanSave {:.3f} s",
                            o.budget_s, round.median - alone.median);
  b.ratio = SpreadOf(
      Ratios(round_s, std::vector<double>(round_s.size(), o.budget_s)));
  b.ratio_note = "plan round / budget";
  b.target = r.target;
  b.pass = r.pass;
  results->push_back(b);
  PrintLine(b, o);

  const Spread codec = SpreadOf(codec_s);
  Result k;
  k.name = base + "/codec";
  k.spread = codec;
  k.value = codec.median;
  k.figure = FormatSeconds(codec);
  k.ref_value = round.median;
  k.reference = fmt::format("the plan round {:.3f} s", round.median);
  k.ratio = SpreadOf(Ratios(codec_s, round_s));
  k.ratio_note =
      "refused round (encode + send + decode, no planning) / plan round";
  k.extra = {{"issue_s", SpreadOf(codec_issue_s).median},
             {"round_issue_s", issue.median},
             {"process_cpu_s_of_round", cpu.median}};
  results->push_back(k);
  PrintLine(k, o);

  const Spread cached = SpreadOf(cached_s), floor = SpreadOf(floor_s);
  Result m;
  m.name = base + "/cached";
  m.spread = cached;
  m.value = cached.median;
  m.figure = FormatSeconds(cached);
  m.ref_value = floor.median;
  m.reference = fmt::format("{} concurrent Heartbeats {}", num_nodes,
                            FormatSeconds(floor));
  m.ratio = SpreadOf(Ratios(cached_s, floor_s));
  m.ratio_note = "digest-only plan round / heartbeat round trip";
  m.target = fmt::format("< {:g} ms{}", 1e3 * kCachedBudgetS,
                         target_applies ? "" : " (at 1024x2000)");
  if (target_applies) m.pass = cached.median < kCachedBudgetS;
  m.extra = {{"index_digest_one_node_s", c.digest_s}};
  results->push_back(m);
  PrintLine(m, o);

  Result cold;
  cold.name = base + "/cold";
  cold.value = cold_s;
  cold.spread = {cold_s, cold_s, cold_s};
  cold.figure = fmt::format("{:.3f} s (first round)", cold_s);
  // Beside the same run's empty RPC round (the first repetition's
  // concurrent Heartbeats), held to the budget like the warm rounds.
  cold.ref_value = cold_floor_s;
  cold.reference = fmt::format("{} concurrent Heartbeats {:.1f} ms (same rep)",
                               num_nodes, 1e3 * cold_floor_s);
  const double cold_ratio = cold_s / cold_floor_s;
  cold.ratio = {cold_ratio, cold_ratio, cold_ratio};
  cold.ratio_note = "first plan round of the process / heartbeat round trip";
  cold.target = r.target;
  if (target_applies) cold.pass = cold_s < o.budget_s;
  cold.extra = {{"process_cpu_s", cold_cpu_s},
                {"page_faults", cold_faults},
                {"plan_save_alone_cold_s", cold_alone_s},
                {"over_plan_save_alone", cold_s / cold_alone_s},
                {"over_warm_round", cold_s / round.median}};
  results->push_back(cold);
  PrintLine(cold, o);
  fmt::print(
      stderr,
      "  [{}] round: issue (all Plan() calls returned) {:.3f} s, process CPU "
      "{:.2f} s over the round; IndexDigest of one node {:.1f} ms\n",
      base, issue.median, cpu.median, 1e3 * c.digest_s);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// 2. Commit latency
// ---------------------------------------------------------------------------

struct CommitRun {
  double latency_s = 0;
  double plan_s = 0;
  uint64_t metadata_bytes = 0;
};

// One checkpoint end to end; only the last node's Prepare is timed.
absl::StatusOr<CommitRun> CommitOnce(Harness& h, const Cluster& c,
                                     const std::string& checkpoint_id,
                                     const std::string& job) {
  const int n = static_cast<int>(c.nodes.size());
  CommitRun out;
  PlanRound plan = RunPlanRound(h, c, checkpoint_id, job, PlanMode::kFullIndex);
  RETURN_IF_ERROR(CheckPlans(plan, c, /*cached=*/false));
  out.plan_s = plan.timing.wall_s;
  const std::string dir = JoinPath(h.root(), checkpoint_id);

  // Each node writes its ranks' files (sparse, of the size the storage
  // describes) and says where each kept item lies.
  std::vector<PrepareCall> calls(n);
  for (int i = 0; i < n; ++i) {
    PrepareCall& call = calls[i];
    call.id = plan.ids[i];
    for (const NodePlan::Rank& rp : plan.plans[i]->ranks) {
      PrepareCall::Rank& r = call.ranks.emplace_back();
      r.rank = rp.rank;
      uint64_t offset = 0;
      for (size_t k = 0; k < rp.keep.size(); ++k) {
        if (!rp.keep[k]) continue;
        r.offset.push_back(offset);
        r.length.push_back(kStoredItemBytes);
        offset += kStoredItemBytes;
      }
      if (rp.file.empty()) {
        if (offset != 0)
          return absl::InternalError(fmt::format("rank {}: no file", rp.rank));
        continue;
      }
      const std::string path = JoinPath(dir, rp.file);
      const int fd =
          ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0)
        return absl::ErrnoToStatus(errno, fmt::format("create {}", path));
      const int rc = ::ftruncate(fd, static_cast<off_t>(offset));
      const int err = errno;
      ::close(fd);
      if (rc != 0)
        return absl::ErrnoToStatus(err, fmt::format("ftruncate {}", path));
    }
    call.progress.ranks_staged = static_cast<int>(call.ranks.size());
  }
  RETURN_IF_ERROR(SyncFileSystem(dir));

  struct Answers {
    absl::Mutex mu;
    int pending = 0;
    std::vector<absl::Status> status;
    Clock::time_point last_answered;
  };
  auto answers = std::make_shared<Answers>();
  answers->pending = n;
  answers->status.assign(n, absl::UnknownError("no answer"));
  auto prepare = [&](int i) {
    h.link(i)->Prepare(
        std::move(calls[i]),
        [answers, i, last = i == n - 1](absl::StatusOr<GlobalStatus> g) {
          const auto t = Clock::now();
          absl::MutexLock l(&answers->mu);
          if (last) answers->last_answered = t;
          answers->status[i] = g.status();
          --answers->pending;
        });
  };
  for (int i = 0; i + 1 < n; ++i) prepare(i);
  // Wait until the coordinator holds n - 1 prepares.
  const auto wait_start = Clock::now();
  while (true) {
    absl::StatusOr<GlobalStatus> g = h.coordinator()->Status(checkpoint_id);
    if (!g.ok()) return g.status();
    if (!g->error.ok()) return g->error;
    if (g->nodes_prepared == n - 1) break;
    if (SecondsSince(wait_start) > 300) {
      return absl::DeadlineExceededError(
          "the coordinator did not see the prepares");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const auto t0 = Clock::now();
  prepare(n - 1);
  {
    absl::MutexLock l(&answers->mu);
    answers->mu.Await(absl::Condition(
        +[](int* p) { return *p == 0; }, &answers->pending));
    out.latency_s = Seconds(t0, answers->last_answered);
    for (int i = 0; i < n; ++i) {
      if (!answers->status[i].ok()) {
        return absl::Status(answers->status[i].code(),
                            fmt::format("prepare of node {}: {}", i,
                                        answers->status[i].message()));
      }
    }
  }
  ASSIGN_OR_RETURN(out.metadata_bytes, Env::Default()->GetFileSize(JoinPath(
                                           dir, format::kMetadataName)));
  return out;
}

// Reference: `bytes` written to `dir` with write + fsync + rename + fsync dir.
absl::StatusOr<double> RawDurableWrite(const std::string& dir,
                                       const std::string& bytes) {
  const std::string tmp = JoinPath(dir, "raw_reference.tmp");
  const std::string final_path = JoinPath(dir, "raw_reference");
  const auto t0 = Clock::now();
  const int fd =
      ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, fmt::format("create {}", tmp));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, fmt::format("write {}", tmp));
    }
    done += static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, fmt::format("fsync {}", tmp));
  }
  ::close(fd);
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    return absl::ErrnoToStatus(errno, fmt::format("rename {}", tmp));
  }
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return absl::ErrnoToStatus(errno, fmt::format("open {}", dir));
  const int rc = ::fsync(dfd);
  ::close(dfd);
  if (rc != 0) return absl::ErrnoToStatus(errno, fmt::format("fsync {}", dir));
  const double s = SecondsSince(t0);
  ::unlink(final_path.c_str());
  return s;
}

// The Metadata the coordinator commits for this cluster's plan (items of a
// rank at kStoredItemBytes steps in item order), for the encode reference.
absl::StatusOr<format::Metadata> BuildMetadata(const Cluster& c,
                                               const std::string& dir) {
  std::vector<std::vector<format::ItemDesc>> global = GlobalItems(c);
  ASSIGN_OR_RETURN(format::SavePlan plan, format::PlanSave(global));
  format::Metadata md;
  md.state_dict_metadata = std::move(plan.metadata.state_dict_metadata);
  md.planner_data = std::move(plan.metadata.planner_data);
  md.version = plan.metadata.version;
  std::vector<const std::string*> file_of(c.world, nullptr);
  for (const format::PlannedFile& f : plan.files)
    file_of[f.rank] = &f.relative_path;
  std::vector<uint64_t> cursor(c.world, 0);
  md.storage_data.reserve(plan.items.size());
  for (const format::PlannedItem& pi : plan.items) {
    md.storage_data.emplace_back(
        global[pi.rank][pi.item_index].Key(),
        format::StorageInfo{
            *file_of[pi.rank], cursor[pi.rank], kStoredItemBytes, {}});
    cursor[pi.rank] += kStoredItemBytes;
  }
  // (No BuildIndex(): EncodeMetadata does not use the lookup indexes.)
  format::StorageMeta sm;
  sm.checkpoint_id = dir;
  md.storage_meta = sm;
  return md;
}

absl::Status RunCommitBench(const BenchOptions& o, Harness& h,
                            const CommitConfig& cfg,
                            std::vector<Result>* results) {
  const std::string base = "commit_" + cfg.Name();
  const auto tb = Clock::now();
  Cluster c = MakeCluster(cfg.nodes, cfg.ranks_per_node, cfg.tensors);
  ASSIGN_OR_RETURN(
      format::Metadata md,
      BuildMetadata(
          c, JoinPath(h.root(), fmt::format("commit-{}/step0", cfg.Name()))));
  fmt::print(
      stderr,
      "  [{}] built {} node indexes and the reference Metadata in {:.2f} s "
      "(untimed)\n",
      base, cfg.nodes, SecondsSince(tb));

  // EncodeMetadata alone, first, so that its Metadata (roughly 0.5 GB at
  // 2 M chunks) is freed before the coordinator builds its own.
  std::vector<double> encode_s;
  uint64_t encoded_bytes = 0;
  for (int rep = 0; rep < o.reps; ++rep) {
    const auto t0 = Clock::now();
    absl::StatusOr<std::string> enc =
        format::EncodeMetadata(md, format::EncodeOptions{});
    encode_s.push_back(SecondsSince(t0));
    if (!enc.ok()) return enc.status();
    encoded_bytes = enc->size();
  }
  md = format::Metadata();
  ReleaseFreeMemory();

  std::vector<double> latency_s, raw_s, plan_s;
  uint64_t metadata_bytes = 0;
  for (int rep = 0; rep < o.reps; ++rep) {
    RETURN_IF_ERROR(h.ResetCoordinator());
    const std::string job = fmt::format("commit-{}-r{}", cfg.Name(), rep);
    const std::string id = job + "/step0";
    ASSIGN_OR_RETURN(CommitRun run, CommitOnce(h, c, id, job));
    latency_s.push_back(run.latency_s);
    plan_s.push_back(run.plan_s);
    metadata_bytes = run.metadata_bytes;
    const std::string dir = JoinPath(h.root(), id);
    {
      const std::string bytes(metadata_bytes, '\x5a');
      ASSIGN_OR_RETURN(double raw, RawDurableWrite(dir, bytes));
      raw_s.push_back(raw);
    }
    fmt::print(stderr,
               "  [{}] rep {}: commit {:.1f} ms, raw durable write {:.1f} ms, "
               "EncodeMetadata alone {:.1f} ms, .metadata {} B (plan round "
               "{:.3f} s)\n",
               base, rep, 1e3 * run.latency_s, 1e3 * raw_s.back(),
               1e3 * encode_s[rep], metadata_bytes, run.plan_s);
    RETURN_IF_ERROR(h.ResetCoordinator());
    RETURN_IF_ERROR(RemoveTree(JoinPath(h.root(), job)));
  }
  const Spread lat = SpreadOf(latency_s), raw = SpreadOf(raw_s),
               enc = SpreadOf(encode_s);
  Result r;
  r.name = base;
  r.spread = lat;
  r.value = lat.median;
  r.figure = FormatSeconds(lat);
  r.ref_value = raw.median;
  r.reference = fmt::format("raw durable write {}", FormatSeconds(raw));
  r.ratio = SpreadOf(Ratios(latency_s, raw_s));
  r.ratio_note =
      "last prepare → committed / write+fsync+rename+dir fsync of as many "
      "bytes";
  r.extra = {{"metadata_bytes", metadata_bytes},
             {"nodes", cfg.nodes},
             {"ranks", c.world},
             {"items", ExpectedKept(c.world, c.tensors)},
             {"plan_round_s", SpreadOf(plan_s).median},
             {"reps", o.reps}};
  results->push_back(r);
  PrintLine(r, o);

  Result e;
  e.name = base + "/encode_alone";
  e.spread = enc;
  e.value = enc.median;
  e.figure = FormatSeconds(enc);
  e.ref_value = lat.median;
  e.reference = fmt::format("the commit {:.1f} ms ({} B)", 1e3 * lat.median,
                            encoded_bytes);
  e.ratio = SpreadOf(Ratios(encode_s, latency_s));
  e.ratio_note = "EncodeMetadata of an equal Metadata / commit latency";
  e.extra = {{"encoded_bytes", encoded_bytes}};
  if (encoded_bytes != metadata_bytes) {
    fmt::print(
        stderr,
        "  [{}] note: the reference Metadata encodes to {} B, the committed "
        ".metadata has {} B\n",
        base, encoded_bytes, metadata_bytes);
  }
  results->push_back(e);
  PrintLine(e, o);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------

absl::StatusOr<CommitConfig> ParseCommitConfig(const std::string& s) {
  std::vector<std::string> p = absl::StrSplit(s, 'x');
  CommitConfig c;
  if (p.size() != 3 || !absl::SimpleAtoi(p[0], &c.nodes) ||
      !absl::SimpleAtoi(p[1], &c.ranks_per_node) ||
      !absl::SimpleAtoi(p[2], &c.tensors) || c.nodes < 2 ||
      c.ranks_per_node < 1 || c.tensors < 1) {
    return absl::InvalidArgumentError(fmt::format(
        "--commit: '{}' is not NODESxRANKS_PER_NODExTENSORS (NODES >= 2)", s));
  }
  return c;
}

int Main(int argc, char** argv) {
  BenchOptions o;
  CLI::App app{
      "ckptd multi-node benchmark: plan round and commit latency over gRPC "
      "loopback"};
  std::vector<std::string> commits;
  bool quick = false, no_commit = false, no_plan = false;
  app.add_option("--ranks", o.ranks,
                 "world size of the plan round (default 1024)");
  app.add_option("--tensors", o.tensors,
                 "sharded tensors per rank of the plan round (2000)");
  app.add_option("--plan-nodes", o.plan_nodes,
                 "node counts of the plan round (64 8)");
  app.add_option("--commit", commits,
                 "commit configs NODESxRANKS_PER_NODExTENSORS (4x8x200 "
                 "64x8x200 64x16x2000)");
  app.add_option("--reps", o.reps, "repetitions per figure (3)");
  app.add_option("--dir", o.dir,
                 "where the temporary checkpoint root is made (/tmp)");
  app.add_option("--budget", o.budget_s, "plan round budget in seconds (1)");
  app.add_flag("--quick", quick, "128 ranks x 200 tensors, small commits only");
  app.add_flag("--no-commit", no_commit, "skip the commit latency figures");
  app.add_flag("--no-plan", no_plan, "skip the plan round figures");
  app.add_flag("--json", o.json,
               "one JSON line per figure on stdout (the table goes to stderr)");
  app.add_flag("--log", o.log, "show the daemon's info log");
  CLI11_PARSE(app, argc, argv);
  if (quick) {  // (options given explicitly win)
    if (app.count("--ranks") == 0) o.ranks = 128;
    if (app.count("--tensors") == 0) o.tensors = 200;
    if (app.count("--plan-nodes") == 0) o.plan_nodes = {16, 4};
    o.commits = {{4, 8, 200}, {16, 8, 200}};
  }
  if (!commits.empty()) {
    o.commits.clear();
    for (const std::string& s : commits) {
      absl::StatusOr<CommitConfig> c = ParseCommitConfig(s);
      if (!c.ok()) {
        fmt::print(stderr, "multinode_bench: {}\n", c.status().message());
        return 2;
      }
      o.commits.push_back(*c);
    }
  }
  if (no_commit) o.commits.clear();
  if (no_plan) o.plan_nodes.clear();
  if (o.reps < 1 || o.ranks < 1 || o.tensors < 1) {
    fmt::print(stderr,
               "multinode_bench: --reps, --ranks and --tensors must be >= 1\n");
    return 2;
  }
  spdlog::set_level(o.log ? spdlog::level::info : spdlog::level::off);

  int max_nodes = 1;
  for (int n : o.plan_nodes) max_nodes = std::max(max_nodes, n);
  for (const CommitConfig& c : o.commits)
    max_nodes = std::max(max_nodes, c.nodes);

  const double load = LoadAverage1();
  struct utsname un;
  std::FILE* info = o.json ? stderr : stdout;
  fmt::print(info,
             "multinode_bench: {} ({} cores), kernel {}, load avg {:.2f}\n",
             ReadCpuModel(), ::sysconf(_SC_NPROCESSORS_ONLN),
             ::uname(&un) == 0 ? un.release : "?", load);
  if (load > 1.5) {
    fmt::print(stderr,
               "  warning: load average {:.2f} > 1.5: figures will be noisy\n",
               load);
  }

  absl::StatusOr<std::unique_ptr<Harness>> h = Harness::Create(o, max_nodes);
  if (!h.ok()) {
    fmt::print(stderr, "multinode_bench: {}\n", h.status().ToString());
    return 2;
  }
  // Connect every link before anything is timed.
  RunHeartbeatRound(**h, max_nodes);
  fmt::print(info,
             "  coordinator on 127.0.0.1:{} (checkpoint root {}, fsync on); {} "
             "simulated nodes, "
             "one link factory (channel) each: {} TCP connection(s) to the "
             "coordinator\n",
             (*h)->port(), (*h)->root(), max_nodes,
             CountConnectionsTo((*h)->port()));
  fmt::print(info,
             "  figures: median of {} repetitions [range]; ratio = figure / "
             "reference, "
             "per repetition\n",
             o.reps);
  std::fflush(info);

  std::vector<Result> results;
  absl::Status status;
  for (int n : o.plan_nodes) {
    status = RunPlanBench(o, **h, n, &results);
    ReleaseFreeMemory();
    if (!status.ok()) break;
  }
  for (const CommitConfig& c : o.commits) {
    if (!status.ok()) break;
    status = RunCommitBench(o, **h, c, &results);
    ReleaseFreeMemory();
  }
  h->reset();
  fmt::print(info, "  peak RSS {:.2f} GiB\n", PeakRssBytes() / double(1 << 30));
  if (!status.ok()) {
    fmt::print(stderr, "multinode_bench: {}\n", status.ToString());
    return 2;
  }
  bool all_pass = true;
  for (const Result& r : results) all_pass = all_pass && r.pass.value_or(true);
  return all_pass ? 0 : 1;
}

}  // namespace
}  // namespace ckptd::daemon

int main(int argc, char** argv) { return ckptd::daemon::Main(argc, argv); }
