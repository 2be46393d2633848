// Copyright 2026 The ckptd Authors.
//
// cli/progress.h: the progress formatting of `ckptctl status` (human units,
// phases, the sliding-window rate with an injected clock, ETA, the bar, the
// terminal and plain lines, the JSON object).
#include <string>

#include "absl/time/time.h"
#include "cli/progress.h"
#include "gtest/gtest.h"

namespace ckptd::cli {
namespace {

using client::CheckpointInfo;

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// A fixed "now" (the clock the tests inject).
const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);

CheckpointInfo Info(std::string state, uint64_t total, uint64_t staged,
                    uint64_t written, uint64_t file_bytes = 0) {
  CheckpointInfo c;
  c.checkpoint_id = "/ckpt/job/step_1";
  c.job = "job";
  c.state = std::move(state);
  c.world_size = 4;
  c.ranks_staged = 2;
  c.total_bytes = total;
  c.staged_bytes = staged;
  c.written_bytes = written;
  c.file_bytes = file_bytes;
  return c;
}

TEST(HumanUnits, Bytes) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(12 * kMiB), "12.0 MiB");
  EXPECT_EQ(HumanBytes(kGiB + kGiB / 4), "1.25 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{2} << 40), "2.00 TiB");
}

TEST(HumanUnits, Rate) {
  EXPECT_EQ(HumanRate(std::nullopt), "-");
  EXPECT_EQ(HumanRate(-1.0), "-");
  EXPECT_EQ(HumanRate(0.0), "0 B/s");
  EXPECT_EQ(HumanRate(312.0 * kMiB), "312.0 MiB/s");
  EXPECT_EQ(HumanRate(1.5 * kGiB), "1.50 GiB/s");
}

TEST(HumanUnits, EtaAndDuration) {
  EXPECT_EQ(FormatEta(std::nullopt), "-");
  EXPECT_EQ(FormatEta(-3), "-");
  EXPECT_EQ(FormatEta(0), "0s");
  EXPECT_EQ(FormatEta(0.2), "1s");  // rounds up
  EXPECT_EQ(FormatEta(59), "59s");
  EXPECT_EQ(FormatEta(185), "3m05s");
  EXPECT_EQ(FormatEta(7620), "2h07m");
  EXPECT_EQ(FormatEta(3 * 86400 + 4 * 3600 + 5), "3d04h");
  EXPECT_EQ(FormatEta(1e12), "-");
  EXPECT_EQ(HumanDuration(absl::Seconds(45)), "45s");
  EXPECT_EQ(HumanDuration(absl::Minutes(12)), "12m");
  EXPECT_EQ(HumanDuration(absl::Seconds(-1)), "-");
  EXPECT_EQ(Percent(1, 2), "50.0%");
  EXPECT_EQ(Percent(1, 0), "-");
}

TEST(Phases, BytesOfTheCurrentPhase) {
  PhaseProgress p = ProgressOf(Info("STAGING", 100, 40, 0));
  EXPECT_EQ(p.phase, Phase::kStaging);
  EXPECT_EQ(p.done, 40u);
  EXPECT_EQ(p.total, 100u);
  // Writing: of the data files' size once known, else of the data bytes.
  p = ProgressOf(Info("WRITING", 100, 100, 30));
  EXPECT_EQ(p.phase, Phase::kWriting);
  EXPECT_EQ(p.done, 30u);
  EXPECT_EQ(p.total, 100u);
  p = ProgressOf(Info("WRITING", 100, 100, 30, 120));
  EXPECT_EQ(p.total, 120u);
  EXPECT_EQ(ProgressOf(Info("STAGED", 100, 100, 0)).phase, Phase::kWriting);
  EXPECT_EQ(ProgressOf(Info("COMMITTING", 100, 100, 120, 120)).phase,
            Phase::kCommitting);
  p = ProgressOf(Info("COMMITTED", 100, 100, 120, 120));
  EXPECT_EQ(p.phase, Phase::kDone);
  EXPECT_EQ(p.done, 120u);
  p = ProgressOf(Info("CANCELLED", 100, 100, 50, 120));
  EXPECT_EQ(p.phase, Phase::kDone);
  EXPECT_EQ(p.done, 50u);
  EXPECT_STREQ(PhaseName(Phase::kWriting), "writing");
}

