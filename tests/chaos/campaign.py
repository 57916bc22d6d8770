#!/usr/bin/env python3
"""Fault campaign (issue 23): a local cluster of a scheduler, two prefill workers and two decode
workers under a steady load of streaming completions (bench/serve.py's request generator: token-id
prompts from the corpus, ignore_eos, every token counted), while the campaign

  - injects KV transfer faults all along: both prefill workers drop, corrupt and delay chunks on
    their way to the decode workers (`tripod-prefill --inject_transfer_faults`, a test-only switch),
  - SIGKILLs prefill-1 a quarter of the way in,
  - SIGSTOPs decode-2 for longer than the scheduler's health timeout, then SIGCONTs it,
  - SIGKILLs decode-1 seven tenths of the way in.

Every request is counted: completed (all its tokens, then [DONE]), ended with an explicit error
(an HTTP error status with a JSON body, or an error event in the stream), lost (the stream ended
or broke without either) or hung (no end within REQUEST_TIMEOUT_S). The campaign holds when none
is lost or hung, every error names decode-1 (the decode worker that was killed under it: a request
streaming from a worker that dies cannot complete), so that every request that reached a surviving
decode worker completed, and afterwards the survivors hold no KV block, reservation, sequence or
queued request. Prints one JSON object; exit status 1 when the campaign does not hold.

  build/venv/bin/python tests/chaos/campaign.py --requests 1000

The binaries come from build/release unless TRIPOD_*_BIN say otherwise (as ctest sets them); the
short version runs in the test command (tests/integration/test_chaos.py).
"""

import argparse
import asyncio
import json
import os
import random
import re
import signal
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
for var, name in [("TRIPOD_BIN", "tripod"), ("TRIPOD_PREFILL_BIN", "tripod-prefill"),
                  ("TRIPOD_DECODE_BIN", "tripod-decode"), ("TRIPOD_DRAFT_BIN", "tripod-draft"),
                  ("TRIPOD_SCHEDULER_BIN", "tripod-scheduler"),
                  ("TRIPOD_TOKENIZE_BIN", "tests/tokenize_tool")]:
  os.environ.setdefault(var, os.path.join(REPO, "build", "release", name))
os.environ.setdefault("TRIPOD_SOURCE_DIR", REPO)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.join(REPO, "tests", "integration"))
sys.path.insert(0, os.path.join(REPO, "bench"))

import httpx2 as httpx  # noqa: E402

import serve as load  # noqa: E402  bench/serve.py
from cluster import Cluster, MODEL, corpus_prompt, wait_until  # noqa: E402

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]
REQUEST_TIMEOUT_S = 120  # a request not ended by then is "hung"
# Per data chunk. The prefill streams each layer's KV as it is done, so a prompt of ~80 tokens
# goes in ~30 chunks: about 6% of transfers lose a chunk, 6% carry a corrupted one, 14% wait.
FAULTS = "drop=0.002,corrupt=0.002,delay=0.005,delay_ms=100"


def scrape(worker, names):
  """{metric line prefix: value} of the worker's /metrics for the lines starting with `names`."""
  status, body = worker.http_get("/metrics")
  out = {}
  if status != 200:
    return out
  for line in body.splitlines():
    if line.startswith(tuple(names)):
      key, value = line.rsplit(" ", 1)
      out[key] = float(value)
  return out


def classify(result):
  """completed | error | lost, from bench/serve.py's Result."""
  if result.ok:
    return "completed"
  if result.error.startswith(("HTTP ", "error event")):
    return "error"
  return "lost"


