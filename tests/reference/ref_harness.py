"""Shared plumbing of the reference tests: environment, the tripod CLI, reporting.

The CLI contract these tests rely on:
  $TRIPOD_BIN logits --model M --ids 1,2,3 --precision fp32|bf16 [--chunk N] [--all] --out FILE
      writes the last position's logits (or with --all every position's, [n, vocab]) as raw
      little-endian float32;
  $TRIPOD_BIN generate --model M --ids 1,2,3 --max-tokens 64 --temperature 0 [--chunk N] --print-ids
      prints the generated ids space-separated on stdout.
"""

import os
import shutil
import subprocess
import sys
import tempfile

# One BLAS thread: the tests share a small machine with the C++ side (and other jobs), and
# OpenBLAS's spinning threads slow a loaded machine down more than they help. Must precede the
# first numpy import.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SUBPROCESS_TIMEOUT_S = 900


class TestFailure(Exception):
  pass


class Unsupported(TestFailure):
  """The CLI refused a mode this machine cannot run (FAILED_PRECONDITION), e.g. bf16 on a CPU
  without AVX512_BF16/AMX. Tests report it and skip that part instead of failing."""


SKIP_EXIT_CODE = 77  # ctest's conventional "skipped" status (SKIP_RETURN_CODE)


def source_dir():
  return os.environ.get("TRIPOD_SOURCE_DIR") or os.path.normpath(os.path.join(HERE, "..", ".."))


def model_path():
  path = os.environ.get("TRIPOD_MODEL") or os.path.join(
      source_dir(), "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
  if not os.path.isfile(path):
    fail(f"model not found: {path} (set TRIPOD_MODEL, or run scripts/setup to fetch it)")
  return path


def tripod_bin():
  """The tripod CLI from TRIPOD_BIN; fails the test with a clear message when it is missing."""
  path = os.environ.get("TRIPOD_BIN")
  if not path:
    fail("TRIPOD_BIN is not set: these tests compare the C++ `tripod` CLI against the NumPy "
         "reference; run them through ctest, or set TRIPOD_BIN=<build>/tripod")
  if not os.path.isfile(path) and shutil.which(path):
    path = shutil.which(path)
  if not os.path.isfile(path) or not os.access(path, os.X_OK):
    fail(f"TRIPOD_BIN={path} is not an executable file (build the `tripod` target first)")
  return path


def fail(message):
  print(f"FAIL: {message}", flush=True)
  sys.exit(1)


def _run(args, what):
  cmd = [tripod_bin()] + [str(a) for a in args]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    raise TestFailure(f"{what}: timed out after {SUBPROCESS_TIMEOUT_S}s: {' '.join(cmd)[:300]}")
  if proc.returncode != 0 and "FAILED_PRECONDITION" in proc.stderr:
    raise Unsupported(f"{what}: {proc.stderr.strip()[-500:]}")
  if proc.returncode != 0:
    raise TestFailure(f"{what}: exit status {proc.returncode}: {' '.join(cmd)[:300]}\n"
                      f"stderr: {proc.stderr[-2000:]}")
  return proc


def _ids_arg(ids):
  return ",".join(str(int(i)) for i in ids)


def cpp_logits(ids, precision, vocab, chunk=None, all_positions=False, model=None, kv=None):
  """Runs `tripod logits` (kv: the KV cache type, default the precision's); returns float32
  [vocab] or [n, vocab]."""
  with tempfile.TemporaryDirectory(prefix="tripod_ref_") as tmp:
    out = os.path.join(tmp, "logits.f32")
    args = ["logits", "--model", model or model_path(), "--ids", _ids_arg(ids),
            "--precision", precision, "--out", out]
    if chunk is not None:
      args += ["--chunk", chunk]
    if all_positions:
      args.append("--all")
    if kv is not None:
      args += ["--kv_cache_dtype", kv]
    _run(args, f"tripod logits ({precision}, kv {kv or 'auto'}, {len(ids)} tokens)")
    if not os.path.isfile(out):
      raise TestFailure(f"tripod logits wrote no file {out}")
    data = np.fromfile(out, dtype="<f4")
  want = len(ids) * vocab if all_positions else vocab
  if data.size != want:
    raise TestFailure(f"tripod logits wrote {data.size} floats, expected {want}")
  if not np.all(np.isfinite(data)):
    raise TestFailure(f"tripod logits ({precision}) wrote non-finite values")
  return data.reshape(len(ids), vocab) if all_positions else data


def cpp_generate(ids, max_tokens, chunk=None, model=None):
  """Runs greedy `tripod generate --print-ids`; returns the generated ids."""
  args = ["generate", "--model", model or model_path(), "--ids", _ids_arg(ids),
          "--max-tokens", max_tokens, "--temperature", 0, "--print-ids"]
  if chunk is not None:
    args += ["--chunk", chunk]
  proc = _run(args, f"tripod generate (chunk {chunk})")
  try:
    return [int(t) for t in proc.stdout.split()]
  except ValueError:
    raise TestFailure(f"tripod generate --print-ids printed non-ids: {proc.stdout[:300]!r}")


def rel_l2(a, b):
  a = np.asarray(a, dtype=np.float64)
  b = np.asarray(b, dtype=np.float64)
  return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def print_table(header, rows):
  widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
  line = "  ".join(str(h).rjust(w) for h, w in zip(header, widths))
  print(line)
  print("-" * len(line))
  for r in rows:
    print("  ".join(str(c).rjust(w) for c, w in zip(r, widths)))
  sys.stdout.flush()


def skip(message):
  print(f"SKIP: {message}", flush=True)
  sys.exit(SKIP_EXIT_CODE)


def main_wrapper(fn, allow_skip=True):
  """Runs fn(); exit 0 on success, 1 with a FAIL line on TestFailure / AssertionError, 77 with
  a SKIP line when the whole test needs a mode this machine cannot run (a failure instead when
  allow_skip is False)."""
  try:
    fn()
  except Unsupported as e:
    if not allow_skip:
      print(f"FAIL: {e}", flush=True)
      sys.exit(1)
    skip(str(e))
  except (TestFailure, AssertionError) as e:
    print(f"FAIL: {e}", flush=True)
    sys.exit(1)
  print("PASS", flush=True)
  sys.exit(0)
