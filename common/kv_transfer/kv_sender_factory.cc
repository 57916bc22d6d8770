// PushKvSenders; see kv_sender_factory.h.
#include "common/kv_transfer/kv_sender_factory.h"

#include <utility>

#include "common/kv_transfer/fault_injecting_stream.h"
#include "common/kv_transfer/push_kv_stream.h"

namespace tripod {

std::unique_ptr<KvSender> NewPushKvSender(std::shared_ptr<grpc::Channel> channel,
                                          uint64_t transfer_id, KvSenderOptions options,
                                          std::chrono::system_clock::time_point deadline,
                                          TransferFaultInjector* faults) {
  std::unique_ptr<KvChunkStream> stream =
      std::make_unique<PushKvStream>(std::move(channel), deadline);
  if (faults != nullptr)
    stream = std::make_unique<FaultInjectingStream>(std::move(stream), *faults);
  return std::make_unique<KvSender>(std::move(stream), transfer_id, std::move(options));
}

OpenKvSender PushKvSenders(std::function<std::shared_ptr<grpc::Channel>(
                               const std::string& address, const std::string& tls_name)>
                               channel,
                           const TransferOptions& options) {
  return [channel = std::move(channel), options](const KvSendTarget& t) {
    const std::shared_ptr<grpc::Channel> ch = channel(t.address, t.tls_name);
    KvSenderOptions so;
    so.max_queued_bytes = options.max_queued_bytes;
    so.ack_timeout = options.ack_timeout;
    so.stall_timeout = options.stall_timeout;
    so.peer = t.address;
    // A link (device to device) when this worker's KV is on a device and one is open or opens
    // now (Get never waits for the network).
    if (t.may_link && options.links != nullptr && options.links->enabled() &&
        options.faults == nullptr) {
      so.link = options.links->Get(t.address, ch);
      so.link_timeout = options.link_timeout;
      so.on_link_failed = [links = options.links](const std::shared_ptr<OpenKvLink>& l,
                                                  const absl::Status& why) {
        links->Failed(l, why);
      };
    }
    return NewPushKvSender(ch, t.transfer_id, std::move(so), t.deadline, options.faults.get());
  };
}

}  // namespace tripod
