// PrefillEngine::Create on the backend the options name, and FullModelWeightBytes: the parts that
// make a backend by name (and so link every backend); see prefill_engine.h.
#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/make_backend.h"
#include "common/model/bundled_model.h"
#include "common/util/status_macros.h"
#include "prefill_node/prefill_engine.h"

namespace tripod {

absl::StatusOr<std::unique_ptr<PrefillEngine>> PrefillEngine::Create(
    const PrefillOptions& options) {
  ASSIGN_OR_RETURN(MadeBackend made, MakeBackend(options.backend, options.precision));
  return Create(options, std::move(made.backend), made.default_kv);
}

absl::StatusOr<size_t> FullModelWeightBytes(const std::string& model_path,
                                            const std::string& precision) {
  ASSIGN_OR_RETURN(CpuBackendOptions cpu, CpuOptionsForPrecision(precision));
  std::unique_ptr<Backend> backend = MakeCpuBackend(cpu);
  ASSIGN_OR_RETURN(std::unique_ptr<LoadedModel> m,
                   LoadModel(model_path.empty() ? BundledModelPath() : model_path, *backend));
  return m->resident_weight_bytes();
}

}  // namespace tripod
