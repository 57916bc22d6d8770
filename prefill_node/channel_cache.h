// ChannelCache: one gRPC channel per decode worker address (and the name its certificate is
// checked against), made on first use and kept, so that
// transfers to the same worker share its connection (and its TCP window, already opened).
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "common/util/mutex.h"
#include "grpcpp/grpcpp.h"

namespace tripod {

class ChannelCache {
 public:
  // The channel to `address` (host:port) checked under `tls_name`: NewWorkerChannel's, made
  // once. Thread-safe.
  std::shared_ptr<grpc::Channel> Get(const std::string& address, const std::string& tls_name = "");

 private:
  Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tripod
