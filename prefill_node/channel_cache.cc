// ChannelCache; see channel_cache.h.
#include "prefill_node/channel_cache.h"

#include "common/rpc/protocol.h"

namespace tripod {

std::shared_ptr<grpc::Channel> ChannelCache::Get(const std::string& address,
                                                 const std::string& tls_name) {
  MutexLock lock(&mu_);
  // A space is in neither a host:port nor a DNS name.
  std::shared_ptr<grpc::Channel>& ch = channels_[address + " " + tls_name];
  if (ch == nullptr) ch = NewWorkerChannel(address, tls_name);
  return ch;
}

}  // namespace tripod
