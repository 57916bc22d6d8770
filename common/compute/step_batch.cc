// StepBatch helpers; see step_batch.h.
#include "common/compute/step_batch.h"

namespace tripod {

void StepBatch::AddSequence(int32_t kv_seq, const int32_t* ids, int n, int32_t pos0, int32_t n_past,
                            bool logits_for_last) {
  SeqInBatch s;
  s.token_begin = n_tokens();
  s.n_tokens = n;
  s.n_past = n_past;
  s.kv_seq = kv_seq;
  for (int i = 0; i < n; ++i) {
    tokens.push_back(ids[i]);
    positions.push_back(pos0 + i);
  }
  if (logits_for_last && n > 0) logit_rows.push_back(s.token_begin + n - 1);
  seqs.push_back(s);
}

}  // namespace tripod
