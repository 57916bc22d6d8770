#!/usr/bin/env python3
"""Chunked prefill changes nothing: the fp32 path's 64 greedy tokens are the same with the
prompt prefilled at once, in chunks of 7 and of 64, and token by token (chunk 1), for two prompts
(prose continuation and a ChatML request), through `tripod generate --print-ids`.
"""

import ref_harness as H

import prompts
import ref_tokenizer

MAX_TOKENS = 64
CHUNKS = (7, 64, 1)  # compared with one chunk of the whole prompt


def main():
  H.tripod_bin()
  model = H.model_path()
  failures = []
  rows = []
  for name, ids in prompts.chunking_prompts(model):
    # One-shot: the whole prompt as one chunk. A chunk at least as long as the prompt would be
    # the one-shot prefill again, so it is not run twice.
    chunks = [len(ids)] + [c for c in CHUNKS if c < len(ids)]
    outputs = {c: H.cpp_generate(ids, MAX_TOKENS, chunk=c) for c in chunks}
    base = outputs[len(ids)]
    if not base:
      failures.append(f"{name}: no tokens generated")
    if len(base) > MAX_TOKENS:
      failures.append(f"{name}: {len(base)} tokens generated, asked for {MAX_TOKENS}")
    for c in chunks[1:]:
      out = outputs[c]
      same = out == base
      first_diff = next((i for i, (a, b) in enumerate(zip(out, base)) if a != b),
                        None if len(out) == len(base) else min(len(out), len(base)))
      rows.append((name, len(ids), c, len(out), "yes" if same else f"NO (from {first_diff})"))
      if not same:
        failures.append(f"{name}: chunk {c} differs from one-shot prefill at token {first_diff}")
    print(f"{name}: {ref_tokenizer.decode(model, base)!r}")
  H.print_table(("prompt", "prompt tokens", "chunk", "generated", "same as one-shot"), rows)
  assert not failures, "; ".join(failures)


if __name__ == "__main__":
  H.main_wrapper(main)
