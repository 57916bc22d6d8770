// tripod-scheduler's own flags (beside the shared ones of common/rpc/worker_process.h), checked
// and turned into the options of its parts: the worker registry, the dispatcher, the HTTP API.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/http/http_server.h"
#include "scheduler/admission_gate.h"
#include "scheduler/dispatcher.h"
#include "scheduler/worker_registry.h"

namespace tripod::scheduler {

struct SchedulerFlags {
  WorkerRegistryOptions registry;  // but model_sha256, which comes from the model
  DispatcherOptions dispatcher;
  http::HttpServerOptions http;
  int api_threads = 2;
  AdmissionLimits admission;  // on the requests waiting for or on the API threads
  std::string api_key, api_key_file;
  std::string served_model_name;  // --served_model_name as given
  std::string chat_template;
  int64_t max_model_len = 0;  // 0: the model's context length (checked against it by the caller)
};

// INVALID_ARGUMENT names the flag whose value is wrong.
absl::StatusOr<SchedulerFlags> SchedulerFlagsFromCommandLine();

}  // namespace tripod::scheduler
