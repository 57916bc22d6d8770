#!/usr/bin/env python3
"""The C++ forward pass on the real Qwen2.5-Coder 0.5B file against the float64 NumPy reference.

The reference (numpy_forward.py: weights dequantised by the `gguf` package, Q/K/V biases, NEOX
RoPE, tied or separate output head) first checks itself on this file:
  * its greedy answer to "What is the capital of France?" (the GGUF's chat template, rendered
    by jinja2) names Paris;
  * float32 and float64 runs agree (rel L2 < 1e-4, same top-1) on the shortest prompt;
  * a license text is likely under it (mean NLL bound), and much less likely with the other
    RoPE pairing (NEOX for qwen2 is confirmed, not assumed).
Then five prompts of 16..512 tokens (two chats in the file's own template, prose, a license, a
code question), the last position's logits of `tripod logits`:
  * --precision fp32: rel L2 <= 1e-3 against the reference, same top-1;
  * --precision auto (the default): rel L2 <= 3e-2, same top-1;
  * auto prefilled 3 tokens at a time on the shortest prompt (every matrix through the decode
    GEMVs, whose Q5_0/Q8_0/K-quant kernels are not the prefill's): the same bars.
The file holds Q5_0, Q8_0, Q4_K and Q6_K matrices, so each block type is on the path.

Tier: ctest (label real_model, run by scripts/test), and scripts/check_real_models the same.
Runtime on the 2-core machine with the scalar Q5_0/K-quant kernels of main: 98 s alone, 131 s
beside the other real_model tests (ctest -j2), 260 s while other builds loaded the machine.
About 65 s of it is the reference (float64 load 23 s, self-checks, forwards), which the fast
kernels will not shorten; the 11 C++ runs take 2-4 s each, the chunk-3 run 10 s. Peak memory
8.2 GB (float64 weights, and a float32 copy for the self-check). With main's vector
K-quant/Q5_0 kernels merged in: 77 s alone, each C++ run 1-2 s (fp32 rel L2 4e-7..1e-6, auto
3.2e-3..4.2e-3, chunk 3 4.7e-4).
"""

import argparse
import time

import ref_harness as H  # sets BLAS threads before numpy loads

import numpy as np

import numpy_forward
import prompts
import real_models
import ref_tokenizer

FP32_MAX_REL = 1e-3
AUTO_MAX_REL = 3e-2
MAX_LICENSE_NLL = 2.0  # nats/token on the Apache license; chance is ln(151936) = 11.9

CODE = '''def merge_intervals(intervals):
    """Merge overlapping [start, end] intervals and return them sorted."""
    intervals = sorted(intervals, key=lambda iv: iv[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
'''


def render_chat(model_path, messages):
  template = ref_tokenizer.load(model_path)[1]["chat_template"]
  import jinja2.sandbox
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  return env.from_string(template).render(messages=messages, add_generation_prompt=True)


def real_prompts(model_path):
  """[(name, ids)]: five prompts of 16..512 tokens, shortest first."""
  enc = lambda text: ref_tokenizer.encode(model_path, text)  # noqa: E731
  out = [
      ("chat-france", enc(render_chat(model_path, [
          {"role": "user", "content": "What is the capital of France?"}]))),
      ("lighthouse", enc(prompts.LIGHTHOUSE)),
      ("chat-code", enc(render_chat(model_path, [
          {"role": "system", "content": "You are a careful code reviewer."},
          {"role": "user", "content": "What does this function do, and what is its time "
                                      "complexity?\n\n```python\n" + CODE + "```"}]))),
      ("apache-2.0[:300]", enc(prompts.read_license("Apache-2.0"))[:300]),
      ("gpl-3[:512]", enc(prompts.read_license("GPL-3"))[:512]),
  ]
  for name, ids in out:
    if not 16 <= len(ids) <= 512:
      raise H.TestFailure(f"prompt {name} has {len(ids)} tokens, outside 16..512")
  return out


def nll_of(logits, ids):
  """Mean -log p(ids[i + 1] | ids[:i + 1]) from all positions' logits [n, vocab]."""
  block = np.asarray(logits[:-1], dtype=np.float64)
  m = block.max(axis=-1, keepdims=True)
  lse = m[:, 0] + np.log(np.exp(block - m).sum(axis=-1))
  return float(np.mean(lse - block[np.arange(len(ids) - 1), np.asarray(ids[1:])]))