TEST(RateWindowTest, SlidingWindowWithInjectedClock) {
  RateWindow w(absl::Seconds(5));
  EXPECT_EQ(w.Rate(), std::nullopt);
  w.Add(kT0, Phase::kWriting, 0);
  EXPECT_EQ(w.Rate(), std::nullopt);  // one sample
  w.Add(kT0, Phase::kWriting, 10 * kMiB);
  EXPECT_EQ(w.Rate(), std::nullopt);  // no time between them
  // 100 MiB/s for 5 s.
  for (int i = 1; i <= 10; ++i) {
    w.Add(kT0 + absl::Milliseconds(500 * i), Phase::kWriting,
          10 * kMiB + i * 50 * kMiB);
  }
  ASSERT_TRUE(w.Rate().has_value());
  EXPECT_DOUBLE_EQ(*w.Rate(), 100.0 * kMiB);
  // Then 10 MiB/s: after a full window only the new rate counts.
  const uint64_t base = 10 * kMiB + 500 * kMiB;
  for (int i = 1; i <= 10; ++i) {
    w.Add(kT0 + absl::Seconds(5) + absl::Milliseconds(500 * i), Phase::kWriting,
          base + i * 5 * kMiB);
  }
  EXPECT_DOUBLE_EQ(*w.Rate(), 10.0 * kMiB);
  EXPECT_LE(w.size(), 12u);
  // Stalled: the rate drops to 0 once the window holds no progress.
  for (int i = 1; i <= 11; ++i) {
    w.Add(kT0 + absl::Seconds(10) + absl::Milliseconds(500 * i),
          Phase::kWriting, base + 50 * kMiB);
  }
  EXPECT_DOUBLE_EQ(*w.Rate(), 0.0);
}

TEST(RateWindowTest, NewPhaseOrFewerBytesRestart) {
  RateWindow w(absl::Seconds(5));
  w.Add(kT0, Phase::kStaging, 0);
  w.Add(kT0 + absl::Seconds(1), Phase::kStaging, 100);
  EXPECT_DOUBLE_EQ(*w.Rate(), 100.0);
  w.Add(kT0 + absl::Seconds(2), Phase::kWriting, 0);
  EXPECT_EQ(w.Rate(), std::nullopt);
  w.Add(kT0 + absl::Seconds(4), Phase::kWriting, 50);
  EXPECT_DOUBLE_EQ(*w.Rate(), 25.0);
  w.Add(kT0 + absl::Seconds(5), Phase::kWriting, 10);  // went down
  EXPECT_EQ(w.Rate(), std::nullopt);
}

TEST(Eta, FromRate) {
  EXPECT_EQ(EtaSeconds(0, 0, 10.0), std::nullopt);  // total unknown
  EXPECT_EQ(EtaSeconds(0, 100, std::nullopt), std::nullopt);
  EXPECT_EQ(EtaSeconds(0, 100, 0.0), std::nullopt);
  EXPECT_DOUBLE_EQ(*EtaSeconds(40, 100, 20.0), 3.0);
  EXPECT_DOUBLE_EQ(*EtaSeconds(100, 100, std::nullopt), 0.0);
}

