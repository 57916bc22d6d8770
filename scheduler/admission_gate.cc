#include "scheduler/admission_gate.h"

namespace tripod::scheduler {

AdmissionTicket::~AdmissionTicket() {
  if (gate_ == nullptr) return;
  gate_->bytes.fetch_sub(static_cast<int64_t>(bytes_), std::memory_order_relaxed);
  gate_->requests.fetch_sub(1, std::memory_order_relaxed);
}

std::optional<AdmissionTicket> Admit(AdmissionGate& gate, size_t bytes, AdmissionRefusal* refusal) {
  const auto size = static_cast<int64_t>(bytes);
  // Reserve first, then check what the reservation made: concurrent callers can never pass a
  // limit together, at the price of a rare refusal while another caller's failed reservation is
  // being undone.
  const int held = gate.requests.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t held_bytes = gate.bytes.fetch_add(size, std::memory_order_relaxed) + size;
  const bool too_many = held > gate.limits.max_requests;
  const bool too_big = held_bytes > static_cast<int64_t>(gate.limits.max_bytes) && held > 1;
  if (!too_many && !too_big) return AdmissionTicket(&gate, bytes);
  gate.bytes.fetch_sub(size, std::memory_order_relaxed);
  gate.requests.fetch_sub(1, std::memory_order_relaxed);
  const AdmissionRefusal why = too_many ? AdmissionRefusal::kRequests : AdmissionRefusal::kBytes;
  (why == AdmissionRefusal::kRequests ? gate.refused_requests : gate.refused_bytes)
      .fetch_add(1, std::memory_order_relaxed);
  if (refusal != nullptr) *refusal = why;
  return std::nullopt;
}

}  // namespace tripod::scheduler
