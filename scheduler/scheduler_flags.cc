// tripod-scheduler's flags; see scheduler_flags.h.
#include "scheduler/scheduler_flags.h"

#include <chrono>
#include <variant>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/rpc/worker_server.h"
#include "common/util/status_macros.h"
#include "scheduler/choices.h"
#include "scheduler/openai_request.h"

ABSL_FLAG(std::string, served_model_name, "",
          "the name clients use in `model` (default: --model's catalogue name, else the GGUF "
          "file name without .gguf, which stays accepted under another name)");
ABSL_FLAG(int64_t, max_model_len, 0,
          "prompt plus completion tokens a request may use, at most (0: the model's context "
          "length; more than it is an error); longer requests get a 400");
ABSL_FLAG(std::string, chat_template, "", "chatml | llama3 (default: the model's own)");
ABSL_FLAG(std::string, prefill, "", "prefill workers' gRPC addresses, host:port,...");
ABSL_FLAG(std::string, decode, "", "decode workers' gRPC addresses, host:port,...");
ABSL_FLAG(std::string, prefill_dns, "",
          "name:port,... resolved every health interval; every address is a prefill worker (a "
          "Kubernetes headless Service)");
ABSL_FLAG(std::string, decode_dns, "", "the same for decode workers");
ABSL_FLAG(std::string, draft, "",
          "draft workers' gRPC addresses, host:port,... (for tripod.method speckv, specpc, "
          "draftmap)");
ABSL_FLAG(std::string, draft_dns, "", "the same as --prefill_dns for draft workers");
ABSL_FLAG(std::string, tls_server_name, "",
          "mutual TLS: the name every worker's certificate is checked against (and the prefill "
          "workers check the decode workers' against). Default: a worker found through a *_dns "
          "name is checked against that name, one listed by address against its address");
ABSL_FLAG(int64_t, draft_timeout_ms, 30000,
          "a draft worker's Score deadline for every 4096 prompt tokens begun; past it the "
          "request runs without its method");
ABSL_FLAG(int, method_min_tokens, 512,
          "a tripod.budget given as a fraction keeps at least this many prompt tokens: prompts "
          "this short or shorter run without the method (0: no floor; a budget in tokens is "
          "kept as asked)");
ABSL_FLAG(int, speckv_lookahead, 64,
          "SpecKV's draft lookahead tokens at most (also at most the request's max_tokens)");
ABSL_FLAG(
    std::string, pop, "",
    "POP ratio for requests that name none (\"1/3\", \"0\"); empty: the prefill workers' own");
ABSL_FLAG(std::string, api_key, "", "API key clients must send (Authorization: Bearer KEY)");
ABSL_FLAG(std::string, api_key_file, "", "a file of API keys, one per line");
ABSL_FLAG(int, migration_limit, 1,
          "times a request streaming from a decode worker that dies moves to another one, which "
          "continues it from the prompt and the tokens already streamed (0: the stream ends with "
          "an error)");
ABSL_FLAG(int, max_n, 16,
          "choices (n) and candidates (best_of) a request may ask for at most; past it: 400 "
          "(at most 128)");
ABSL_FLAG(int, max_inflight, 256, "requests at the workers at once");
ABSL_FLAG(int, max_queue, 1024, "requests waiting beyond --max_inflight; past this: 429");
ABSL_FLAG(int, direct_prefill_tokens, 32,
          "prompts shorter than this go straight to a decode worker, which prefills them itself");
ABSL_FLAG(int64_t, health_interval_ms, 2000, "how often every worker's Health is called");
ABSL_FLAG(int64_t, health_timeout_ms, 1000, "one Health call's deadline");
ABSL_FLAG(int, unhealthy_after, 2, "failed checks in a row that take a worker out of routing");
ABSL_FLAG(int, io_threads, 1, "HTTP I/O threads");
ABSL_FLAG(int, api_threads, 2,
          "threads that parse, tokenize and submit API requests, off the HTTP I/O threads");
