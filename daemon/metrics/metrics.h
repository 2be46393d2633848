// Copyright 2026 The ckptd Authors.
//
// A small metrics registry rendered in the Prometheus text exposition format
// 0.0.4 (https://prometheus.io/docs/instrumenting/exposition_formats/):
// counters, gauges and histograms with fixed buckets, each a family of
// series told apart by label values.
//
//   MetricsRegistry registry;
//   CounterFamily* done = registry.AddCounter(
//       "ckptd_checkpoints_finished_total", "Checkpoints finished.",
//       {"outcome"});
//   done->WithLabels({"committed"})->Increment();
//   std::string text = registry.Render();  // the body of GET /metrics
//
// Gauges whose value lives elsewhere are set at scrape time by a collector
// (AddCollector), which Render() runs first.
//
// Thread-safety: everything is thread-safe. Metric pointers stay valid as
// long as the registry. Updating a series takes no registry-wide lock.
#ifndef CKPTD_DAEMON_METRICS_METRICS_H_
#define CKPTD_DAEMON_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckptd::daemon {

// Label values of one series, in the order of its family's label names.
using LabelValues = std::vector<std::string>;

// A value that only goes up (Prometheus resets are process restarts).
class Counter {
 public:
  // REQUIRES: v >= 0 (a negative or NaN v is ignored).
  void Increment(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down.
class Gauge {
 public:
  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double v) { value_.fetch_add(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into fixed buckets (upper bounds, inclusive), plus
// their sum and count; the +Inf bucket is implicit.
class Histogram {
 public:
  // REQUIRES: `bounds` strictly ascending and finite.
  explicit Histogram(std::vector<double> bounds);

  void Observe(double v);  // NaN is ignored

  struct Snapshot {
    std::vector<double> bounds;        // without +Inf
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 (last: +Inf)
    double sum = 0;
    uint64_t count = 0;
  };
  // A consistent view (count == cumulative.back()).
  Snapshot snapshot() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket + +Inf
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

// The series of one metric name. T: Counter, Gauge or Histogram.
template <typename T>
class MetricFamily {
 public:
  // The series with these label values, created (at zero) on first use.
  // REQUIRES: values.size() == label_names().size() (crashes otherwise:
  // label sets are fixed in the code).
  T* WithLabels(const LabelValues& values);
  // The unlabelled series. REQUIRES: the family has no labels.
  T* Get() { return WithLabels({}); }

  const std::string& name() const { return name_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

 private:
  friend class MetricsRegistry;
  MetricFamily(std::string name, std::string help,
               std::vector<std::string> label_names,
               std::vector<double> bounds = {})
      : name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(label_names)),
        bounds_(std::move(bounds)) {}
  // Appends the family (HELP, TYPE and every series) to `out`.
  void Render(std::string_view type, std::string* out) const;

  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<LabelValues, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

// Owns the families; renders them in registration order.
class MetricsRegistry {
 public:
  MetricsRegistry();
  ~MetricsRegistry();
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // REQUIRES (crashes otherwise: names are fixed in the code): `name` is a
  // valid metric name not registered yet, `label_names` valid label names
  // (no "le" for histograms, none starting with "__"); counters' names end
  // in "_total". The families live as long as the registry.
  CounterFamily* AddCounter(std::string name, std::string help,
                            std::vector<std::string> label_names = {});
  GaugeFamily* AddGauge(std::string name, std::string help,
                        std::vector<std::string> label_names = {});
  // REQUIRES: `bounds` strictly ascending, finite, not empty.
  HistogramFamily* AddHistogram(std::string name, std::string help,
                                std::vector<double> bounds,
                                std::vector<std::string> label_names = {});

  // `collect` runs at the start of every Render() (never concurrently with
  // another collector), to set gauges whose value lives elsewhere.
  void AddCollector(std::function<void()> collect);

  // The text exposition format 0.0.4 of every family.
  std::string Render() const;

 private:
  struct Entry;
  void AddEntry(std::unique_ptr<Entry> entry);

  mutable absl::Mutex render_mu_;  // one Render (and its collectors) at a time
  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Prometheus' rules: [a-zA-Z_:][a-zA-Z0-9_:]* and [a-zA-Z_][a-zA-Z0-9_]*.
bool IsValidMetricName(std::string_view name);
bool IsValidLabelName(std::string_view name);
// A sample value or bucket bound: shortest round-trip decimal, "+Inf",
// "-Inf", "NaN".
std::string FormatMetricValue(double v);
// Escapes a label value (\\, \", \n) and HELP text (\\, \n).
std::string EscapeLabelValue(std::string_view v);
std::string EscapeHelp(std::string_view v);

// Bucket bounds start, start*factor, ... (count of them).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

}  // namespace ckptd::daemon

#endif  // CKPTD_DAEMON_METRICS_METRICS_H_
