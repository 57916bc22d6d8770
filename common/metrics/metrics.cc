// Counters, gauges and histograms, their registry and the text exposition; see metrics.h.
#include "common/metrics/metrics.h"

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/metrics/process_stats.h"
#include "common/util/log.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"

namespace tripod::metrics {

enum class Registry::Kind { kCounter, kGauge, kHistogram };

struct Registry::Series {
  Labels labels;  // sorted by name
  // Exactly one of these is set once registration returns.
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
  std::function<double()> fn;
};

struct Registry::Family {
  std::string name;
  std::string help;
  Kind kind = Kind::kCounter;
  std::vector<double> bounds;  // histograms
  std::vector<std::unique_ptr<Series>> series;
};

namespace {

// Misuse of the API is a bug in the caller, found on its first run; there is no way to report
// it from an Inc() and no sensible way to go on.
[[noreturn]] void Die(const std::string& message) {
  Logger("metrics").critical("{}", message);
  std::abort();
}

bool IsMetricName(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool IsLabelName(std::string_view s) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

const char* KindName(int kind) {
  static const char* const kNames[] = {"counter", "gauge", "histogram"};
  return kNames[kind];
}

// prometheus-cpp 1.0.1's TextSerializer writes help as given: backslash and newline are escaped
// here, as the text format asks.
std::string EscapedHelp(std::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '\\') {
      out.append("\\\\");
    } else if (c == '\n') {
      out.append("\\n");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

prometheus::MetricType PromType(int kind) {
  static const prometheus::MetricType kTypes[] = {prometheus::MetricType::Counter,
                                                  prometheus::MetricType::Gauge,
                                                  prometheus::MetricType::Histogram};
  return kTypes[kind];
}

// The names a family writes lines under: a histogram's three suffixes, or the name itself.
std::vector<std::string> ExposedNames(const std::string& name, bool histogram) {
  if (!histogram) return {name};
  return {name + "_bucket", name + "_sum", name + "_count"};
}

std::string LabelsDebugString(const Labels& labels) {
  return absl::StrCat(
      "{",
      absl::StrJoin(labels, ",",
                    [](std::string* out, const std::pair<std::string, std::string>& l) {
                      absl::StrAppend(out, l.first, "=\"", l.second, "\"");
                    }),
      "}");
}

}  // namespace

void Counter::Inc(double v) {
  if (!(v >= 0)) Die(absl::StrCat("Counter::Inc(", v, "): a counter only goes up"));
  c_.Increment(v);
}

void Gauge::Set(double v) { g_.Set(v == 0 ? 0.0 : v); }  // no "-0" in the exposition

Histogram::Histogram(std::vector<double> upper_bounds) : bounds_(std::move(upper_bounds)) {
  if (!bounds_.empty() && bounds_.back() == std::numeric_limits<double>::infinity()) {
    bounds_.pop_back();
  }
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && !(bounds_[i - 1] < bounds_[i]))) {
      Die(absl::StrCat("histogram bounds [", absl::StrJoin(bounds_, ", "),
                       "] are not finite and strictly ascending (at index ", i, ")"));
    }
  }
  h_ = std::make_unique<prometheus::Histogram>(bounds_);
}

void Histogram::Observe(double v) {
  if (!std::isnan(v)) {
    h_->Observe(v);
    return;
  }
  // prometheus-cpp 1.0.1 files NaN under the first bound (its bucket search compares false); a
  // NaN is above no bound, so it belongs to +Inf alone.
  std::vector<double> increments(bounds_.size() + 1, 0.0);
  increments.back() = 1;
  h_->ObserveMultiple(increments, v);
}

