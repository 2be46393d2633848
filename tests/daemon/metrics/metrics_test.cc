// Copyright 2026 The ckptd Authors.
//
// The metrics registry (daemon/metrics/metrics.h): exact Prometheus text format 0.0.4
// output for counters, gauges and histograms (HELP/TYPE, label escaping,
// _bucket{le}/_sum/_count, +Inf), value formatting, name rules, concurrent
// updates; DaemonMetrics' event accounting and health; the HTTP endpoint
// (daemon/metrics/http_server.h) over real TCP on port 0.

#include "daemon/metrics/metrics.h"

#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/metrics/http_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "tests/testing/test_util.h"

namespace ckptd::daemon {
namespace {

using ::ckptd::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// ---------------------------------------------------------------------------
// Formatting helpers

TEST(MetricsFormatTest, Values) {
  EXPECT_EQ(FormatMetricValue(0), "0");
  EXPECT_EQ(FormatMetricValue(-0.0), "0");
  EXPECT_EQ(FormatMetricValue(1), "1");
  EXPECT_EQ(FormatMetricValue(42), "42");
  EXPECT_EQ(FormatMetricValue(0.25), "0.25");
  EXPECT_EQ(FormatMetricValue(-1.5), "-1.5");
  EXPECT_EQ(FormatMetricValue(0.1), "0.1");
  EXPECT_EQ(FormatMetricValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatMetricValue(-std::numeric_limits<double>::infinity()),
            "-Inf");
  EXPECT_EQ(FormatMetricValue(std::nan("")), "NaN");
  // Large byte counts round-trip exactly (up to 2^53).
  EXPECT_EQ(std::stod(FormatMetricValue(123456789012345.0)), 123456789012345.0);
  EXPECT_EQ(std::stod(FormatMetricValue(1e300)), 1e300);
}

TEST(MetricsFormatTest, Escaping) {
  EXPECT_EQ(EscapeLabelValue(R"(a"b\c)"
                             "\nd"),
            R"(a\"b\\c\nd)");
  EXPECT_EQ(EscapeLabelValue("plain / text: ok"), "plain / text: ok");
  // HELP escapes backslash and newline, not quotes.
  EXPECT_EQ(EscapeHelp("say \"hi\"\\\nbye"), R"(say "hi"\\\nbye)");
}

TEST(MetricsFormatTest, Names) {
  EXPECT_TRUE(IsValidMetricName("ckptd_bytes_written_total"));
  EXPECT_TRUE(IsValidMetricName("a:b_c9"));
  EXPECT_TRUE(IsValidMetricName("_x"));
  EXPECT_FALSE(IsValidMetricName(""));
  EXPECT_FALSE(IsValidMetricName("9lives"));
  EXPECT_FALSE(IsValidMetricName("has-dash"));
  EXPECT_FALSE(IsValidMetricName("has space"));
  EXPECT_TRUE(IsValidLabelName("code"));
  EXPECT_TRUE(IsValidLabelName("_a1"));
  EXPECT_FALSE(IsValidLabelName("a:b"));
  EXPECT_FALSE(IsValidLabelName("1a"));
  EXPECT_FALSE(IsValidLabelName(""));
}

TEST(MetricsFormatTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_TRUE(ExponentialBuckets(1, 2, 0).empty());
}

// ---------------------------------------------------------------------------
// Rendering

TEST(MetricsRenderTest, CounterAndGaugeExactText) {
  MetricsRegistry r;
  CounterFamily* c =
      r.AddCounter("test_events_total", "Events seen.", {"kind"});
  c->WithLabels({"b"})->Increment(2);
  c->WithLabels({"a"})->Increment();
  c->WithLabels({"a"})->Increment(0.5);
  c->WithLabels({"a"})->Increment(-7);  // ignored: counters only go up
  GaugeFamily* g = r.AddGauge("test_temperature", "Current\ntemp \\ C.");
  g->Get()->Set(-3.25);
  g->Get()->Add(1);
  EXPECT_EQ(r.Render(),
            "# HELP test_events_total Events seen.\n"
            "# TYPE test_events_total counter\n"
            "test_events_total{kind=\"a\"} 1.5\n"
            "test_events_total{kind=\"b\"} 2\n"
            "# HELP test_temperature Current\\ntemp \\\\ C.\n"
            "# TYPE test_temperature gauge\n"
            "test_temperature -2.25\n");
}

TEST(MetricsRenderTest, UnlabelledSeriesStartAtZero) {
  MetricsRegistry r;
  r.AddCounter("test_a_total", "A.");
  r.AddGauge("test_b", "B.");
  r.AddCounter("test_c_total", "C.", {"x"});  // no series until used
  EXPECT_EQ(r.Render(),
            "# HELP test_a_total A.\n# TYPE test_a_total counter\n"
            "test_a_total 0\n"
            "# HELP test_b B.\n# TYPE test_b gauge\ntest_b 0\n"
            "# HELP test_c_total C.\n# TYPE test_c_total counter\n");
}

TEST(MetricsRenderTest, LabelValuesAreEscaped) {
  MetricsRegistry r;
  GaugeFamily* g = r.AddGauge("test_info", "Info.", {"path", "why"});
  g->WithLabels({"C:\\dir\\\"x\"", "line1\nline2"})->Set(1);
  EXPECT_THAT(r.Render(), HasSubstr("test_info{path=\"C:\\\\dir\\\\\\\"x\\\"\","
                                    "why=\"line1\\nline2\"} 1\n"));
}

TEST(MetricsRenderTest, HistogramExactText) {
  MetricsRegistry r;
  HistogramFamily* h =
      r.AddHistogram("test_latency_seconds", "Latency.", {0.1, 1, 2.5});
  Histogram* s = h->Get();
  s->Observe(0.05);
  s->Observe(0.1);  // le is inclusive
  s->Observe(0.7);
  s->Observe(3);
  s->Observe(1000);
  s->Observe(std::nan(""));  // ignored
  EXPECT_EQ(r.Render(),
            "# HELP test_latency_seconds Latency.\n"
            "# TYPE test_latency_seconds histogram\n"
            "test_latency_seconds_bucket{le=\"0.1\"} 2\n"
            "test_latency_seconds_bucket{le=\"1\"} 3\n"
            "test_latency_seconds_bucket{le=\"2.5\"} 3\n"
            "test_latency_seconds_bucket{le=\"+Inf\"} 5\n"
            "test_latency_seconds_sum 1003.85\n"
            "test_latency_seconds_count 5\n");
}

TEST(MetricsRenderTest, LabelledHistogramPutsLeLast) {
  MetricsRegistry r;
  HistogramFamily* h =
      r.AddHistogram("test_size_bytes", "Sizes.", {1024}, {"op"});
  h->WithLabels({"read"})->Observe(10);
  h->WithLabels({"write"})->Observe(4096);
  EXPECT_EQ(r.Render(),
            "# HELP test_size_bytes Sizes.\n"
            "# TYPE test_size_bytes histogram\n"
            "test_size_bytes_bucket{op=\"read\",le=\"1024\"} 1\n"
            "test_size_bytes_bucket{op=\"read\",le=\"+Inf\"} 1\n"
            "test_size_bytes_sum{op=\"read\"} 10\n"
            "test_size_bytes_count{op=\"read\"} 1\n"
            "test_size_bytes_bucket{op=\"write\",le=\"1024\"} 0\n"
            "test_size_bytes_bucket{op=\"write\",le=\"+Inf\"} 1\n"
            "test_size_bytes_sum{op=\"write\"} 4096\n"
            "test_size_bytes_count{op=\"write\"} 1\n");
}

TEST(MetricsRenderTest, CollectorsRunAtRenderTime) {
  MetricsRegistry r;
  GaugeFamily* g = r.AddGauge("test_live", "Live value.");
  int calls = 0;
  r.AddCollector([&] { g->Get()->Set(++calls * 10); });
  EXPECT_THAT(r.Render(), HasSubstr("test_live 10\n"));
  EXPECT_THAT(r.Render(), HasSubstr("test_live 20\n"));
}

TEST(MetricsRenderTest, ConcurrentUpdatesAreCountedExactly) {
  MetricsRegistry r;
  CounterFamily* c = r.AddCounter("test_n_total", "N.", {"t"});
  HistogramFamily* h = r.AddHistogram("test_h", "H.", {0.5});
  constexpr int kThreads = 4, kPerThread = 20000;
  std::vector<std::thread> threads;
  std::atomic<bool> done{false};
  std::thread renderer([&] {
    while (!done) {
      // Every snapshot is self-consistent: +Inf bucket == count.
      const std::string text = r.Render();
      const size_t inf = text.find("test_h_bucket{le=\"+Inf\"} ");
      const size_t cnt = text.find("test_h_count ");
      ASSERT_NE(inf, std::string::npos);
      ASSERT_NE(cnt, std::string::npos);
      const long a = std::stol(text.substr(inf + 25));
      const long b = std::stol(text.substr(cnt + 13));
      ASSERT_EQ(a, b);
    }
  });
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        c->WithLabels({t % 2 ? "odd" : "even"})->Increment();
        h->Get()->Observe(i % 2);
      }
    });
  }
  for (auto& t : threads) t.join();
  done = true;
  renderer.join();
  EXPECT_EQ(c->WithLabels({"odd"})->value(), 2.0 * kPerThread);
  EXPECT_EQ(c->WithLabels({"even"})->value(), 2.0 * kPerThread);
  const Histogram::Snapshot s = h->Get()->snapshot();
  EXPECT_EQ(s.count, uint64_t{kThreads} * kPerThread);
  EXPECT_EQ(s.cumulative[0], s.count / 2);
  EXPECT_EQ(s.sum, kThreads * kPerThread / 2.0);
}

