#!/usr/bin/env python3
"""The C++ forward pass against the independent NumPy reference (numpy_forward.py).

First the reference checks itself (it must be right before it can judge anything):
  * its greedy answer to "What is the capital of France?" names Paris;
  * float32 and float64 runs agree (rel L2 < 1e-4, same top-1);
  * real text is likely under it (mean NLL bound), and much less likely with the wrong RoPE
    pairing, so the adjacent-pair convention for Llama GGUFs is confirmed, not assumed.
Then, for six prompts of 16..512 tokens, the last position's logits of `tripod logits`:
  * fp32: rel L2 <= 1e-3 against the float64 reference, and the same top-1;
  * reduced precision (auto, and bf16 where the CPU has it): rel L2 <= 3e-2; int8 printed;
  * the opt-in q8_0 KV cache (with auto): rel L2 <= 1e-1, a bar that catches a broken kernel
    or codec (those give ~1) but not the codec's own loss (~1e-2..5e-2 here).
Run with --self-check-only to run the first part alone (no TRIPOD_BIN needed).
"""

import sys
import time

import ref_harness as H  # sets BLAS threads before numpy loads

import numpy as np

import numpy_forward
import prompts
import ref_tokenizer

FP32_MAX_REL = 1e-3
BF16_MAX_REL = 3e-2
Q8KV_MAX_REL = 1e-1


def self_check(model, model_path):
  tok_eos = {ref_tokenizer.token_id(model_path, "<|im_end|>"),
             ref_tokenizer.token_id(model_path, "<|endoftext|>")}
  france = ref_tokenizer.encode(model_path, prompts.FRANCE)
  t0 = time.time()
  out = model.greedy(france, 24, eos=tok_eos)
  text = ref_tokenizer.decode(model_path, out)
  print(f"reference greedy answer ({time.time() - t0:.1f}s): {text!r}")
  print(f"  ids: {out}")
  assert "Paris" in text, f"reference greedy answer does not name Paris: {text!r}"

  m32 = model.cast(np.float32)
  for name, ids in prompts.reference_prompts(model_path)[:3]:
    l64 = model.logits(ids)
    l32 = m32.logits(ids)
    err = H.rel_l2(l32, l64)
    print(f"reference float32 vs float64, {name} ({len(ids)} tokens): rel L2 {err:.2e}")
    assert err < 1e-4, f"reference float32 vs float64 rel L2 {err:.2e} >= 1e-4 on {name}"
    assert np.argmax(l32) == np.argmax(l64), f"reference float32/float64 top-1 differ on {name}"

  text_ids = ref_tokenizer.encode(model_path, prompts.LIGHTHOUSE)
  nll = model.mean_nll(text_ids)
  wrong = model.with_config(rope_neox=not model.config.rope_neox).mean_nll(text_ids)
  print(f"reference mean NLL on prose: {nll:.3f} nats (ppl {np.exp(nll):.1f}); "
        f"with the other RoPE pairing: {wrong:.3f} nats (ppl {np.exp(wrong):.1f})")
  assert nll < 4.5, f"reference mean NLL {nll:.3f} nats is implausibly high for English prose"
  assert wrong > nll + 0.8, "the RoPE pairing makes no clear difference: check the reference"


def compare_with_cpp(model, model_path):
  vocab = model.config.vocab
  rows = []
  failures = []
  cases = [(name, ids, None) for name, ids in prompts.reference_prompts(model_path)]
  # The chunked prefill path of `logits` too, on one mid-sized prompt.
  name, ids = cases[2][0], cases[2][1]
  cases.append((name, ids, 7))
  ref_cache = {}
  # Reduced-precision paths: "auto" (the default: bf16 GEMMs where the CPU has them, f16 KV)
  # and "bf16" where the CPU can run it (elsewhere the CLI refuses it and the table says so)
  # must pass; so must "auto" prefilled 3 tokens at a time, which runs every matrix through
  # the decode-sized GEMVs (int16 activations below 4 rows), and "int16" itself. "int8"
  # (int8-activation GEMVs, run in chunks of 16 so that they do the work) is an opt-in speed
  # path that does not meet the bar on this model (rel L2 1-4e-2): its column is printed for
  # the record and not asserted, and it is not the default.
  # Columns: (label, precision, chunk, KV cache type); label -> bar where asserted.
  reduced = [("auto", "auto", None, None), ("auto chunk 3", "auto", 3, None),
             ("int16", "int16", 3, None), ("int8", "int8", 16, None),
             ("bf16", "bf16", None, None), ("auto+q8_0 kv", "auto", None, "q8_0")]
  asserted = {"auto": BF16_MAX_REL, "auto chunk 3": BF16_MAX_REL, "int16": BF16_MAX_REL,
              "bf16": BF16_MAX_REL, "auto+q8_0 kv": Q8KV_MAX_REL}
  unsupported = {}
  for name, ids, chunk in cases:
    key = tuple(ids)
    if key not in ref_cache:
      ref_cache[key] = model.logits(ids)
    ref = ref_cache[key]
    fp32 = H.cpp_logits(ids, "fp32", vocab, chunk=chunk)
    e32 = H.rel_l2(fp32, ref)
    top_ref = int(np.argmax(ref))
    top32 = int(np.argmax(fp32))
    label = name if chunk is None else f"{name} chunk {chunk}"
    if not e32 <= FP32_MAX_REL:
      failures.append(f"{label}: fp32 rel L2 {e32:.2e} > {FP32_MAX_REL}")
    if top32 != top_ref:
      failures.append(f"{label}: fp32 top-1 {top32} != reference {top_ref}")
    row = [label, len(ids), f"{e32:.2e}", "yes" if top32 == top_ref else "NO"]
    for column, precision, own_chunk, kv in reduced:
      if precision in unsupported:
        row.append("n/a")
        continue
      try:
        logits = H.cpp_logits(ids, precision, vocab, chunk=own_chunk or chunk, kv=kv)
      except H.Unsupported as e:
        if precision != "bf16":
          raise
        unsupported[precision] = str(e)
        row.append("n/a")
        continue
      err = H.rel_l2(logits, ref)
      top = "" if int(np.argmax(logits)) == top_ref else " (top1 differs)"
      row.append(f"{err:.2e}{top}")
      if column in asserted and not err <= asserted[column]:
        failures.append(f"{label}: {column} rel L2 {err:.2e} > {asserted[column]}")
    rows.append(tuple(row))
  H.print_table(("prompt", "tokens", "fp32 rel L2", "fp32 top1") +
                tuple(f"{c} rel L2" for c, _, _, _ in reduced), rows)
  for precision, why in unsupported.items():
    print(f"NOTE: {precision} not checked, this CPU cannot run it: {why}")
  assert not failures, "; ".join(failures)


def main():
  self_only = "--self-check-only" in sys.argv[1:]
  model_path = H.model_path()
  if not self_only:
    H.tripod_bin()  # fail early and clearly when the binary is missing
  t0 = time.time()
  model = numpy_forward.ReferenceModel(model_path, np.float64)
  print(f"reference model loaded in {time.time() - t0:.1f}s: {model.config}")
  self_check(model, model_path)
  if not self_only:
    compare_with_cpp(model, model_path)


if __name__ == "__main__":
  H.main_wrapper(main)
