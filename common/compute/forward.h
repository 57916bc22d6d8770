// The forward pass, written once: one loop over layers that branches only on the plan's
// layer modes. Every node (prefill, draft, decode, the CLI) runs models through Forward.
#pragma once

#include <functional>
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

// Told, on the calling thread, that layers [layer_begin, layer_end) of every sequence in the batch
// have their K/V in the store: each layer that writes K/V (kFull, kKvOnly) once, as the forward
// reaches it, and the stacked K/V-only layers once, as one range, after RunKvStack wrote them all.
// The store's K/V of these layers is final for this batch, so a prefill worker can send it while
// the forward goes on (layer-wise transfer). A non-OK status stops the forward, which returns it
// (a cancel between layers).
using KvLayersDone = std::function<absl::Status(int layer_begin, int layer_end)>;

// One sequence's captured attention (ForwardPlan::capture): n_keys = its cache slots after the
// batch; max and sum are [n_layers][n_kv_heads][n_keys] (layers not captured stay 0).
struct CapturedAttention {
  int n_layers = 0;
  int n_kv_heads = 0;
  int n_keys = 0;
  std::vector<float> max, sum;

  const float* max_at(int layer, int head) const {
    return max.data() + (size_t{1} * layer * n_kv_heads + head) * n_keys;
  }
  const float* sum_at(int layer, int head) const {
    return sum.data() + (size_t{1} * layer * n_kv_heads + head) * n_keys;
  }
};

// Runs `batch` through `model` under `plan`, writing K/V into `kv` and, when the plan has the
// output head, the logits of batch.logit_rows into `logits` ([rows, vocab], host memory).
// `on_kv` (may be empty) hears of each layer's K/V as above. When the plan captures attention,
// `captured` (required then) gets one entry per sequence of the batch, in its order.
absl::Status Forward(const LoadedModel& model, Backend& backend, const ForwardPlan& plan,
                     const StepBatch& batch, KvStore& kv, ForwardWorkspace& ws,
                     std::vector<float>* logits, const KvLayersDone& on_kv = {},
                     std::vector<CapturedAttention>* captured = nullptr);

}  // namespace tripod