TEST(MetricsDeathTest, BrokenDefinitionsCrashLoudly) {
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddGauge("test_x", "X.");
        r.AddGauge("test_x", "X again.");
      },
      "registered twice");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddHistogram("test_h", "H.", {1});
        r.AddGauge("test_h_count", "clash");
      },
      "clashes");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddCounter("test_events", "no _total");
      },
      "_total");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddGauge("test-x", "bad name");
      },
      "not a valid metric name");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddHistogram("test_h", "H.", {1}, {"le"});
      },
      "label name 'le'");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddHistogram("test_h", "H.", {2, 1});
      },
      "ascending");
  EXPECT_DEATH(
      {
        MetricsRegistry r;
        r.AddGauge("test_g", "G.", {"a", "b"})->WithLabels({"only one"});
      },
      "1 label values for 2 labels");
}

// ---------------------------------------------------------------------------
// DaemonMetrics: events in, Prometheus text out (no manager: the scrape-time
// gauges stay at zero and /healthz says why).

CheckpointInfo Finished(State state, absl::Time created, absl::Duration stall,
                        absl::Duration total, uint64_t bytes) {
  CheckpointInfo info;
  info.state = state;
  info.created = created;
  info.staged =
      stall < absl::ZeroDuration() ? absl::InfinitePast() : created + stall;
  info.finished = created + total;
  info.local_staged_bytes = bytes;
  info.local_written_bytes = state == State::kCommitted ? bytes + 100 : 0;
  return info;
}