async def run_load(base_url, prompts, n, concurrency, output_tokens, progress):
  """n streaming requests, at most `concurrency` in flight; returns [(outcome, detail)]."""
  args = SimpleNamespace(model=MODEL_NAME, output_tokens=output_tokens, base_url=base_url + "/v1",
                         strict=True)
  limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
  timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=30)
  sem = asyncio.Semaphore(concurrency)
  results = [None] * n

  async def one(i, client):
    async with sem:
      progress["started"] += 1
      try:
        r = await asyncio.wait_for(load.one_request(client, args, prompts[i % len(prompts)]),
                                   REQUEST_TIMEOUT_S)
        outcome, detail = classify(r), r.error
      except asyncio.TimeoutError:
        outcome, detail = "hung", f"no end within {REQUEST_TIMEOUT_S} s"
      # When it ended, on the events' clock: an error is read against the kills and pauses.
      if outcome != "completed":
        detail = f"{detail} (ended at t_s {time.monotonic() - progress['t0']:.2f})"
      results[i] = (outcome, detail)
      progress["ended"] += 1

  async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
    await asyncio.gather(*(one(i, client) for i in range(n)))
  return results


async def run_faults(progress, n, c, log, pause_s, health_wait_s):
  """Kills and pauses at fixed shares of the requests started; returns the events' times."""
  t0 = progress["t0"]
  events = []

  async def at_share(share):
    while progress["started"] < share * n:
      await asyncio.sleep(0.02)

  def note(what):
    events.append({"t_s": round(time.monotonic() - t0, 2), "started": progress["started"],
                   "ended": progress["ended"],
                   "event": what})
    log(f"chaos: {events[-1]}")

  await at_share(0.25)
  c["injected"]["prefill-1"] = scrape(c["p1"], ["tripod:kv_transfer_faults_injected"])
  c["p1"].signal(signal.SIGKILL)
  note("SIGKILL prefill-1")
  await at_share(0.45)
  c["d2"].signal(signal.SIGSTOP)
  note(f"SIGSTOP decode-2 for {pause_s} s")
  await asyncio.sleep(pause_s)

  def healthy_decode_workers():
    return json.loads(c["sched"].http_get("/health")[1])["healthy_decode_workers"]

  c["paused_out_of_routing"] = await asyncio.to_thread(healthy_decode_workers) == 1
  c["d2"].signal(signal.SIGCONT)
  note(f"SIGCONT decode-2 (out of routing before: {c['paused_out_of_routing']})")

  def decode_healthy():
    return healthy_decode_workers() == 2

  # decode-2 must be back in routing before decode-1 goes, or requests would meet no decode
  # worker at all (503, not what this campaign is about).
  deadline = time.monotonic() + health_wait_s
  while not await asyncio.to_thread(decode_healthy):
    if time.monotonic() > deadline:
      raise TimeoutError(f"decode-2 not back in routing {health_wait_s} s after SIGCONT")
    await asyncio.sleep(0.1)
  note("decode-2 back in routing")
  await at_share(0.70)
  c["d1"].signal(signal.SIGKILL)
  note("SIGKILL decode-1")
  return events


