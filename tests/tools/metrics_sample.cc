// Prints the exposition of a registry holding every kind of metric, for the promtool.metrics
// test (`metrics_sample | promtool check metrics`): counters and gauges with and without labels,
// label values and help text that need escaping, histograms, callback gauges and counters, the
// process metrics, and values that format specially (+Inf, NaN, large and small numbers). Names
// follow Prometheus' conventions, so that promtool's lint has nothing to say.
#include <cmath>
#include <cstdio>
#include <limits>

#include "common/metrics/metrics.h"

int main() {
  using tripod::metrics::ExponentialBuckets;
  tripod::metrics::Registry r;

  r.AddCounter("tripod_sample_requests_total", "Requests served, by route.",
               {{"route", "/v1/completions"}, {"code", "200"}})
      .Inc(41);
  r.AddCounter("tripod_sample_requests_total", "Requests served, by route.",
               {{"route", "quote \" backslash \\ newline \n end"}, {"code", "500"}})
      .Inc();
  r.AddCounter("tripod_sample_transferred_bytes_total",
               "Help with a backslash \\ and a\nsecond line.")
      .Inc(1.5e12);

  r.AddGauge("tripod_sample_queue_length", "Requests waiting.").Set(3);
  r.AddGauge("tripod_sample_temperature_celsius", "A gauge that went below zero.", {{"zone", "a"}})
      .Set(-2.25);
  r.AddGauge("tripod_sample_limit_ratio", "Not limited: +Inf.")
      .Set(std::numeric_limits<double>::infinity());
  r.AddGauge("tripod_sample_unknown_ratio", "Not known: NaN.").Set(std::nan(""));
  r.AddGauge("tripod_sample_tiny_seconds", "A small value.").Set(1.25e-9);

  auto& latency = r.AddHistogram("tripod_sample_request_duration_seconds", "Request latency.",
                                 ExponentialBuckets(0.001, 4, 8), {{"stage", "prefill"}});
  for (double v : {0.0005, 0.002, 0.03, 0.03, 0.5, 7.0, 200.0}) latency.Observe(v);
  r.AddHistogram("tripod_sample_request_duration_seconds", "Request latency.",
                 ExponentialBuckets(0.001, 4, 8), {{"stage", "decode"}})
      .Observe(0.01);
  r.AddHistogram("tripod_sample_chunk_size_bytes", "KV chunk sizes.", {1024, 65536, 1048576})
      .Observe(4096);

  r.AddCallbackGauge("tripod_sample_free_kv_blocks", "Free KV blocks.", {{"pool", "main"}},
                     [] { return 128.0; });
  r.AddCallbackCounter("tripod_sample_tokens_generated_total", "Tokens generated.", {},
                       [] { return 123456789.0; });
  r.AddProcessMetrics();

  const std::string text = r.Exposition();
  std::fwrite(text.data(), 1, text.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}