TEST(DaemonMetricsTest, MultiNodeCheckpointsCountByRole) {
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  DaemonMetrics m("9.9.9", t0);
  CheckpointInfo multi = Finished(State::kCommitted, t0, absl::Milliseconds(10),
                                  absl::Seconds(2), 100);
  multi.num_nodes = 2;
  multi.is_coordinator = true;
  m.CheckpointFinished(multi);
  multi.is_coordinator = false;
  multi.state = State::kFailed;
  multi.error = absl::UnavailableError("coordinator gone");
  m.CheckpointFinished(multi);

  const std::string text = m.Render();
  EXPECT_THAT(text, HasSubstr("ckptd_multinode_checkpoints_finished_total{role="
                              "\"coordinator\",outcome=\"committed\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_multinode_checkpoints_finished_total{role="
                              "\"participant\",outcome=\"failed\"} 1\n"));
  // Single-node checkpoints are not counted there.
  EXPECT_THAT(text, ::testing::Not(HasSubstr("outcome=\"cancelled\"} 1")));
}

TEST(DaemonMetricsTest, EventsMoveCountersAndHistograms) {
  const absl::Time t0 = absl::FromUnixSeconds(1700000000);
  DaemonMetrics m("9.9.9", t0);
  m.CheckpointFinished(Finished(State::kCommitted, t0, absl::Milliseconds(20),
                                absl::Seconds(3), 1000));
  m.CheckpointFinished(Finished(State::kCommitted, t0, absl::Milliseconds(30),
                                absl::Seconds(4), 2000));
  CheckpointInfo failed = Finished(State::kFailed, t0, absl::Milliseconds(5),
                                   absl::Seconds(1), 500);
  failed.error = absl::ResourceExhaustedError("disk full");
  m.CheckpointFinished(failed);
  CheckpointInfo early =
      Finished(State::kFailed, t0, absl::Seconds(-1), absl::Seconds(1), 0);
  early.error = absl::DeadlineExceededError("stage timeout");
  m.CheckpointFinished(early);
  m.CheckpointFinished(
      Finished(State::kCancelled, t0, absl::Seconds(-1), absl::Seconds(1), 0));
  m.SaveRejected(absl::InvalidArgumentError("bad dtype"));
  m.SaveRejected(absl::InvalidArgumentError("bad shape"));
  const std::string text = m.Render();
  EXPECT_THAT(text, HasSubstr("ckptd_build_info{version=\"9.9.9\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_process_start_time_seconds 1700000000\n"));
  EXPECT_THAT(
      text,
      HasSubstr("ckptd_checkpoints_finished_total{outcome=\"committed\"} 2\n"));
  EXPECT_THAT(
      text,
      HasSubstr("ckptd_checkpoints_finished_total{outcome=\"failed\"} 2\n"));
  EXPECT_THAT(
      text,
      HasSubstr("ckptd_checkpoints_finished_total{outcome=\"cancelled\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_bytes_staged_total 3500\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_bytes_written_total 3200\n"));
  // Stall: three checkpoints reached "staged" (20, 30, 5 ms).
  EXPECT_THAT(
      text, HasSubstr("ckptd_trainer_stall_seconds_bucket{le=\"0.005\"} 1\n"));
  EXPECT_THAT(
      text, HasSubstr("ckptd_trainer_stall_seconds_bucket{le=\"0.025\"} 2\n"));
  EXPECT_THAT(text,
              HasSubstr("ckptd_trainer_stall_seconds_bucket{le=\"+Inf\"} 3\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_trainer_stall_seconds_count 3\n"));
  // Commit latency (staged → committed): 2.98 s and 3.97 s.
  EXPECT_THAT(text,
              HasSubstr("ckptd_commit_latency_seconds_bucket{le=\"2.5\"} 0\n"));
  EXPECT_THAT(text,
              HasSubstr("ckptd_commit_latency_seconds_bucket{le=\"5\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_commit_latency_seconds_count 2\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_checkpoint_latency_seconds_sum 7\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_errors_total{code=\"INVALID_ARGUMENT\","
                              "stage=\"validation\"} 2\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_errors_total{code=\"RESOURCE_EXHAUSTED\","
                              "stage=\"persisting\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_errors_total{code=\"DEADLINE_EXCEEDED\","
                              "stage=\"staging\"} 1\n"));
  // Cancelled is an outcome, not an error.
  EXPECT_THAT(text, Not(HasSubstr("code=\"CANCELLED\"")));
  // No manager: gauges at zero, every state present.
  EXPECT_THAT(text, HasSubstr("ckptd_checkpoints{state=\"committing\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("ckptd_serving 0\n"));
}

TEST(DaemonMetricsTest, HealthWithoutManagerIsUnavailable) {
  DaemonMetrics m("1", absl::Now());
  absl::Status s = m.Health();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(Msg(s), HasSubstr("manager is not up"));
}

TEST(DaemonMetricsTest, CheckDirUsable) {
  TempDir dir;
  EXPECT_OK(CheckDirUsable(dir.path()));
  // Missing: usable if it can be created under an existing ancestor.
  EXPECT_OK(CheckDirUsable(dir.Join("not/yet/there")));
  ASSERT_EQ(::ckptd::testing::RunCommand("touch " + dir.Join("file")), 0);
  absl::Status s = CheckDirUsable(dir.Join("file"));
  EXPECT_THAT(Msg(s), HasSubstr("not a directory"));
  s = CheckDirUsable(dir.Join("file/below"));
  EXPECT_FALSE(s.ok());
}

// ---------------------------------------------------------------------------
// HttpServer

TEST(HttpServerTest, ParseListenAddress) {
  using P = std::pair<std::string, int>;
  ASSERT_OK_AND_ASSIGN(P a, ParseListenAddress("0.0.0.0:9464"));
  EXPECT_EQ(a, P("0.0.0.0", 9464));
  ASSERT_OK_AND_ASSIGN(P b, ParseListenAddress("[::1]:0"));
  EXPECT_EQ(b, P("::1", 0));
  ASSERT_OK_AND_ASSIGN(P c, ParseListenAddress(":80"));
  EXPECT_EQ(c, P("0.0.0.0", 80));
  for (const char* bad : {"", "localhost", "host:", "host:x", "host:65536",
                          "host:-1", "::1:80"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(ParseListenAddress(bad).status()))
        << bad;
  }
}

TEST(HttpServerTest, ServesMetricsHealthAnd404) {
  std::atomic<bool> healthy{true};
  HttpServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics = [] { return std::string("# TYPE x gauge\nx 1\n"); };
  o.health = [&]() -> absl::Status {
    if (healthy) return absl::OkStatus();
    return absl::UnavailableError("recovery not finished");
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HttpServer> server,
                       HttpServer::Create(o));
  ASSERT_GT(server->port(), 0);
  EXPECT_EQ(server->host(), "127.0.0.1");

  httplib::Client client("127.0.0.1", server->port());
  httplib::Result r = client.Get("/metrics");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "# TYPE x gauge\nx 1\n");
  EXPECT_THAT(r->get_header_value("Content-Type"),
              StartsWith("text/plain; version=0.0.4"));

  r = client.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "ok\n");
  healthy = false;
  r = client.Get("/healthz");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 503);
  EXPECT_THAT(r->body, HasSubstr("recovery not finished"));

  r = client.Get("/nope");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_THAT(r->body, HasSubstr("not found"));
  r = client.Post("/metrics", "x", "text/plain");
  ASSERT_TRUE(r);
  EXPECT_GE(r->status, 400);

  server->Stop();
  server->Stop();  // idempotent
  httplib::Client after("127.0.0.1", server->port());
  after.set_connection_timeout(1);
  EXPECT_FALSE(after.Get("/healthz"));  // nothing listens any more
}

