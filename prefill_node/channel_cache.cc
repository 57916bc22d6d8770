// ChannelCache; see channel_cache.h.
#include "prefill_node/channel_cache.h"

#include "common/rpc/protocol.h"

namespace tripod {

std::shared_ptr<grpc::Channel> ChannelCache::Get(const std::string& address) {
  MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel>& ch = channels_[address];
  if (ch == nullptr) ch = NewWorkerChannel(address);
  return ch;
}

}  // namespace tripod
