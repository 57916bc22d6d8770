// The prefill worker's real OpenKvSender (kv_sender.h): senders on PushKv streams, with a KV link
// for the payloads where one is open, and test-only fault injection.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/kv_transfer/kv_link_cache.h"
#include "common/kv_transfer/kv_sender.h"
#include "common/kv_transfer/transfer_faults.h"
#include "grpcpp/grpcpp.h"

namespace tripod {

struct TransferOptions {
  size_t max_queued_bytes = size_t{64} << 20;      // encoded KV waiting for the network, at most
  std::chrono::milliseconds ack_timeout{30000};    // end message -> acknowledgement, at most
  std::chrono::milliseconds stall_timeout{10000};  // a full send buffer waited on, at most
  std::shared_ptr<TransferFaultInjector> faults;   // test-only (transfer_faults.h); null: none
  // KV links (device to device) for untrimmed KV; null or disabled: payloads in PushKv messages.
  std::shared_ptr<KvLinkCache> links;
  absl::Duration link_timeout = absl::Seconds(30);  // one payload on a link, at most
};

// The PushKv sender over `channel`, through `faults` when not null (which must outlive it).
std::unique_ptr<KvSender> NewPushKvSender(
    std::shared_ptr<grpc::Channel> channel, uint64_t transfer_id, KvSenderOptions options = {},
    std::chrono::system_clock::time_point deadline = std::chrono::system_clock::time_point::max(),
    TransferFaultInjector* faults = nullptr);

// Senders on the PushKv streams of `channel(address)`'s channels, with a link from
// options.links where one is open to the decode worker (never with fault injection: it tests
// the PushKv path only).
OpenKvSender PushKvSenders(std::function<std::shared_ptr<grpc::Channel>(
                               const std::string& address, const std::string& tls_name)>
                               channel,
                           const TransferOptions& options);

}  // namespace tripod
