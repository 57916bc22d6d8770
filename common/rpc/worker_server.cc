// Worker server set-up shared by the mains; see worker_server.h.
#include "common/rpc/worker_server.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/protocol.h"
#include "google/protobuf/util/json_util.h"

namespace tripod {

absl::StatusOr<HostPort> ParseHostPort(const std::string& flag, const std::string& s) {
  const size_t colon = s.rfind(':');
  HostPort hp;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(s.substr(colon + 1), &hp.port) || hp.port < 0 || hp.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", s, ": expected host:port (port 0..65535), e.g. 127.0.0.1:0"));
  }
  hp.host = s.substr(0, colon);
  if (hp.host.size() > 2 && hp.host.front() == '[' && hp.host.back() == ']') {
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  }
  return hp;
}

void ConfigureWorkerServer(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(8 << 20);
  builder.SetMaxSendMessageSize(8 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             kWorkerMinRecvPingIntervalMs);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, kWorkerMaxPingStrikes);
}

absl::Status WritePortFile(const std::string& path, int grpc_port, int http_port) {
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << "{\"grpc_port\":" << grpc_port << ",\"http_port\":" << http_port << "}\n";
    f.close();
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot rename ", tmp, " to ", path));
  }
  return absl::OkStatus();
}

std::string HealthJson(const v1::HealthResponse& health) {
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  o.preserve_proto_field_names = true;
  std::string json;
  if (!google::protobuf::util::MessageToJsonString(health, &json, o).ok()) return "{}";
  return json;
}

}  // namespace tripod
