#!/usr/bin/env python3
"""A self-draft's SpecPC scores against their definition, computed by the independent NumPy
reference (docs/algorithms.md, "SpecPC", steps 1-6).

`tripod draft --precision fp32` runs the first DEPTH of SmolLM2's 30 layers over a real-text
prompt (in chunks, so that the scored window's keys come partly from the cache), and prints per
prompt position s(j) = max over layers l_0..DEPTH-1, query heads and the last W queries i of
i/(W-1) * softmax(q_i . K^T / sqrt(d))_j, and the positions SpecPC keeps for a budget. In float64
NumPy the same s(j) comes from the reference forward's own Q and K:
  * every score within MAX_ABS of the reference (fp32 against float64 measures ~1e-6 here);
  * negative controls: scores from one layer fewer, and from an unweighted window, must each be
    farther than 10 x MAX_ABS from the C++ ones, so the comparison can tell them apart;
  * steps 4-6 (max-pool, seeds and neighbourhoods, the window first and latest first, truncate,
    sort), written here from the description, applied to the C++ scores give exactly the C++ kept
    positions, for several budgets (one below the window); a budget of the whole prompt keeps
    every position.
"""

import json

import ref_harness as H  # sets BLAS threads before numpy loads

import numpy as np

import numpy_forward
import prompts

N_TOKENS = 160
DEPTH = 8
FIRST_LAYER = 4  # the default for a draft under 16 layers: DEPTH // 2
WINDOW = 24
POOL = 7
NEIGHBOURHOOD = 5
CHUNK = 48  # the last forward holds the window; the earlier keys come from the cache
MAX_ABS = 2e-4


def cpp_draft(ids, budget):
  proc = H._run(["draft", "--model", H.model_path(), "--ids", H._ids_arg(ids), "--precision",
                 "fp32", "--draft-layers", DEPTH, "--window", WINDOW, "--budget", budget,
                 "--pool", POOL, "--neighbourhood", NEIGHBOURHOOD, "--chunk", CHUNK],
                f"tripod draft (budget {budget})")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def reference_scores(model, ids, last_layer, weighted=True):
  """s(j) over layers FIRST_LAYER..last_layer-1 of the reference forward."""
  c = model.config
  n = len(ids)
  w = min(WINDOW, n)
  weights = np.arange(w) / (w - 1) if (weighted and w > 1) else np.ones(w)
  group = c.n_head // c.n_head_kv
  scale = 1.0 / np.sqrt(c.head_dim)
  mask = np.triu(np.full((n, n), -np.inf), k=1)[n - w:]
  x = model.token_embd[np.asarray(ids)].astype(model.dtype)
  s = np.zeros(n)
  for l, layer in enumerate(model.layers[:last_layer]):
    if l >= FIRST_LAYER:
      q, k, _ = model._qkv(model._rms_norm(x, layer["attn_norm"]), layer)
      for h in range(c.n_head):
        a = (q[n - w:, h, :] @ k[:, h // group, :].T) * scale + mask  # [w, n]
        a = np.exp(a - a.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        s = np.maximum(s, (weights[:, None] * a).max(axis=0))
    x = x + model._attention(model._rms_norm(x, layer["attn_norm"]), layer)
    x = x + model._ffn(model._rms_norm(x, layer["ffn_norm"]), layer)
  return s


def select(scores, budget):
  """Steps 4-6 of docs/algorithms.md ("SpecPC"), independently of the C++."""
  n = len(scores)
  if budget >= n:
    return list(range(n))
  left = (POOL - 1) // 2
  pooled = [max(scores[max(0, j - left):min(n, j + POOL - left)]) for j in range(n)]
  seeds = sorted(range(n), key=lambda j: (-pooled[j], j))[:budget]
  lo = (NEIGHBOURHOOD - 1) // 2
  hi = NEIGHBOURHOOD - 1 - lo
  order = list(range(n - 1, max(0, n - WINDOW) - 1, -1))  # the window, latest first
  for seed in seeds:
    order.append(seed)
    for d in range(1, max(lo, hi) + 1):
      if d <= lo:
        order.append(max(0, seed - d))
      if d <= hi:
        order.append(min(n - 1, seed + d))
  kept = []
  for j in order:
    if j not in kept:
      kept.append(j)
  return sorted(kept[:budget])


def main():
  H.tripod_bin()
  path = H.model_path()
  model = numpy_forward.ReferenceModel(path, np.float64)
  ids = prompts.corpus_ids(path, N_TOKENS)[:N_TOKENS]
  got = cpp_draft(ids, 40)
  failures = []
  if got["depth"] != DEPTH or got["first_layer"] != FIRST_LAYER:
    failures.append(f"depth {got['depth']} first layer {got['first_layer']}, expected "
                    f"{DEPTH} and {FIRST_LAYER}")
  cpp = np.asarray(got["token_scores"], dtype=np.float64)
  ref = reference_scores(model, ids, DEPTH)
  fewer = reference_scores(model, ids, DEPTH - 1)
  flat = reference_scores(model, ids, DEPTH, weighted=False)
  err = float(np.abs(cpp - ref).max())
  rows = [("reference", f"{err:.2e}", "<=", MAX_ABS)]
  if not err <= MAX_ABS:
    failures.append(f"token scores differ from the reference by up to {err:.2e} > {MAX_ABS}")
  for label, control in (("one layer fewer", fewer), ("unweighted window", flat)):
    d = float(np.abs(cpp - control).max())
    rows.append((label, f"{d:.2e}", ">", 10 * MAX_ABS))
    if not d > 10 * MAX_ABS:
      failures.append(f"control '{label}' within {d:.2e}: the comparison cannot tell it apart")
  for budget in (16, 40, 80, 120, N_TOKENS):  # 16: below the window, which keeps its end
    out = got if budget == 40 else cpp_draft(ids, budget)
    want = select(list(np.asarray(out["token_scores"], dtype=np.float64)), budget)
    rows.append((f"keep, budget {budget}", len(out["keep"]), "==", len(want)))
    if out["keep"] != want:
      failures.append(f"budget {budget}: kept {out['keep']} where the steps give {want}")
  H.print_table(("check", "value", "", "bound"), rows)
  if failures:
    raise H.TestFailure("; ".join(failures))


if __name__ == "__main__":
  H.main_wrapper(main)
