// Copyright 2026 The ckptd Authors.
//
// ckptd: the per-node checkpoint daemon. Reads its configuration (config
// file + flags, config.h), picks the data-file writer (io_uring, else
// pwrite; both give up on hung storage after write_timeout), recovers
// unfinished checkpoints, and serves the trainer/CLI service on a Unix
// socket until SIGTERM/SIGINT.
//
// Shutdown, on a signal:
//  1. stop accepting calls (the calls in flight stay open, to be answered);
//  2. drain: checkpoints whose local ranks are all staged get up to
//     shutdown_grace to finish; what is still unfinished then is logged;
//  3. teardown: the manager fails the unfinished checkpoints, naming the
//     signal, and their callers (Save, Wait) get that error; then the
//     listeners stop and the manager joins its tasks; exit 0.
// Hung storage can keep a task in the kernel for ever (an uninterruptible
// write, unlink or fsync). A watchdog started at the signal bounds the
// whole shutdown at shutdown_grace + write_timeout + 30 s (+ peer_timeout
// + 5 s with peers): past that it logs the checkpoints it abandons and
// _exit(3)s. The process then ends as soon as its threads leave the kernel
// (a thread blocked by a frozen file system holds the exit until the file
// system answers); the next start's recovery removes the abandoned files.

#include <linux/magic.h>
#include <signal.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/absl_fmt.h"
#include "common/failpoint.h"
#include "common/status_macros.h"
#include "common/uring_env.h"
#include "common/write_timeout_env.h"
#include "daemon/cluster/peer_service.h"
#include "daemon/config.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/metrics/http_server.h"
#include "daemon/save/checkpoint_manager.h"
#include "daemon/service/arena_listener.h"
#include "daemon/service/service.h"
#include "spdlog/sinks/basic_file_sink.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

