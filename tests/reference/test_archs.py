#!/usr/bin/env python3
"""The C++ forward pass on every architecture variant it claims, with tiny random-weight GGUFs.

For each variant (Llama with separate / tied head, mixed quantized weights and GQA, Llama 3.1
RoPE scaling via keys and via rope_freqs.weight, Qwen2 with Q/K/V biases, Qwen3 with per-head
Q/K norms and key_length != d_model / n_head) a GGUF is written to a temp dir and
`tripod logits --all --precision fp32` (whole prompt, --chunk 1, --chunk 7) is compared, every
position, with the float64 NumPy reference: rel L2 <= 1e-4 and the same argmax.
Each variant also has negative controls: the reference with the feature removed (other RoPE
pairing, no scaling, no biases, ...) must be far (> 100x the tolerance) from the C++ logits, so
a pass means the feature is really exercised.
Finally, files the loader must refuse (unknown architecture, missing or misshapen tensors) must
fail with a non-zero exit, no signal, and a message on stderr naming the problem.
"""

import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: the machine is shared

import numpy as np  # noqa: E402

import arch_gguf  # noqa: E402
import arch_reference  # noqa: E402
from arch_gguf import Q  # noqa: E402

MAX_REL = 1e-4
CONTROL_MIN_REL = 100 * MAX_REL
N_IDS = 20
CHUNKS = (None, 1, 7)
TIMEOUT_S = 120

LLAMA3_KEYS = dict(factor=8.0, low_freq_factor=2.0, high_freq_factor=8.0,
                   original_context_length=64)
ROPE_FREQS_SCALING = dict(factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_context=128)


def variants():
  """[(name, description, ArchSpec, {control name: reference switches})]."""
  flip = {"other RoPE pairing": dict(rope_neox=True)}
  mixed = {  # per layer: the C++ must dequantize each type on every path
      "token_embd": Q.Q8_0,
      "attn_q": [Q.Q8_0, Q.Q4_1, Q.F16],
      "attn_k": [Q.Q4_1, Q.F16, Q.Q8_0],
      "attn_v": [Q.F16, Q.Q8_0, Q.Q4_1],
      "attn_output": [Q.Q4_1, Q.Q8_0, Q.F16],
      "ffn_gate": [Q.Q8_0, Q.F16, Q.Q4_1],
      "ffn_up": [Q.F16, Q.Q4_1, Q.Q8_0],
      "ffn_down": [Q.Q4_1, Q.Q8_0, Q.F16],
  }
  freqs = arch_reference.llama3_rope_factors(10000.0, 32, **ROPE_FREQS_SCALING)
  return [
      ("a", "llama, separate head, F32", arch_gguf.ArchSpec(
          arch="llama", n_layer=2, d_model=64, n_head=4, n_head_kv=4, d_ff=192, seed=1), flip),
      ("b", "llama, tied head, Q8_0/Q4_1/F16, GQA 4/2", arch_gguf.ArchSpec(
          arch="llama", n_layer=3, d_model=128, n_head=4, n_head_kv=2, d_ff=256,
          tied_head=True, types=mixed, seed=2), flip),
      ("c", "llama 3.1 scaling via keys", arch_gguf.ArchSpec(
          arch="llama", n_layer=2, d_model=64, n_head=2, n_head_kv=1, d_ff=192,
          llama3_keys=LLAMA3_KEYS, seed=3),
       dict(flip, **{"no scaling": dict(llama3=None)})),
      ("d", "llama rope_freqs.weight", arch_gguf.ArchSpec(
          arch="llama", n_layer=2, d_model=96, n_head=3, n_head_kv=1, d_ff=160,
          rope_freqs=freqs, seed=4),
       dict(flip, **{"rope_freqs ignored": dict(rope_freqs=None)})),
      ("e", "qwen2, Q/K/V biases, GQA 4/2", arch_gguf.ArchSpec(
          arch="qwen2", n_layer=2, d_model=64, n_head=4, n_head_kv=2, d_ff=192,
          rope_base=1e6, rms_eps=1e-6, qkv_bias=True, seed=5),
       {"adjacent RoPE pairing": dict(rope_neox=False), "no biases": dict(drop_biases=True)}),
      ("f", "qwen3, q/k norm, head_dim 32 (d 64, 4 heads)", arch_gguf.ArchSpec(
          arch="qwen3", n_layer=2, d_model=64, n_head=4, n_head_kv=2, head_dim=32, d_ff=192,
          rope_base=1e6, rms_eps=1e-6, qk_norm=True, tied_head=True,
          types={"attn_q": Q.Q8_0, "ffn_down": Q.F16}, seed=6),
       {"adjacent RoPE pairing": dict(rope_neox=False), "no q/k norm": dict(drop_qk_norm=True),
        "q/k norm after RoPE": dict(qk_norm_after_rope=True)}),
  ]


