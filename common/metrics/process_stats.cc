// Reads /proc/self for the process_* metrics; see process_stats.h.
#include "common/metrics/process_stats.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace tripod::metrics {
namespace {

bool ReadWholeFile(const char* path, std::string* out) {
  std::ifstream in(path);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

// Seconds since the epoch at which the machine booted (/proc/stat's btime line).
double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("btime ", 0) == 0) return std::strtod(line.c_str() + 6, nullptr);
  }
  return kUnknown;
}

void ReadStat(ProcessStats* s) {
  std::string stat;
  if (!ReadWholeFile("/proc/self/stat", &stat)) return;
  // Field 2 (comm) is in parentheses and may itself hold spaces and parentheses: the fields that
  // matter are counted from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return;
  std::istringstream rest(stat.substr(close + 1));
  std::vector<std::string> fields;  // fields[0] is field 3 (state)
  for (std::string f; rest >> f;) fields.push_back(f);
  constexpr size_t kUtime = 14 - 3, kStime = 15 - 3, kStartTime = 22 - 3;
  if (fields.size() <= kStartTime) return;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  if (ticks <= 0) return;
  s->cpu_seconds = (std::strtod(fields[kUtime].c_str(), nullptr) +
                    std::strtod(fields[kStime].c_str(), nullptr)) /
                   ticks;
  const double boot = BootTimeSeconds();
  if (!std::isnan(boot))
    s->start_time_seconds = boot + std::strtod(fields[kStartTime].c_str(), nullptr) / ticks;
}

void ReadStatm(ProcessStats* s) {
  std::ifstream in("/proc/self/statm");
  double size_pages = 0, resident_pages = 0;
  if (!(in >> size_pages >> resident_pages)) return;
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  s->virtual_memory_bytes = size_pages * page;
  s->resident_memory_bytes = resident_pages * page;
}

void CountFds(ProcessStats* s) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return;
  const std::string own = std::to_string(dirfd(dir));
  double n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.' || own == e->d_name) continue;
    ++n;
  }
  closedir(dir);
  s->open_fds = n;
}

void ReadFdLimit(ProcessStats* s) {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0) return;
  s->max_fds = lim.rlim_cur == RLIM_INFINITY ? std::numeric_limits<double>::infinity()
                                             : static_cast<double>(lim.rlim_cur);
}

}  // namespace

ProcessStats ReadProcessStats() {
  ProcessStats s;
  ReadStat(&s);
  ReadStatm(&s);
  CountFds(&s);
  ReadFdLimit(&s);
  return s;
}

}  // namespace tripod::metrics
