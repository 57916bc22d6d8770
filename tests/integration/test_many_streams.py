"""1000 streaming completions opened at once against one scheduler: every stream completes (16
tokens, finish_reason length, a usage chunk, [DONE]); the scheduler's resident memory, sampled
every 100 ms from /proc, stays under 200 MB; afterwards the decode worker holds no KV block, no
reservation and no running sequence.

The scheduler keeps its defaults (--max_inflight 256 at the workers, --max_queue 1024 waiting), so
the 1000 requests are all accepted and most of them wait in its queue; the decode worker runs up to
--max_running of the 256 it is sent at once and queues the rest itself. Short prompts (below
--direct_prefill_tokens) go straight to the decode worker: no prefill worker is needed.

TRIPOD_MANY_STREAMS=N runs N streams instead (local experiments).
"""

import asyncio
import json
import os
import resource
import threading
import time

import httpx2 as httpx
import pytest

from cluster import Cluster, MODEL, all_blocks_free, wait_until

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]
STREAMS = int(os.environ.get("TRIPOD_MANY_STREAMS", "1000"))
MAX_TOKENS = 16
RSS_LIMIT_MB = 200
RUN_TIMEOUT_S = 300  # all streams, opened to [DONE]
SAMPLE_EVERY_S = 0.1


def rss_mb(pid):
  """VmRSS of a live process, in MiB (None once it is gone)."""
  try:
    with open(f"/proc/{pid}/status") as f:
      for line in f:
        if line.startswith("VmRSS:"):
          return int(line.split()[1]) / 1024
  except FileNotFoundError:
    return None
  return None


class RssSampler:
  """Samples a process's VmRSS every SAMPLE_EVERY_S on its own thread (the event loop is busy)."""

  def __init__(self, pid):
    self.pid = pid
    self.samples = []
    self._stop = threading.Event()
    self._thread = threading.Thread(target=self._run, daemon=True)

  def _run(self):
    while not self._stop.is_set():
      v = rss_mb(self.pid)
      if v is not None:
        self.samples.append(v)
      self._stop.wait(SAMPLE_EVERY_S)

  def __enter__(self):
    self._thread.start()
    return self

  def __exit__(self, *exc):
    self._stop.set()
    self._thread.join(timeout=10)
    return False

  @property
  def peak(self):
    return max(self.samples)


def raise_fd_limit(need):
  """The client holds one socket per stream, and the scheduler (started after this, inheriting the
  limit) one per client: raise the soft limit of open files toward the hard one."""
  soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
  if soft != resource.RLIM_INFINITY and soft < need:
    if hard != resource.RLIM_INFINITY and hard < need:
      pytest.skip(f"{need} open files needed, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


async def one_stream(client, url, i):
  """Runs one streaming completion to its end; returns what the test checks."""
  body = {"model": MODEL_NAME, "prompt": f"Story number {i}:", "max_tokens": MAX_TOKENS,
          "ignore_eos": True, "temperature": 0.8, "seed": i, "stream": True,
          "stream_options": {"include_usage": True}}
  chunks, done = [], False
  async with client.stream("POST", url, json=body) as r:
    if r.status_code != 200:
      return {"i": i, "status": r.status_code, "body": (await r.aread()).decode(errors="replace")}
    buf = b""
    async for piece in r.aiter_bytes():
      buf += piece
      while b"\n\n" in buf:
        event, buf = buf.split(b"\n\n", 1)
        assert event.startswith(b"data: "), event
        data = event[len(b"data: "):]
        if data == b"[DONE]":
          done = True
          continue
        assert not done, f"stream {i}: an event after [DONE]"
        chunks.append(json.loads(data))
  finishes = [c["choices"][0]["finish_reason"] for c in chunks
              if c.get("choices") and c["choices"][0]["finish_reason"]]
  last = chunks[-1] if chunks else {}
  return {"i": i, "status": 200, "done": done, "finishes": finishes,
          "usage": last.get("usage") if not last.get("choices") else None,
          "errors": [c for c in chunks if "error" in c]}


async def run_all(base_url, n):
  limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
  timeout = httpx.Timeout(RUN_TIMEOUT_S, connect=60)
  async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client:
    tasks = [asyncio.create_task(one_stream(client, "/v1/completions", i)) for i in range(n)]
    try:
      return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True),
                                    RUN_TIMEOUT_S)
    finally:
      for t in tasks:
        t.cancel()


def test_1000_concurrent_streams():
  raise_fd_limit(STREAMS + 1024)
  with Cluster() as c:
    # 256 sequences in the batch at once (the scheduler sends no more: --max_inflight 256), each
    # a few prompt tokens and 16 generated: 2 blocks of 16 slots; 256 MiB holds ~700 blocks.
    decode = c.decode(kv_budget_mb=256, max_running=256)
    sched = c.scheduler(decode=[decode])
    pid = sched.proc.pid
    idle_mb = rss_mb(pid)
    started = time.monotonic()
    with RssSampler(pid) as sampler:
      results = asyncio.run(run_all(sched.url, STREAMS))
    elapsed = time.monotonic() - started
    print(f"{STREAMS} streams in {elapsed:.1f} s; scheduler RSS idle {idle_mb:.1f} MB, "
          f"peak {sampler.peak:.1f} MB over {len(sampler.samples)} samples")

    failed = [r for r in results if isinstance(r, BaseException)]
    assert not failed, f"{len(failed)} streams raised, e.g. {failed[0]!r}"
    refused = [r for r in results if r["status"] != 200]
    assert not refused, f"{len(refused)} streams refused, e.g. {refused[:3]}"
    for r in results:
      assert r["done"] and not r["errors"], r
      assert r["finishes"] == ["length"], r
      assert r["usage"] is not None and r["usage"]["completion_tokens"] == MAX_TOKENS, r
      assert r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + MAX_TOKENS, r
    assert sampler.peak < RSS_LIMIT_MB, \
        f"scheduler peak RSS {sampler.peak:.1f} MB (idle {idle_mb:.1f} MB)"
    wait_until(lambda: all_blocks_free(decode), 30, "every KV block free after the streams")
    _, health = sched.http_get("/health")
    h = json.loads(health)
    assert h["running"] == 0 and h["waiting"] == 0, h
