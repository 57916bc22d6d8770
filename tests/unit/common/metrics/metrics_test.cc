// Tests for common/metrics/metrics: the exposition byte for byte as prometheus-cpp's text writer
// makes it (labels and their escaping, help escaping, histograms, value formatting), registration
// rules and their deaths, callbacks, process metrics, and exact totals under concurrent updates.
#include "common/metrics/metrics.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/metrics/process_stats.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tripod::metrics {
namespace {

using ::testing::HasSubstr;

TEST(MetricsTest, CounterWithoutLabels) {
  Registry r;
  Counter& c = r.AddCounter("tripod_requests_total", "Requests served.");
  c.Inc();
  c.Inc(2);
  EXPECT_EQ(c.value(), 3);
  EXPECT_EQ(r.Exposition(),
            "# HELP tripod_requests_total Requests served.\n"
            "# TYPE tripod_requests_total counter\n"
            "tripod_requests_total 3\n");
}

TEST(MetricsTest, LabelValuesAndHelpAreEscaped) {
  Registry r;
  r.AddGauge("tripod_queue", "Help with a \\ backslash,\na newline and \"quotes\".",
             {{"path", "a\"b\\c\nd"}, {"code", "200"}})
      .Set(1.5);
  // Labels come out sorted by name; help keeps its quotes (only label values escape them).
  EXPECT_EQ(r.Exposition(),
            R"(# HELP tripod_queue Help with a \\ backslash,\na newline and "quotes".
# TYPE tripod_queue gauge
tripod_queue{code="200",path="a\"b\\c\nd"} 1.5
)");
}

TEST(MetricsTest, HistogramIsCumulativeWithInfSumAndCount) {
  Registry r;
  Histogram& h = r.AddHistogram("tripod_latency_seconds", "Latency.", {0.5, 1, 10}, {{"op", "x"}});
  h.Observe(0.25);
  h.Observe(0.5);  // a bound is inclusive: le="0.5"
  h.Observe(5);
  h.Observe(100);
  EXPECT_EQ(h.count(), 4u);
  EXPECT_EQ(h.sum(), 105.75);
  EXPECT_EQ(h.cumulative_counts(), (std::vector<uint64_t>{2, 2, 3, 4}));
  EXPECT_EQ(r.Exposition(),
            R"(# HELP tripod_latency_seconds Latency.
# TYPE tripod_latency_seconds histogram
tripod_latency_seconds_count{op="x"} 4
tripod_latency_seconds_sum{op="x"} 105.75
tripod_latency_seconds_bucket{op="x",le="0.5"} 2
tripod_latency_seconds_bucket{op="x",le="1"} 2
tripod_latency_seconds_bucket{op="x",le="10"} 3
tripod_latency_seconds_bucket{op="x",le="+Inf"} 4
)");
}

TEST(MetricsTest, HistogramWithoutLabelsAndEmpty) {
  Registry r;
  r.AddHistogram("tripod_size_bytes", "Sizes.", {1024, std::numeric_limits<double>::infinity()});
  EXPECT_EQ(r.Exposition(),
            R"(# HELP tripod_size_bytes Sizes.
# TYPE tripod_size_bytes histogram
tripod_size_bytes_count 0
tripod_size_bytes_sum 0
tripod_size_bytes_bucket{le="1024"} 0
tripod_size_bytes_bucket{le="+Inf"} 0
)");
}

TEST(MetricsTest, HistogramNanGoesToInfOnly) {
  Histogram h({1, 2});
  h.Observe(std::nan(""));
  h.Observe(1.5);
  EXPECT_EQ(h.cumulative_counts(), (std::vector<uint64_t>{0, 1, 2}));
  EXPECT_TRUE(std::isnan(h.sum()));
}

TEST(MetricsTest, ValuesFormatAsPrometheusParsesThem) {
  Registry r;
  const std::vector<std::pair<double, std::string>> cases = {
      {std::numeric_limits<double>::infinity(), "+Inf"},
      {-std::numeric_limits<double>::infinity(), "-Inf"},
      {std::nan(""), "Nan"},  // Go's ParseFloat (Prometheus, promtool) takes any case
      {0.0, "0"},
      {-0.0, "0"},
      {123456789.0, "123456789"},
      {-42.0, "-42"},
      {4503599627370496.0, "4503599627370496"},  // 2^52: still a plain integer
      {1e20, "1e+20"},
      {0.1, "0.1"},
      {1e-7, "1e-07"},
      {2.5e-3, "0.0025"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    r.AddGauge("tripod_value", "Values.", {{"i", std::to_string(100 + i)}}).Set(cases[i].first);
  }
  const std::string text = r.Exposition();
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_THAT(text, HasSubstr("tripod_value{i=\"" + std::to_string(100 + i) + "\"} " +
                                cases[i].second + "\n"))
        << "value " << cases[i].first;
  }
}

// prometheus-cpp writes 16 significant digits, one short of what every double needs to read back
// exactly: values come back within a relative 1e-15.
TEST(MetricsTest, NonIntegralValuesRoundTrip) {
  Registry r;
  Gauge& g = r.AddGauge("tripod_g", "A gauge.");
  for (double v : {1.0 / 3, -2.0 / 7, 6.02214076e23, 1e-300, 0.30000000000000004, 9.5e15}) {
    g.Set(v);
    const std::string text = r.Exposition();
    const size_t at = text.rfind(' ');
    ASSERT_NE(at, std::string::npos);
    EXPECT_NEAR(std::strtod(text.c_str() + at + 1, nullptr), v, std::fabs(v) * 1e-15) << text;
  }
}

TEST(MetricsTest, SameNameAndLabelsGiveTheSameObject) {
  Registry r;
  Counter& a = r.AddCounter("tripod_c_total", "C.", {{"x", "1"}, {"y", "2"}});
  Counter& b = r.AddCounter("tripod_c_total", "C.", {{"y", "2"}, {"x", "1"}});
  Counter& other = r.AddCounter("tripod_c_total", "C.", {{"x", "2"}, {"y", "2"}});
  EXPECT_EQ(&a, &b);
  EXPECT_NE(&a, &other);
  a.Inc(5);
  other.Inc(1);
  Histogram& h1 = r.AddHistogram("tripod_h_seconds", "H.", {1, 2});
  Histogram& h2 =
      r.AddHistogram("tripod_h_seconds", "H.", {1, 2, std::numeric_limits<double>::infinity()});
  EXPECT_EQ(&h1, &h2);
  // One HELP/TYPE per family, series in registration order, families in registration order.
  EXPECT_EQ(r.Exposition(),
            R"(# HELP tripod_c_total C.
# TYPE tripod_c_total counter
tripod_c_total{x="1",y="2"} 5
tripod_c_total{x="2",y="2"} 1
# HELP tripod_h_seconds H.
# TYPE tripod_h_seconds histogram
tripod_h_seconds_count 0
tripod_h_seconds_sum 0
tripod_h_seconds_bucket{le="1"} 0
tripod_h_seconds_bucket{le="2"} 0
tripod_h_seconds_bucket{le="+Inf"} 0
)");
}

TEST(MetricsTest, CallbacksAreReadAtScrapeAndCanBeReplaced) {
  Registry r;
  double free_blocks = 7;
  r.AddCallbackGauge("tripod_free_blocks", "Free blocks.", {{"pool", "kv"}},
                     [&free_blocks] { return free_blocks; });
  r.AddCallbackCounter("tripod_tokens_total", "Tokens.", {}, [] { return 12.0; });
  EXPECT_THAT(r.Exposition(), HasSubstr("tripod_free_blocks{pool=\"kv\"} 7\n"));
  free_blocks = 3;
  EXPECT_THAT(r.Exposition(), HasSubstr("tripod_free_blocks{pool=\"kv\"} 3\n"));
  r.AddCallbackGauge("tripod_free_blocks", "Free blocks.", {{"pool", "kv"}}, [] { return 99.0; });
  const std::string text = r.Exposition();
  EXPECT_THAT(text, HasSubstr("tripod_free_blocks{pool=\"kv\"} 99\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE tripod_tokens_total counter\ntripod_tokens_total 12\n"));
  EXPECT_EQ(text.find("tripod_free_blocks{"), text.rfind("tripod_free_blocks{"));  // one series
}

TEST(MetricsTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_EQ(ExponentialBuckets(0.001, 10, 3).size(), 3u);
}

TEST(MetricsTest, ProcessStatsArePlausible) {
  const ProcessStats before = ReadProcessStats();
  EXPECT_GT(before.resident_memory_bytes, 0);
  EXPECT_GE(before.virtual_memory_bytes, before.resident_memory_bytes);
  EXPECT_GE(before.open_fds, 0);
  EXPECT_GT(before.max_fds, 0);
  EXPECT_GE(before.cpu_seconds, 0);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(before.start_time_seconds, now + 2);
  EXPECT_GT(before.start_time_seconds, now - 7 * 24 * 3600);

  // One more descriptor is counted as one more.
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const double with_one_more = ReadProcessStats().open_fds;
  close(fd);
  EXPECT_EQ(with_one_more, ReadProcessStats().open_fds + 1);

  // CPU time burnt shows (the tick is 10 ms; 200 ms burnt must show at least 100).
  timespec t0{}, t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
  volatile double sink = 0;
  do {
    for (int i = 0; i < 100000; ++i) sink = sink + std::sqrt(static_cast<double>(i));
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  } while ((t.tv_sec - t0.tv_sec) + 1e-9 * (t.tv_nsec - t0.tv_nsec) < 0.2);
  EXPECT_GE(ReadProcessStats().cpu_seconds - before.cpu_seconds, 0.1);
}

TEST(MetricsTest, ProcessMetricsAppearOnceEvenWhenAddedTwice) {
  Registry r;
  r.AddProcessMetrics();
  r.AddProcessMetrics();
  const std::string text = r.Exposition();
  for (const char* name :
       {"process_cpu_seconds_total counter", "process_resident_memory_bytes gauge",
        "process_virtual_memory_bytes gauge", "process_open_fds gauge", "process_max_fds gauge",
        "process_start_time_seconds gauge"}) {
    const std::string type_line = std::string("# TYPE ") + name + "\n";
    EXPECT_THAT(text, HasSubstr(type_line));
    EXPECT_EQ(text.find(type_line), text.rfind(type_line)) << name;
  }
  EXPECT_EQ(text.find("NaN"), std::string::npos) << text;
}

// Many threads updating the same objects lose nothing: the totals are exact.
TEST(MetricsTest, ConcurrentUpdatesGiveExactTotals) {
  Registry r;
  constexpr int kThreads = 8, kPerThread = 100000;
  Counter& c = r.AddCounter("tripod_ops_total", "Ops.");
  Gauge& g = r.AddGauge("tripod_level", "Level.");
  Histogram& h = r.AddHistogram("tripod_obs_seconds", "Obs.", {0.5, 1.5});
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        c.Inc();
        g.Add(t % 2 == 0 ? 2 : -1);
        h.Observe(i % 2 == 0 ? 1.0 : 2.0);
        // The same object back from the registry while others update and scrape.
        if (i % 10000 == 0) {
          EXPECT_EQ(&r.AddCounter("tripod_ops_total", "Ops."), &c);
          EXPECT_FALSE(r.Exposition().empty());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.value(), kThreads * kPerThread);
  EXPECT_EQ(g.value(), (kThreads / 2) * kPerThread * 2 - (kThreads / 2) * kPerThread);
  EXPECT_EQ(h.count(), static_cast<uint64_t>(kThreads) * kPerThread);
  EXPECT_EQ(h.cumulative_counts(),
            (std::vector<uint64_t>{0, kThreads * kPerThread / 2, kThreads * kPerThread}));
  EXPECT_EQ(h.sum(), 1.5 * kThreads * kPerThread);
  EXPECT_THAT(r.Exposition(), HasSubstr("tripod_ops_total 800000\n"));
}

// Misuse is a programming error: it dies with a message that names the problem.
class MetricsDeathTest : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(MetricsDeathTest, InvalidNamesDie) {
  Registry r;
  EXPECT_DEATH(r.AddCounter("1starts_with_digit_total", "x"), "invalid metric name");
  EXPECT_DEATH(r.AddCounter("has-dash_total", "x"), "invalid metric name");
  EXPECT_DEATH(r.AddCounter("", "x"), "invalid metric name");
  EXPECT_DEATH(r.AddGauge("tripod_g", "x", {{"a.b", "v"}}), "invalid label name");
  EXPECT_DEATH(r.AddGauge("tripod_g", "x", {{"__reserved", "v"}}), "invalid label name");
  EXPECT_DEATH(r.AddGauge("tripod_g", "x", {{"a", "1"}, {"a", "2"}}), "given twice");
  EXPECT_DEATH(r.AddHistogram("tripod_h", "x", {1}, {{"le", "1"}}), "reserved");
  EXPECT_DEATH(r.AddGauge("tripod_g", ""), "no help");
}

TEST_F(MetricsDeathTest, ConflictingRegistrationsDie) {
  Registry r;
  r.AddCounter("tripod_x_total", "X.");
  r.AddHistogram("tripod_y", "Y.", {1, 2});
  EXPECT_DEATH(r.AddGauge("tripod_x_total", "X."), "is a counter, registered again as a gauge");
  EXPECT_DEATH(r.AddCounter("tripod_x_total", "Other."), "two help texts");
  EXPECT_DEATH(r.AddHistogram("tripod_y", "Y.", {1, 3}), "two bucket layouts");
  EXPECT_DEATH(r.AddGauge("tripod_y_count", "Z."), "would write lines named tripod_y_count");
  EXPECT_DEATH(r.AddCallbackCounter("tripod_x_total", "X.", {}, [] { return 1.0; }),
               "already a plain counter");
}

TEST_F(MetricsDeathTest, BadValuesDie) {
  Registry r;
  Counter& c = r.AddCounter("tripod_x_total", "X.");
  EXPECT_DEATH(c.Inc(-1), "only goes up");
  EXPECT_DEATH(Histogram({2, 1}), "strictly ascending");
  EXPECT_DEATH(Histogram({1, std::nan("")}), "strictly ascending");
  EXPECT_DEATH(ExponentialBuckets(0, 2, 3), "start > 0");
}

}  // namespace
}  // namespace tripod::metrics