ABSL_FLAG(int, max_preparing, 0,
          "API requests handed to the API threads and not yet submitted or answered, at most "
          "(0: 4 x --api_threads + --max_queue); beyond: 429 before the body is parsed");
ABSL_FLAG(int64_t, max_preparing_bytes, 64 << 20,
          "the bodies of those requests, bytes at most; beyond: 429 before the body is parsed");
ABSL_FLAG(int, max_connections_per_client, 0,
          "open HTTP connections from one client address, at most (0: no limit; behind a proxy "
          "every client shares its address); beyond: 429");
ABSL_FLAG(std::string, http_tls_cert, "",
          "HTTPS on the API: the server's certificate chain (PEM); with --http_tls_key");
ABSL_FLAG(std::string, http_tls_key, "", "HTTPS on the API: --http_tls_cert's private key (PEM)");

namespace tripod::scheduler {
namespace {

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    out.emplace_back(absl::StripAsciiWhitespace(part));
  }
  return out;
}

absl::Status CheckFlags(const WorkerRegistryOptions& ro) {
  for (const auto* list :
       {&ro.prefill, &ro.decode, &ro.draft, &ro.prefill_dns, &ro.decode_dns, &ro.draft_dns}) {
    for (const std::string& a : *list) {
      absl::StatusOr<HostPort> hp = ParseHostPort("worker address", a);
      if (!hp.ok()) return hp.status();
      if (hp->port == 0) return absl::InvalidArgumentError("a worker address needs a port: " + a);
    }
  }
  if (ro.decode.empty() && ro.decode_dns.empty()) {
    return absl::InvalidArgumentError("no decode worker: give --decode or --decode_dns");
  }
  if (absl::GetFlag(FLAGS_max_inflight) < 1) {
    return absl::InvalidArgumentError("--max_inflight must be >= 1");
  }
  if (absl::GetFlag(FLAGS_max_queue) < 0) {
    return absl::InvalidArgumentError("--max_queue must be >= 0");
  }
  if (absl::GetFlag(FLAGS_health_interval_ms) <= 0 || absl::GetFlag(FLAGS_health_timeout_ms) <= 0) {
    return absl::InvalidArgumentError("--health_interval_ms and --health_timeout_ms must be > 0");
  }
  if (absl::GetFlag(FLAGS_unhealthy_after) < 1) {
    return absl::InvalidArgumentError("--unhealthy_after must be >= 1");
  }
  if (absl::GetFlag(FLAGS_max_connections_per_client) < 0) {
    return absl::InvalidArgumentError("--max_connections_per_client must not be negative");
  }
  if (absl::GetFlag(FLAGS_io_threads) < 1) {
    return absl::InvalidArgumentError("--io_threads must be >= 1");
  }
  if (absl::GetFlag(FLAGS_api_threads) < 1) {
    return absl::InvalidArgumentError("--api_threads must be >= 1");
  }
  if (absl::GetFlag(FLAGS_max_preparing) < 0) {
    return absl::InvalidArgumentError("--max_preparing must not be negative");
  }
  if (absl::GetFlag(FLAGS_max_preparing_bytes) <= 0) {
    return absl::InvalidArgumentError("--max_preparing_bytes must be > 0");
  }
  if (absl::GetFlag(FLAGS_draft_timeout_ms) <= 0) {
    return absl::InvalidArgumentError("--draft_timeout_ms must be > 0");
  }
  if (absl::GetFlag(FLAGS_max_n) < 1 || absl::GetFlag(FLAGS_max_n) > kMaxChoicesLimit) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_n must be in [1, ", kMaxChoicesLimit, "]"));
  }
  if (absl::GetFlag(FLAGS_migration_limit) < 0) {
    return absl::InvalidArgumentError("--migration_limit must be >= 0");
  }
  if (absl::GetFlag(FLAGS_method_min_tokens) < 0) {
    return absl::InvalidArgumentError("--method_min_tokens must be >= 0");
  }
  if (absl::GetFlag(FLAGS_speckv_lookahead) < 0) {
    return absl::InvalidArgumentError("--speckv_lookahead must be >= 0");
  }
  if (const std::string pop = absl::GetFlag(FLAGS_pop); !pop.empty()) {
    ApiResult<PopChoice> p = ParsePopChoice(pop);
    const PopChoice* choice = std::get_if<PopChoice>(&p);
    if (choice == nullptr || choice->kind != PopChoice::Kind::kRatio) {
      return absl::InvalidArgumentError("--pop must be a ratio in [0, 1) such as 1/3 or 0.25");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SchedulerFlags> SchedulerFlagsFromCommandLine() {
  SchedulerFlags f;
  WorkerRegistryOptions& ro = f.registry;
  ro.prefill = SplitList(absl::GetFlag(FLAGS_prefill));
  ro.decode = SplitList(absl::GetFlag(FLAGS_decode));
  ro.prefill_dns = SplitList(absl::GetFlag(FLAGS_prefill_dns));
  ro.decode_dns = SplitList(absl::GetFlag(FLAGS_decode_dns));
  ro.draft = SplitList(absl::GetFlag(FLAGS_draft));
  ro.draft_dns = SplitList(absl::GetFlag(FLAGS_draft_dns));
  ro.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  ro.interval = std::chrono::milliseconds(absl::GetFlag(FLAGS_health_interval_ms));
  ro.timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_health_timeout_ms));
  ro.unhealthy_after = absl::GetFlag(FLAGS_unhealthy_after);
  RETURN_IF_ERROR(CheckFlags(ro));
  DispatcherOptions& dopt = f.dispatcher;
  dopt.max_inflight = absl::GetFlag(FLAGS_max_inflight);
  dopt.max_queue = absl::GetFlag(FLAGS_max_queue);
  dopt.direct_prefill_tokens = absl::GetFlag(FLAGS_direct_prefill_tokens);
  dopt.default_pop = absl::GetFlag(FLAGS_pop);
  dopt.draft_timeout = std::chrono::milliseconds(absl::GetFlag(FLAGS_draft_timeout_ms));
  dopt.methods.speckv_lookahead = absl::GetFlag(FLAGS_speckv_lookahead);
  dopt.methods.min_kept = absl::GetFlag(FLAGS_method_min_tokens);
  dopt.migration_limit = absl::GetFlag(FLAGS_migration_limit);
  dopt.max_n = absl::GetFlag(FLAGS_max_n);
  f.http.io_threads = absl::GetFlag(FLAGS_io_threads);
  f.http.max_connections_per_client = absl::GetFlag(FLAGS_max_connections_per_client);
  const std::string tls_cert = absl::GetFlag(FLAGS_http_tls_cert);
  const std::string tls_key = absl::GetFlag(FLAGS_http_tls_key);
  if (tls_cert.empty() != tls_key.empty()) {
    return absl::InvalidArgumentError("HTTPS needs both --http_tls_cert and --http_tls_key");
  }
  if (!tls_cert.empty()) f.http.tls = http::HttpTlsFiles{tls_cert, tls_key};
  f.api_threads = absl::GetFlag(FLAGS_api_threads);
  const int max_preparing = absl::GetFlag(FLAGS_max_preparing);
  f.admission.max_requests = max_preparing > 0 ? max_preparing : 4 * f.api_threads + dopt.max_queue;
  f.admission.max_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_max_preparing_bytes));
  f.api_key = absl::GetFlag(FLAGS_api_key);
  f.api_key_file = absl::GetFlag(FLAGS_api_key_file);
  f.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  f.chat_template = absl::GetFlag(FLAGS_chat_template);
  f.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  return f;
}

}  // namespace tripod::scheduler
