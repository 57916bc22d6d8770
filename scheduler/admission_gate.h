// A bound on the API requests handed off the HTTP I/O threads and not yet done with: how many,
// and how many body bytes they hold. The I/O threads take a ticket before handing a body to the
// API threads, so that a flood of large bodies is refused at the door (429) instead of piling up
// in memory ahead of tokenizing, where --max_queue does not reach. The ticket gives its share
// back when it is destroyed, on whatever path the request leaves by.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace tripod::scheduler {

struct AdmissionLimits {
  int max_requests = 1;
  // A body larger than this alone is still admitted when nothing else is held, so that no body
  // the HTTP server accepts is refused forever.
  size_t max_bytes = 64 << 20;
};

enum class AdmissionRefusal { kRequests, kBytes };

struct AdmissionGate {
  explicit AdmissionGate(AdmissionLimits l) : limits(l) {}
  const AdmissionLimits limits;
  std::atomic<int> requests{0};  // held now
  std::atomic<int64_t> bytes{0};
  std::atomic<uint64_t> refused_requests{0};  // refusals so far, by the limit that refused
  std::atomic<uint64_t> refused_bytes{0};
};

class AdmissionTicket;

// A ticket for a request of `bytes`, or nullopt (the refusal counted, and said in *refusal if
// given) when it would take the gate past either limit. Thread-safe.
std::optional<AdmissionTicket> Admit(AdmissionGate& gate, size_t bytes,
                                     AdmissionRefusal* refusal = nullptr);

// One admitted request's share of the gate, given back on destruction (move-only).
class AdmissionTicket {
 public:
  AdmissionTicket(AdmissionTicket&& other) noexcept : gate_(other.gate_), bytes_(other.bytes_) {
    other.gate_ = nullptr;
  }
  AdmissionTicket& operator=(AdmissionTicket&&) = delete;
  AdmissionTicket(const AdmissionTicket&) = delete;
  ~AdmissionTicket();

 private:
  friend std::optional<AdmissionTicket> Admit(AdmissionGate& gate, size_t bytes,
                                              AdmissionRefusal* refusal);
  AdmissionTicket(AdmissionGate* gate, size_t bytes) : gate_(gate), bytes_(bytes) {}
  AdmissionGate* gate_;
  size_t bytes_;
};

}  // namespace tripod::scheduler
