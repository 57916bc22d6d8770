// libFuzzer target for the scheduler's request bodies: arbitrary bytes (and, more often,
// JSON objects assembled from the fields the API knows with arbitrary values) through
// ParseCompletionBody for both endpoints. Promises checked: no crash or sanitizer report, and
// every body ends as a request or as an OpenAI-style error with a status of 400-499 and a message;
// an accepted request's values lie within the limits the API documents.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <variant>

#include "nlohmann/json.hpp"
#include "scheduler/openai_request.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

const char* const kFields[] = {"model",
                               "prompt",
                               "messages",
                               "max_tokens",
                               "max_completion_tokens",
                               "temperature",
                               "top_p",
                               "top_k",
                               "min_p",
                               "stop",
                               "seed",
                               "stream",
                               "logprobs",
                               "top_logprobs",
                               "n",
                               "echo",
                               "suffix",
                               "logit_bias",
                               "presence_penalty",
                               "frequency_penalty",
                               "user",
                               "ignore_eos",
                               "tripod",
                               "stream_options",
                               "repetition_penalty",
                               "tools",
                               "response_format"};

nlohmann::json Value(FuzzedDataProvider& in, int depth) {
  switch (in.ConsumeIntegralInRange<int>(0, depth > 2 ? 5 : 7)) {
    case 0:
      return nullptr;
    case 1:
      return in.ConsumeBool();
    case 2:
      return in.ConsumeIntegral<int64_t>();
    case 3:
      return in.ConsumeFloatingPoint<double>();
    case 4:
      return in.ConsumeRandomLengthString(64);
    case 5:
      return in.ConsumeIntegralInRange<int>(-3, 300);
    case 6: {
      nlohmann::json a = nlohmann::json::array();
      for (int i = in.ConsumeIntegralInRange<int>(0, 4); i > 0; --i)
        a.push_back(Value(in, depth + 1));
      return a;
    }
    default: {
      nlohmann::json o = nlohmann::json::object();
      for (int i = in.ConsumeIntegralInRange<int>(0, 4); i > 0; --i) {
        const std::string key =
            in.ConsumeBool()
                ? std::string(in.PickValueInArray(
                      {"role", "content", "method", "budget", "pop", "include_usage", "type"}))
                : in.ConsumeRandomLengthString(12);
        o[key] = Value(in, depth + 1);
      }
      return o;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tripod::scheduler;
  FuzzedDataProvider in(data, size);
  const ApiKind kind = in.ConsumeBool() ? ApiKind::kCompletion : ApiKind::kChatCompletion;
  std::string body;
  if (in.ConsumeIntegralInRange<int>(0, 3) == 0) {
    body = in.ConsumeRemainingBytesAsString();
  } else {
    nlohmann::json o = nlohmann::json::object();
    for (int i = in.ConsumeIntegralInRange<int>(0, 10); i > 0; --i) {
      o[in.PickValueInArray(kFields)] = Value(in, 0);
    }
    body = o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  ApiResult<CompletionRequest> r = ParseCompletionBody(body, kind);
  if (const ApiError* e = std::get_if<ApiError>(&r)) {
    Check(e->http_status >= 400 && e->http_status < 500);
    Check(!e->message.empty());
  } else {
    const CompletionRequest& req = std::get<CompletionRequest>(r);
    Check(req.stop.size() <= static_cast<size_t>(kMaxStops));
    for (const std::string& s : req.stop) Check(!s.empty() && s.size() <= size_t{kMaxStopBytes});
    Check(req.sampling.temperature >= 0 && req.sampling.temperature <= kMaxTemperature);
  }
  return 0;
}
