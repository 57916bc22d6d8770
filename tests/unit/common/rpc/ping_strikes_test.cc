// A worker's gRPC server against ping floods: a client that pings far more often than the
// server's minimum interval is sent away (GOAWAY, ENHANCE_YOUR_CALM), while a channel with the
// workers' own keepalive stays connected beside it.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/rpc/protocol.h"
#include "common/rpc/worker_server.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"

namespace tripod {
namespace {

std::chrono::system_clock::time_point In(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

TEST(PingStrikesTest, APingFloodIsSentAwayAndTheWorkersKeepaliveIsNot) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  ConfigureWorkerServer(builder);
  grpc::CallbackGenericService unimplemented;  // a server needs a service; none is called
  builder.RegisterCallbackGenericService(&unimplemented);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", port);

  grpc::ChannelArguments flood;
  flood.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 50);
  flood.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 1000);
  flood.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  flood.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  flood.SetInt(GRPC_ARG_HTTP2_MIN_SENT_PING_INTERVAL_WITHOUT_DATA_MS, 50);
  std::shared_ptr<grpc::Channel> flooder =
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), flood);
  std::shared_ptr<grpc::Channel> ours = grpc::CreateCustomChannel(
      address, grpc::InsecureChannelCredentials(), WorkerChannelArguments());
  ASSERT_TRUE(flooder->WaitForConnected(In(std::chrono::seconds(5))));
  ASSERT_TRUE(ours->WaitForConnected(In(std::chrono::seconds(5))));

  // A few strikes at 50 ms apart: the server closes the connection within a second or so.
  ASSERT_TRUE(flooder->WaitForStateChange(GRPC_CHANNEL_READY, In(std::chrono::seconds(5))))
      << "the server let a ping flood go on";
  EXPECT_NE(flooder->GetState(false), GRPC_CHANNEL_READY);
  EXPECT_EQ(ours->GetState(false), GRPC_CHANNEL_READY);
  server->Shutdown(In(std::chrono::seconds(1)));
}

}  // namespace
}  // namespace tripod
