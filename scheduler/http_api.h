// The OpenAI-compatible HTTP API on the scheduler's HTTP port: routes, API keys, and each
// completion's answer (a whole JSON response, or an SSE stream) from the dispatcher's tokens.
//   POST /v1/completions, /v1/chat/completions   (stream or not)
//   GET  /v1/models
//   POST /tokenize, /detokenize                  (as vLLM has them)
//   GET  /health                                  (200 while a decode worker is in routing)
//   GET  /metrics                                 (Prometheus)
// Errors are OpenAI-shaped JSON with their status. A streamed answer's headers go out with its
// first piece, so that an error before the first token still gets its own status; after that an
// error is an SSE error event. A client that hangs up cancels its request on the workers.
#pragma once

#include <memory>
#include <string>

#include "common/http/http_server.h"
#include "common/metrics/metrics.h"
#include "scheduler/api_keys.h"
#include "scheduler/dispatcher.h"
#include "scheduler/served_model.h"

namespace tripod::scheduler {

struct HttpApiConfig {
  const ServedModel* model = nullptr;
  Dispatcher* dispatcher = nullptr;
  const metrics::Registry* registry = nullptr;
  const ApiKeys* keys = nullptr;
};

class HttpApi {
 public:
  explicit HttpApi(HttpApiConfig config) : config_(config) {}

  // The HttpServer's handler.
  void Handle(std::shared_ptr<http::HttpExchange> exchange);

  // The body of GET /health and whether it is 200.
  std::string HealthBody(bool* ready) const;

 private:
  void Completion(std::shared_ptr<http::HttpExchange> exchange, ApiKind kind);
  void Tokenize(const std::shared_ptr<http::HttpExchange>& exchange);
  void Detokenize(const std::shared_ptr<http::HttpExchange>& exchange);

  const HttpApiConfig config_;
};

}  // namespace tripod::scheduler
