#!/usr/bin/env python3
"""Soak (issue 23; a script a person runs, outside the test command): a scheduler, a prefill
worker and a decode worker on loopback under a steady load of streaming completions for --minutes
(bench/serve.py's request generator, --concurrency in flight, one request in --abort_every hung up
after its first token), sampling every process's resident memory and open file descriptors every
--sample_s. The first third of the run is the warm-up (the KV pool's pages, the allocators' arenas
and gRPC's buffers reach their working size); over the rest, resident memory may grow at most
--max_growth_mb per process and the descriptors not at all (within 2: a connection being
replaced). Prints one JSON line per sample and a summary; exit status 1 when memory or descriptors
are not flat, a request failed or a process died.

  build/venv/bin/python tests/chaos/soak.py --minutes 30
"""

import argparse
import asyncio
import json
import os
import random
import sys
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import campaign  # noqa: E402,F401  sets the binaries' environment and the import paths
import httpx2 as httpx  # noqa: E402

import serve as load  # noqa: E402  bench/serve.py
from cluster import Cluster, corpus_prompt, wait_until  # noqa: E402


def rss_mb(pid):
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  return None


def open_fds(pid):
  return len(os.listdir(f"/proc/{pid}/fd"))


async def aborting_request(client, base_url, prompt, model):
  """A streaming completion whose client hangs up after the first token."""
  body = {"model": model, "prompt": prompt, "max_tokens": 16, "ignore_eos": True,
          "temperature": 0, "stream": True}
  async with client.stream("POST", base_url + "/v1/completions", json=body) as r:
    if r.status_code != 200:
      return f"HTTP {r.status_code}"
    async for line in r.aiter_lines():
      if line.startswith("data:"):
        return ""
  return "no event before the end"


async def drive(base_url, prompts, minutes, concurrency, abort_every, output_tokens, stats):
  args = SimpleNamespace(model=campaign.MODEL_NAME, output_tokens=output_tokens,
                         base_url=base_url + "/v1", strict=True)
  end = time.monotonic() + 60 * minutes
  timeout = httpx.Timeout(campaign.REQUEST_TIMEOUT_S, connect=30)
  async with httpx.AsyncClient(timeout=timeout) as client:

    async def worker(k):
      rng = random.Random(k)
      i = 0
      while time.monotonic() < end:
        i += 1
        prompt = prompts[rng.randrange(len(prompts))]
        try:
          if abort_every and i % abort_every == 0:
            err = await asyncio.wait_for(
                aborting_request(client, base_url, prompt, campaign.MODEL_NAME),
                campaign.REQUEST_TIMEOUT_S)
            stats["aborted"] += 1
          else:
            r = await asyncio.wait_for(load.one_request(client, args, prompt),
                                       campaign.REQUEST_TIMEOUT_S)
            err = r.error
            stats["completed"] += r.ok
        except asyncio.TimeoutError:
          err = "hung"
        if err:
          stats["failed"].append(err)

    await asyncio.gather(*(worker(k) for k in range(concurrency)))


async def sample_loop(procs, minutes, sample_s, samples):
  t0 = time.monotonic()
  end = t0 + 60 * minutes
  while True:
    row = {"t_s": round(time.monotonic() - t0)}
    for name, w in procs.items():
      if w.proc.poll() is None:
        row[name] = {"rss_mb": round(rss_mb(w.proc.pid), 1), "fds": open_fds(w.proc.pid)}
      else:
        row[name] = None
    samples.append(row)
    print(json.dumps(row), flush=True)
    if time.monotonic() >= end:
      return
    await asyncio.sleep(min(sample_s, max(0.0, end - time.monotonic())))


def main(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--minutes", type=float, default=30)
  p.add_argument("--sample_s", type=float, default=30)
  p.add_argument("--concurrency", type=int, default=4)
  p.add_argument("--output_tokens", type=int, default=32)
  p.add_argument("--abort_every", type=int, default=10)
  p.add_argument("--max_growth_mb", type=float, default=32)
  a = p.parse_args(argv)
  ids = corpus_prompt(4096, offset=0)
  rng = random.Random(1)
  prompts = [ids[o:o + rng.randint(48, 160)] for o in range(0, 3900, 97)]
  with Cluster() as c:
    prefill = c.prefill(threads=1, chunk=64)
    decode = c.decode(threads=1, kv_budget_mb=48, max_running=32)
    sched = c.scheduler(prefill=[prefill], decode=[decode], direct_prefill_tokens=16)
    procs = {"scheduler": sched, "prefill": prefill, "decode": decode}
    stats = {"completed": 0, "aborted": 0, "failed": []}
    samples = []

    async def both():
      await asyncio.gather(
          drive(sched.url, prompts, a.minutes, a.concurrency, a.abort_every, a.output_tokens,
                stats),
          sample_loop(procs, a.minutes, a.sample_s, samples))

    asyncio.run(both())
    wait_until(lambda: decode.health().running == 0 and decode.health().reservations == 0, 60,
               "the decode worker idle after the soak")
    h = decode.health()
    warm = samples[len(samples) // 3]
    last = samples[-1]
    why = []
    growth = {}
    for name in procs:
      if last[name] is None:
        why.append(f"{name} died")
        continue
      growth[name] = {"rss_mb": round(last[name]["rss_mb"] - warm[name]["rss_mb"], 1),
                      "fds": last[name]["fds"] - warm[name]["fds"]}
      if growth[name]["rss_mb"] > a.max_growth_mb:
        why.append(f"{name} resident memory grew {growth[name]['rss_mb']} MB after the warm-up")
      if abs(growth[name]["fds"]) > 2:
        why.append(f"{name} open descriptors changed by {growth[name]['fds']} after the warm-up")
    if stats["failed"]:
      why.append(f"{len(stats['failed'])} requests failed, e.g. {stats['failed'][:3]}")
    if h.free_kv_blocks != h.total_kv_blocks:
      why.append(f"the decode worker holds KV blocks afterwards: {h}")
    summary = {"minutes": a.minutes, "completed": stats["completed"], "aborted": stats["aborted"],
               "failed": len(stats["failed"]), "after_warmup": {"t_s": warm["t_s"]},
               "growth_after_warmup": growth, "end": last, "holds": not why, "why": why}
    print(json.dumps(summary))
    return 0 if not why else 1


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
