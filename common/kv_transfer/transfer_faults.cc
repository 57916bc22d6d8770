// TransferFaultInjector; see transfer_faults.h.
#include "common/kv_transfer/transfer_faults.h"

#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tripod {

absl::StatusOr<TransferFaultRates> ParseTransferFaults(const std::string& spec) {
  TransferFaultRates r;
  if (spec.empty()) return r;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    const std::vector<absl::string_view> kv = absl::StrSplit(part, absl::MaxSplits('=', 1));
    if (kv.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--inject_transfer_faults: '", part, "' is not name=value"));
    }
    const absl::string_view name = kv[0];
    if (name == "drop" || name == "corrupt" || name == "delay") {
      double p;
      if (!absl::SimpleAtod(kv[1], &p) || !(p >= 0 && p <= 1)) {
        return absl::InvalidArgumentError(absl::StrCat("--inject_transfer_faults: ", name,
                                                       " must be a probability in [0, 1], not '",
                                                       kv[1], "'"));
      }
      (name == "drop" ? r.drop : name == "corrupt" ? r.corrupt : r.delay) = p;
    } else if (name == "delay_ms") {
      if (!absl::SimpleAtoi(kv[1], &r.delay_ms) || r.delay_ms < 0 || r.delay_ms > 60000) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--inject_transfer_faults: delay_ms must be in [0, 60000], not '", kv[1], "'"));
      }
    } else if (name == "seed") {
      if (!absl::SimpleAtoi(kv[1], &r.seed)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--inject_transfer_faults: seed must be an integer, not '", kv[1], "'"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("--inject_transfer_faults: unknown '", name,
                                                     "' (drop, corrupt, delay, delay_ms, seed)"));
    }
  }
  if (r.drop + r.corrupt + r.delay > 1) {
    return absl::InvalidArgumentError(
        "--inject_transfer_faults: drop + corrupt + delay must not exceed 1");
  }
  return r;
}

const char* ChunkFaultName(ChunkFault f) {
  switch (f) {
    case ChunkFault::kDrop:
      return "drop";
    case ChunkFault::kCorrupt:
      return "corrupt";
    case ChunkFault::kDelay:
      return "delay";
    default:
      return "none";
  }
}

TransferFaultInjector::TransferFaultInjector(const TransferFaultRates& rates) : rates_(rates) {
  MutexLock lock(&mu_);
  rng_.seed(rates.seed != 0 ? rates.seed
                            : static_cast<uint64_t>(
                                  std::chrono::steady_clock::now().time_since_epoch().count()));
}

ChunkFault TransferFaultInjector::Draw() {
  double u;
  {
    MutexLock lock(&mu_);
    u = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  }
  ChunkFault f = ChunkFault::kNone;
  if (u < rates_.drop) {
    f = ChunkFault::kDrop;
  } else if (u < rates_.drop + rates_.corrupt) {
    f = ChunkFault::kCorrupt;
  } else if (u < rates_.drop + rates_.corrupt + rates_.delay) {
    f = ChunkFault::kDelay;
  }
  counts_[static_cast<int>(f)].fetch_add(1);
  return f;
}

void TransferFaultInjector::Corrupt(std::string* payload) {
  if (payload->empty()) {
    payload->push_back('\x5a');
    return;
  }
  size_t at;
  {
    MutexLock lock(&mu_);
    at = std::uniform_int_distribution<size_t>(0, payload->size() - 1)(rng_);
  }
  (*payload)[at] = static_cast<char>((*payload)[at] ^ 0x01);
}

}  // namespace tripod