std::vector<uint64_t> Histogram::cumulative_counts() const {
  const prometheus::ClientMetric m = h_->Collect();
  std::vector<uint64_t> out;
  out.reserve(m.histogram.bucket.size());
  for (const prometheus::ClientMetric::Bucket& b : m.histogram.bucket) {
    out.push_back(b.cumulative_count);
  }
  return out;
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  if (!(start > 0) || !(factor > 1) || count < 1) {
    Die(absl::StrCat("ExponentialBuckets(", start, ", ", factor, ", ", count,
                     "): need start > 0, factor > 1, count >= 1"));
  }
  std::vector<double> bounds(count);
  double b = start;
  for (double& out : bounds) {
    out = b;
    b *= factor;
  }
  return bounds;
}

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Family& Registry::GetFamily(const std::string& name, const std::string& help, Kind kind,
                                      const std::vector<double>* bounds) {
  for (const std::unique_ptr<Family>& f : families_) {
    if (f->name != name) continue;
    if (f->kind != kind) {
      Die(absl::StrCat("metric ", name, " is a ", KindName(static_cast<int>(f->kind)),
                       ", registered again as a ", KindName(static_cast<int>(kind))));
    }
    if (f->help != help) {
      Die(absl::StrCat("metric ", name, " registered with two help texts: \"", f->help, "\" and \"",
                       help, "\""));
    }
    if (bounds != nullptr && *bounds != f->bounds) {
      Die(absl::StrCat("histogram ", name, " registered with two bucket layouts: [",
                       absl::StrJoin(f->bounds, ", "), "] and [", absl::StrJoin(*bounds, ", "),
                       "]"));
    }
    return *f;
  }
  if (!IsMetricName(name)) Die(absl::StrCat("invalid metric name \"", name, "\""));
  if (help.empty()) Die(absl::StrCat("metric ", name, " has no help text"));
  // Two families must not write lines under one name (a gauge x_count beside a histogram x).
  for (const std::string& mine : ExposedNames(name, kind == Kind::kHistogram)) {
    for (const std::unique_ptr<Family>& f : families_) {
      for (const std::string& theirs : ExposedNames(f->name, f->kind == Kind::kHistogram)) {
        if (mine == theirs) {
          Die(absl::StrCat("metric ", name, " would write lines named ", mine, ", as metric ",
                           f->name, " does"));
        }
      }
    }
  }
  auto f = std::make_unique<Family>();
  f->name = name;
  f->help = help;
  f->kind = kind;
  if (bounds != nullptr) f->bounds = *bounds;
  families_.push_back(std::move(f));
  return *families_.back();
}

Registry::Series& Registry::GetSeries(Family& family, const Labels& labels) {
  Labels sorted = labels;
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& l = sorted[i].first;
    if (!IsLabelName(l) || l.rfind("__", 0) == 0) {
      Die(absl::StrCat("metric ", family.name, ": invalid label name \"", l, "\""));
    }
    if (family.kind == Kind::kHistogram && l == "le") {
      Die(absl::StrCat("histogram ", family.name, ": the label name le is reserved"));
    }
    if (i > 0 && sorted[i - 1].first == l) {
      Die(absl::StrCat("metric ", family.name, ": label ", l, " given twice"));
    }
  }
  for (const std::unique_ptr<Series>& s : family.series) {
    if (s->labels == sorted) return *s;
  }
  auto s = std::make_unique<Series>();
  s->labels = std::move(sorted);
  family.series.push_back(std::move(s));
  return *family.series.back();
}

Counter& Registry::AddCounter(const std::string& name, const std::string& help,
                              const Labels& labels) {
  MutexLock lock(&mu_);
  Series& s = GetSeries(GetFamily(name, help, Kind::kCounter, nullptr), labels);
  if (s.fn) Die(absl::StrCat(name, LabelsDebugString(labels), " is a callback counter"));
  if (!s.counter) s.counter = std::make_unique<Counter>();
  return *s.counter;
}

Gauge& Registry::AddGauge(const std::string& name, const std::string& help, const Labels& labels) {
  MutexLock lock(&mu_);
  Series& s = GetSeries(GetFamily(name, help, Kind::kGauge, nullptr), labels);
  if (s.fn) Die(absl::StrCat(name, LabelsDebugString(labels), " is a callback gauge"));
  if (!s.gauge) s.gauge = std::make_unique<Gauge>();
  return *s.gauge;
}

