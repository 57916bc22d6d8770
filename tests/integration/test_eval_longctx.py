"""`tripod eval-longctx` on one short sample (the bounded version of the evaluation in
docs/draft.md): one JSON line per method, budget and POP setting; the KV bytes of every trimming
method fall to the budget (within 2%); SpecPC and keep-last prefill the kept tokens only (its KV is theirs;
times are measured in the evaluation, not asserted here); a budget of the whole
prompt leaves every method's output exactly the full KV's; shards merge into the same summary.
"""

import json
import os
import subprocess
import tempfile

import cluster as C

METHODS = ["full", "speckv", "specpc", "draftmap", "snapkv", "pyramidkv", "streamingllm",
           "keeplast"]


def run(args):
  out = subprocess.run([C.binary("tripod"), "eval-longctx", f"--model={C.MODEL}", *args],
                       capture_output=True, text=True, timeout=C.CALL_TIMEOUT_S, check=True)
  return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def test_one_sample_through_every_method():
  with tempfile.TemporaryDirectory(prefix="tripod_lc_") as tmp:
    rows_path = os.path.join(tmp, "rows.jsonl")
    summary = run(["--lengths=512", "--tasks=niah_multikey", "--samples=1", "--budgets=1/4,1",
                   "--methods=" + ",".join(METHODS), "--pop_rows=off,on", "--precision=fp32",
                   "--chunk=128", f"--out={rows_path}"])
    with open(rows_path) as f:
      rows = [json.loads(line) for line in f]
    # Merging the rows gives the summary back.
    merged = run([f"--merge={rows_path}"])
  assert merged == summary
  # full once per POP setting; 7 methods x 2 budgets x 2 POP settings.
  assert len(summary) == 2 + 7 * 2 * 2, [(s["method"], s["budget"], s["pop"]) for s in summary]
  by = {(r["method"], r["budget"], r["pop"]): r for r in rows}
  # POP's rows ran the paper's 1/3 of the layers as K/V projections only (--pop not given), the
  # others the full plan.
  layers = 30  # the bundled model's
  for r in rows:
    assert r["pop_kv_only_layers"] == (layers // 3 if r["pop"] else 0), r
  for pop in (False, True):
    full = by[("full", 1.0, pop)]
    n = full["prompt_tokens"]
    assert abs(n - 512) <= 5
    for method in METHODS[1:]:
      r = by[(method, 0.25, pop)]
      assert r["budget_tokens"] == round(n / 4)
      if method in ("specpc", "keeplast"):
        # The kept prompt's KV: budget - 1 entries (its last token is decode's).
        want = full["kv_bytes"] * (r["budget_tokens"] - 1) / (n - 1)
      else:
        want = full["kv_bytes"] * r["budget_tokens"] / (n - 1)
      assert abs(r["kv_bytes"] - want) <= 0.02 * want, (method, r["kv_bytes"], want)
      assert 0.0 <= r["accuracy"] <= 1.0
      if method == "keeplast":
        # The prompt's end, prefilled as a prompt: its KV is that of a plain prefill of those
        # tokens, so its bytes are exact.
        assert r["kv_bytes"] == full["kv_bytes"] // (n - 1) * (r["budget_tokens"] - 1)
      # The whole prompt as the budget: the request runs as without the method.
      whole = by[(method, 1.0, pop)]
      assert whole["output"] == full["output"], method
      assert whole["kv_bytes"] == full["kv_bytes"]
  for s in summary:
    lo, hi = s["accuracy_ci95"]
    assert s["samples"] == 1 and 0.0 <= lo <= s["accuracy"] <= hi <= 1.0


def test_a_separate_draft_model():
  # --draft_model: the draft runs that file in full (here the bundled model itself, which shares
  # its own vocabulary), as `tripod serve`'s draft workers run the catalogue's draft; the draft's
  # map still shapes SpecPC's kept prompt to the budget.
  rows = run(["--lengths=512", "--tasks=niah_single", "--samples=1", "--budgets=1/4",
              "--methods=full,specpc", "--pop_rows=off", "--precision=fp32", "--chunk=128",
              f"--draft_model={C.MODEL}"])
  assert [r["method"] for r in rows] == ["full", "specpc"], rows
  assert rows[1]["draft_s"] > 0 and rows[0]["draft_s"] == 0, rows
  assert rows[1]["budget_tokens"] == round(rows[0]["prompt_tokens"] / 4), rows
  # A separate draft runs in full: the self-draft's depth flags do not apply to it.
  out = subprocess.run([C.binary("tripod"), "eval-longctx", f"--model={C.MODEL}",
                        f"--draft_model={C.MODEL}", "--draft_layers=4", "--lengths=512"],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode != 0 and "--draft_model=self" in out.stderr, out.stderr


def test_bad_flags_are_refused():
  for args, words in ((["--tasks=qa"], "unknown 'qa'"), (["--budgets=2"], "fraction"),
                      (["--lengths=100"], ">= 256"), (["--shard=3/2"], "--shard")):
    out = subprocess.run([C.binary("tripod"), "eval-longctx", f"--model={C.MODEL}", *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and words in out.stderr, (args, out.stderr)


def test_resume_goes_on_from_the_rows_file():
  # A run stopped after its first sample, its last line cut short: --resume keeps the whole
  # lines, evaluates only the missing sample and ends with the rows of an uninterrupted run (the
  # same outputs; times aside). Run again, it evaluates nothing.
  args = ["--lengths=256", "--tasks=niah_single", "--samples=2", "--budgets=1/4",
          "--methods=full,snapkv", "--pop_rows=off", "--precision=fp32", "--chunk=128"]
  timeless = lambda r: {k: v for k, v in r.items() if k not in ("prefill_s", "draft_s")}
  with tempfile.TemporaryDirectory(prefix="tripod_lc_") as tmp:
    rows_path = os.path.join(tmp, "rows.jsonl")
    run([*args, f"--out={rows_path}"])
    with open(rows_path) as f:
      lines = f.read().splitlines()
    assert [json.loads(l)["sample"] for l in lines] == [0, 0, 1, 1], lines
    with open(rows_path, "w") as f:
      f.write("\n".join(lines[:2]) + "\n" + lines[2][:40])
    out = subprocess.run([C.binary("tripod"), "eval-longctx", f"--model={C.MODEL}", *args,
                          f"--out={rows_path}", "--resume"], capture_output=True, text=True,
                         timeout=C.CALL_TIMEOUT_S, check=True)
    assert "1 samples (2 rows) kept" in out.stderr, out.stderr
    assert "tokens, sample 0:" not in out.stderr and "tokens, sample 1:" in out.stderr, out.stderr
    with open(rows_path) as f:
      resumed = f.read().splitlines()
    assert resumed[:2] == lines[:2]
    assert [timeless(json.loads(l)) for l in resumed] == [timeless(json.loads(l)) for l in lines]
    again = subprocess.run([C.binary("tripod"), "eval-longctx", f"--model={C.MODEL}", *args,
                            f"--out={rows_path}", "--resume"], capture_output=True, text=True,
                           timeout=C.CALL_TIMEOUT_S, check=True)
    assert "tokens, sample" not in again.stderr, again.stderr
    with open(rows_path) as f:
      assert f.read().splitlines() == resumed
  out = subprocess.run([C.binary("tripod"), "eval-longctx", f"--model={C.MODEL}", "--resume",
                        "--lengths=256"], capture_output=True, text=True, timeout=120)
  assert out.returncode != 0 and "--resume needs --out" in out.stderr, out.stderr
