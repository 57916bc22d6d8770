#!/usr/bin/env python3
"""POP prefill's KV against its definition, computed by the independent NumPy reference.

`tripod prefill --precision fp32 --kv-out FILE` prefills a real-text prompt at ratio 1/3 (the
last 10 of SmolLM2's 30 layers skipped) and writes the KV of tokens 0..n-2. In float64 NumPy:
  * kept layers 0..19 run in full; their K/V must match (rel L2 <= 1e-4 per layer: fp32 against
    float64 measures ~1e-6 here, so the bound has ~50x margin and still catches a wrong norm,
    stream, layer or RoPE, which are O(0.1..1));
  * h* is the stream leaving layer 19; each skipped layer l writes K = RoPE(rmsnorm(h*, w_l) W_k,l)
    and V = rmsnorm(h*, w_l) W_v,l (+ biases, K-norm where the model has them): same bound;
  * negative control: the full model's K/V of layers 21..29 (made from a deeper stream) must be
    far from POP's (rel L2 > 10x the bound), so the comparison can tell them apart.
Both the stacked K/V GEMM (default) and one GEMM per skipped layer are checked.
"""

import os
import tempfile

import ref_harness as H  # sets BLAS threads before numpy loads

import numpy as np

import numpy_forward
import prompts

MAX_REL = 1e-4
N_TOKENS = 96
CHUNK = 32  # several chunks: the engine's chunked prefill is part of what is checked


def cpp_prefill_kv(ids, config, stack):
  with tempfile.TemporaryDirectory(prefix="tripod_pop_") as tmp:
    out = os.path.join(tmp, "kv.bin")
    H._run(["prefill", "--model", H.model_path(), "--ids", H._ids_arg(ids), "--precision", "fp32",
            "--chunk", CHUNK, "--compare-full=false", f"--pop-stack-kv={str(stack).lower()}",
            "--kv-out", out], f"tripod prefill (stack {stack})")
    data = np.fromfile(out, dtype="<f4")
  c = config
  shape = (c.n_layer, c.n_head_kv, len(ids) - 1, c.head_dim)
  if data.size != 2 * np.prod(shape):
    raise H.TestFailure(f"tripod prefill wrote {data.size} floats, expected {2 * np.prod(shape)}")
  k, v = data.reshape((2,) + shape)
  return k, v


def layer_kv(model, layer, x):
  """K (RoPE applied) and V of one layer from the stream x: [n_kv_heads, n, head_dim] each."""
  c = model.config
  n = x.shape[0]
  u = model._rms_norm(x, layer["attn_norm"])
  k = u @ layer["attn_k"].T
  v = u @ layer["attn_v"].T
  if layer["attn_k.bias"] is not None:
    k = k + layer["attn_k.bias"]
  if layer["attn_v.bias"] is not None:
    v = v + layer["attn_v.bias"]
  k = k.reshape(n, c.n_head_kv, c.head_dim)
  if layer["attn_k_norm"] is not None:
    k = model._rms_norm(k, layer["attn_k_norm"])
  k = model._rope(k)
  return k.transpose(1, 0, 2), v.reshape(n, c.n_head_kv, c.head_dim).transpose(1, 0, 2)


def reference(model, ids, n_kept):
  """(POP K, POP V, full-model K, full-model V), each [n_layer, n_kv_heads, n, head_dim]."""
  x = model.token_embd[np.asarray(ids)].astype(model.dtype)
  pop_k, pop_v, full_k, full_v = [], [], [], []
  h_star = None
  for i, layer in enumerate(model.layers):
    if i == n_kept:
      h_star = x
    k, v = layer_kv(model, layer, x)
    full_k.append(k)
    full_v.append(v)
    if i < n_kept:
      pop_k.append(k)
      pop_v.append(v)
    else:
      k, v = layer_kv(model, layer, h_star)
      pop_k.append(k)
      pop_v.append(v)
    x = x + model._attention(model._rms_norm(x, layer["attn_norm"]), layer)
    x = x + model._ffn(model._rms_norm(x, layer["ffn_norm"]), layer)
  return tuple(np.stack(a) for a in (pop_k, pop_v, full_k, full_v))


def main():
  H.tripod_bin()
  path = H.model_path()
  model = numpy_forward.ReferenceModel(path, np.float64)
  c = model.config
  ids = prompts.corpus_ids(path, N_TOKENS)[:N_TOKENS]
  n_skipped = c.n_layer // 3
  n_kept = c.n_layer - n_skipped
  ref_k, ref_v, full_k, full_v = reference(model, ids[:-1], n_kept)
  failures = []
  rows = []
  for stack in (True, False):
    k, v = cpp_prefill_kv(ids, c, stack)
    for l in range(c.n_layer):
      rk, rv = H.rel_l2(k[l], ref_k[l]), H.rel_l2(v[l], ref_v[l])
      control = H.rel_l2(k[l], full_k[l]) if l > n_kept else None
      kind = "kept" if l < n_kept else "skipped"
      rows.append((stack, l, kind, f"{rk:.2e}", f"{rv:.2e}",
                   "-" if control is None else f"{control:.2e}"))
      if not (rk <= MAX_REL and rv <= MAX_REL):
        failures.append(f"stack {stack} layer {l} ({kind}): rel L2 K {rk:.2e} V {rv:.2e}")
      if control is not None and control <= 10 * MAX_REL:
        failures.append(f"stack {stack} layer {l}: POP K within {control:.2e} of the full "
                        "model's, the control cannot tell them apart")
  H.print_table(("stacked", "layer", "kind", "rel L2 K", "rel L2 V", "K vs full model"), rows)
  if failures:
    raise H.TestFailure("; ".join(failures))


if __name__ == "__main__":
  H.main_wrapper(main)
