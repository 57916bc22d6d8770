// The forward the decode worker's tests compare against: a fresh model on its own fp32,
// batch-invariant CPU backend (the decode engine's kernels for fp32), the full plan and a
// contiguous f32 cache, one forward over a token sequence. What a prefill worker would compute,
// and what teacher forcing through the engine must give.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/compute/cpu/cpu_backend.h"
#include "common/compute/forward.h"
#include "common/compute/model.h"
#include "common/kv/contiguous_kv_cache.h"
#include "common/kv/kv_snapshot.h"
#include "tests/unit/test_model.h"

namespace tripod {

struct ReferenceForward {
  std::unique_ptr<ContiguousKvCache> kv;  // positions 0 .. n - 1
  std::vector<float> logits;              // the asked rows, vocab_size floats each
  int vocab_size = 0;

  std::span<const float> row(size_t i) const {
    return {logits.data() + i * vocab_size, static_cast<size_t>(vocab_size)};
  }
};

// One forward over ids[0 .. n - 1]; logits for logit_rows (none by default). Failures are test
// failures (and an empty result).
inline ReferenceForward RunReferenceForward(const std::vector<int32_t>& ids, int n,
                                            const std::vector<int32_t>& logit_rows = {}) {
  CpuBackendOptions o = *CpuOptionsForPrecision("fp32");
  o.batch_invariant = true;
  o.prepack_at_load = false;
  auto backend = MakeCpuBackend(o);
  auto model = LoadModel(TestModelPath(), *backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  const ModelConfig& c = (*model)->config;
  auto kv = ContiguousKvCache::Create({c.n_layers, c.n_kv_heads, c.head_dim, KvDtype::kF32}, 1, n);
  EXPECT_TRUE(kv.ok()) << kv.status();
  if (!kv.ok()) return {};
  ForwardWorkspace ws(*backend);
  StepBatch batch;
  batch.AddSequence(0, ids.data(), n, 0, 0, false);
  batch.logit_rows = logit_rows;
  ReferenceForward out;
  out.vocab_size = c.vocab_size;
  EXPECT_TRUE(Forward(**model, *backend, ForwardPlan::Full(c.n_layers), batch, **kv, ws,
                      logit_rows.empty() ? nullptr : &out.logits)
                  .ok());
  out.kv = *std::move(kv);
  return out;
}

// The KV of prompt tokens 0 .. n - 2 as a snapshot, as a prefill worker sends it (the last prompt
// token is the decode side's first step).
inline KvSnapshot ReferencePrefillSnapshot(const std::vector<int32_t>& prompt) {
  const int n = static_cast<int>(prompt.size()) - 1;
  ReferenceForward f = RunReferenceForward(prompt, n);
  if (f.kv == nullptr) return {};
  auto snap = ExportSnapshot(*f.kv, 0, n);
  EXPECT_TRUE(snap.ok()) << snap.status();
  if (!snap.ok()) return {};
  snap->token_ids.assign(prompt.begin(), prompt.end() - 1);
  snap->plan_key = ForwardPlan::Full(snap->layout.n_layers).KvKey();
  return *std::move(snap);
}

}  // namespace tripod