def campaign(n=1000, concurrency=8, output_tokens=16, pause_s=5.0, seed=1, log=print):
  """Runs the campaign; returns its report (a dict) with report["holds"] and report["why"]."""
  rng = random.Random(seed)
  ids = corpus_prompt(4096, offset=0)
  # 64-112-token prompts: long enough for the disaggregated path (prefill, KV transfer, decode).
  prompts = [ids[o:o + rng.randint(64, 112)] for o in range(0, 3900, 131)]
  with Cluster() as cl:
    p1 = cl.prefill(name="prefill-1", threads=1, chunk=64,
                    inject_transfer_faults=f"{FAULTS},seed={seed}")
    p2 = cl.prefill(name="prefill-2", threads=1, chunk=64,
                    inject_transfer_faults=f"{FAULTS},seed={seed + 1}")
    d1 = cl.decode(name="decode-1", threads=1, kv_budget_mb=48, max_running=32)
    d2 = cl.decode(name="decode-2", threads=1, kv_budget_mb=48, max_running=32)
    # Health every 300 ms with the default 1 s deadline, out of routing after 2 misses: a paused
    # or dead worker leaves routing within ~2.6 s, before the pause ends. With a 300 ms deadline
    # one CI run met six 503s "no decode worker" (not reproduced here): most likely the live
    # decode worker, busy on a loaded machine, missed two checks while the other was paused or
    # dead. The errors' times and the scheduler's routing lines are in the report since.
    sched = cl.scheduler(prefill=[p1, p2], decode=[d1, d2], direct_prefill_tokens=16,
                         health_interval_ms=300, health_timeout_ms=1000, unhealthy_after=2)
    c = {"p1": p1, "p2": p2, "d1": d1, "d2": d2, "sched": sched, "injected": {}}
    progress = {"started": 0, "ended": 0, "t0": time.monotonic()}

    async def both():
      load_task = asyncio.create_task(
          run_load(sched.url, prompts, n, concurrency, output_tokens, progress))
      fault_task = asyncio.create_task(run_faults(progress, n, c, log, pause_s, 60))
      try:
        events = await fault_task
      except BaseException:
        load_task.cancel()
        raise
      return await load_task, events

    t0 = time.monotonic()
    results, events = asyncio.run(both())
    wall_s = time.monotonic() - t0

    def quiet():
      h2 = d2.health()
      p = p2.health()
      s = json.loads(sched.http_get("/health")[1])
      return (h2.free_kv_blocks == h2.total_kv_blocks and h2.reservations == 0 and
              h2.running == 0 and p.queued == 0 and p.running == 0 and s["running"] == 0 and
              s["waiting"] == 0)

    settled = True
    try:
      wait_until(quiet, 30, "the survivors quiet after the campaign")
    except TimeoutError:
      settled = False
    h2 = d2.health()
    c["injected"]["prefill-2"] = scrape(p2, ["tripod:kv_transfer_faults_injected"])
    sched_metrics = scrape(sched, ["tripod:prefill_retries_total", "tripod:decode_reroutes_total",
                                   "tripod:request_migrations_total",
                                   "tripod:request_success_total"])
    alive = {name: w.proc.poll() is None for name, w in
             [("scheduler", sched), ("prefill-2", p2), ("decode-2", d2)]}

    counts = {}
    for outcome, _ in results:
      counts[outcome] = counts.get(outcome, 0) + 1
    errors = [d for o, d in results if o == "error"]
    foreign = [d for d in errors if d1.address not in d]
    lost = [d for o, d in results if o in ("lost", "hung")]
    injected = {}
    for per_worker in c["injected"].values():
      for key, v in per_worker.items():
        kind = re.search(r'kind="(\w+)"', key).group(1)
        injected[kind] = injected.get(kind, 0) + int(v)
    why = []
    if lost:
      why.append(f"{len(lost)} requests lost or hung, e.g. {lost[:3]}")
    if foreign:
      why.append(f"{len(foreign)} errors not from the killed decode worker, e.g. {foreign[:3]}")
      # What the scheduler saw of its workers meanwhile (health misses, failures marked).
      with open(sched.log_path, "rb") as f:
        lines = f.read().decode(errors="replace").splitlines()
      why.append([ln for ln in lines if "routing" in ln][-12:])
    if not settled:
      why.append("the survivors did not settle")
    if h2.free_kv_blocks != h2.total_kv_blocks or h2.reservations or h2.running:
      why.append(f"decode-2 holds KV afterwards: {h2}")
    if not c.get("paused_out_of_routing"):
      why.append("the paused decode worker was still in routing at the end of its pause")
    if not all(alive.values()):
      why.append(f"a surviving process died: {alive}")
    return {
        "requests": n, "concurrency": concurrency, "output_tokens": output_tokens,
        "wall_s": round(wall_s, 1), "outcomes": counts, "events": events,
        "faults_injected": injected, "scheduler": sched_metrics,
        "errors_from_killed_decode": len(errors) - len(foreign),
        "decode_2_blocks_free": f"{h2.free_kv_blocks}/{h2.total_kv_blocks}",
        "holds": not why, "why": why}


def main(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--requests", type=int, default=1000)
  p.add_argument("--concurrency", type=int, default=8)
  p.add_argument("--output_tokens", type=int, default=16)
  p.add_argument("--pause_s", type=float, default=5.0)
  p.add_argument("--seed", type=int, default=1)
  a = p.parse_args(argv)
  report = campaign(a.requests, a.concurrency, a.output_tokens, a.pause_s, a.seed,
                    log=lambda m: print(m, file=sys.stderr))
  print(json.dumps(report))
  return 0 if report["holds"] else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