TEST(View, WindowRateElsePhaseAverage) {
  CheckpointInfo c = Info("WRITING", 100 * kMiB, 100 * kMiB, 40 * kMiB);
  c.created_unix_ms = absl::ToUnixMillis(kT0 - absl::Seconds(10));
  c.staged_unix_ms = absl::ToUnixMillis(kT0 - absl::Seconds(4));
  // One-shot: the average since staged, 10 MiB/s; 60 MiB left: 6 s.
  ProgressView v = MakeProgressView(c, std::nullopt, kT0);
  ASSERT_TRUE(v.rate.has_value());
  EXPECT_DOUBLE_EQ(*v.rate, 10.0 * kMiB);
  EXPECT_DOUBLE_EQ(*v.eta_seconds, 6.0);
  // A follower's window wins.
  v = MakeProgressView(c, 30.0 * kMiB, kT0);
  EXPECT_DOUBLE_EQ(*v.rate, 30.0 * kMiB);
  EXPECT_DOUBLE_EQ(*v.eta_seconds, 2.0);
  // Staging: the average since created.
  c = Info("STAGING", 100 * kMiB, 50 * kMiB, 0);
  c.created_unix_ms = absl::ToUnixMillis(kT0 - absl::Seconds(5));
  v = MakeProgressView(c, std::nullopt, kT0);
  EXPECT_DOUBLE_EQ(*v.rate, 10.0 * kMiB);
  // Final states have neither.
  c = Info("COMMITTED", 100, 100, 100, 100);
  v = MakeProgressView(c, 5.0, kT0);
  EXPECT_EQ(v.rate, std::nullopt);
  EXPECT_EQ(v.eta_seconds, std::nullopt);
  // No timestamps: unknown.
  v = MakeProgressView(Info("WRITING", 100, 100, 10), std::nullopt, kT0);
  EXPECT_EQ(v.rate, std::nullopt);
}

TEST(Bar, Rendering) {
  EXPECT_EQ(RenderBar(0, 12), "[..........]");
  EXPECT_EQ(RenderBar(0.5, 12), "[#####.....]");
  EXPECT_EQ(RenderBar(0.999, 12), "[#########.]");
  EXPECT_EQ(RenderBar(1, 12), "[##########]");
  EXPECT_EQ(RenderBar(2, 12), "[##########]");
  EXPECT_EQ(RenderBar(-1, 12), "[..........]");
  EXPECT_EQ(RenderBar(0.5, 1), "[.]");  // at least 3 wide
  for (int w = 3; w < 50; ++w) EXPECT_EQ(RenderBar(0.37, w).size(), size_t(w));
}

ProgressView WritingView(int nodes = 1) {
  CheckpointInfo c = Info("WRITING", 2 * kGiB, 2 * kGiB, kGiB + kGiB / 10);
  c.ranks_staged = 4;
  if (nodes > 1) {
    c.num_nodes = nodes;
    c.nodes_planned = nodes;
    c.nodes_prepared = 1;
    c.coordinator = "node0:7070";
  }
  ProgressView v;
  v.info = c;
  v.progress = ProgressOf(c);
  v.rate = 312.0 * kMiB;
  v.eta_seconds = 4.0;
  v.time = kT0;
  return v;
}

bool HasControlChars(const std::string& s) {
  for (unsigned char ch : s) {
    if (ch < 0x20 || ch == 0x7f) return true;
  }
  return false;
}

TEST(Lines, Plain) {
  const std::string line = FormatProgressLine(WritingView());
  EXPECT_EQ(line,
            "WRITING 55.0% 1.10 GiB/2.00 GiB written, 312.0 MiB/s, ETA 4s, "
            "ranks 4/4 staged");
  EXPECT_FALSE(HasControlChars(line));
  EXPECT_EQ(FormatProgressLine(WritingView(3)),
            "WRITING 55.0% 1.10 GiB/2.00 GiB written, 312.0 MiB/s, ETA 4s, "
            "ranks 4/4 staged, nodes 3 (planned 3, prepared 1)");
  ProgressView done = WritingView();
  done.info.state = "COMMITTED";
  done.progress = ProgressOf(done.info);
  EXPECT_EQ(FormatProgressLine(done),
            "COMMITTED 100.0% 2.00 GiB/2.00 GiB written, ranks 4/4 staged");
  ProgressView pending;
  pending.info = Info("PENDING", 0, 0, 0);
  pending.progress = ProgressOf(pending.info);
  EXPECT_EQ(FormatProgressLine(pending),
            "PENDING 0 B staged, ranks 2/4 staged");
}

