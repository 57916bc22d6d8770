// The scheduler's core: admission (a bounded number of requests at the workers, a bounded queue
// behind them, 429 past it) and each request's path through the workers (request_call.h). The
// front ends (HTTP, gRPC) hand it tokenized, validated requests and get tokens and one end back;
// it knows nothing of HTTP or JSON: its errors are absl::Status (request_status.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "common/model/sampler.h"
#include "common/util/mutex.h"
#include "scheduler/completion_events.h"
#include "scheduler/completion_request.h"
#include "scheduler/draft_methods.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/worker_registry.h"

namespace tripod::scheduler {

// A request ready to run: tokenized and checked against the context.
struct PreparedRequest {
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  SamplingParams sampling;
  std::vector<std::string> stop;
  bool include_stop_str = false;        // vLLM's include_stop_str_in_output
  std::vector<int32_t> stop_token_ids;  // sorted, each once (vLLM's)
  int min_tokens = 0;                   // vLLM's
  bool ignore_eos = false;
  std::string output_regex;  // CompletionRequest's: the structured output's; empty: none
  PopChoice pop;
  MethodChoice method;
  int n = 1;  // candidates the decode worker generates (best_of; choices.h)
  // >= 0: the prompt tokens' log-probabilities with this many alternatives (echo + logprobs,
  // prompt_logprobs): the decode worker prefills the whole prompt with the full model.
  int prompt_logprobs = -1;
};

// Called from gRPC's threads, one call at a time per request, in order: tokens, then exactly
// one of on_end / on_error (unless the request was cancelled by its client: then maybe none
// more). The callbacks must not block.
struct RequestCallbacks {
  // With PreparedRequest::prompt_logprobs: the prompt's, in position order, before any token
  // (in one or more calls).
  std::function<void(std::span<const PromptLogprob>)> on_prompt_logprobs;
  std::function<void(const GeneratedToken&)> on_token;
  std::function<void(const CompletionEnd&)> on_end;
  // Why the request failed: a status whose code says whose fault it is (request_status.h).
  std::function<void(const absl::Status&)> on_error;
  // With n > 1 candidates: a choice ended ("stop", "length"), each once, before on_end (whose
  // finish_reason is the last choice's). May be empty.
  std::function<void(int choice, const std::string& finish_reason)> on_choice_end;
};

class Call;

// What a front end holds while its request runs.
class RequestHandle {
 public:
  explicit RequestHandle(std::shared_ptr<Call> call) : call_(std::move(call)) {}
  // The client went away: the request is cancelled on every worker holding it and nothing more
  // is reported. Idempotent, any thread.
  void Cancel();

 private:
  std::shared_ptr<Call> call_;
};

struct DispatcherOptions {
  int max_inflight = 256;  // requests at the workers at once
  int max_queue = 1024;    // waiting behind them; past this: 429
  // Prompts shorter than this go straight to a decode worker, which prefills them itself.
  int direct_prefill_tokens = 32;
  std::string default_pop;     // POP ratio for requests that name none; empty: the workers' own
  std::string pop_on = "1/3";  // what `"pop": "on"` means when --pop is empty
  std::chrono::milliseconds reserve_timeout{10000};
  std::chrono::milliseconds prefill_timeout{600000};
  // A draft worker's Score per 4096 prompt tokens begun (DraftDeadline); past it the request
  // runs without its method.
  std::chrono::milliseconds draft_timeout{30000};
  DraftMethodParams methods;
  // Times a request whose decode worker dies mid-stream moves to another (Dynamo's
  // --migration-limit): the new worker prefills the prompt and the tokens already streamed and
  // continues (greedy output continues exactly; sampling continues with the same parameters).
  int migration_limit = 1;
  int max_n = 16;         // n and best_of at most (choices.h); past it: 400
  int retry_after_s = 1;  // the Retry-After of a 429
};

class Dispatcher {
 public:
  Dispatcher(WorkerRegistry& registry, SchedulerMetrics* metrics, DispatcherOptions options);
  ~Dispatcher();  // Shutdown()

  // Starts the request now, queues it, or refuses it (nullptr, *error set: RESOURCE_EXHAUSTED
  // "server_busy" when the queue is full, UNAVAILABLE when no decode worker is in routing or
  // the scheduler drains).
  std::shared_ptr<RequestHandle> Submit(PreparedRequest request, RequestCallbacks callbacks,
                                        absl::Status* error);

  int running() const;
  int waiting() const;
  // Refuses new requests (503) while those accepted run on; WaitIdle waits (bounded) for them.
  void StartDraining();
  bool draining() const;
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Ends every request (queued ones with 503, running ones cancelled on their workers) and
  // waits (bounded) for their gRPC calls to finish.
  void Shutdown(std::chrono::milliseconds wait);

  const DispatcherOptions& options() const { return options_; }
  WorkerRegistry& registry() { return registry_; }
  SchedulerMetrics* metrics() { return metrics_; }

 private:
  friend class Call;
  // A running call ended (or a queued one was cancelled): admit the next.
  void CallDone(Call* call);
  void CancelQueued(Call* call);

  WorkerRegistry& registry_;
  SchedulerMetrics* metrics_;
  const DispatcherOptions options_;
  mutable Mutex mu_;
  CondVar idle_cv_;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<Call>> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<Call*, std::weak_ptr<Call>> live_ ABSL_GUARDED_BY(mu_);  // running
  bool draining_ ABSL_GUARDED_BY(mu_) = false;
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace tripod::scheduler
