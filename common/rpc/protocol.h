// The protocol's version and the glue every service and client shares: the version travels in
// the metadata of every call (a client's ClientContext gets it from NewClientContext; a handler
// checks it first with CheckProtocol), so that workers of different versions fail at the first
// call with a message that says so, never with garbage. Status conversion both ways keeps the
// codes and messages.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"

namespace tripod {

// Bumped on every incompatible change to proto/tripod/v1 or to what a field means.
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr char kProtocolMetadataKey[] = "tripod-protocol-version";

// A client context carrying the protocol version, with a deadline `timeout` from now (zero: none).
std::unique_ptr<grpc::ClientContext> NewClientContext(
    std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// OK when the caller sent this protocol's version; FAILED_PRECONDITION naming both versions
// otherwise (or when it sent none).
grpc::Status CheckProtocol(const grpc::ServerContextBase& context);

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The keepalive of every channel to a worker (the scheduler's and the workers' own), and what a
// worker's server accepts of pings (ConfigureWorkerServer): a ping sooner than the minimum after
// the last one, with no data sent in between, is a strike, and past kWorkerMaxPingStrikes the
// server answers GOAWAY (ENHANCE_YOUR_CALM) and closes the connection, so that a peer cannot
// flood a worker with pings. Our own channels ping at twice the minimum and never strike.
inline constexpr int kWorkerKeepaliveTimeMs = 10000;
inline constexpr int kWorkerKeepaliveTimeoutMs = 5000;
inline constexpr int kWorkerMinRecvPingIntervalMs = 5000;
inline constexpr int kWorkerMaxPingStrikes = 2;  // gRPC's default
static_assert(kWorkerKeepaliveTimeMs >= 2 * kWorkerMinRecvPingIntervalMs,
              "the workers' clients' keepalive would trip their servers' ping strikes");

// Channel arguments for worker-to-worker channels: messages up to 8 MiB (a KV chunk is 1 MiB
// plus its header), keepalive so that a dead peer is noticed.
grpc::ChannelArguments WorkerChannelArguments();
// A channel to a worker, with those arguments and the process's worker-channel credentials
// (mutual TLS once SetWorkerChannelCredentials has set them, tls.h; plaintext otherwise).
// tls_name: the name the worker's certificate is checked against (gRPC's SSL target-name
// override), for an address its certificate cannot name (a pod IP dialled for a Service's name);
// empty: the address itself.
std::shared_ptr<grpc::Channel> NewWorkerChannel(const std::string& address,
                                                const std::string& tls_name = "");

}  // namespace tripod