def tripod_bin():
  path = os.environ.get("TRIPOD_BIN")
  if not path or not os.access(path, os.X_OK):
    sys.exit(f"FAIL: TRIPOD_BIN={path!r} is not an executable (build the `tripod` target)")
  return path


def run_tripod(args):
  env = dict(os.environ)
  env.setdefault("OMP_NUM_THREADS", "2")
  return subprocess.run([tripod_bin()] + args, capture_output=True, text=True,
                        timeout=TIMEOUT_S, env=env)


def cpp_logits(model, ids, vocab, out_dir, chunk=None):
  out = os.path.join(out_dir, "logits.f32")
  if os.path.exists(out):
    os.remove(out)
  args = ["logits", "--model", model, "--ids", ",".join(str(i) for i in ids),
          "--precision", "fp32", "--out", out, "--all"]
  if chunk is not None:
    args += ["--chunk", str(chunk)]
  r = run_tripod(args)
  if r.returncode != 0:
    raise AssertionError(f"tripod logits failed (exit {r.returncode}): {r.stderr.strip()}")
  data = np.fromfile(out, dtype="<f4")
  if data.size != len(ids) * vocab:
    raise AssertionError(f"tripod wrote {data.size} floats, expected {len(ids)} x {vocab}")
  return data.reshape(len(ids), vocab)


def max_rel_l2(got, ref):
  """Worst per-position ||got - ref|| / ||ref||."""
  got = np.asarray(got, dtype=np.float64)
  ref = np.asarray(ref, dtype=np.float64)
  return float(np.max(np.linalg.norm(got - ref, axis=1) / np.linalg.norm(ref, axis=1)))


def reference_self_check(tmp):
  """The llama3 scaling the reference implements must agree with the converter's rope_freqs."""
  failures = []
  for base, dim, kw in ((500000.0, 128, dict(factor=8.0, low_freq_factor=1.0,
                                             high_freq_factor=4.0, original_context=8192)),
                        (10000.0, 32, dict(LLAMA3_KEYS, original_context=64)),
                        (10000.0, 32, ROPE_FREQS_SCALING)):
    kw = {k: v for k, v in kw.items() if k != "original_context_length"}
    inv = arch_reference.llama3_inv_freq(base, dim, **kw)
    plain = base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    via_factors = plain / arch_reference.llama3_rope_factors(base, dim, **kw)
    err = float(np.max(np.abs(inv / via_factors - 1)))
    scaled = int(np.sum(np.abs(inv / plain - 1) > 1e-9))
    print(f"reference: llama3 inv_freq (HF) vs converter rope_freqs, base {base:g} dim {dim}: "
          f"max rel diff {err:.1e}, {scaled}/{dim // 2} frequencies scaled")
    if err > 1e-12:
      failures.append(f"reference llama3 scaling disagrees with the converter formula ({err:.1e})")
  # On a model: keys path == rope_freqs path with the converter's factors.
  path = os.path.join(tmp, "selfcheck.gguf")
  arch_gguf.write_gguf(path, arch_gguf.ArchSpec(llama3_keys=LLAMA3_KEYS, n_head=2, n_head_kv=1,
                                                seed=3))
  ref = arch_reference.ArchReference(path)
  kw = dict(LLAMA3_KEYS, original_context=LLAMA3_KEYS["original_context_length"])
  del kw["original_context_length"]
  factors = arch_reference.llama3_rope_factors(10000.0, 32, **kw)
  ids = list(range(0, 300, 15))
  a = ref.logits(ids, all_positions=True)
  b = ref.variant(llama3=None, rope_freqs=factors).logits(ids, all_positions=True)
  err = max_rel_l2(a, b)
  print(f"reference: llama3 keys vs rope_freqs tensor on a model: max rel L2 {err:.1e}")
  if err > 1e-10:
    failures.append(f"reference llama3 keys vs rope_freqs paths differ ({err:.1e})")
  return failures


def check_variant(tmp, name, desc, spec, controls, ids):
  path = os.path.join(tmp, f"arch_{name}.gguf")
  arch_gguf.write_gguf(path, spec)
  ref_model = arch_reference.ArchReference(path)
  ref = ref_model.logits(ids, all_positions=True)
  failures = []
  errs = {}
  first = None
  for chunk in CHUNKS:
    label = "full" if chunk is None else f"chunk {chunk}"
    try:
      got = cpp_logits(path, ids, spec.vocab, tmp, chunk)
    except (AssertionError, subprocess.TimeoutExpired) as e:
      failures.append(f"({name}) {label}: {e}")
      errs[label] = float("nan")
      continue
    if first is None:
      first = got
    errs[label] = max_rel_l2(got, ref)
    bad = np.nonzero(np.argmax(got, axis=1) != np.argmax(ref, axis=1))[0]
    if errs[label] > MAX_REL:
      failures.append(f"({name}) {label}: max rel L2 {errs[label]:.2e} > {MAX_REL:g}")
    if len(bad):
      failures.append(f"({name}) {label}: argmax differs at positions {bad.tolist()}")
  ctrl = {}
  if first is not None:
    for cname, switches in controls.items():
      ctrl[cname] = max_rel_l2(first, ref_model.variant(**switches).logits(ids, True))
      if ctrl[cname] < CONTROL_MIN_REL:
        failures.append(f"({name}) control '{cname}' is only {ctrl[cname]:.1e} from the C++ "
                        f"logits: the test does not exercise that feature")
    if name == "c":
      # Diagnosis only: does the C++ match the scaling with the default low/high factors?
      dflt = dict(ref_model.llama3, low_freq_factor=1.0, high_freq_factor=4.0)
      ctrl["(diag) default low/high freq factors"] = max_rel_l2(
          first, ref_model.variant(llama3=dflt).logits(ids, True))
  return errs, ctrl, failures