Histogram& Registry::AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> upper_bounds, const Labels& labels) {
  // The constructor validates and normalises the bounds (a trailing +Inf dropped) before they
  // are compared with the family's.
  auto h = std::make_unique<Histogram>(std::move(upper_bounds));
  MutexLock lock(&mu_);
  Series& s = GetSeries(GetFamily(name, help, Kind::kHistogram, &h->upper_bounds()), labels);
  if (!s.histogram) s.histogram = std::move(h);
  return *s.histogram;
}

void Registry::AddCallback(const std::string& name, const std::string& help, Kind kind,
                           const Labels& labels, std::function<double()> fn) {
  if (!fn) Die(absl::StrCat("callback metric ", name, " has no function"));
  MutexLock lock(&mu_);
  Series& s = GetSeries(GetFamily(name, help, kind, nullptr), labels);
  if (s.counter || s.gauge) {
    Die(absl::StrCat(name, LabelsDebugString(labels), " is already a plain ",
                     KindName(static_cast<int>(kind)), ", not a callback"));
  }
  s.fn = std::move(fn);
}

void Registry::AddCallbackGauge(const std::string& name, const std::string& help,
                                const Labels& labels, std::function<double()> fn) {
  AddCallback(name, help, Kind::kGauge, labels, std::move(fn));
}

void Registry::AddCallbackCounter(const std::string& name, const std::string& help,
                                  const Labels& labels, std::function<double()> fn) {
  AddCallback(name, help, Kind::kCounter, labels, std::move(fn));
}

void Registry::AddProcessMetrics() {
  // Each reads the whole of ReadProcessStats(): a handful of small /proc reads per scrape.
  struct Entry {
    const char* name;
    const char* help;
    Kind kind;
    double ProcessStats::*field;
  };
  static const Entry kEntries[] = {
      {"process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
       Kind::kCounter, &ProcessStats::cpu_seconds},
      {"process_resident_memory_bytes", "Resident memory size in bytes.", Kind::kGauge,
       &ProcessStats::resident_memory_bytes},
      {"process_virtual_memory_bytes", "Virtual memory size in bytes.", Kind::kGauge,
       &ProcessStats::virtual_memory_bytes},
      {"process_open_fds", "Number of open file descriptors.", Kind::kGauge,
       &ProcessStats::open_fds},
      {"process_max_fds", "Maximum number of open file descriptors.", Kind::kGauge,
       &ProcessStats::max_fds},
      {"process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
       Kind::kGauge, &ProcessStats::start_time_seconds},
  };
  for (const Entry& e : kEntries) {
    AddCallback(e.name, e.help, e.kind, {},
                [field = e.field] { return ReadProcessStats().*field; });
  }
  // glibc's count of the heap bytes handed out and not freed: beside resident memory it tells a
  // leak (this grows) from allocator caching and fragmentation (only resident memory grows).
  AddCallback("process_heap_in_use_bytes", "Heap bytes allocated and not freed (glibc mallinfo2)",
              Kind::kGauge, {}, [] {
                const struct mallinfo2 m = mallinfo2();
                return static_cast<double>(m.uordblks + m.hblkhd);
              });
}

std::string Registry::Exposition() const {
  std::vector<prometheus::MetricFamily> families;
  {
    MutexLock lock(&mu_);
    families.reserve(families_.size());
    for (const std::unique_ptr<Family>& f : families_) {
      prometheus::MetricFamily& out = families.emplace_back();
      out.name = f->name;
      out.help = EscapedHelp(f->help);
      out.type = PromType(static_cast<int>(f->kind));
      for (const std::unique_ptr<Series>& s : f->series) {
        prometheus::ClientMetric m;
        if (s->histogram) {
          m = s->histogram->Collect();
        } else if (s->counter) {
          m = s->counter->Collect();
        } else if (s->gauge) {
          m = s->gauge->Collect();
        } else if (f->kind == Kind::kCounter) {
          m.counter.value = s->fn();
        } else {
          const double v = s->fn();
          m.gauge.value = v == 0 ? 0.0 : v;
        }
        for (const auto& [name, value] : s->labels) m.label.push_back({name, value});
        out.metric.push_back(std::move(m));
      }
    }
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace tripod::metrics
