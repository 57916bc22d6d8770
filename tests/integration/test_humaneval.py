"""eval/humaneval.py on small bounded cases: its sandbox (a known-correct completion passes, a
wrong one fails, an infinite loop dies by its time limit, a network connection is refused, a
fork bomb stops at the process limit), its Wilson interval, and the harness end to end through a
real `tripod serve` of the bundled model on two problems (every field of the JSON lines, the
prefill FLOPs share of POP 1/3 against the full model, shards merged, a POP control served through the API)."""

import importlib.util
import json
import os
import socket
import re
import subprocess
import sys
import time

import pytest

from cluster import MODEL, SOURCE_DIR, binary

SCRIPT = os.path.join(SOURCE_DIR, "eval", "humaneval.py")
spec = importlib.util.spec_from_file_location("humaneval", SCRIPT)
humaneval = importlib.util.module_from_spec(spec)
spec.loader.exec_module(humaneval)

FIELDS = {"eval", "model", "config", "task_id", "passed", "prompt_tokens", "output_tokens",
          "ttft_s", "prefill_flops_share"}


@pytest.fixture(scope="module")
def problems():
  ps = humaneval.load_problems()
  assert len(ps) == 164 and ps[0]["task_id"] == "HumanEval/0"
  return ps


def test_known_correct_completions_pass_and_wrong_ones_fail(problems):
  for p in problems[:3]:
    ok = humaneval.check_completion(p, p["canonical_solution"])
    assert ok["passed"] and ok["result"] == "passed", (p["task_id"], ok)
  # HumanEval/0 (has_close_elements) answering a constant is wrong on its tests.
  wrong = humaneval.check_completion(problems[0], "    return False\n")
  assert not wrong["passed"] and "AssertionError" in wrong["result"], wrong
  broken = humaneval.check_completion(problems[0], "    return (\n")
  assert not broken["passed"] and "SyntaxError" in broken["result"], broken


def test_an_infinite_loop_dies_by_its_time_limit(problems):
  r = humaneval.check_completion(problems[0], "    while True:\n        pass\n", timeout_s=2)
  assert not r["passed"] and r["result"] == "timed out", r
  assert 1.9 <= r["seconds"] < 10, r


def test_a_network_connection_is_refused(problems):
  # A listener on loopback: were the check's network ours, it would connect and pass.
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    completion = ("    import socket\n"
                  f"    socket.create_connection(('127.0.0.1', {port}), timeout=3).close()\n"
                  "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
                  "               for b in numbers[i + 1:])\n")
    r = humaneval.check_completion(problems[0], completion)
    assert not r["passed"] and r["result"].startswith("failed: OSError"), r
    with pytest.raises(BlockingIOError):
      listener.accept()  # nobody came


def test_a_fork_bomb_stops_at_the_process_limit(problems):
  completion = ("    import os, time\n"
                "    for n in range(1000):\n"
                "        try:\n"
                "            pid = os.fork()\n"
                "        except OSError:\n"
                "            raise SystemExit(f'forks stopped at {n}')\n"
                "        if pid == 0:\n"
                "            time.sleep(60)\n"
                "            os._exit(0)\n"
                "    return True\n")
  r = humaneval.check_completion(problems[0], completion, timeout_s=10)
  assert not r["passed"] and "forks stopped at" in r["result"], r
  n = int(r["result"].rsplit(" ", 1)[1])
  assert n < humaneval.MAX_PROCESSES, r


def test_wilson_interval():
  lo, hi = humaneval.wilson(5, 10)
  assert abs(lo - 0.2366) < 1e-3 and abs(hi - 0.7634) < 1e-3
  lo, hi = humaneval.wilson(0, 2)
  assert lo == 0 and abs(hi - 0.6576) < 1e-3
  lo, hi = humaneval.wilson(164, 164)
  assert abs(lo - 0.9771) < 1e-3 and abs(hi - 1) < 1e-12


