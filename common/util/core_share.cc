// The share file and the process's place in it; see core_share.h.
#include "common/util/core_share.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/util/mutex.h"

namespace tripod {
namespace {

constexpr uint64_t kMagic = 0x5452504443525331ull;  // "TRPDCRS1"
constexpr int32_t kVersion = 2;

struct Slot {
  int32_t busy;     // a bit per member computing; accessed through std::atomic_ref only
  int32_t backlog;  // a bit per member with work queued; the same
  int32_t n_cpus;
  int32_t cpus[kCoreShareMaxCpusPerSlot];
};

struct ShareFile {
  uint64_t magic;
  int32_t version;
  int32_t n_slots;
  Slot slots[kCoreShareMaxSlots];
};

static_assert(std::atomic_ref<int32_t>::is_always_lock_free,
              "the busy flags are shared between processes: they must be lock-free");

struct Joined {
  ShareFile* file = nullptr;  // mapped for the process's lifetime, never unmapped
  int slot = -1;
  int32_t bit = 1;         // this member's bit of the slot's busy and backlog words
  std::vector<int> order;  // own CPUs first, then the following slots'
  std::vector<int> home;
};

// Written once by JoinCoreShare before any compute thread reads it (start-up), then read-only.
Joined g_joined;
std::atomic<bool> g_in_share{false};

Mutex g_busy_mu;  // makes "count changes" and "flag written" one step
int g_busy_count ABSL_GUARDED_BY(g_busy_mu) = 0;
int g_backlog_count ABSL_GUARDED_BY(g_busy_mu) = 0;

// Counts a process-wide mark up or down (never below zero) and sets or clears this member's bit
// of the slot's `word` when the count leaves or reaches zero.
void CountMark(int& count, bool up, int32_t Slot::*word) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_busy_mu) {
  const int before = count;
  count = std::max(0, count + (up ? 1 : -1));  // an unmatched (false) stays at zero
  if ((before > 0) == (count > 0)) return;
  std::atomic_ref<int32_t> bits(g_joined.file->slots[g_joined.slot].*word);
  if (count > 0) {
    bits.fetch_or(g_joined.bit, std::memory_order_relaxed);
  } else {
    bits.fetch_and(~g_joined.bit, std::memory_order_relaxed);
  }
}

int32_t LoadBusy(Slot& s) {
  return std::atomic_ref<int32_t>(s.busy).load(std::memory_order_relaxed);
}

}  // namespace

