// Mean and standard error of a sample, for the evaluation tools' reports.
#pragma once

#include <cmath>
#include <vector>

namespace tripod {

inline double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

// Standard error of the mean (sample standard deviation / sqrt(n)); 0 below two samples.
inline double StdErr(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double mu = Mean(v);
  double s = 0;
  for (double x : v) s += (x - mu) * (x - mu);
  return std::sqrt(s / (v.size() - 1) / v.size());
}

}  // namespace tripod