def check_refusals(tmp, ids):
  """Files the loader must refuse cleanly: (spec, substrings stderr must hold)."""
  cases = [
      ("unknown architecture gpt2", arch_gguf.ArchSpec(arch="gpt2"),
       ["unsupported architecture", "gpt2"]),
      ("missing blk.1.ffn_up.weight", arch_gguf.ArchSpec(omit=("blk.1.ffn_up.weight",)),
       ["blk.1.ffn_up.weight", "missing"]),
      ("missing token_embd.weight", arch_gguf.ArchSpec(omit=("token_embd.weight",)),
       ["token_embd.weight"]),
      ("qwen2 missing blk.0.attn_k.bias",
       arch_gguf.ArchSpec(arch="qwen2", qkv_bias=True, omit=("blk.0.attn_k.bias",)),
       ["blk.0.attn_k.bias"]),
      ("qwen3 missing blk.1.attn_q_norm.weight",
       arch_gguf.ArchSpec(arch="qwen3", qk_norm=True, head_dim=32,
                          omit=("blk.1.attn_q_norm.weight",)), ["blk.1.attn_q_norm.weight"]),
      ("misshapen blk.0.attn_k.weight", arch_gguf.ArchSpec(wrong_shape=("blk.0.attn_k.weight",)),
       ["blk.0.attn_k.weight"]),
  ]
  failures = []
  for label, spec, want in cases:
    path = os.path.join(tmp, "bad.gguf")
    arch_gguf.write_gguf(path, spec)
    r = run_tripod(["logits", "--model", path, "--ids", ",".join(map(str, ids)), "--precision",
                    "fp32", "--out", os.path.join(tmp, "bad.f32"), "--all"])
    msg = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""
    ok = r.returncode > 0 and all(w.lower() in r.stderr.lower() for w in want)
    print(f"  {'ok  ' if ok else 'FAIL'} {label}: exit {r.returncode}, stderr: {msg}")
    if not ok:
      failures.append(f"refusal '{label}': exit {r.returncode} (want > 0, no signal), stderr "
                      f"{r.stderr.strip()!r} (want {want})")
  # An id outside the vocabulary is a clean error too.
  path = os.path.join(tmp, "arch_a.gguf")
  r = run_tripod(["logits", "--model", path, "--ids", "1,2,300", "--precision", "fp32", "--out",
                  os.path.join(tmp, "bad.f32")])
  ok = r.returncode > 0 and "vocabulary" in r.stderr
  print(f"  {'ok  ' if ok else 'FAIL'} token id 300 of 300: exit {r.returncode}, stderr: "
        f"{r.stderr.strip()}")
  if not ok:
    failures.append(f"out-of-vocabulary id: exit {r.returncode}, stderr {r.stderr.strip()!r}")
  return failures


def main():
  tripod_bin()
  t0 = time.time()
  failures = []
  rng = np.random.default_rng(1234)
  ids = [int(i) for i in rng.integers(0, 300, N_IDS)]
  with tempfile.TemporaryDirectory(prefix="tripod_archs_") as tmp:
    failures += reference_self_check(tmp)
    rows = []
    for name, desc, spec, controls in variants():
      errs, ctrl, f = check_variant(tmp, name, desc, spec, controls, ids)
      failures += f
      rows.append((name, desc, errs, ctrl, not f))
    print(f"\n{'':2}{'variant':48} {'full':>9} {'chunk 1':>9} {'chunk 7':>9}  result")
    for name, desc, errs, ctrl, ok in rows:
      e = [errs.get(k, float("nan")) for k in ("full", "chunk 1", "chunk 7")]
      print(f"({name}) {desc:47} {e[0]:9.2e} {e[1]:9.2e} {e[2]:9.2e}  {'ok' if ok else 'FAIL'}")
      for cname, v in ctrl.items():
        print(f"{'':8}control {cname}: {v:.2e}")
    print("\nrefusals:")
    failures += check_refusals(tmp, ids)
  print(f"\n{time.time() - t0:.1f}s")
  if failures:
    print("\nFAILURES:")
    for f in failures:
      print(f"  {f}")
    return 1
  print("PASS")
  return 0


if __name__ == "__main__":
  sys.exit(main())
