#!/usr/bin/env python3
"""The service on the GPU (bench/gpu_check.sh run, after gpu_check): `tripod serve --backend cuda`
on the one GPU, with the exactness switches (POP 0, no draft worker), asked over HTTP for the
reference prompt's greedy continuation. The answer must be the CPU's fp32 reference text
(bench/gpu_reference: greedy_texts), alone, again (the decode worker's prefix cache), and for four
requests at once (decode steps batched); once with decode steps op by op and once as CUDA graphs
(TRIPOD_CUDA_GRAPHS=1). The prefill and decode workers share the GPU, so the decode worker grants
an IPC link in NCCL's place (a buffer of its memory the prefill worker maps); the first request's
KV goes in the PushKv messages while the link is set up. Which path the KV took is reported from
the workers' log lines, not asserted (the answers must be right either way).

Python's standard library only: the GPU machine has python3 but nothing can be installed there.
Also runs here on the CPU (--backend cpu --precision fp32), which is how the script is tested.
  gpu_serve_check.py --bin DIR --model M --reference ref.json [--backend cuda] [--out F.jsonl]
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request


def request(url, body=None, timeout=120):
  data = None if body is None else json.dumps(body).encode()
  req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(req, timeout=timeout) as r:
    return r.status, json.loads(r.read().decode() or "null")


def start(args, graphs):
  env = dict(os.environ, TRIPOD_CUDA_GRAPHS="1" if graphs else "0")
  cmd = [os.path.join(args.bin, "tripod"), "serve", "--port=0", f"--model={args.model}",
         f"--backend={args.backend}", "--pop=0", "--draft_workers=0"]
  if args.precision:
    cmd.append(f"--precision={args.precision}")
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True)
  log = []
  threading.Thread(target=lambda: log.extend(proc.stderr), daemon=True).start()
  line = {}
  t = threading.Thread(target=lambda: line.setdefault("l", proc.stdout.readline()), daemon=True)
  t.start()
  t.join(timeout=args.start_timeout)
  m = re.search(r"(http://127\.0\.0\.1:\d+)/v1\b", line.get("l", ""))
  if not m:
    stop(proc)
    raise RuntimeError("tripod serve did not print its URL; its log ends:\n" + "".join(log[-30:]))
  return proc, m.group(1), log


def stop(proc):
  try:
    os.killpg(proc.pid, signal.SIGTERM)
  except ProcessLookupError:
    return
  try:
    proc.wait(timeout=30)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def complete(base, model, prompt_ids, max_tokens):
  t0 = time.monotonic()
  status, r = request(base + "/v1/completions", {"model": model, "prompt": prompt_ids,
                                                 "max_tokens": max_tokens, "temperature": 0})
  elapsed = time.monotonic() - t0
  if status != 200:
    raise RuntimeError(f"completion: HTTP {status}: {r}")
  return r["choices"][0]["text"], r["usage"]["completion_tokens"], elapsed


def check(args, ref, graphs, emit):
  prompt = ref["prompt_ids"]
  texts = ref["greedy_texts"]
  n = len(texts) - 1
  proc, base, log = start(args, graphs)
  try:
    _, models = request(base + "/v1/models")
    model = models["data"][0]["id"]

    def equal(text, k):
      return 1 <= k <= n and text == texts[k]

    text, k, first_s = complete(base, model, prompt, n)
    alone = equal(text, k)
    text2, k2, again_s = complete(base, model, prompt, n)
    again = equal(text2, k2)
    results = [None] * 4

    def one(i):
      try:
        results[i] = complete(base, model, prompt, n)
      except Exception as e:  # reported below as a mismatch
        results[i] = (repr(e), 0, 0.0)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    t0 = time.monotonic()
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=300)
    batch_s = time.monotonic() - t0
    together = sum(1 for r in results if r is not None and equal(r[0], r[1]))
    ok = alone and again and together == 4
    opened = sorted(set(re.findall(r"KV link \d+ \((\w+)\) to \S+ open", "".join(log))))
    refused = re.findall(r"no KV link to \S+[^\n]*", "".join(log))
    link = ("KV link: " + ", ".join(opened)) if opened else (
        "no KV link" + (f" ({refused[0][:160]})" if refused else ""))
    mode = "CUDA graphs" if graphs else "op by op"
    print(f"  serve, decode steps {mode:11s}: {k} tokens {'equal' if alone else 'DIFFER'}, "
          f"again {'equal' if again else 'DIFFER'}, 4 at once {together}/4 equal; "
          f"{first_s * 1e3:.0f} ms, {again_s * 1e3:.0f} ms, 4 at once {batch_s * 1e3:.0f} ms; "
          f"{link}  {'ok' if ok else 'FAIL'}", flush=True)
    if not alone:
      print(f"    got {text!r}\n    want {texts[k] if 0 <= k <= n else None!r}", flush=True)
    emit({"part": "serve", "graphs": graphs, "tokens": k, "equal": alone, "again_equal": again,
          "concurrent_equal": together, "first_s": first_s, "again_s": again_s,
          "four_s": batch_s, "links": opened, "ok": ok})
    return ok
  finally:
    stop(proc)
    if args.verbose:
      sys.stdout.write("".join(log[-40:]))


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--bin", required=True, help="folder of tripod and the worker binaries")
  p.add_argument("--model", required=True)
  p.add_argument("--reference", required=True)
  p.add_argument("--backend", default="cuda")
  p.add_argument("--precision", default="")
  p.add_argument("--out", default="")
  p.add_argument("--start_timeout", type=float, default=180)
  p.add_argument("--verbose", action="store_true", help="print the end of the service's log")
  args = p.parse_args()
  with open(args.reference) as f:
    ref = json.load(f)
  out = open(args.out, "a") if args.out else None

  def emit(j):
    if out:
      out.write(json.dumps(j) + "\n")
      out.flush()

  ok = True
  for graphs in (False, True):
    try:
      ok = check(args, ref, graphs, emit) and ok
    except Exception as e:
      print(f"  serve ({'graphs' if graphs else 'op by op'}): {e}", flush=True)
      emit({"part": "serve", "graphs": graphs, "error": str(e), "ok": False})
      ok = False
  print("gpu_serve_check: " + ("all checks passed" if ok else "FAILED"), flush=True)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
