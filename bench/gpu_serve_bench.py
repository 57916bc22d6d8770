#!/usr/bin/env python3
"""The service's speed on one GPU, through its HTTP API (bench/gpu_check.sh run, part 5): `tripod
serve --backend cuda` on a model of a real model's shape (bench/gpu_random_model.py makes it on
the GPU machine), measured three ways, one fresh service each:

  two processes   a prefill and a decode worker on the one GPU (the KV over their link: CUDA IPC
                  where the device allows it, else the PushKv messages), decode steps op by op;
  one process     --prefill_workers 0: the decode worker prefills the prompt itself;
  graphs          two processes again, decode steps as CUDA graphs (TRIPOD_CUDA_GRAPHS=1).

What each prints (and writes as a JSON line with --out):
  ttft            median time of a one-token completion of a --ttft_tokens prompt (distinct random
                  prompts, so no prefix-cache hit), after one warm-up request; the KV bytes the
                  scheduler saw moved;
  streams S       S concurrent greedy requests (--prompt_tokens random ids, --max_tokens output
                  tokens with ignore_eos): output tokens/s over the wall time, and against the rate
                  a decode step bound by reading the weights and the streams' KV at the copy
                  bandwidth would give (--copy_gbs, or the copy_bytes_per_s bench/gpu_check
                  wrote into --gpu_check_jsonl);
and the comparisons the issue asks for: two-process TTFT over one-process TTFT; graphs' tokens
equal to op by op's (the same prompts, greedy) and their speed-up.

Python's standard library only (the GPU machine has nothing else). Runs on the CPU too
(--backend cpu), which is how it is tested (tests/integration/test_gpu_serve_bench.py).
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "eval"))
import gpu_random_model  # noqa: E402  (the GGUF header reader)
import humaneval  # noqa: E402  (serve_targets, counter_total; standard library only at import)


def request(url, body=None, timeout=300):
  data = None if body is None else json.dumps(body).encode()
  req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(req, timeout=timeout) as r:
    return json.loads(r.read().decode() or "null")


class Service:
  """`tripod serve` on free ports for a `with`; its whole process group stopped on exit."""

  def __init__(self, args, one_process, graphs):
    self.args, self.one_process, self.graphs = args, one_process, graphs
    self.proc, self.log, self.tmp = None, [], None

  def __enter__(self):
    a = self.args
    self.tmp = tempfile.mkdtemp(prefix="gpu-serve-bench-")
    targets = os.path.join(self.tmp, "targets.json")
    cmd = [os.path.join(a.bin, "tripod"), "serve", "--port=0", f"--model={a.model}",
           f"--backend={a.backend}", "--pop=0", "--draft_workers=0",
           f"--prometheus_targets={targets}",
           f"--prefill_workers={0 if self.one_process else 1}"] + a.serve_arg
    env = dict(os.environ, TRIPOD_CUDA_GRAPHS="1" if self.graphs else "0")
    self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env, start_new_session=True)
    threading.Thread(target=lambda: self.log.extend(self.proc.stderr), daemon=True).start()
    line = {}
    t = threading.Thread(target=lambda: line.setdefault("l", self.proc.stdout.readline()),
                         daemon=True)
    t.start()
    t.join(timeout=a.start_timeout)
    m = re.search(r"(http://127\.0\.0\.1:\d+)/v1\b", line.get("l", ""))
    try:
      if not m:
        raise RuntimeError("tripod serve did not print its URL; its log ends:\n" +
                           "".join(self.log[-30:]))
      self.base = m.group(1)
      by_name = humaneval.serve_targets(targets, self.proc, 60)
      self.scheduler_metrics = f"http://{by_name['scheduler']}/metrics"
      self.model = request(self.base + "/v1/models")["data"][0]["id"]
    except BaseException:
      self.__exit__()
      raise
    return self

  def __exit__(self, *exc):
    if self.proc is not None and self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(timeout=60)
      except ProcessLookupError:
        pass
      except subprocess.TimeoutExpired:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
    if self.tmp:
      for f in os.listdir(self.tmp):
        os.unlink(os.path.join(self.tmp, f))
      os.rmdir(self.tmp)
    return False

  def complete(self, ids, max_tokens):
    """(text, completion tokens, seconds) of one greedy completion."""
    t0 = time.monotonic()
    r = request(self.base + "/v1/completions",
                {"model": self.model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                 "ignore_eos": True}, timeout=self.args.request_timeout)
    return r["choices"][0]["text"], r["usage"]["completion_tokens"], time.monotonic() - t0

  def links(self):
    """The KV links the workers opened (from their log lines)."""
    return sorted(set(re.findall(r"KV link \d+ \((\w+)\) to \S+ open", "".join(self.log))))


def prompts(n, length, vocab, seed):
  """n distinct random prompts of token ids (their first tokens differ: no prefix-cache hit)."""
  rng = random.Random(seed)
  lo = min(1000, vocab // 4)
  return [[lo + (i * 7919) % (vocab - lo)] + [rng.randrange(lo, vocab) for _ in range(length - 1)]
          for i in range(n)]


def median(v):
  v = sorted(v)
  n = len(v)
  return (v[n // 2] + v[(n - 1) // 2]) / 2


def measure_ttft(svc, args, vocab, seed):
  ps = prompts(args.ttft_requests + 1, args.ttft_tokens, vocab, seed)
  svc.complete(ps[0], 1)  # warm-up: first use of the shapes, the KV link's set-up
  before = humaneval.counter_total(svc.scheduler_metrics, "tripod:kv_transfer_bytes_total")
  times = [svc.complete(p, 1)[2] for p in ps[1:]]
  moved = humaneval.counter_total(svc.scheduler_metrics, "tripod:kv_transfer_bytes_total") - before
  return {"ttft_p50_s": median(times), "ttft_s": times,
          "kv_bytes_per_request": moved / len(times)}


def measure_streams(svc, args, n, vocab, seed):
  ps = prompts(n, args.prompt_tokens, vocab, seed)
  results, errors = [None] * n, []

  def one(i):
    try:
      results[i] = svc.complete(ps[i], args.max_tokens)
    except Exception as e:  # noqa: BLE001 (counted and reported)
      errors.append(repr(e))

  threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
  t0 = time.monotonic()
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=args.request_timeout)
  wall = time.monotonic() - t0
  if errors or any(r is None for r in results):
    raise RuntimeError(f"{n} streams: {len(errors)} failed: {errors[:1]}")
  tokens = sum(r[1] for r in results)
  return {"output_tokens": tokens, "wall_s": wall, "output_tok_s": tokens / wall,
          "texts": [r[0] for r in results]}


def model_bytes(path):
  """(bf16 bytes of every weight but the token embedding, KV bytes per token at f16) from the
  GGUF header: what one decode step reads on the device besides the KV."""
  with open(path, "rb") as f:
    meta, tensors, _ = gpu_random_model.parse_header(f.read(64 << 20))
  arch = meta["general.architecture"]
  elements = 0
  for name, dims, _, _ in tensors:
    if name != "token_embd.weight":
      n = 1
      for d in dims:
        n *= d
      elements += n
  heads = meta[f"{arch}.attention.head_count"]
  head_dim = meta.get(f"{arch}.attention.key_length") or meta[f"{arch}.embedding_length"] // heads
  kv_heads = meta.get(f"{arch}.attention.head_count_kv") or heads
  kv_per_token = meta[f"{arch}.block_count"] * 2 * kv_heads * head_dim * 2
  vocab = next(d[1] for name, d, _, _ in tensors if name == "token_embd.weight")
  return 2 * elements, kv_per_token, vocab


def copy_bandwidth(args):
  if args.copy_gbs:
    return args.copy_gbs * 1e9
  if args.gpu_check_jsonl and os.path.exists(args.gpu_check_jsonl):
    with open(args.gpu_check_jsonl) as f:
      for line in f:
        j = json.loads(line)
        if j.get("copy_bytes_per_s"):
          return j["copy_bytes_per_s"]
  return None


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--bin", required=True, help="folder of tripod and the worker binaries")
  p.add_argument("--model", required=True)
  p.add_argument("--backend", default="cuda")
  p.add_argument("--ttft_tokens", type=int, default=2048)
  p.add_argument("--ttft_requests", type=int, default=5)
  p.add_argument("--streams", default="16,64")
  p.add_argument("--prompt_tokens", type=int, default=512)
  p.add_argument("--max_tokens", type=int, default=128)
  p.add_argument("--copy_gbs", type=float, default=0, help="device copy bandwidth, GB/s")
  p.add_argument("--gpu_check_jsonl", default="", help="bench/gpu_check's lines (copy rate)")
  p.add_argument("--serve_arg", action="append", default=[], help="one more tripod serve flag")
  p.add_argument("--start_timeout", type=float, default=300)
  p.add_argument("--request_timeout", type=float, default=300)
  p.add_argument("--out", default="")
  args = p.parse_args(argv)
  streams = [int(s) for s in args.streams.split(",") if s]
  weight_bytes, kv_per_token, vocab = model_bytes(args.model)
  copy_bw = copy_bandwidth(args)
  out = open(args.out, "a") if args.out else None

  def emit(j):
    j = {"part": "serve_bench", "backend": args.backend, **j}
    if out:
      out.write(json.dumps(j) + "\n")
      out.flush()

  runs = [("two processes", False, False), ("one process", True, False),
          ("graphs", False, True)]
  got = {}
  ok = True
  for label, one_process, graphs in runs:
    try:
      t0 = time.monotonic()
      with Service(args, one_process, graphs) as svc:
        start_s = time.monotonic() - t0
        r = {"run": label, "one_process": one_process, "graphs": graphs, "start_s": start_s}
        r.update(measure_ttft(svc, args, vocab, seed=1))
        print(f"  {label:13s} ttft at {args.ttft_tokens} tokens: p50 {r['ttft_p50_s'] * 1e3:.1f}"
              f" ms, KV moved {r['kv_bytes_per_request'] / 1e6:.1f} MB a request", flush=True)
        r["streams"] = {}
        for n in ([] if one_process else streams):
          s = measure_streams(svc, args, n, vocab, seed=100 + n)
          # A step reads the weights and every stream's KV (the mean context over the run).
          ctx = args.prompt_tokens + args.max_tokens / 2
          bound = (n * copy_bw / (weight_bytes + n * ctx * kv_per_token)) if copy_bw else None
          s["bound_tok_s"] = bound
          s["of_bound"] = s["output_tok_s"] / bound if bound else None
          r["streams"][n] = s
          print(f"  {label:13s} {n:3d} streams: {s['output_tok_s']:9.1f} output tok/s"
                + (f", {100 * s['of_bound']:.0f}% of the copy-bound {bound:.0f}" if bound else ""),
                flush=True)
        r["links"] = svc.links()
      got[label] = r
      emit({k: v for k, v in r.items() if k != "streams"} |
           {"streams": {n: {k: v for k, v in s.items() if k != "texts"}
                        for n, s in r["streams"].items()}})
    except Exception as e:  # noqa: BLE001 (reported; the other runs go on)
      print(f"  {label}: {e}", flush=True)
      emit({"run": label, "error": str(e)})
      ok = False
  summary = {"run": "summary", "weight_bytes_bf16": weight_bytes,
             "kv_bytes_per_token": kv_per_token,
             "copy_bytes_per_s": copy_bw}
  two, one, gr = got.get("two processes"), got.get("one process"), got.get("graphs")
  if two and one:
    summary["ttft_two_over_one"] = two["ttft_p50_s"] / one["ttft_p50_s"]
    print(f"  TTFT two processes / one: {summary['ttft_two_over_one']:.3f} (goal <= 1.15)")
  if two and gr:
    for n in streams:
      a, b = two["streams"][n], gr["streams"][n]
      same = sum(x == y for x, y in zip(a["texts"], b["texts"]))
      summary[f"graphs_equal_{n}"] = same
      summary[f"graphs_speedup_{n}"] = b["output_tok_s"] / a["output_tok_s"]
      print(f"  graphs at {n} streams: {same}/{n} outputs equal to op by op's, "
            f"{summary[f'graphs_speedup_{n}']:.2f}x the tokens/s")
  emit(summary)
  print("gpu_serve_bench: " + ("done" if ok else "FAILED"), flush=True)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
