// The forward pass, written once: one loop over layers that branches only on the plan's
// layer modes. Every node (prefill, draft, decode, the CLI) runs models through Forward.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "common/compute/backend.h"
#include "common/compute/model.h"
#include "common/compute/plan.h"
#include "common/compute/step_batch.h"

namespace tripod {

// Activation buffers reused across calls (grown on demand), so that decode steps allocate
// nothing. One per thread of control that calls Forward.
class ForwardWorkspace {
 public:
  explicit ForwardWorkspace(Backend& backend) : backend_(backend) {}
  ~ForwardWorkspace();
  ForwardWorkspace(const ForwardWorkspace&) = delete;
  ForwardWorkspace& operator=(const ForwardWorkspace&) = delete;

  // A buffer of at least `floats`, slot i (slots are independent buffers).
  float* Get(int slot, size_t floats);

 private:
  Backend& backend_;
  std::vector<std::pair<float*, size_t>> buffers_;
};

// Runs `batch` through `model` under `plan`, writing K/V into `kv` and, when the plan has the
// output head, the logits of batch.logit_rows into `logits` ([rows, vocab], host memory).
absl::Status Forward(const LoadedModel& model, Backend& backend, const ForwardPlan& plan,
                     const StepBatch& batch, KvStore& kv, ForwardWorkspace& ws,
                     std::vector<float>* logits);

}  // namespace tripod
