#!/usr/bin/env python3
"""Accuracy-aware goodput: what each approximation buys in speed and costs in task score.

Every configuration is served by `tripod serve` (on free ports, reaped afterwards) and given the
same mixed workload at a fixed concurrency: HumanEval problems (greedy, Codex's stop sequences,
checked in eval/humaneval.py's sandbox) and RULER-style long-context samples (`tripod
eval-longctx --samples_out`: chat-rendered token ids, scored as eval-longctx scores them). It
prints one JSON line per configuration: output tokens/s over the run, TTFT p50/p99 (all, and per
kind), the HumanEval pass rate, the long-context mean score, and `score`, the mean of the two (the
kinds present). `--plot` draws score against TTFT p50, one point per configuration (matplotlib).

  bench/goodput.py --model qwen2.5-coder-1.5b-instruct --humaneval 24 \\
      --longctx niah_single:4096:8,niah_multikey:4096:8 --concurrency 4 \\
      --out docs/results/goodput_qwen15.jsonl --plot docs/images/goodput_qwen15.png

Configurations (name: `tripod serve --pop`, the requests' `tripod` object):
  full        0     {"pop": "off"}
  pop0.2      0.2   {"pop": "0.2"}
  pop1/3      1/3   {"pop": "1/3"}
  speckv1/4   0     SpecKV at a quarter of the prompt's KV (draft workers on)
  specpc1/4   0     SpecPC at a quarter of the prompt (draft workers on)
  speckv1/8, specpc1/8: the same at an eighth.
  speckv1/4+pop1/3, specpc1/4+pop1/3: the method over a POP 1/3 prefill.
  pop<ratio>  any other POP ratio by name, e.g. pop0.1 or pop3/28.
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time

SOURCE_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "eval"))
import humaneval as he  # noqa: E402  (the sandboxed checker and `tripod serve` wrapper)


def _method(name, budget):
  return {"method": name, "budget": budget}


CONFIGS = {
    "full": ("0", {"pop": "off"}, False),
    "pop0.2": ("0.2", {"pop": "0.2"}, False),
    "pop1/3": ("1/3", {"pop": "1/3"}, False),
    "speckv1/4": ("0", {"pop": "off", **_method("speckv", 0.25)}, True),
    "specpc1/4": ("0", {"pop": "off", **_method("specpc", 0.25)}, True),
    "speckv1/8": ("0", {"pop": "off", **_method("speckv", 0.125)}, True),
    "specpc1/8": ("0", {"pop": "off", **_method("specpc", 0.125)}, True),
    "speckv1/4+pop1/3": ("1/3", {"pop": "1/3", **_method("speckv", 0.25)}, True),
    "specpc1/4+pop1/3": ("1/3", {"pop": "1/3", **_method("specpc", 0.25)}, True),
}


def config_spec(name):
  """(serve --pop, the requests' tripod object, draft workers on) of a configuration's name."""
  if name in CONFIGS:
    return CONFIGS[name]
  serve_pop, request_pop, variant = he.config_spec(name)  # ValueError for an unknown name
  if variant is not None:
    raise ValueError(f"{name}: POP's controls are eval/humaneval.py's, not goodput configurations")
  return serve_pop, {"pop": request_pop}, False


def percentile(values, q):
  """The q-quantile by linear interpolation (numpy's default), None for no values."""
  if not values:
    return None
  v = sorted(values)
  pos = (len(v) - 1) * q
  lo = int(pos)
  hi = min(lo + 1, len(v) - 1)
  return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def score_longctx(sample, output):
  """eval/longctx_tasks.cc's ScoreLongCtxOutput: case-insensitive containment (share for recall)."""
  out = output.lower()
  answers = sample["answers"]
  if not answers:
    return 0.0
  if sample["recall"]:
    return sum(a.lower() in out for a in answers) / len(answers)
  return 1.0 if answers[0].lower() in out else 0.0


def longctx_samples(tripod, model, spec, seed):
  """spec "task:length:count,...": the samples, made by `tripod eval-longctx --samples_out`."""
  out = []
  for part in filter(None, spec.split(",")):
    task, length, count = part.split(":")
    with tempfile.TemporaryDirectory(prefix="goodput-") as tmp:
      path = os.path.join(tmp, "samples.jsonl")
      subprocess.run([tripod, "eval-longctx", f"--model={model}", f"--tasks={task}",
                      f"--lengths={length}", f"--samples={count}", f"--seed={seed}",
                      f"--samples_out={path}"], check=True, stdout=subprocess.DEVNULL,
                     timeout=600)
      with open(path) as f:
        out += [json.loads(line) for line in f]
  return out


def workload(args):
  """The requests, in one seeded order shared by every configuration."""
  reqs = []
  for p in he.load_problems()[:args.humaneval]:
    reqs.append({"kind": "humaneval", "id": p["task_id"], "prompt": p["prompt"],
                 "max_tokens": args.max_tokens, "stop": he.STOP, "problem": p})
  for s in longctx_samples(args.tripod, args.model, args.longctx, args.seed):
    reqs.append({"kind": "longctx", "id": f"{s['task']}@{s['length']}#{s['sample']}",
                 "prompt": s["prompt"], "max_tokens": s["max_tokens"], "stop": None,
                 "sample": s})
  random.Random(args.seed).shuffle(reqs)
  return reqs


def method_outcome(method, prompt_tokens):
  """What the scheduler did with a request's method (its response's tripod.method): "applied",
  "whole" (the budget kept the whole prompt: under the floor), "fallback: <why>", or None when
  the request named no method."""
  if method is None:
    return None
  if not method.get("applied"):
    return f"fallback: {method.get('fallback')}"
  kept_all = method.get("kv_entries") is None and method.get("prompt_tokens") == prompt_tokens
  return "whole" if kept_all else "applied"


def one_request(client, model, req, options, timeout_s):
  """Streams one greedy completion (eval/humaneval.py's): (text, output tokens, ttft_s, route,
  method outcome)."""
  info = {}
  text, n_prompt, n_out, ttft, route = he.complete(client, model, req["prompt"], options,
                                                   req["max_tokens"], timeout_s,
                                                   stop=req["stop"], info=info)
  return text, n_out, ttft, route, method_outcome(info.get("method"), n_prompt)


def run_config(args, name, reqs):
  import openai
  serve_pop, options, draft = config_spec(name)
  extra = list(args.serve_arg) + ([f"--draft_workers={args.draft_workers}"] if draft else [])
  results = [None] * len(reqs)
  errors = []
  with he.Serve(args.tripod, args.model, serve_pop, args.start_timeout_s, extra) as serve:
    client = openai.OpenAI(base_url=serve.base_url, api_key="unused", max_retries=0)
    next_index = iter(range(len(reqs)))
    lock = threading.Lock()

    def worker():
      while True:
        with lock:
          i = next(next_index, None)
        if i is None or errors:
          return
        try:
          results[i] = one_request(client, serve.served_name, reqs[i], options,
                                   args.request_timeout_s)
        except Exception as e:  # noqa: BLE001 (reported, and the run fails below)
          errors.append(f"{reqs[i]['id']}: {e!r}")

    def kv_bytes():
      return {k: he.counter_total(serve.scheduler_metrics, f"tripod:kv_transfer_bytes_{k}total")
              for k in ("", "saved_")}

    kv_before = kv_bytes()
    start = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(args.concurrency)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    wall = time.monotonic() - start
    kv_after = kv_bytes()
  # The KV payload prefill workers sent for these requests, and what trimming kept from being sent
  # (SpecKV sends budget / prompt of the full bytes).
  kv_sent = kv_after[""] - kv_before[""]
  kv_saved = kv_after["saved_"] - kv_before["saved_"]
  if errors:
    raise RuntimeError(f"goodput: {name}: {len(errors)} request(s) failed, first: {errors[0]}")

  ttft = {"humaneval": [], "longctx": []}
  scores = {"humaneval": [], "longctx": []}
  out_tokens = 0
  routes = {}  # per kind: the route the scheduler reported for each request
  methods = {}  # per kind: what became of the requests' method (method_outcome)
  for req, (text, n_out, t, route, outcome) in zip(reqs, results):
    out_tokens += n_out
    kind_routes = routes.setdefault(req["kind"], {})
    kind_routes[str(route)] = kind_routes.get(str(route), 0) + 1
    if outcome is not None:
      kind_methods = methods.setdefault(req["kind"], {})
      kind_methods[outcome] = kind_methods.get(outcome, 0) + 1
    ttft[req["kind"]].append(t)
    if req["kind"] == "humaneval":
      scores["humaneval"].append(
          1.0 if he.check_completion(req["problem"], text, args.check_timeout_s)["passed"]
          else 0.0)
    else:
      scores["longctx"].append(score_longctx(req["sample"], text))
  kind_means = {k: sum(v) / len(v) for k, v in scores.items() if v}
  every = ttft["humaneval"] + ttft["longctx"]

  def r(x, d=4):
    return None if x is None else round(x, d)

  return {
      "bench": "goodput", "model": args.model, "config": name, "serve_pop": serve_pop,
      "tripod": options, "serve_args": extra, "concurrency": args.concurrency,
      "requests": len(reqs),
      "humaneval_problems": len(scores["humaneval"]), "longctx_samples": len(scores["longctx"]),
      "longctx": args.longctx, "wall_s": r(wall, 2), "output_tokens": out_tokens,
      "output_tok_s": r(out_tokens / wall, 2),
      "ttft_p50_s": r(percentile(every, 0.5)), "ttft_p99_s": r(percentile(every, 0.99)),
      "humaneval_ttft_p50_s": r(percentile(ttft["humaneval"], 0.5)),
      "longctx_ttft_p50_s": r(percentile(ttft["longctx"], 0.5)),
      "humaneval_pass": r(kind_means.get("humaneval")),
      "longctx_score": r(kind_means.get("longctx")),
      "score": r(sum(kind_means.values()) / len(kind_means)),
      "kv_transfer_bytes": int(kv_sent), "kv_transfer_bytes_saved": int(kv_saved),
      "kv_transfer_share": r(kv_sent / (kv_sent + kv_saved)) if kv_sent + kv_saved else None,
      "routes": routes, "methods": methods,
  }


def plot(rows, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  xs = [row["ttft_p50_s"] for row in rows]
  ys = [row["score"] for row in rows]
  span_x = (max(xs) - min(xs)) or 1.0
  span_y = (max(ys) - min(ys)) or 1.0
  placed = []  # points already labelled, in shares of the axes' spans
  for row in rows:
    x, y = row["ttft_p50_s"], row["score"]
    ax.scatter(x, y, s=36)
    # A label near an earlier point's goes below its own point, so that the two stay readable.
    near = sum(abs(x - px) / span_x < 0.15 and abs(y - py) / span_y < 0.08 for px, py in placed)
    placed.append((x, y))
    ax.annotate(f"{row['config']} ({row['output_tok_s']:.1f} tok/s)", (x, y),
                textcoords="offset points", xytext=(5, 4 - 12 * near), fontsize=8)
  ax.set_xlabel("TTFT p50 (s)")
  ax.set_ylabel("task score (HumanEval and long-context mean)")
  first = rows[0]
  ax.set_title(f"{first['model']}: {first['requests']} requests at concurrency "
               f"{first['concurrency']}", fontsize=9)
  ax.grid(True, alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
  ap.add_argument("--tripod", default=os.environ.get("TRIPOD_BIN") or
                  os.path.join(SOURCE_DIR, "build", "release", "tripod"))
  ap.add_argument("--configs", default="full,pop0.2,pop1/3,speckv1/4,specpc1/4",
                  help="comma-separated, from: " + ", ".join(CONFIGS))
  ap.add_argument("--humaneval", type=int, default=24, help="the first N HumanEval problems")
  ap.add_argument("--longctx", default="niah_single:4096:8,niah_multikey:4096:8",
                  help="task:length:count,... (empty: none)")
  ap.add_argument("--concurrency", type=int, default=4)
  ap.add_argument("--max-tokens", type=int, default=512, help="HumanEval's output limit")
  ap.add_argument("--draft-workers", type=int, default=1)
  ap.add_argument("--seed", type=int, default=1)
  ap.add_argument("--check-timeout-s", type=float, default=10.0)
  ap.add_argument("--request-timeout-s", type=float, default=1800.0)
  ap.add_argument("--start-timeout-s", type=float, default=600.0)
  ap.add_argument("--serve-arg", action="append", default=[],
                  help="one more `tripod serve` flag (repeatable)")
  ap.add_argument("--out", help="also append the JSON lines to this file")
  ap.add_argument("--plot", help="score against TTFT p50 into this image (.png)")
  args = ap.parse_args(argv)
  configs = [c for c in args.configs.split(",") if c]
  unknown = []
  for c in configs:
    try:
      config_spec(c)
    except ValueError:
      unknown.append(c)
  if unknown or not configs:
    ap.error(f"--configs: unknown {unknown}" if unknown else "--configs is empty")
  if args.concurrency < 1 or args.humaneval < 0:
    ap.error("--concurrency must be >= 1 and --humaneval >= 0")
  reqs = workload(args)
  if not reqs:
    ap.error("no requests: give --humaneval or --longctx")
  rows = []
  for name in configs:
    row = run_config(args, name, reqs)
    rows.append(row)
    print(json.dumps(row), flush=True)
    if args.out:
      with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
  if args.plot:
    plot(rows, args.plot)
  return 0


if __name__ == "__main__":
  sys.exit(main())
