#!/usr/bin/env python3
"""bf16 against fp32 in the C++ forward pass, teacher-forced over >= 10,000 tokens of real text.

Text: Debian's license texts from /usr/share/common-licenses (GPL-3, Apache-2.0, MPL-2.0,
LGPL-2.1; package base-files), tokenized with the GGUF's own vocabulary through Hugging Face
`tokenizers`, cut into 5 windows of 2048 tokens. For every position of every window, `tripod
logits --all` in both precisions; the top-1 tokens must agree at >= 99% of positions. The fp32
path's mean NLL of the text is checked too, so that two equally broken paths cannot agree.
"""

import time

import ref_harness as H  # sets BLAS threads before numpy loads

import numpy as np

import prompts
import ref_tokenizer

WINDOWS = 5
WINDOW = 2048
MIN_AGREEMENT = 0.99
MAX_FP32_NLL = 3.5  # nats/token; the reference gives 2.65..2.98 per window, chance is 10.8


def mean_nll(logits, targets):
  """Mean -log p(target) over rows, computed in blocks of float64."""
  total = 0.0
  for s in range(0, len(targets), 256):
    block = logits[s:s + 256].astype(np.float64)
    m = block.max(axis=-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(block - m).sum(axis=-1))
    total += float(np.sum(lse - block[np.arange(len(block)), targets[s:s + 256]]))
  return total / len(targets)


def main():
  H.tripod_bin()
  model = H.model_path()
  ids = prompts.corpus_ids(model, WINDOWS * WINDOW + 1)
  vocab = len(ref_tokenizer.load(model)[1]["tokens"])
  H.cpp_logits(ids[:8], "bf16", vocab)  # skips the test at once if this CPU has no bf16 path
  rows = []
  agree_total = 0
  positions = 0
  nll32_sum = 0.0
  nll16_sum = 0.0
  for w in range(WINDOWS):
    window = ids[w * WINDOW:(w + 1) * WINDOW]
    targets = np.asarray(ids[w * WINDOW + 1:(w + 1) * WINDOW + 1])
    t0 = time.time()
    fp32 = H.cpp_logits(window, "fp32", vocab, all_positions=True)
    top32 = fp32.argmax(axis=-1)
    nll32 = mean_nll(fp32, targets)
    del fp32
    bf16 = H.cpp_logits(window, "bf16", vocab, all_positions=True)
    top16 = bf16.argmax(axis=-1)
    nll16 = mean_nll(bf16, targets)
    del bf16
    agree = int(np.sum(top32 == top16))
    agree_total += agree
    positions += WINDOW
    nll32_sum += nll32 * WINDOW
    nll16_sum += nll16 * WINDOW
    rows.append((f"{w * WINDOW}..{(w + 1) * WINDOW - 1}", WINDOW, agree,
                 f"{agree / WINDOW:.4f}", f"{nll32:.3f}", f"{nll16:.3f}",
                 f"{time.time() - t0:.1f}"))
  rate = agree_total / positions
  rows.append(("all", positions, agree_total, f"{rate:.4f}", f"{nll32_sum / positions:.3f}",
               f"{nll16_sum / positions:.3f}", ""))
  print(f"text: {', '.join(prompts.CORPUS_FILES)} from {prompts.LICENSE_DIR}")
  H.print_table(("window", "positions", "top1 agree", "rate", "fp32 NLL", "bf16 NLL", "s"), rows)
  print(f"bf16 vs fp32 top-1 agreement: {rate * 100:.2f}% of {positions} positions")
  assert rate >= MIN_AGREEMENT, f"bf16/fp32 top-1 agreement {rate:.4f} < {MIN_AGREEMENT}"
  nll32 = nll32_sum / positions
  assert nll32 <= MAX_FP32_NLL, f"fp32 mean NLL {nll32:.3f} > {MAX_FP32_NLL}: logits look wrong"


if __name__ == "__main__":
  H.main_wrapper(main)
