"""TRIPOD_PROFILE=1 on `tripod serve`: every worker prints its per-op table when it stops, named by
its process and pid, and bench/profile_tables.py reads the tables back from the shared stderr as
JSON lines (how a served burst's time is taken apart: docs/benchmarks.md)."""

import json
import os
import subprocess
import sys

import openai

from cluster import MODEL, SOURCE_DIR, Serve

SCRIPT = os.path.join(SOURCE_DIR, "bench", "profile_tables.py")
MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]
N_LAYERS = 30  # the bundled SmolLM2-135M


def test_served_workers_print_tables_that_profile_tables_reads(tmp_path):
  prompts = [" ".join(f"Line {i} of story {s} says {i * s}." for i in range(12)) for s in (1, 2)]
  usage = []
  with Serve(env=dict(os.environ, TRIPOD_PROFILE="1")) as serve:
    client = openai.OpenAI(base_url=serve.url, api_key="unused", max_retries=0, timeout=120)
    for p in prompts:
      r = client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
      usage.append(r.usage)
  serve.stderr_reader.join(timeout=60)
  assert not serve.stderr_reader.is_alive()
  assert serve.proc.returncode == 0, "".join(serve.stderr_lines[-20:])
  log = tmp_path / "serve.log"
  log.write_text("".join(serve.stderr_lines))

  out = subprocess.run([sys.executable, SCRIPT, "--label", "run=test", str(log)], check=True,
                       capture_output=True, text=True, timeout=60).stdout
  tables = [json.loads(line) for line in out.splitlines()]
  by_process = {t["process"]: t for t in tables}
  assert sorted(by_process) == ["tripod-decode", "tripod-draft", "tripod-prefill"], out
  for t in tables:
    assert t["run"] == "test" and t["pid"] > 0, t
    calls = sum(o["calls"] for o in t["ops"])
    # Every op but the first comes after a gap, counted in one of the three classes.
    assert sum(t["gaps"]) == max(calls - 1, 0), t
    assert abs(t["ops_s"] - sum(o["ms"] for o in t["ops"]) / 1e3) < 0.01 + 0.01 * t["ops_s"], t
    if calls:
      assert 0 < t["busy_share"] <= 1, t

  ops = lambda t: {o["op"]: o for o in t["ops"]}
  # The prefill worker wrote the K/V of every prompt token but the last at every layer (nothing
  # cached: the prompts differ from their first words); the decode worker's first step is the
  # last prompt token, which gives the first output token, so it ran one step per output token.
  prefill = ops(by_process["tripod-prefill"])
  prefilled = sum(u.prompt_tokens - 1 for u in usage)
  assert prefill["embed"]["rows"] == prefilled, prefill
  assert prefill["write_kv"]["rows"] == N_LAYERS * prefilled, prefill
  assert prefill["attention prefill"]["rows"] % prefilled == 0, prefill
  decode = ops(by_process["tripod-decode"])
  steps = sum(u.completion_tokens for u in usage)
  assert decode["attention decode"]["rows"] == N_LAYERS * steps, decode
  assert decode["write_kv"]["rows"] == N_LAYERS * steps, decode
  assert "attention prefill" not in decode, decode
