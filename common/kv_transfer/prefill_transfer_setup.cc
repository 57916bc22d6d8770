#include "common/kv_transfer/prefill_transfer_setup.h"

#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/kv_transfer/kv_link_cache.h"
#include "common/kv_transfer/nccl_kv_link.h"
#include "common/kv_transfer/transfer_faults.h"
#include "common/util/log.h"
#include "common/util/status_macros.h"

namespace tripod {
namespace {

// Fault injection when the flag asks for it, announced loudly and counted per kind.
absl::Status SetUpFaults(const std::string& spec, metrics::Registry& registry,
                         TransferOptions* out) {
  ASSIGN_OR_RETURN(const TransferFaultRates faults, ParseTransferFaults(spec));
  if (!faults.any()) return absl::OkStatus();
  out->faults = std::make_shared<TransferFaultInjector>(faults);
  Logger("kv_transfer")
      .warn(
          "TESTING ONLY: injecting KV transfer faults per chunk: drop {}, corrupt {}, delay {} "
          "({} ms)",
          faults.drop, faults.corrupt, faults.delay, faults.delay_ms);
  for (ChunkFault f : {ChunkFault::kDrop, ChunkFault::kCorrupt, ChunkFault::kDelay}) {
    registry.AddCallbackGauge(
        "tripod:kv_transfer_faults_injected", "KV chunks dropped, corrupted or delayed on purpose",
        {{"role", "prefill"}, {"kind", ChunkFaultName(f)}},
        [injector = out->faults, f] { return static_cast<double>(injector->count(f)); });
  }
  return absl::OkStatus();
}

// The link mode checked against what this worker's KV and build can do.
absl::StatusOr<KvLinkCacheOptions> LinkOptions(const PrefillTransferFlags& flags,
                                               const std::optional<KvMemory>& kv_memory) {
  ASSIGN_OR_RETURN(const KvLinkMode mode, ParseKvLinkMode(flags.kv_link));
  const bool nccl = flags.backend == "cuda" && NcclLinksBuilt();
  if (mode == KvLinkMode::kNccl && !nccl) {
    return absl::InvalidArgumentError("--kv_link=nccl needs --backend cuda and a build with NCCL");
  }
  if (mode == KvLinkMode::kTcp && (!kv_memory || !kv_memory->gather_rows)) {
    return absl::InvalidArgumentError(
        "--kv_link=tcp needs a KV out of the host's memory (--backend cuda or cpu-guarded-kv)");
  }
  if (mode == KvLinkMode::kIpc && (!kv_memory || !kv_memory->open_shared)) {
    return absl::InvalidArgumentError(
        "--kv_link=ipc needs a KV memory other processes share (--backend cuda or "
        "cpu-guarded-kv)");
  }
  KvLinkCacheOptions lo;
  lo.mode = mode;
  lo.nccl = nccl;
  lo.gpu = flags.backend == "cuda";
  lo.open_timeout = lo.io_timeout = absl::Milliseconds(flags.kv_link_timeout_ms);
  return lo;
}

}  // namespace

absl::Status CheckPrefillTransferFlags(const PrefillTransferFlags& flags) {
  if (flags.ack_timeout_ms <= 0 || flags.send_buffer_mb <= 0 || flags.send_stall_ms <= 0) {
    return absl::InvalidArgumentError(
        "--ack_timeout_ms, --send_stall_ms and --send_buffer_mb must be positive");
  }
  if (flags.kv_link_timeout_ms <= 0) {
    return absl::InvalidArgumentError("--kv_link_timeout_ms must be positive");
  }
  RETURN_IF_ERROR(ParseTransferFaults(flags.inject_faults).status());
  return ParseKvLinkMode(flags.kv_link).status();
}

absl::StatusOr<TransferOptions> SetUpPrefillTransfer(const PrefillTransferFlags& flags,
                                                     const std::optional<KvMemory>& kv_memory,
                                                     KvDtype kv_dtype,
                                                     metrics::Registry& registry) {
  RETURN_IF_ERROR(CheckPrefillTransferFlags(flags));
  TransferOptions o;
  o.ack_timeout = std::chrono::milliseconds(flags.ack_timeout_ms);
  o.stall_timeout = std::chrono::milliseconds(flags.send_stall_ms);
  o.max_queued_bytes = size_t{1} * flags.send_buffer_mb << 20;
  RETURN_IF_ERROR(SetUpFaults(flags.inject_faults, registry, &o));
  ASSIGN_OR_RETURN(const KvLinkCacheOptions lo, LinkOptions(flags, kv_memory));
  metrics::Counter* fallbacks = &registry.AddCounter(
      "tripod:kv_link_fallbacks_total",
      "KV transfers that could have taken a KV link (device to device) and sent their payloads "
      "in the PushKv messages: the decode worker offered none, or the link failed",
      {{"role", "prefill"}});
  std::map<std::string, metrics::Counter*> on_link;
  for (const char* kind : {"nccl", "ipc", "tcp"}) {
    on_link[kind] = &registry.AddCounter("tripod:kv_link_transfers_total",
                                         "KV transfers whose payloads took a KV link",
                                         {{"role", "prefill"}, {"kind", kind}});
  }
  o.links = std::make_shared<KvLinkCache>(
      lo, kv_memory ? &*kv_memory : nullptr, kv_dtype,
      [on_link](const char* kind) {
        if (auto it = on_link.find(kind); it != on_link.end()) it->second->Inc();
      },
      [fallbacks](const std::string&) { fallbacks->Inc(); });
  o.link_timeout = lo.io_timeout;
  return o;
}

}  // namespace tripod