absl::Status CreateCoreShare(const std::string& path, const std::vector<std::vector<int>>& slots) {
  if (slots.empty() || slots.size() > static_cast<size_t>(kCoreShareMaxSlots)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a core share holds 1 to ", kCoreShareMaxSlots, " slots, not ", slots.size()));
  }
  auto file = std::make_unique<ShareFile>();
  std::memset(file.get(), 0, sizeof(ShareFile));
  file->magic = kMagic;
  file->version = kVersion;
  file->n_slots = static_cast<int32_t>(slots.size());
  std::set<int> seen;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].empty() || slots[i].size() > static_cast<size_t>(kCoreShareMaxCpusPerSlot)) {
      return absl::InvalidArgumentError(absl::StrCat("core share slot ", i, " has ",
                                                     slots[i].size(), " CPUs (1 to ",
                                                     kCoreShareMaxCpusPerSlot, ")"));
    }
    file->slots[i].n_cpus = static_cast<int32_t>(slots[i].size());
    for (size_t c = 0; c < slots[i].size(); ++c) {
      const int cpu = slots[i][c];
      if (cpu < 0 || cpu >= CPU_SETSIZE || !seen.insert(cpu).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("core share slot ", i, ": CPU ", cpu, " is out of range or in two slots"));
      }
      file->slots[i].cpus[c] = cpu;
    }
  }
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(file.get()), sizeof(ShareFile));
    if (!out) return absl::InternalError(absl::StrCat("cannot write the core share ", tmp));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("rename ", tmp, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status JoinCoreShare(const std::string& path, int slot, int member) {
  if (g_in_share.load()) return absl::FailedPreconditionError("already in a core share");
  if (member < 0 || member >= kCoreShareMaxMembers) {
    return absl::InvalidArgumentError(
        absl::StrCat("core share member ", member, " is not in 0..", kCoreShareMaxMembers - 1));
  }
  const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("core share ", path, ": ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size != static_cast<off_t>(sizeof(ShareFile))) {
    close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("core share ", path, " is not a core share file (size ", st.st_size, ")"));
  }
  void* p = mmap(nullptr, sizeof(ShareFile), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("mmap ", path, ": ", std::strerror(errno)));
  }
  auto* file = static_cast<ShareFile*>(p);
  auto fail = [&](const std::string& why) {
    munmap(p, sizeof(ShareFile));
    return absl::InvalidArgumentError(absl::StrCat("core share ", path, ": ", why));
  };
  if (file->magic != kMagic || file->version != kVersion) return fail("bad magic or version");
  if (file->n_slots < 1 || file->n_slots > kCoreShareMaxSlots) {
    return fail(absl::StrCat(file->n_slots, " slots"));
  }
  if (slot < 0 || slot >= file->n_slots) {
    return fail(absl::StrCat("slot ", slot, " is not one of its ", file->n_slots));
  }
  Joined j;
  j.file = file;
  j.slot = slot;
  j.bit = int32_t{1} << member;
  for (int k = 0; k < file->n_slots; ++k) {
    const Slot& s = file->slots[(slot + k) % file->n_slots];
    if (s.n_cpus < 1 || s.n_cpus > kCoreShareMaxCpusPerSlot) {
      return fail(absl::StrCat("a slot of ", s.n_cpus, " CPUs"));
    }
    for (int c = 0; c < s.n_cpus; ++c) {
      if (s.cpus[c] < 0 || s.cpus[c] >= CPU_SETSIZE) return fail(absl::StrCat("CPU ", s.cpus[c]));
      j.order.push_back(s.cpus[c]);
      if (k == 0) j.home.push_back(s.cpus[c]);
    }
  }
  // A worker restarted after a crash finds its bits set by its predecessor: it is idle, with
  // nothing queued (the slot's other members keep theirs).
  std::atomic_ref<int32_t>(file->slots[slot].busy).fetch_and(~j.bit, std::memory_order_relaxed);
  std::atomic_ref<int32_t>(file->slots[slot].backlog).fetch_and(~j.bit, std::memory_order_relaxed);
  g_joined = std::move(j);
  g_in_share.store(true);
  return absl::OkStatus();
}

bool InCoreShare() { return g_in_share.load(std::memory_order_acquire); }

std::vector<int> CoreShareCpuOrder() { return InCoreShare() ? g_joined.order : std::vector<int>{}; }

std::vector<int> CoreShareHomeCpus() { return InCoreShare() ? g_joined.home : std::vector<int>{}; }

int CoreShareThreads() {
  if (!InCoreShare()) return 0;
  ShareFile& f = *g_joined.file;
  int n = static_cast<int>(g_joined.home.size());
  for (int k = 1; k < f.n_slots; ++k) {
    Slot& s = f.slots[(g_joined.slot + k) % f.n_slots];
    if (LoadBusy(s) != 0) break;
    n += s.n_cpus;
  }
  return n;
}

void SetComputeBusy(bool busy) {
  if (!InCoreShare()) return;
  MutexLock lock(&g_busy_mu);
  CountMark(g_busy_count, busy, &Slot::busy);
}

void SetCoreShareBacklog(bool queued) {
  if (!InCoreShare()) return;
  MutexLock lock(&g_busy_mu);
  CountMark(g_backlog_count, queued, &Slot::backlog);
}

bool CoreShareOthersBacklogged() {
  if (!InCoreShare()) return false;
  ShareFile& f = *g_joined.file;
  for (int k = 1; k < f.n_slots; ++k) {
    Slot& s = f.slots[(g_joined.slot + k) % f.n_slots];
    if (std::atomic_ref<int32_t>(s.backlog).load(std::memory_order_relaxed) != 0) return true;
  }
  return false;
}

ComputeBusy::ComputeBusy() { SetComputeBusy(true); }
ComputeBusy::~ComputeBusy() { SetComputeBusy(false); }

}  // namespace tripod
