"""bench/goodput.py on a small bounded case: the long-context samples it serves (`tripod
eval-longctx --samples_out`), its scoring against eval-longctx's rule, and a run of two
configurations through real `tripod serve` processes on the bundled model (every field of its
JSON lines, the counts, the plot)."""

import importlib.util
import json
import os
import subprocess
import sys

from cluster import MODEL, SOURCE_DIR, binary

SCRIPT = os.path.join(SOURCE_DIR, "bench", "goodput.py")
spec = importlib.util.spec_from_file_location("goodput", SCRIPT)
goodput = importlib.util.module_from_spec(spec)
spec.loader.exec_module(goodput)


def samples(tmp_path, name, *flags):
  out = tmp_path / name
  subprocess.run([binary("tripod"), "eval-longctx", f"--model={MODEL}",
                  f"--samples_out={out}", *flags], check=True, timeout=300,
                 stdout=subprocess.DEVNULL)
  with open(out) as f:
    return [json.loads(line) for line in f]


def test_samples_out_writes_reproducible_samples_of_the_length_asked(tmp_path):
  flags = ["--tasks=niah_single,niah_multivalue", "--lengths=600", "--samples=2", "--seed=3"]
  a = samples(tmp_path, "a.jsonl", *flags)
  assert [(s["task"], s["sample"]) for s in a] == [
      ("niah_single", 0), ("niah_single", 1), ("niah_multivalue", 0), ("niah_multivalue", 1)]
  for s in a:
    assert s["length"] == 600 and abs(len(s["prompt"]) - 600) <= 6, (s["task"], len(s["prompt"]))
    assert s["answers"] and all(isinstance(t, int) and t >= 0 for t in s["prompt"])
    assert s["max_tokens"] > 0 and s["recall"] == (s["task"] == "niah_multivalue")
  assert a[0]["prompt"] != a[1]["prompt"]
  assert samples(tmp_path, "b.jsonl", *flags) == a
  assert samples(tmp_path, "c.jsonl", *flags[:-1], "--seed=4")[0]["prompt"] != a[0]["prompt"]


def test_longctx_score_is_eval_longctxs_rule():
  one = {"answers": ["7421", "x"], "recall": False}
  assert goodput.score_longctx(one, "The key is 7421.") == 1.0
  assert goodput.score_longctx(one, "The key is 742.") == 0.0
  many = {"answers": ["Alpha", "beta", "gamma", "delta"], "recall": True}
  assert goodput.score_longctx(many, "ALPHA, Beta and gamma") == 0.75
  assert goodput.score_longctx({"answers": [], "recall": True}, "anything") == 0.0


def test_method_outcomes_tell_applied_whole_and_fallback():
  assert goodput.method_outcome(None, 100) is None
  applied = {"applied": True, "kv_entries": 25, "prompt_tokens": 100, "fallback": None}
  assert goodput.method_outcome(applied, 100) == "applied"
  kept = {"applied": True, "kv_entries": None, "prompt_tokens": 25, "fallback": None}  # SpecPC
  assert goodput.method_outcome(kept, 100) == "applied"
  whole = {"applied": True, "kv_entries": None, "prompt_tokens": 100, "fallback": None}
  assert goodput.method_outcome(whole, 100) == "whole"
  late = {"applied": False, "fallback": "draft worker r:1: timed out", "prompt_tokens": 100}
  assert goodput.method_outcome(late, 100) == "fallback: draft worker r:1: timed out"


def test_percentile_interpolates_as_numpy():
  assert goodput.percentile([3.0, 1.0, 2.0, 4.0], 0.5) == 2.5
  assert abs(goodput.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.99) - 4.96) < 1e-9
  assert goodput.percentile([], 0.5) is None


def test_two_configurations_served_and_scored(tmp_path):
  out = tmp_path / "goodput.jsonl"
  png = tmp_path / "goodput.png"
  r = subprocess.run(
      [sys.executable, SCRIPT, f"--tripod={binary('tripod')}", f"--model={MODEL}",
       "--configs=full,pop1/3", "--humaneval=2", "--longctx=niah_single:600:1",
       "--concurrency=2", "--max-tokens=24", "--start-timeout-s=180",
       "--request-timeout-s=300", f"--out={out}", f"--plot={png}"],
      capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  printed = [json.loads(line) for line in r.stdout.splitlines()]
  with open(out) as f:
    assert [json.loads(line) for line in f] == printed
  assert [row["config"] for row in printed] == ["full", "pop1/3"]
  for row in printed:
    assert row["bench"] == "goodput" and row["model"] == MODEL and row["concurrency"] == 2
    assert row["requests"] == 3 and row["humaneval_problems"] == 2
    assert row["longctx_samples"] == 1
    assert 0 < row["output_tokens"] <= 2 * 24 + 16 and row["output_tok_s"] > 0
    assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"] <= row["wall_s"]
    assert row["humaneval_pass"] in (0.0, 0.5, 1.0) and 0 <= row["longctx_score"] <= 1
    assert abs(row["score"] - (row["humaneval_pass"] + row["longctx_score"]) / 2) < 1e-3
    # Every prompt here took the disaggregated route, and neither configuration trims the KV.
    assert row["kv_transfer_bytes"] > 0 and row["kv_transfer_bytes_saved"] == 0
    assert row["kv_transfer_share"] == 1.0
    assert row["routes"] == {"humaneval": {"disaggregated": 2}, "longctx": {"disaggregated": 1}}
    assert row["methods"] == {} and row["serve_args"] == []  # no method asked
  assert printed[0]["serve_pop"] == "0" and printed[0]["tripod"] == {"pop": "off"}
  assert printed[1]["serve_pop"] == "1/3" and printed[1]["tripod"] == {"pop": "1/3"}
  with open(png, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
