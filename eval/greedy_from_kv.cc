#include "eval/greedy_from_kv.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/util/status_macros.h"

namespace tripod {

absl::StatusOr<std::vector<int32_t>> GreedyFromKv(DecodeEngine& engine,
                                                  const std::vector<int32_t>& prompt,
                                                  const KvSnapshot& kv, int max_tokens) {
  DecodeRequest req;
  req.prompt = prompt;
  req.max_tokens = max_tokens;
  req.sampling.temperature = 0;
  req.kv = std::make_shared<const KvSnapshot>(kv);
  std::vector<int32_t> ids;
  std::string error;
  req.on_event = [&](const TokenEvent& e) {
    if (e.token >= 0) ids.push_back(e.token);
    if (e.finish == FinishReason::kError || e.finish == FinishReason::kCancelled) {
      error = e.error.empty() ? FinishReasonName(e.finish) : e.error;
    }
  };
  RETURN_IF_ERROR(engine.Submit(std::move(req)).status());
  RETURN_IF_ERROR(engine.RunUntilIdle());
  if (!error.empty()) return absl::InternalError(absl::StrCat("decode: ", error));
  return ids;
}

}  // namespace tripod