TEST(HttpServerTest, PortInUseIsAClearError) {
  HttpServerOptions o;
  o.listen = "127.0.0.1:0";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HttpServer> first,
                       HttpServer::Create(o));
  o.listen = "127.0.0.1:" + std::to_string(first->port());
  absl::StatusOr<std::unique_ptr<HttpServer>> second = HttpServer::Create(o);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsUnavailable(second.status())) << second.status();
  EXPECT_THAT(Msg(second.status()), HasSubstr(o.listen));

  o.listen = "not an address";
  EXPECT_TRUE(absl::IsInvalidArgument(HttpServer::Create(o).status()));
  // A host that is not an address of this machine.
  o.listen = "192.0.2.1:0";
  EXPECT_FALSE(HttpServer::Create(o).ok());
}

TEST(HttpServerTest, ManyConcurrentScrapes) {
  MetricsRegistry registry;
  CounterFamily* c = registry.AddCounter("test_scrapes_total", "Scrapes.");
  HttpServerOptions o;
  o.listen = "127.0.0.1:0";
  o.metrics = [&] {
    c->Get()->Increment();
    return registry.Render();
  };
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<HttpServer> server,
                       HttpServer::Create(o));
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      httplib::Client client("127.0.0.1", server->port());
      for (int i = 0; i < 25; ++i) {
        httplib::Result r = client.Get("/metrics");
        if (r && r->status == 200 &&
            r->body.find("test_scrapes_total") != std::string::npos) {
          ++ok;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 100);
  EXPECT_EQ(c->Get()->value(), 100);
}

}  // namespace
}  // namespace ckptd::daemon
