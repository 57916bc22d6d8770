// The shared metric scheme; see metric_scheme.h.
#include "common/metrics/metric_scheme.h"

#include "absl/strings/ascii.h"

namespace tripod::metrics {

std::string StatusLabel(const absl::Status& status) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(status.code()));
}

Labels RoleWith(const Labels& role, const std::string& name, const std::string& value) {
  Labels l = role;
  l.emplace_back(name, value);
  return l;
}

std::vector<double> LatencyBuckets() {
  return {0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75, 1.0,
          2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0};
}

std::vector<double> TokenGapBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15,
          0.2,   0.3,   0.4,  0.5,  0.75, 1.0,  2.5,  5.0, 10.0};
}

}  // namespace tripod::metrics
