// Prometheus metrics: counters, gauges and histograms with labels, and their text exposition
// (format 0.0.4, what `promtool check metrics` and a Prometheus server read). The metric objects,
// their samples and the text writer are prometheus-cpp's (Debian's prometheus-cpp-dev); this module
// keeps what it does not: one registry across the processes' services with registration rules
// that die on misuse, gauges and counters read from callbacks at scrape time, the process
// metrics, and the exposition in registration order. Updates are lock-free (atomics; a histogram
// observation takes its own short lock); registration and exposition take the registry's lock.
// Metric objects live as long as their registry and never move, so callers keep references.
//
// Misuse is a programming error and aborts with a message: an invalid metric or label name, a
// reserved label (`__*`, `le` on a histogram), a repeated label name, empty help, a name
// registered again under another type, help or bucket layout, a negative counter increment.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/util/mutex.h"
#include "prometheus/client_metric.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"

namespace tripod::metrics {

// Label pairs (name, value). Their order does not matter: a series' labels are kept sorted by
// name, and {a,b} and {b,a} name the same series.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(double v = 1.0);  // v >= 0
  double value() const { return c_.Value(); }
  prometheus::ClientMetric Collect() const { return c_.Collect(); }

 private:
  prometheus::Counter c_;
};

class Gauge {
 public:
  void Set(double v);
  void Add(double v) { g_.Increment(v); }
  double value() const { return g_.Value(); }
  prometheus::ClientMetric Collect() const { return g_.Collect(); }

 private:
  prometheus::Gauge g_;
};

class Histogram {
 public:
  // Ascending finite bounds; +Inf is implied (a trailing +Inf is dropped).
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);  // NaN counts in the +Inf bucket only (and makes the sum NaN)
  // Cumulative counts per bound (+Inf last), sum and count, from one consistent read.
  std::vector<uint64_t> cumulative_counts() const;
  double sum() const { return h_->Collect().histogram.sample_sum; }
  uint64_t count() const { return h_->Collect().histogram.sample_count; }
  const std::vector<double>& upper_bounds() const { return bounds_; }
  prometheus::ClientMetric Collect() const { return h_->Collect(); }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<prometheus::Histogram> h_;
};

// Bucket bounds: `count` bounds starting at `start`, each `factor` times the last
// (start > 0, factor > 1, count >= 1).
std::vector<double> ExponentialBuckets(double start, double factor, int count);

class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The same name and labels give the same object. A name is one type and one help text: a
  // second registration of a name under another type dies (a programming error).
  Counter& AddCounter(const std::string& name, const std::string& help, const Labels& labels = {});
  Gauge& AddGauge(const std::string& name, const std::string& help, const Labels& labels = {});
  Histogram& AddHistogram(const std::string& name, const std::string& help,
                          std::vector<double> upper_bounds, const Labels& labels = {});
  // A gauge read at scrape time (queue lengths, free blocks); fn runs under the registry's lock
  // and must be cheap and thread-safe. Registering the same name and labels again replaces fn
  // (a service rebuilt in the same process points the series at its new state).
  void AddCallbackGauge(const std::string& name, const std::string& help, const Labels& labels,
                        std::function<double()> fn);
  // The same for a counter kept elsewhere (fn must never decrease).
  void AddCallbackCounter(const std::string& name, const std::string& help, const Labels& labels,
                          std::function<double()> fn);
  // Adds process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds,
  // process_max_fds, process_cpu_seconds_total and process_start_time_seconds, read from /proc
  // at scrape time (see process_stats.h). Calling it again changes nothing.
  void AddProcessMetrics();

  // The text exposition of everything registered (prometheus-cpp's TextSerializer), families in
  // registration order, series in the order of their first registration.
  std::string Exposition() const;

 private:
  enum class Kind;
  struct Family;
  struct Series;
  // The family `name` (created if new) after checking that it has this type, help and buckets.
  Family& GetFamily(const std::string& name, const std::string& help, Kind kind,
                    const std::vector<double>* bounds) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The series of `labels` in `family`, created empty if new (labels validated and sorted).
  Series& GetSeries(Family& family, const Labels& labels) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddCallback(const std::string& name, const std::string& help, Kind kind,
                   const Labels& labels, std::function<double()> fn);

  mutable Mutex mu_;
  std::vector<std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tripod::metrics
