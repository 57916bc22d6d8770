#include "scheduler/router.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"

namespace tripod::scheduler {

int WorkerLoad(const Worker& worker) {
  const v1::HealthResponse h = worker.last_health();
  const int reported = h.running() + h.queued() + h.reservations();
  return std::max(reported, worker.inflight());
}

std::shared_ptr<Worker> PickDecode(const std::vector<std::shared_ptr<Worker>>& workers,
                                   int prompt_tokens, uint64_t rotation, const Worker* exclude) {
  std::shared_ptr<Worker> best, roomiest;
  int best_load = std::numeric_limits<int>::max();
  int best_free = -1, most_free = -1;
  const size_t n = workers.size();
  for (size_t k = 0; k < n; ++k) {
    const std::shared_ptr<Worker>& w = workers[(k + rotation) % n];
    if (w.get() == exclude) continue;
    const v1::HealthResponse h = w->last_health();
    const int free_blocks = h.free_kv_blocks();
    const int need =
        h.block_tokens() > 0 ? (prompt_tokens + h.block_tokens() - 1) / h.block_tokens() : 0;
    if (free_blocks > most_free) {
      most_free = free_blocks;
      roomiest = w;
    }
    if (free_blocks < need) continue;
    const int load = WorkerLoad(*w);
    if (load < best_load || (load == best_load && free_blocks > best_free)) {
      best = w;
      best_load = load;
      best_free = free_blocks;
    }
  }
  return best != nullptr ? best : roomiest;
}

bool CanRunPlan(const v1::HealthResponse& health, const std::string& pop_ratio) {
  if (pop_ratio.empty() || health.full_weights()) return true;
  double num = 0, den = 1;
  const size_t slash = pop_ratio.find('/');
  if (!absl::SimpleAtod(pop_ratio.substr(0, slash), &num)) return false;
  if (slash != std::string::npos && !absl::SimpleAtod(pop_ratio.substr(slash + 1), &den)) {
    return false;
  }
  if (!(den > 0) || !(num >= 0)) return false;
  const int n_layers = health.model().n_layers();
  // PopConfig's rule: floor(L * r), forgiving decimal rounding; at least one layer kept.
  const int k = std::min(n_layers - 1, static_cast<int>(std::floor(n_layers * (num / den) + 1e-9)));
  if (k != health.skipped_layers_size()) return false;
  for (int i = 0; i < k; ++i) {
    if (health.skipped_layers(i) != n_layers - k + i) return false;
  }
  return true;
}

std::shared_ptr<Worker> PickDraft(const std::vector<std::shared_ptr<Worker>>& workers,
                                  uint64_t rotation) {
  return PickPrefill(workers, nullptr, "", rotation);  // the least loaded, any plan
}

std::shared_ptr<Worker> PickPrefill(const std::vector<std::shared_ptr<Worker>>& workers,
                                    const Worker* exclude, const std::string& pop_ratio,
                                    uint64_t rotation) {
  std::shared_ptr<Worker> best;
  int best_load = std::numeric_limits<int>::max();
  const size_t n = workers.size();
  for (size_t k = 0; k < n; ++k) {
    const std::shared_ptr<Worker>& w = workers[(k + rotation) % n];
    if (w.get() == exclude || !CanRunPlan(w->last_health(), pop_ratio)) continue;
    const int load = WorkerLoad(*w);
    if (load < best_load) {
      best = w;
      best_load = load;
    }
  }
  return best;
}

}  // namespace tripod::scheduler
