// The OpenAI-compatible HTTP API on the scheduler's HTTP port: routes, API keys, and each
// completion's answer (a whole JSON response, or an SSE stream) from the dispatcher's tokens.
//   POST /v1/completions, /v1/chat/completions   (stream or not)
//   GET  /v1/models
//   POST /tokenize, /detokenize                  (as vLLM has them)
//   GET  /health                                  (200 while a decode worker is in routing; the
//                                                  workers' detail only with a valid API key)
//   GET  /metrics                                 (Prometheus)
// Errors are OpenAI-shaped JSON with their status. A streamed answer's headers go out with its
// first piece, so that an error before the first token still gets its own status; after that an
// error is an SSE error event. A client that hangs up cancels its request on the workers.
// The HTTP I/O threads only route: parsing a body, tokenizing and submitting run on a few threads
// of the API's own (`work_threads`), since a prompt of megabytes takes a second or more to
// encode, and on an I/O thread that second would stall every stream and connection it serves.
// The bodies handed to those threads and not yet done with are bounded in number and bytes
// (AdmissionGate): past either bound the I/O thread answers 429 with Retry-After at once.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "common/http/http_server.h"
#include "common/metrics/metrics.h"
#include "scheduler/admission_gate.h"
#include "scheduler/api_keys.h"
#include "scheduler/dispatcher.h"
#include "scheduler/served_model.h"

namespace tripod::scheduler {

struct HttpApiConfig {
  const ServedModel* model = nullptr;
  Dispatcher* dispatcher = nullptr;
  const metrics::Registry* registry = nullptr;
  const ApiKeys* keys = nullptr;
  int work_threads = 2;       // parse, tokenize and submit completions, /tokenize and /detokenize
  AdmissionLimits admission;  // on the requests handed to those threads
  int retry_after_s = 1;      // the Retry-After of a 429 past those limits
};

class HttpApi {
 public:
  explicit HttpApi(HttpApiConfig config);
  ~HttpApi();  // waits for the requests in hand (stop the HttpServer first)

  // The HttpServer's handler.
  void Handle(std::shared_ptr<http::HttpExchange> exchange);

  // Requests handed to the work threads and not yet done with (parsed, tokenized and submitted,
  // or answered).
  int preparing() const { return admission_.requests.load(std::memory_order_relaxed); }
  // Their bodies' bytes, and the requests refused at the door so far.
  const AdmissionGate& admission() const { return admission_; }

  // The body of GET /health and whether it is 200: the status alone, or with `detail` the
  // model, the request counts and every worker (addresses, errors).
  std::string HealthBody(bool* ready, bool detail = true) const;

 private:
  void TextCompletion(std::shared_ptr<http::HttpExchange> exchange);
  void ChatCompletion(std::shared_ptr<http::HttpExchange> exchange);
  // received_unix_s: when the I/O thread took the request, every answer's `created`.
  void Completion(std::shared_ptr<http::HttpExchange> exchange, ApiKind kind,
                  int64_t received_unix_s);
  void Tokenize(std::shared_ptr<http::HttpExchange> exchange);
  void Detokenize(std::shared_ptr<http::HttpExchange> exchange);
  // Runs fn(exchange) on a work thread, unless the client has gone by then; or answers 429 when
  // the admission limits are reached.
  void OffIo(std::shared_ptr<http::HttpExchange> exchange,
             void (HttpApi::*fn)(std::shared_ptr<http::HttpExchange>));

  const HttpApiConfig config_;
  struct WorkThreads;
  AdmissionGate admission_;
  std::unique_ptr<WorkThreads> work_;  // after admission_: joined before the gate goes
};

}  // namespace tripod::scheduler