TEST(Lines, TerminalFitsTheWidth) {
  const ProgressView v = WritingView(3);
  const std::string wide = FormatTerminalLine(v, 200);
  EXPECT_EQ(wide,
            "WRITING [####################..................] 55.0%  "
            "1.10 GiB/2.00 GiB written  312.0 MiB/s  ETA 4s  ranks 4/4  "
            "nodes 1/3 prepared");
  for (int cols = 1; cols <= 200; ++cols) {
    const std::string line = FormatTerminalLine(v, cols);
    EXPECT_LE(static_cast<int>(line.size()), std::max(cols - 1, 1)) << cols;
    EXPECT_FALSE(HasControlChars(line)) << cols;
  }
  // 110 columns: the bar shrinks (to 16) before any field goes.
  const std::string mid = FormatTerminalLine(v, 110);
  EXPECT_NE(mid.find("nodes 1/3 prepared"), std::string::npos) << mid;
  EXPECT_NE(mid.find(" [#######.......] "), std::string::npos) << mid;
  // Narrower: trailing fields go, the bar stays at 10 or more.
  const std::string sixty = FormatTerminalLine(v, 60);
  EXPECT_EQ(sixty.find("nodes"), std::string::npos) << sixty;
  EXPECT_NE(sixty.find("[#####"), std::string::npos) << sixty;
  EXPECT_NE(sixty.find("written"), std::string::npos) << sixty;
  // Too narrow for a bar: state and bytes, cut to fit.
  const std::string narrow = FormatTerminalLine(v, 30);
  EXPECT_EQ(narrow.find('['), std::string::npos) << narrow;
  EXPECT_EQ(narrow.rfind("WRITING 55.0%", 0), 0u) << narrow;
}

TEST(Json, FieldsAndNulls) {
  nlohmann::ordered_json j = ProgressJson(WritingView(3));
  EXPECT_EQ(j["checkpoint_id"], "/ckpt/job/step_1");
  EXPECT_EQ(j["state"], "WRITING");
  EXPECT_EQ(j["phase"], "writing");
  EXPECT_EQ(j["bytes"], kGiB + kGiB / 10);
  EXPECT_EQ(j["bytes_total"], 2 * kGiB);
  EXPECT_NEAR(j["progress"].get<double>(), 0.55, 1e-6);
  EXPECT_EQ(j["rate"], 312.0 * kMiB);
  EXPECT_EQ(j["eta_seconds"], 4.0);
  EXPECT_EQ(j["final"], false);
  EXPECT_EQ(j["time_unix_ms"], absl::ToUnixMillis(kT0));
  EXPECT_EQ(j["num_nodes"], 3);
  EXPECT_EQ(j["nodes_prepared"], 1);
  EXPECT_EQ(j["ranks_staged"], 4);
  // Unknown values are null, not absent.
  ProgressView pending;
  pending.info = Info("PENDING", 0, 0, 0);
  pending.progress = ProgressOf(pending.info);
  j = ProgressJson(pending);
  EXPECT_TRUE(j["progress"].is_null());
  EXPECT_TRUE(j["rate"].is_null());
  EXPECT_TRUE(j["eta_seconds"].is_null());
  EXPECT_EQ(j["bytes_total"], 0);
}

TEST(Terminal, ColumnsFromEnvironment) {
  // Not a terminal: $COLUMNS, else 80.
  const int fd = -1;
  ::setenv("COLUMNS", "123", 1);
  EXPECT_EQ(TerminalColumns(fd), 123);
  ::setenv("COLUMNS", "junk", 1);
  EXPECT_EQ(TerminalColumns(fd), 80);
  ::unsetenv("COLUMNS");
  EXPECT_EQ(TerminalColumns(fd), 80);
}

}  // namespace
}  // namespace ckptd::cli