def test_a_configuration_names_any_pop_ratio():
  assert humaneval.config_spec("full") == ("0", "off", None)
  assert humaneval.config_spec("pop0.1") == ("0.1", "0.1", None)
  assert humaneval.config_spec("pop3/28") == ("3/28", "3/28", None)
  assert humaneval.config_spec("nokv0.25") == ("0.25", "0.25", "nokv")
  for bad in ("pop0", "pop1", "pop1.5", "pop", "popx", "pop3/", "nokv", "half0.2"):
    with pytest.raises(ValueError, match="unknown configuration"):
      humaneval.config_spec(bad)


def test_the_corpus_is_every_prompt_with_its_solution(problems, tmp_path):
  out = tmp_path / "corpus.txt"
  assert humaneval.main(["--corpus", f"--out={out}"]) == 0
  text = out.read_text()
  at = 0
  for p in problems:  # in task order, each prompt followed by its solution
    at = text.index(p["prompt"] + p["canonical_solution"], at) + 1
  assert len(text) == sum(len(p["prompt"] + p["canonical_solution"]) for p in problems) + 2 * 163


def run_harness(tmp_path, config, *extra):
  out = tmp_path / f"{config.replace('/', '_')}.jsonl"
  cmd = [sys.executable, SCRIPT, f"--tripod={binary('tripod')}", f"--model={MODEL}",
         f"--config={config}", "--max-tokens=24", f"--out={out}", "--start-timeout-s=180",
         "--request-timeout-s=300"] + list(extra)
  p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
  return p, out


def serve_pid(stderr):
  m = re.search(r"humaneval: tripod serve pid (\d+)", stderr)
  assert m, stderr[-3000:]
  return int(m.group(1))


def session_members(sid):
  """Processes (not zombies) of session `sid`: tripod serve and the workers it started."""
  members = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
      continue
    if fields[0] != "Z" and int(fields[3]) == sid:
      members.append(int(pid))
  return members


def assert_stopped(stderr):
  """tripod serve was stopped by the harness (SIGTERM: a clean exit) and left nothing behind."""
  assert "humaneval: tripod serve stopped (exit status 0)" in stderr, stderr[-3000:]
  assert_reaped(serve_pid(stderr))


def assert_reaped(sid):
  # The harness waits for tripod serve, which waits for its workers: by the time the harness has
  # exited they are gone (a little slack for the kernel's bookkeeping). Without that wait they
  # would live on until a write to the closed pipes killed them.
  deadline = time.monotonic() + 2
  while session_members(sid) and time.monotonic() < deadline:
    time.sleep(0.2)
  assert not session_members(sid), f"left behind: {session_members(sid)}"


def read_lines(path):
  with open(path) as f:
    return [json.loads(line) for line in f]


