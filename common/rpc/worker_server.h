// What every worker's main does alike to stand up its gRPC server: parse listen addresses, set
// the server's channel limits to match the workers' clients (protocol.h), and tell whoever
// started it which ports the kernel picked (--port_file), so that tests and local clusters can
// ask for port 0 and never collide.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "tripod/v1/common.pb.h"

namespace tripod {

struct HostPort {
  std::string host;
  int port = 0;
};

// "host:port" or "[v6]:port"; port 0..65535 (0: any free port). `flag` names the flag in errors.
absl::StatusOr<HostPort> ParseHostPort(const std::string& flag, const std::string& text);

// Message limits for 1 MiB KV chunks plus headers, and keepalive pings from peers every
// kWorkerKeepaliveTimeMs (WorkerChannelArguments) accepted, with or without calls in flight;
// pings more often than kWorkerMinRecvPingIntervalMs are strikes (protocol.h).
void ConfigureWorkerServer(grpc::ServerBuilder& builder);

// Writes {"grpc_port":N,"http_port":M} to `path` atomically (a temporary file renamed): a reader
// sees no file or the whole of it.
absl::Status WritePortFile(const std::string& path, int grpc_port, int http_port);

// The body of GET /health: the Health message in protobuf's JSON mapping, every field present,
// the proto's field names (64-bit integers are strings there).
std::string HealthJson(const v1::HealthResponse& health);

}  // namespace tripod
