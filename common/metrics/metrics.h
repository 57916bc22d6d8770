// Prometheus metrics: counters, gauges and histograms with labels, and their text exposition
// (format 0.0.4, what `promtool check metrics` and a Prometheus server read). prometheus-cpp is
// not packaged for Debian 12, so this small module is written here. Updates are lock-free
// (atomics); registration and exposition take the registry's lock. Metric objects live as long
// as their registry and never move, so callers keep references.
//
// Misuse is a programming error and aborts with a message: an invalid metric or label name, a
// reserved label (`__*`, `le` on a histogram), a repeated label name, empty help, a name
// registered again under another type, help or bucket layout, a negative counter increment.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/util/mutex.h"

namespace tripod::metrics {

// Label pairs (name, value). Their order does not matter: a series' labels are kept sorted by
// name, and {a,b} and {b,a} name the same series.
using Labels = std::vector<std::pair<std::string, std::string>>;

class Counter {
 public:
  void Inc(double v = 1.0);  // v >= 0
  double value() const;

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double v);
  void Add(double v);
  double value() const;

 private:
  std::atomic<double> value_{0.0};
};

class Histogram {
 public:
  // Ascending finite bounds; +Inf is implied (a trailing +Inf is dropped).
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);  // NaN counts in the +Inf bucket only (and makes the sum NaN)
  // Cumulative counts per bound (+Inf last), sum and count. Each bucket is read atomically;
  // count() is the +Inf bucket's cumulative count, so the two always agree in a scrape.
  std::vector<uint64_t> cumulative_counts() const;
  double sum() const;
  uint64_t count() const;
  const std::vector<double>& upper_bounds() const { return bounds_; }

 private:
  std::vector<double> bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // per bucket (not cumulative), +Inf last
  std::atomic<double> sum_{0.0};
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

  // The text exposition of everything registered, families in registration order, series in
  // the order of their first registration.
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