def test_harness_end_to_end(tmp_path):
  p, pop_out = run_harness(tmp_path, "pop1/3", "--limit=2")
  assert p.returncode == 0, p.stderr[-3000:]
  assert_stopped(p.stderr)
  rows = read_lines(pop_out)
  assert len(rows) == 3 and rows[-1]["summary"] is True
  for r in rows[:2]:
    assert FIELDS <= r.keys(), r
    assert r["eval"] == "humaneval" and r["config"] == "pop1/3" and r["model"] == MODEL
    assert isinstance(r["passed"], bool) and r["passed"] == (r["result"] == "passed")
    assert r["prompt_tokens"] > 50 and 1 <= r["output_tokens"] <= 24
    assert 0 < r["ttft_s"] < 300
    assert r["route"] == "disaggregated", r
    # 10 of SmolLM2's 30 layers K/V-only: a third of the layers spend ~6% of their FLOPs.
    assert 0.6 < r["prefill_flops_share"] < 0.75, r
  assert [r["task_id"] for r in rows[:2]] == ["HumanEval/0", "HumanEval/1"]
  s = rows[-1]
  assert s["n"] == 2 and s["passed"] == sum(r["passed"] for r in rows[:2])
  assert s["pass_at_1"] == s["passed"] / 2 and s["ci95"][0] <= s["pass_at_1"] <= s["ci95"][1]
  assert s["sandbox"] in ("netns", "socket-stub")

  # --resume keeps what is done: nothing left to run, no server started, the same rows.
  p = subprocess.run([sys.executable, SCRIPT, f"--tripod={binary('tripod')}", f"--model={MODEL}",
                      "--config=pop1/3", "--limit=2", "--resume", f"--out={pop_out}"],
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0 and "done already" in p.stderr and " serve --port" not in p.stderr, \
      p.stderr[-3000:]
  assert read_lines(pop_out)[:2] == rows[:2] and read_lines(pop_out)[-1]["n"] == 2

  # The full model, shard 1 of 2: the odd problems; its prefill spends every FLOP.
  p, full_out = run_harness(tmp_path, "full", "--shard=1/2", "--limit=1")
  assert p.returncode == 0, p.stderr[-3000:]
  assert_stopped(p.stderr)
  rows = read_lines(full_out)
  assert [r["task_id"] for r in rows[:-1]] == ["HumanEval/1"]
  assert rows[0]["prefill_flops_share"] == 1.0 and rows[0]["route"] == "disaggregated", rows[0]
  assert rows[-1]["shard"] == "1/2"


def test_merge_joins_shards_and_refuses_duplicates(tmp_path):
  def row(task, passed):
    return {"eval": "humaneval", "model": "m", "config": "full", "task_id": task,
            "passed": passed, "prompt_tokens": 10, "output_tokens": 5, "ttft_s": 0.1,
            "prefill_flops_share": 1.0, "route": "disaggregated"}
  a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
  a.write_text(json.dumps(row("HumanEval/2", True)) + "\n" + json.dumps({"summary": True}) + "\n")
  b.write_text(json.dumps(row("HumanEval/1", False)) + "\n")
  out = tmp_path / "all.jsonl"
  assert humaneval.main(["--merge", str(a), str(b), f"--out={out}"]) == 0
  rows = read_lines(out)
  assert [r.get("task_id") for r in rows] == ["HumanEval/1", "HumanEval/2", None]
  assert rows[-1]["n"] == 2 and rows[-1]["pass_at_1"] == 0.5
  with pytest.raises(SystemExit):
    humaneval.main(["--merge", str(a), str(a), f"--out={out}"])


def test_a_failed_start_leaves_no_process(tmp_path):
  # tripod serve runs, workers and all, but its "serving at" line never reaches the harness (its
  # stdout goes elsewhere; fd 3 keeps the harness's pipe open): the harness gives up at its start
  # timeout, says so, and stops it and its workers.
  mute = tmp_path / "tripod"
  mute.write_text(f'#!/bin/sh\nexec 3>&1 >/dev/null\nexec "{binary("tripod")}" "$@"\n')
  mute.chmod(0o755)
  p, out = run_harness(tmp_path, "full", "--limit=1", "--start-timeout-s=15", f"--tripod={mute}")
  assert p.returncode != 0 and "did not start within 15 s" in p.stderr, p.stderr[-3000:]
  assert_stopped(p.stderr)


def test_a_control_is_served_through_the_api(tmp_path):
  # No K/V projection at 1/3 (tripod.pop_variant "nokv"): the prefill worker runs SmolLM2's last
  # 10 layers kSkip, so its prefill spends exactly the 20 full layers' FLOPs (POP's K/V-only
  # layers would spend a little more: 0.6875 of the full model's), and the request still takes
  # the disaggregated route.
  p, out = run_harness(tmp_path, "nokv1/3", "--limit=1")
  assert p.returncode == 0, p.stderr[-3000:]
  assert_stopped(p.stderr)
  rows = read_lines(out)
  assert len(rows) == 2 and rows[-1]["summary"] is True and rows[-1]["n"] == 1
  r = rows[0]
  assert FIELDS <= r.keys() and r["config"] == "nokv1/3" and r["task_id"] == "HumanEval/0", r
  assert 1 <= r["output_tokens"] <= 24 and r["route"] == "disaggregated", r
  assert abs(r["prefill_flops_share"] - 20 / 30) < 1e-4, r
