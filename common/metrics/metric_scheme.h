// What the three processes' metrics share (docs/workers.md, "Metrics"): every series carries a
// `role` label (scheduler, prefill, decode, draft), and a name's histograms use one bucket layout
// in every role, so that a dashboard compares them across processes.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/metrics/metrics.h"

namespace tripod::metrics {

// {{"role", role}} with one more label after it.
Labels RoleWith(const Labels& role, const std::string& name, const std::string& value);

// An outcome label: "ok", "cancelled", "invalid_argument", ...: the status code's name in lower
// case.
std::string StatusLabel(const absl::Status& status);

// Request latencies (seconds): vLLM's buckets, wider at the top for CPU prefill.
std::vector<double> LatencyBuckets();
// Gaps between two tokens of a request (seconds).
std::vector<double> TokenGapBuckets();

}  // namespace tripod::metrics
