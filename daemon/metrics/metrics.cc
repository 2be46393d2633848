// Copyright 2026 The ckptd Authors.

#include "daemon/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "fmt/format.h"

namespace ckptd::daemon {
namespace {

// Broken invariants in metric definitions are programming errors.
[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "ckptd metrics: %s\n", why.c_str());
  std::abort();
}

void AppendLabels(const std::vector<std::string>& names,
                  const LabelValues& values, std::string_view extra_name,
                  std::string_view extra_value, std::string* out) {
  if (names.empty() && extra_name.empty()) return;
  out->push_back('{');
  bool first = true;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!first) out->push_back(',');
    first = false;
    fmt::format_to(std::back_inserter(*out), "{}=\"{}\"", names[i],
                   EscapeLabelValue(values[i]));
  }
  if (!extra_name.empty()) {
    if (!first) out->push_back(',');
    fmt::format_to(std::back_inserter(*out), "{}=\"{}\"", extra_name,
                   EscapeLabelValue(extra_value));
  }
  out->push_back('}');
}

void RenderSeries(const std::string& name,
                  const std::vector<std::string>& label_names,
                  const LabelValues& values, const Counter& c,
                  std::string* out) {
  *out += name;
  AppendLabels(label_names, values, "", "", out);
  fmt::format_to(std::back_inserter(*out), " {}\n",
                 FormatMetricValue(c.value()));
}

void RenderSeries(const std::string& name,
                  const std::vector<std::string>& label_names,
                  const LabelValues& values, const Gauge& g, std::string* out) {
  *out += name;
  AppendLabels(label_names, values, "", "", out);
  fmt::format_to(std::back_inserter(*out), " {}\n",
                 FormatMetricValue(g.value()));
}

void RenderSeries(const std::string& name,
                  const std::vector<std::string>& label_names,
                  const LabelValues& values, const Histogram& h,
                  std::string* out) {
  const Histogram::Snapshot s = h.snapshot();
  for (size_t i = 0; i <= s.bounds.size(); ++i) {
    const std::string le = i < s.bounds.size() ? FormatMetricValue(s.bounds[i])
                                               : std::string("+Inf");
    *out += name;
    *out += "_bucket";
    AppendLabels(label_names, values, "le", le, out);
    fmt::format_to(std::back_inserter(*out), " {}\n", s.cumulative[i]);
  }
  *out += name;
  *out += "_sum";
  AppendLabels(label_names, values, "", "", out);
  fmt::format_to(std::back_inserter(*out), " {}\n", FormatMetricValue(s.sum));
  *out += name;
  *out += "_count";
  AppendLabels(label_names, values, "", "", out);
  fmt::format_to(std::back_inserter(*out), " {}\n", s.count);
}

void CheckBounds(const std::string& name, const std::vector<double>& bounds) {
  if (bounds.empty()) Die(fmt::format("histogram {}: no buckets", name));
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && bounds[i] <= bounds[i - 1])) {
      Die(
          fmt::format("histogram {}: bucket bounds must be finite and "
                      "strictly ascending",
                      name));
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// Formatting helpers

bool IsValidMetricName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    c == '_' || c == ':' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

bool IsValidLabelName(std::string_view name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    c == '_' || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == 0) return "0";  // also -0
  return fmt::format("{}", v);
}

namespace {
// Backslash and newline escaped (HELP text); with `quote`, '"' too (label
// values).
std::string Escape(std::string_view v, bool quote) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out.push_back(c);
    }
  }
  return out;
}
}  // namespace

std::string EscapeLabelValue(std::string_view v) { return Escape(v, /*quote=*/true); }

std::string EscapeHelp(std::string_view v) { return Escape(v, /*quote=*/false); }

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) out.push_back(v);
  return out;
}

// ---------------------------------------------------------------------------
// Counter, Histogram

void Counter::Increment(double v) {
  if (!(v >= 0)) return;  // negative or NaN
  value_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  if (std::isnan(v)) return;
  // The first bucket whose upper bound is >= v (le is inclusive).
  const size_t i =
      std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  absl::MutexLock l(&mu_);
  ++counts_[i];
  sum_ += v;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock l(&mu_);
  s.cumulative.reserve(counts_.size());
  uint64_t total = 0;
  for (uint64_t c : counts_) {
    total += c;
    s.cumulative.push_back(total);
  }
  s.count = total;
  s.sum = sum_;
  return s;
}

// ---------------------------------------------------------------------------
// MetricFamily

template <typename T>
T* MetricFamily<T>::WithLabels(const LabelValues& values) {
  if (values.size() != label_names_.size()) {
    Die(fmt::format("metric {}: {} label values for {} labels", name_,
                    values.size(), label_names_.size()));
  }
  absl::MutexLock l(&mu_);
  std::unique_ptr<T>& slot = series_[values];
  if (slot == nullptr) {
    if constexpr (std::is_same_v<T, Histogram>) {
      slot = std::make_unique<Histogram>(bounds_);
    } else {
      slot = std::make_unique<T>();
    }
  }
  return slot.get();
}