namespace ckptd::daemon {
namespace {

absl::Status SetUpLogging(const DaemonOptions& o) {
  std::shared_ptr<spdlog::logger> logger;
  if (o.log_file.empty()) {
    logger = spdlog::stderr_color_mt("ckptd");
  } else {
    try {  // spdlog reports a bad file only by throwing; contained here.
      logger = spdlog::basic_logger_mt("ckptd", o.log_file);
    } catch (const spdlog::spdlog_ex& e) {
      return absl::InvalidArgumentError(
          fmt::format("log_file {}: {}", o.log_file, e.what()));
    }
  }
  const spdlog::level::level_enum level = spdlog::level::from_str(o.log_level);
  if (level == spdlog::level::off && o.log_level != "off") {
    return absl::InvalidArgumentError(
        fmt::format("log_level '{}' is unknown", o.log_level));
  }
  logger->set_level(level);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ [%t] %v");
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

// "DIR (WRITING, 12 of 64 MiB written; data files DIR/__<rank>_0.distcp of
// its 2 local ranks), ..." for the shutdown log lines.
std::string DescribeUnfinished(const std::vector<CheckpointInfo>& list) {
  std::string out;
  int n = 0;
  for (const CheckpointInfo& c : list) {
    if (IsFinal(c.state)) continue;
    if (++n > 32) {
      out += ", ...";
      break;
    }
    out += fmt::format(
        "{}{} ({}, {} of {} MiB written; data files {}/__<rank>_0.distcp of "
        "its {} local ranks)",
        out.empty() ? "" : ", ", c.checkpoint_id, StateName(c.state),
        c.local_written_bytes >> 20, c.local_total_bytes >> 20, c.checkpoint_id,
        c.local_ranks);
  }
  return out;
}

// Bounds the shutdown (see the top of this file): unless Done() is called
// within `limit` of Start(), logs what it abandons and _exit(3)s.
class ShutdownWatchdog {
 public:
  ~ShutdownWatchdog() {
    Done();
    if (thread_.joinable()) thread_.join();
  }
  void Start(absl::Duration limit, std::string why) {
    thread_ = std::thread([this, limit, why = std::move(why)] {
      if (done_.WaitForNotificationWithTimeout(limit)) return;
      std::string unfinished;
      {
        absl::MutexLock l(&mu_);
        unfinished = unfinished_;
      }
      spdlog::critical(
          "shutdown did not finish within {} ({}): storage is hung. "
          "Abandoning checkpoints unfinished at the last look: {}; and any "
          "cleanup of failed checkpoints still running. Exiting with status "
          "3; the next start's recovery removes their files",
          absl::FormatDuration(limit), why,
          unfinished.empty() ? "none" : unfinished);
      spdlog::default_logger()->flush();
      ::_exit(3);
    });
  }
  // What the log line names if the watchdog fires.
  void SetUnfinished(std::string text) {
    absl::MutexLock l(&mu_);
    unfinished_ = std::move(text);
  }
  void Done() {
    if (!done_.HasBeenNotified()) done_.Notify();
  }

 private:
  absl::Notification done_;
  absl::Mutex mu_;
  std::string unfinished_ ABSL_GUARDED_BY(mu_) = "(not known yet)";
  std::thread thread_;
};

// The data-file writer's storage: io_uring if it works here, else pwrite
// (through a WriteTimeoutEnv when write_timeout is set). Sets options->env
// and options->io_backend.
struct Storage {
  std::unique_ptr<UringEnv> uring;
  std::unique_ptr<WriteTimeoutEnv> pwrite;
};

absl::StatusOr<Storage> OpenStorage(DaemonOptions* options) {
  Storage st;
  if (absl::Status s = Env::Default()->CreateDirs(options->state_dir);
      !s.ok()) {
    return absl::Status(s.code(), fmt::format("state_dir: {}", s.message()));
  }
  if (options->io_backend != "pwrite") {
    UringEnvOptions uo;
    uo.queue_depth = options->queue_depth;
    uo.block_bytes = options->write_block;
    uo.pool_bytes =
        std::max<uint64_t>(options->write_pool, options->write_block);
    uo.direct = options->direct_io;
    uo.write_timeout = options->write_timeout;
    absl::StatusOr<std::unique_ptr<UringEnv>> env =
        UringEnv::Create(Env::Default(), options->state_dir, uo);
    if (!env.ok() && uo.direct) {
      spdlog::warn(
          "io_uring with O_DIRECT is unusable ({}); trying buffered io_uring",
          env.status());
      uo.direct = false;
      env = UringEnv::Create(Env::Default(), options->state_dir, uo);
    }
    if (env.ok()) {
      st.uring = *std::move(env);
      options->io_backend = "io_uring";
    } else if (options->io_backend == "io_uring") {
      return absl::Status(
          env.status().code(),
          fmt::format("io_backend=io_uring but io_uring is unusable: {}",
                      env.status().message()));
    } else {
      spdlog::warn("io_uring is unusable ({}); writing with pwrite",
                   env.status());
      options->io_backend = "pwrite";
    }
  }
  if (!st.uring && options->write_timeout > absl::ZeroDuration()) {
    WriteTimeoutEnvOptions wo;  // buffer_bytes: the default (1 MiB)
    wo.write_timeout = options->write_timeout;
    absl::StatusOr<std::unique_ptr<WriteTimeoutEnv>> env =
        WriteTimeoutEnv::Create(Env::Default(), wo);
    if (!env.ok()) {
      return absl::Status(
          env.status().code(),
          fmt::format("write_timeout: {}", env.status().message()));
    }
    st.pwrite = *std::move(env);
  }
  options->env = st.uring    ? static_cast<Env*>(st.uring.get())
                 : st.pwrite ? static_cast<Env*>(st.pwrite.get())
                             : Env::Default();
  return st;
}

absl::StatusOr<PeerTls> ReadPeerTls(const DaemonOptions& options) {
  PeerTls tls;
  for (auto [path, pem] : {std::pair{&options.peer_tls_cert, &tls.cert_pem},
                           std::pair{&options.peer_tls_key, &tls.key_pem},
                           std::pair{&options.peer_tls_ca, &tls.ca_pem}}) {
    if (path->empty()) continue;
    absl::StatusOr<std::string> text =
        ReadFileToString(Env::Default(), *path, 1 << 20);
    if (!text.ok()) {
      return absl::Status(
          text.status().code(),
          fmt::format("peer TLS file: {}", text.status().message()));
    }
    *pem = *std::move(text);
  }
  return tls;
}

// The address other daemons reach this one at: peer_advertise as given,
// with a port of 0 replaced by the bound port ("10.0.0.5:0" with
// peer_listen on port 0); empty: this host's name and the bound port.
std::string AdvertisedPeerAddress(const std::string& advertise,
                                  int bound_port) {
  if (advertise.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    return fmt::format("{}:{}", host, bound_port);
  }
  if (absl::EndsWith(advertise, ":0")) {
    return fmt::format("{}{}", advertise.substr(0, advertise.size() - 1),
                       bound_port);
  }
  return advertise;
}

// The peer service (multi-node checkpoints), bound before the manager
// starts so that the advertised address carries the real port; sets
// options->node_name and options->link_factory. Null without peer_listen.
absl::StatusOr<std::unique_ptr<PeerServer>> StartPeers(
    DaemonOptions* options, const std::shared_ptr<DaemonMetrics>& metrics) {
  if (options->peer_listen.empty()) return nullptr;
  ASSIGN_OR_RETURN(std::string token, ReadTokenFile(options->peer_token_file));
  ASSIGN_OR_RETURN(PeerTls tls, ReadPeerTls(*options));
  PeerServerOptions po;
  po.listen = options->peer_listen;
  po.token = token;
  po.tls = tls;
  po.on_request = [metrics](std::string_view method, absl::StatusCode code) {
    metrics->PeerRequest(method, code);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<PeerServer> server, PeerServer::Start(po));
  options->node_name =
      AdvertisedPeerAddress(options->peer_advertise, server->port());
  PeerClientOptions pc;
  pc.token = token;
  pc.tls = tls;
  pc.plan_deadline = options->stage_timeout + options->peer_timeout;
  pc.prepare_deadline = options->commit_timeout + options->peer_timeout;
  pc.call_deadline = std::max(options->peer_timeout / 2, absl::Seconds(1));
  // Reconnection attempts at most a quarter of peer_timeout apart (with
  // gRPC's 20 % jitter still well inside it): after a coordinator restart,
  // this node's next call reaches it before the coordinator's peer_timeout
  // for this node runs out (a 2 s cap against a 2 s peer_timeout failed
  // test_multinode's restarted coordinator's next save now and then).
  pc.max_reconnect_backoff =
      std::min(absl::Seconds(2), options->peer_timeout / 4);
  pc.on_call = [metrics](std::string_view method, absl::StatusCode code) {
    metrics->PeerCall(method, code);
  };
  options->link_factory = MakeLinkFactory(pc);
  options->share_link_factory = MakeShareLinkFactory(pc);
  spdlog::info(
      "peer address {} (coordinator of checkpoints whose rank 0 is on this "
      "node)",
      options->node_name);
  return server;
}

absl::StatusOr<std::unique_ptr<HttpServer>> StartHttp(
    const DaemonOptions& options,
    const std::shared_ptr<DaemonMetrics>& metrics) {
  if (options.http_listen.empty()) return nullptr;
  HttpServerOptions ho;
  ho.listen = options.http_listen;
  ho.metrics = [metrics] { return metrics->Render(); };
  ho.health = [metrics] { return metrics->Health(); };
  ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> server, HttpServer::Create(ho));
  spdlog::info("http endpoint listening on {}:{} (/metrics, /healthz)",
               server->host(), server->port());
  return server;
}

absl::StatusOr<std::unique_ptr<ArenaListener>> StartArenaListener(
    const DaemonOptions& options, CheckpointManager* m, Restorer* restorer) {
  ArenaListenerOptions ao;
  ao.socket_path = options.arena_socket;
  ao.socket_mode = options.socket_mode;
  ao.handler = [m](ArenaRegistration reg) {
    return m->RegisterArenaFd(reg.fd.Release(), reg.size, reg.owner, reg.peer);
  };
  ao.fetch_buffer = [restorer](const std::string& token,
                               const PeerCredentials& peer) {
    return restorer->FetchGroupBuffer(token, peer.uid);
  };
  ASSIGN_OR_RETURN(std::unique_ptr<ArenaListener> listener,
                   ArenaListener::Start(std::move(ao)));
  if (options.allow_named_arenas) {
    spdlog::warn(
        "allow_named_arenas=true: RegisterArena by file name is accepted; any "
        "client can have "
        "any file the daemon can open in {} mapped, and a client truncating "
        "its arena can "
        "crash the daemon (SIGBUS). Use only on single-user nodes",
        options.shm_dir);
  }
  return listener;
}

void LogStart(const DaemonOptions& options, const Storage& st) {
  spdlog::info(
      "ckptd {} starting: writer {} ({} threads{}, write_timeout {}), staging "
      "budget {} MiB, "
      "max batch {} MiB, roots {}, shm {}, state {}",
      CKPTD_VERSION, options.io_backend, options.io_threads,
      st.uring && st.uring->options().direct ? ", O_DIRECT" : "",
      options.write_timeout == absl::ZeroDuration()
          ? std::string("off")
          : absl::FormatDuration(options.write_timeout),
      options.staging_budget >> 20, options.max_batch >> 20,
      fmt::join(options.checkpoint_roots, ","), options.shm_dir,
      options.state_dir);
  if (!options.fsync) spdlog::warn("fsync=false: checkpoints are NOT durable");
  if (struct statfs sf;
      ::statfs(options.shm_dir.c_str(), &sf) == 0 && sf.f_type != TMPFS_MAGIC) {
    // Arenas on a disk file system get written back to disk: slow stalls.
    spdlog::warn(
        "shm_dir {} is not on tmpfs; trainer copies will cause disk writeback",
        options.shm_dir);
  }
}

// Shutdown step 2: checkpoints whose local ranks are all staged get up to
// shutdown_grace to finish; what is still unfinished then is logged.
void Drain(CheckpointManager& manager, const DaemonOptions& options,
           ShutdownWatchdog& watchdog) {
  const absl::Time grace_end = absl::Now() + options.shutdown_grace;
  bool draining = true;
  std::vector<CheckpointInfo> list;
  while (true) {
    list = manager.List("", false);
    watchdog.SetUnfinished(DescribeUnfinished(list));
    draining = false;
    for (const CheckpointInfo& c : list) {
      if (!IsFinal(c.state) && c.local_ranks_staged == c.local_ranks)
        draining = true;
    }
    if (!draining || absl::Now() >= grace_end) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (std::string unfinished = DescribeUnfinished(list); !unfinished.empty()) {
    spdlog::warn("shutdown: {}; aborting the unfinished checkpoints: {}",
                 draining
                     ? fmt::format("shutdown_grace ({}) ran out",
                                   absl::FormatDuration(options.shutdown_grace))
                     : std::string("no checkpoint left to drain"),
                 unfinished);
  }
}

// The options from the command line and config file, finalized, with
// logging set up; an exit code when the daemon must not start (2: bad
// usage, 0: --help).
std::optional<int> Configure(int argc, char** argv, DaemonOptions* options) {
  bool help = false;
  absl::Status s = ParseCommandLine(argc, argv, options, &help);
  if (s.ok() && help) {
    std::fputs(OptionsHelp().c_str(), stdout);
    return 0;
  }
  if (s.ok()) s = FinalizeOptions(options);
  if (s.ok()) s = SetUpLogging(*options);
  if (s.ok()) s = failpoint::ArmFromEnvironment();  // tests only
  if (!s.ok()) {
    std::fprintf(stderr, "ckptd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  return std::nullopt;
}

// Everything that serves, in start order; destroyed in teardown order.
struct Daemon {
  Storage storage;
  std::shared_ptr<DaemonMetrics> metrics;
  std::unique_ptr<PeerServer> peers;
  std::unique_ptr<CheckpointManager> manager;
  std::unique_ptr<HttpServer> http;    // stopped before the manager
  std::unique_ptr<Restorer> restorer;  // outlives the server and arenas
  std::unique_ptr<ArenaListener> arenas;
  std::unique_ptr<Server> server;

  // The end of shutdown step 3 (after CheckpointManager::BeginShutdown):
  // the listeners stop, the manager joins its tasks.
  void Teardown() {
    server.reset();
    arenas.reset();
    restorer.reset();
    if (peers) {
      peers->SetCoordinator(nullptr);
      peers->SetShares(nullptr);
    }
    peers.reset();
    if (http) http->Stop();
    if (metrics) metrics->SetManager(nullptr);
    manager.reset();
  }
};

absl::Status Start(DaemonOptions& options, Daemon& d, absl::Time start_time) {
  ASSIGN_OR_RETURN(d.storage, OpenStorage(&options));
  LogStart(options, d.storage);
  // Metrics (docs/metrics.md): fed by the manager's events and the peer
  // calls. Shared with the peer observers (a late gRPC callback may still
  // count), so it outlives the manager and every peer link.
  d.metrics = std::make_shared<DaemonMetrics>(CKPTD_VERSION, start_time);
  ASSIGN_OR_RETURN(d.peers, StartPeers(&options, d.metrics));
  options.observer = d.metrics.get();
  absl::StatusOr<std::unique_ptr<CheckpointManager>> manager =
      CheckpointManager::Create(options);
  if (!manager.ok()) {
    return absl::Status(
        manager.status().code(),
        fmt::format("start-up failed: {}", manager.status().message()));
  }
  d.manager = *std::move(manager);
  d.metrics->SetManager(d.manager.get());
  ASSIGN_OR_RETURN(d.http, StartHttp(options, d.metrics));
  if (d.peers) {
    d.peers->SetCoordinator(d.manager->coordinator());
    d.peers->SetShares(d.manager->shares());
  }
  const RecoveryReport& rec = d.manager->recovery();
  spdlog::info(
      "recovery: {} unfinished checkpoints removed, {} found committed, {} "
      "errors, {} deferred (multi-node, decided later)",
      rec.removed.size(), rec.completed.size(), rec.errors.size(),
      rec.deferred.size());
  RestorerOptions ro;
  ro.checkpoint_roots = options.checkpoint_roots;
  ro.env = options.env;
  ro.clock = options.clock;
  ro.gather_timeout = options.restore_gather_timeout;
  ro.threads = options.restore_threads;
  ro.read_threads = options.restore_read_threads;
  ro.direct_io = options.restore_direct_io;
  ro.cached_checkpoints = options.restore_cached_checkpoints;
  ro.buffer_bytes = options.restore_buffer_bytes;
  ro.observer = d.metrics.get();
  ro.memory_tier = d.manager->memory_tier();
  if (options.peer_restore != "off") ro.peers = d.manager->shares();
  ro.peers_only_missing = options.peer_restore == "missing";
  CheckpointManager* manager_ptr = d.manager.get();
  ro.find_arena = [manager_ptr](uint64_t id) {
    return manager_ptr->FindArena(id);
  };
  d.restorer = std::make_unique<Restorer>(std::move(ro));
  // The arena socket before the gRPC socket, so that it answers by the time
  // GetInfo (which names it) does.
  ASSIGN_OR_RETURN(
      d.arenas, StartArenaListener(options, d.manager.get(), d.restorer.get()));
  ServerOptions so;
  so.socket_path = options.socket;
  so.socket_mode = options.socket_mode;
  ASSIGN_OR_RETURN(d.server,
                   Server::Start(so, d.manager.get(), d.restorer.get()));
  d.metrics->SetServing(true);
  return absl::OkStatus();
}

int Run(int argc, char** argv) {
  const absl::Time start_time = absl::Now();
  DaemonOptions options;
  if (std::optional<int> exit_code = Configure(argc, argv, &options))
    return *exit_code;
  // Signals are taken by a dedicated thread; block them before any thread
  // starts so that every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  Daemon d;
  if (absl::Status s = Start(options, d, start_time); !s.ok()) {
    spdlog::critical("{}", s.message());
    d.Teardown();
    return 1;
  }
  // Started at the signal; bounds steps 2 and 3 of the shutdown.
  ShutdownWatchdog watchdog;
  const absl::Duration teardown_limit =
      options.write_timeout + absl::Seconds(30) +
      (options.peer_listen.empty() ? absl::ZeroDuration()
                                   : options.peer_timeout + absl::Seconds(5));
  absl::Notification signalled;
  int signal_number = 0;
  std::thread signal_thread([&] {
    sigwait(&signals, &signal_number);
    spdlog::info("signal {}: shutting down", signal_number);
    watchdog.Start(
        options.shutdown_grace + teardown_limit,
        fmt::format("shutdown_grace {} + write_timeout {} + 30s{}",
                    absl::FormatDuration(options.shutdown_grace),
                    absl::FormatDuration(options.write_timeout),
                    options.peer_listen.empty() ? "" : " + peer_timeout + 5s"));
    d.metrics->SetServing(false);  // /healthz: 503 while draining
    d.restorer->Shutdown();        // restores gathering: UNAVAILABLE
    // 1. New calls are refused; the calls in flight stay open, to be
    // answered by steps 2 and 3 (a Wait gets its checkpoint's outcome).
    d.server->RefuseNewCalls(absl::UnavailableError(
        fmt::format("the daemon is shutting down (signal {})", signal_number)));
    signalled.Notify();
  });
  signalled.WaitForNotification();
  Drain(*d.manager, options, watchdog);  // 2.
  // 3. The unfinished checkpoints fail with the reason, which their
  // callers still get; then everything stops.
  d.manager->BeginShutdown(absl::UnavailableError(fmt::format(
      "the daemon is shutting down (signal {}); unfinished checkpoints had "
      "shutdown_grace ({}) to finish",
      signal_number, absl::FormatDuration(options.shutdown_grace))));
  if (const int open = d.server->AwaitCallsAnswered(absl::Seconds(10));
      open > 0) {
    spdlog::warn(
        "shutdown: {} call(s) still unanswered 10s after the "
        "checkpoints were settled; cancelling them",
        open);
  }
  d.server->Shutdown();
  signal_thread.join();
  d.Teardown();
  watchdog.Done();
  spdlog::info("ckptd stopped");
  return 0;
}

}  // namespace
}  // namespace ckptd::daemon

int main(int argc, char** argv) { return ckptd::daemon::Run(argc, argv); }
