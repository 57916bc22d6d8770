// What the process_* metrics report, read from /proc/self (Linux): memory from statm, CPU time
// and start time from stat (start time against /proc/stat's btime), open descriptors by listing
// /proc/self/fd, the descriptor limit from getrlimit. A field that cannot be read is NaN (what
// Prometheus reads as "unknown") rather than failing the scrape that asked for it.
#pragma once

#include <limits>

namespace tripod::metrics {

inline constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();

struct ProcessStats {
  double resident_memory_bytes = kUnknown;
  double virtual_memory_bytes = kUnknown;
  double open_fds = kUnknown;            // not counting the descriptor used to list them
  double max_fds = kUnknown;             // the soft limit (RLIMIT_NOFILE); +Inf when unlimited
  double cpu_seconds = kUnknown;         // user + system
  double start_time_seconds = kUnknown;  // since the Unix epoch
};

ProcessStats ReadProcessStats();

}  // namespace tripod::metrics