template <typename T>
void MetricFamily<T>::Render(std::string_view type, std::string* out) const {
  fmt::format_to(std::back_inserter(*out), "# HELP {} {}\n# TYPE {} {}\n",
                 name_, EscapeHelp(help_), name_, type);
  absl::MutexLock l(&mu_);
  for (const auto& [values, series] : series_) {
    RenderSeries(name_, label_names_, values, *series, out);
  }
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

// ---------------------------------------------------------------------------
// MetricsRegistry

struct MetricsRegistry::Entry {
  std::string name;
  std::unique_ptr<CounterFamily> counter;
  std::unique_ptr<GaugeFamily> gauge;
  std::unique_ptr<HistogramFamily> histogram;
};

MetricsRegistry::MetricsRegistry() = default;
MetricsRegistry::~MetricsRegistry() = default;

void MetricsRegistry::AddEntry(std::unique_ptr<Entry> entry) {
  const bool histogram = entry->histogram != nullptr;
  if (!IsValidMetricName(entry->name)) {
    Die(fmt::format("'{}' is not a valid metric name", entry->name));
  }
  const std::vector<std::string>& labels =
      entry->counter ? entry->counter->label_names()
      : entry->gauge ? entry->gauge->label_names()
                     : entry->histogram->label_names();
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string& l = labels[i];
    if (!IsValidLabelName(l) || l.starts_with("__") ||
        (histogram && l == "le") ||
        std::count(labels.begin(), labels.end(), l) != 1) {
      Die(fmt::format("metric {}: bad or repeated label name '{}'", entry->name,
                      l));
    }
  }
  absl::MutexLock l(&mu_);
  for (const auto& e : entries_) {
    // A histogram's name_bucket/_sum/_count must not collide either.
    const std::string& n = e->name;
    const bool clash = n == entry->name ||
                       (histogram && (n == entry->name + "_bucket" ||
                                      n == entry->name + "_sum" ||
                                      n == entry->name + "_count")) ||
                       (e->histogram && (entry->name == n + "_bucket" ||
                                         entry->name == n + "_sum" ||
                                         entry->name == n + "_count"));
    if (clash) {
      Die(fmt::format("metric {} is registered twice (or clashes with {})",
                      entry->name, n));
    }
  }
  entries_.push_back(std::move(entry));
}

CounterFamily* MetricsRegistry::AddCounter(
    std::string name, std::string help, std::vector<std::string> label_names) {
  if (!name.ends_with("_total")) {
    Die(fmt::format("counter {}: the name must end in _total", name));
  }
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->counter.reset(new CounterFamily(std::move(name), std::move(help),
                                     std::move(label_names)));
  CounterFamily* f = e->counter.get();
  AddEntry(std::move(e));
  // Unlabelled series exist (at 0) from the start.
  if (f->label_names().empty()) f->Get();
  return f;
}

GaugeFamily* MetricsRegistry::AddGauge(std::string name, std::string help,
                                       std::vector<std::string> label_names) {
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->gauge.reset(new GaugeFamily(std::move(name), std::move(help),
                                 std::move(label_names)));
  GaugeFamily* f = e->gauge.get();
  AddEntry(std::move(e));
  if (f->label_names().empty()) f->Get();
  return f;
}

HistogramFamily* MetricsRegistry::AddHistogram(
    std::string name, std::string help, std::vector<double> bounds,
    std::vector<std::string> label_names) {
  CheckBounds(name, bounds);
  auto e = std::make_unique<Entry>();
  e->name = name;
  e->histogram.reset(new HistogramFamily(std::move(name), std::move(help),
                                         std::move(label_names),
                                         std::move(bounds)));
  HistogramFamily* f = e->histogram.get();
  AddEntry(std::move(e));
  if (f->label_names().empty()) f->Get();
  return f;
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock l(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string MetricsRegistry::Render() const {
  absl::MutexLock render(&render_mu_);
  std::vector<std::function<void()>> collectors;
  std::vector<const Entry*> entries;
  {
    absl::MutexLock l(&mu_);
    collectors = collectors_;
    for (const auto& e : entries_) entries.push_back(e.get());
  }
  for (const auto& collect : collectors) collect();
  std::string out;
  for (const Entry* e : entries) {
    if (e->counter) e->counter->Render("counter", &out);
    if (e->gauge) e->gauge->Render("gauge", &out);
    if (e->histogram) e->histogram->Render("histogram", &out);
  }
  return out;
}

}  // namespace ckptd::daemon
