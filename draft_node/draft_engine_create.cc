// DraftEngine::Create on the backend the options name; see draft_engine.h.
#include "common/compute/make_backend.h"
#include "common/util/status_macros.h"
#include "draft_node/draft_engine.h"

namespace tripod {

absl::StatusOr<std::unique_ptr<DraftEngine>> DraftEngine::Create(
    const DraftEngineOptions& options) {
  ASSIGN_OR_RETURN(MadeBackend made, MakeBackend(options.backend, options.precision));
  return Create(options, std::move(made.backend), made.default_kv);
}

}  // namespace tripod