def self_check(model, model_path, cases):
  """Checks the reference on this file; returns {prompt name: last logits} it computed."""
  eos = {ref_tokenizer.token_id(model_path, "<|im_end|>"),
         ref_tokenizer.token_id(model_path, "<|endoftext|>")}
  t0 = time.time()
  out = model.greedy(cases[0][1], 10, eos=eos)
  text = ref_tokenizer.decode(model_path, out)
  print(f"reference greedy answer ({time.time() - t0:.1f}s): {text!r}", flush=True)
  assert "Paris" in text, f"reference greedy answer does not name Paris: {text!r}"

  name, ids = cases[0]
  m32 = model.cast(np.float32)
  l64, l32 = model.logits(ids), m32.logits(ids)
  del m32
  err = H.rel_l2(l32, l64)
  print(f"reference float32 vs float64, {name} ({len(ids)} tokens): rel L2 {err:.2e}")
  assert err < 1e-4, f"reference float32 vs float64 rel L2 {err:.2e} >= 1e-4"
  assert np.argmax(l32) == np.argmax(l64), "reference float32/float64 top-1 differ"

  # The license text is one the model has seen often: likely under the right model, and much
  # less so with RoPE rotating the wrong pairs (measured: 0.96 against 3.85 nats).
  lic_name, lic = cases[3]
  t0 = time.time()
  all_logits = model.logits(lic, all_positions=True)
  nll = nll_of(all_logits, lic)
  wrong = model.with_config(rope_neox=not model.config.rope_neox).mean_nll(lic)
  print(f"reference mean NLL of {lic_name}: {nll:.3f} nats; with the other RoPE pairing: "
        f"{wrong:.3f} ({time.time() - t0:.1f}s)", flush=True)
  assert nll < MAX_LICENSE_NLL, f"reference mean NLL {nll:.3f} is implausibly high"
  assert wrong > nll + 1.0, "the RoPE pairing makes no clear difference: check the reference"
  return {name: l64, lic_name: all_logits[-1]}


def compare(model, model_path, cases, known):
  vocab = model.config.vocab
  failures, rows = [], []
  # (label, precision, chunk); the chunk-3 run only on the shortest prompt (slow for now).
  modes = [("fp32", "fp32", None, FP32_MAX_REL), ("auto", "auto", None, AUTO_MAX_REL),
           ("auto chunk 3", "auto", 3, AUTO_MAX_REL)]
  for i, (name, ids) in enumerate(cases):
    t0 = time.time()
    ref = known[name] if name in known else model.logits(ids)
    top_ref = int(np.argmax(ref))
    row = [name, len(ids), f"{time.time() - t0:.1f}"]
    for label, precision, chunk, bar in modes:
      if chunk is not None and i != 0:
        row.append("")
        continue
      t0 = time.time()
      got = H.cpp_logits(ids, precision, vocab, chunk=chunk, model=model_path)
      err = H.rel_l2(got, ref)
      top = int(np.argmax(got))
      row.append(f"{err:.2e}{'' if top == top_ref else ' TOP1 ' + str(top)} "
                 f"({time.time() - t0:.0f}s)")
      if not err <= bar:
        failures.append(f"{name}: {label} rel L2 {err:.2e} > {bar}")
      if top != top_ref:
        failures.append(f"{name}: {label} top-1 {top} != reference {top_ref}")
    rows.append(tuple(row))
  H.print_table(("prompt", "tokens", "ref s") + tuple(f"{m[0]} rel L2" for m in modes), rows)
  assert not failures, "; ".join(failures)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", default="qwen05", help="a key of real_models.MODELS")
  args = ap.parse_args()
  model_path = real_models.path(real_models.parse_keys(args.model)[0])
  H.tripod_bin()
  t0 = time.time()
  cases = real_prompts(model_path)
  model = numpy_forward.ReferenceModel(model_path, np.float64)
  print(f"reference model loaded in {time.time() - t0:.1f}s: {model.config}", flush=True)
  known = self_check(model, model_path, cases)
  compare(model, model_path, cases, known)
  print(f"total {time.time() - t0:.0f}s")


if __name__ == "__main__":
  H.main_wrapper(main, allow_skip=False)
