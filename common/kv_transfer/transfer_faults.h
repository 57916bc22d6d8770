// Test-only fault injection on the KV transfer (the fault campaign of tests/chaos/): the prefill
// worker's senders drop, corrupt or delay data chunks on their way to the decode worker
// (FaultInjectingStream, fault_injecting_stream.h), each with its own probability, so that the
// decode side's checks (sequence numbers, checksums, leases) and the scheduler's retries are
// exercised by real processes. Off unless `tripod-prefill --inject_transfer_faults=...` names a
// rate; a worker that injects says so at start and counts what it did in
// tripod:kv_transfer_faults_injected_total{kind}.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "common/util/mutex.h"

namespace tripod {

struct TransferFaultRates {
  double drop = 0;     // a data chunk is not sent (the decode side sees a gap in the numbers)
  double corrupt = 0;  // one payload byte is flipped (the checksum no longer matches)
  double delay = 0;    // the chunk waits delay_ms before it is written
  int delay_ms = 200;
  uint64_t seed = 0;  // 0: from the clock

  bool any() const { return drop > 0 || corrupt > 0 || delay > 0; }
};

// "drop=0.02,corrupt=0.02,delay=0.05,delay_ms=300,seed=7": each rate in [0, 1] and their sum at
// most 1, delay_ms in [0, 60000]; empty: no faults. Anything else is an error naming the part.
absl::StatusOr<TransferFaultRates> ParseTransferFaults(const std::string& spec);

enum class ChunkFault { kNone = 0, kDrop, kCorrupt, kDelay };
inline constexpr int kChunkFaultKinds = 4;
const char* ChunkFaultName(ChunkFault f);  // "none", "drop", "corrupt", "delay"

// One draw per data chunk; thread-safe (every transfer's sender thread draws from it).
class TransferFaultInjector {
 public:
  explicit TransferFaultInjector(const TransferFaultRates& rates);

  const TransferFaultRates& rates() const { return rates_; }
  // The fault for the next chunk, counted.
  ChunkFault Draw();
  // Applies a drawn kCorrupt to a payload (flips one byte; an empty payload gets one byte).
  void Corrupt(std::string* payload);
  uint64_t count(ChunkFault f) const { return counts_[static_cast<int>(f)].load(); }

 private:
  const TransferFaultRates rates_;
  Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  std::array<std::atomic<uint64_t>, kChunkFaultKinds> counts_{};
};

}  // namespace tripod
