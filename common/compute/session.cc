// Session; see session.h.
#include "common/compute/session.h"

#include <unistd.h>

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/compute/make_backend.h"
#include "common/kv/kv_dtype.h"
#include "common/util/status_macros.h"

namespace tripod {

absl::StatusOr<std::unique_ptr<Session>> Session::Open(const SessionOptions& options) {
  std::unique_ptr<Session> s(new Session());
  s->options_ = options;
  ASSIGN_OR_RETURN(MadeBackend made, MakeBackend(options.backend, options.precision));
  s->backend_ = std::move(made.backend);
  const KvDtype default_kv = made.default_kv;
  KvLayout layout;
  ASSIGN_OR_RETURN(layout.dtype, ParseKvDtype(options.kv_cache_dtype, default_kv));
  ASSIGN_OR_RETURN(s->model_,
                   LoadModel(options.model_path.empty() ? BundledModelPath() : options.model_path,
                             *s->backend_));
  const ModelConfig& c = s->model_->config;
  RETURN_IF_ERROR(s->backend_->Supports(c, layout.dtype));
  layout.n_layers = c.n_layers;
  layout.n_kv_heads = c.n_kv_heads;
  layout.head_dim = c.head_dim;
  const int ctx = options.context_tokens > 0 ? options.context_tokens : c.context_length;
  ASSIGN_OR_RETURN(s->kv_,
                   ContiguousKvCache::Create(layout, 1, ctx, s->backend_->DeviceKvMemory()));
  s->ws_ = std::make_unique<ForwardWorkspace>(*s->backend_);
  s->plan_ = ForwardPlan::Full(c.n_layers);
  return s;
}

void Session::Truncate(int n) {
  tokens_.resize(std::clamp(n, 0, static_cast<int>(tokens_.size())));
}

int Session::CommonPrefix(const std::vector<int32_t>& ids) const {
  const size_t limit = std::min(tokens_.size(), ids.empty() ? 0 : ids.size() - 1);
  size_t n = 0;
  while (n < limit && tokens_[n] == ids[n]) ++n;
  return static_cast<int>(n);
}

absl::StatusOr<std::vector<float>> Session::Append(const std::vector<int32_t>& ids,
                                                   bool all_logits) {
  if (ids.empty()) return absl::InvalidArgumentError("nothing to append");
  if (tokens_.size() + ids.size() > static_cast<size_t>(kv_->capacity_tokens())) {
    return absl::OutOfRangeError(absl::StrCat("context full: ", tokens_.size(), " + ", ids.size(),
                                              " tokens exceed ", kv_->capacity_tokens()));
  }
  const int vocab = model_->config.vocab_size;
  const int chunk = std::max(1, options_.prefill_chunk);
  std::vector<float> out, logits;
  if (all_logits) out.reserve(ids.size() * vocab);
  for (size_t begin = 0; begin < ids.size(); begin += chunk) {
    const int n = static_cast<int>(std::min<size_t>(chunk, ids.size() - begin));
    const bool last_chunk = begin + n == ids.size();
    StepBatch batch;
    const int32_t past = static_cast<int32_t>(tokens_.size());
    batch.AddSequence(0, ids.data() + begin, n, past, past, false);
    if (all_logits) {
      for (int i = 0; i < n; ++i) batch.logit_rows.push_back(i);
    } else if (last_chunk) {
      batch.logit_rows.push_back(n - 1);
    }
    RETURN_IF_ERROR(Forward(*model_, *backend_, plan_, batch, *kv_, *ws_, &logits));
    tokens_.insert(tokens_.end(), ids.begin() + begin, ids.begin() + begin + n);
    if (all_logits) {
      out.insert(out.end(), logits.begin(), logits.end());
    } else if (last_chunk) {
      out = logits;
    }
  }
  return out;
}

}  // namespace tripod
