#!/usr/bin/env python3
"""Summarises `tripod eval-longctx --out ROWS` files (one JSON line per sample, method, budget and
POP setting) into the markdown tables of docs/draft.md: accuracy per task and length (with
Wilson 95% intervals), the mean over the tasks the model can do with the full KV, each method's
share of the full-KV mean at each budget, SpecPC's prefill time against the full prefill's, and
the KV bytes against the budget.

  scripts/longctx_summary.py ROWS.jsonl [ROWS2.jsonl ...] [--min_full 0.2]
      [--override MORE.jsonl ...]

--override takes a later run's rows for the methods it holds, on the samples both runs hold (its
full rows only check that both runs' full KV agreed): how a method's rows are redone without the
rest.
"""

import argparse
import collections
import json
import math

METHODS = ["speckv", "specpc", "draftmap", "snapkv", "pyramidkv", "streamingllm", "keeplast"]


def wilson(p, k):
  if k == 0:
    return 0.0, 1.0
  z = 1.96
  centre = (p + z * z / (2 * k)) / (1 + z * z / k)
  half = z * math.sqrt(p * (1 - p) / k + z * z / (4 * k * k)) / (1 + z * z / k)
  return max(0.0, centre - half), min(1.0, centre + half)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("rows", nargs="+")
  ap.add_argument("--min_full", type=float, default=0.2,
                  help="tasks whose full-KV accuracy is below this (at a length) are left out of "
                  "the means: the model cannot do them")
  ap.add_argument("--override", nargs="*", default=[],
                  help="rows of a later run replacing the base rows of the methods they hold")
  args = ap.parse_args()
  rows = [json.loads(line) for path in args.rows for line in open(path) if line.strip()]
  sample_key = lambda r: (r["task"], r["length"], r["sample"], r["pop"])
  for path in args.override:
    more = [json.loads(line) for line in open(path) if line.strip()]
    methods = {r["method"] for r in more} - {"full"}
    base_full = {sample_key(r): r["accuracy"] for r in rows if r["method"] == "full"}
    # Only the samples both runs hold: every column then averages the same samples.
    more = [r for r in more if sample_key(r) in base_full]
    same = [base_full[sample_key(r)] == r["accuracy"] for r in more if r["method"] == "full"]
    print(f"{path}: {', '.join(sorted(methods))} from it; its full KV scored as the base run's "
          f"on {sum(same)} of the {len(same)} samples both runs hold\n")
    rows = [r for r in rows if r["method"] not in methods]
    rows += [r for r in more if r["method"] in methods]
  acc = collections.defaultdict(list)
  prefill = collections.defaultdict(list)
  kv = collections.defaultdict(list)
  for r in rows:
    key = (r["task"], r["length"], r["method"], r["budget"], r["pop"])
    acc[key].append(r["accuracy"])
    prefill[key].append(r["prefill_s"])
    kv[key].append(r["kv_bytes"])
  mean = lambda xs: sum(xs) / len(xs)
  tasks = sorted({k[0] for k in acc})
  lengths = sorted({k[1] for k in acc})
  budgets = sorted({k[3] for k in acc if k[2] != "full" and k[3] < 1})
  pops = sorted({k[4] for k in acc})

  print("### Accuracy per task (mean over samples; full KV with its 95% interval)\n")
  header = "| task | length | POP | n | full | " + " | ".join(
      f"{m} {b:g}" for b in budgets for m in METHODS) + " |"
  print(header)
  print("|" + " --- |" * (header.count("|") - 1))
  for length in lengths:
    for pop in pops:
      for t in tasks:
        full = acc.get((t, length, "full", 1.0, pop))
        if not full:
          continue
        lo, hi = wilson(mean(full), len(full))
        cells = []
        for b in budgets:
          for m in METHODS:
            v = acc.get((t, length, m, b, pop))
            cells.append(f"{mean(v):.2f}" if v else "")
        print(f"| {t} | {length} | {'on' if pop else 'off'} | {len(full)} | "
              f"{mean(full):.2f} [{lo:.2f}, {hi:.2f}] | " + " | ".join(cells) + " |")

  print(f"\n### Share of the full-KV mean accuracy (tasks with full >= {args.min_full})\n")
  print("| length | POP | tasks | full mean | " + " | ".join(
      f"{m} {b:g}" for b in budgets for m in METHODS) + " |")
  print("|" + " --- |" * (4 + len(budgets) * len(METHODS)))
  for length in lengths:
    for pop in pops:
      kept = [t for t in tasks
              if acc.get((t, length, "full", 1.0, pop))
              and mean(acc[(t, length, "full", 1.0, pop)]) >= args.min_full]
      if not kept:
        continue
      full_mean = mean([mean(acc[(t, length, "full", 1.0, pop)]) for t in kept])
      cells = []
      for b in budgets:
        for m in METHODS:
          vals = [mean(acc[(t, length, m, b, pop)]) for t in kept if (t, length, m, b, pop) in acc]
          cells.append(f"{mean(vals) / full_mean:.2f}" if vals and full_mean > 0 else "")
      print(f"| {length} | {'on' if pop else 'off'} | {', '.join(kept)} | {full_mean:.2f} | " +
            " | ".join(cells) + " |")

  print(f"\n### Pooled over lengths per POP setting: every sample of the (task, length) pairs "
        f"with full >= {args.min_full}; mean [95% interval] (share of the full KV's)\n")
  print("| POP | budget | samples | full | " + " | ".join(METHODS) + " |")
  print("|" + " --- |" * (4 + len(METHODS)))
  for pop in pops:
    pairs = [(t, length) for length in lengths for t in tasks
             if acc.get((t, length, "full", 1.0, pop))
             and mean(acc[(t, length, "full", 1.0, pop)]) >= args.min_full]
    full = [x for t, length in pairs for x in acc[(t, length, "full", 1.0, pop)]]
    if not full:
      continue
    f_mean = mean(full)
    lo, hi = wilson(f_mean, len(full))
    for i, b in enumerate(budgets):
      cells = []
      for m in METHODS:
        v = [x for t, length in pairs for x in acc.get((t, length, m, b, pop), [])]
        if v:
          vlo, vhi = wilson(mean(v), len(v))
          cells.append(f"{mean(v):.2f} [{vlo:.2f}, {vhi:.2f}] ({mean(v) / f_mean:.2f}x)")
        else:
          cells.append("")
      first = i == 0
      print(f"| {'on' if pop else 'off'} | {b:g} | {len(full) if first else ''} | " +
            (f"{f_mean:.2f} [{lo:.2f}, {hi:.2f}]" if first else "") + " | " +
            " | ".join(cells) + " |")

  print("\n### SpecPC's prefill time and every method's KV bytes, against the full KV's\n")
  print("| length | POP | budget | SpecPC prefill / full | " + " | ".join(
      f"{m} KV / full" for m in METHODS) + " |")
  print("|" + " --- |" * (4 + len(METHODS)))
  for length in lengths:
    for pop in pops:
      full_p = [x for t in tasks for x in prefill.get((t, length, "full", 1.0, pop), [])]
      full_kv = [x for t in tasks for x in kv.get((t, length, "full", 1.0, pop), [])]
      if not full_p:
        continue
      for b in budgets:
        pc = [x for t in tasks for x in prefill.get((t, length, "specpc", b, pop), [])]
        cells = []
        for m in METHODS:
          v = [x for t in tasks for x in kv.get((t, length, m, b, pop), [])]
          cells.append(f"{mean(v) / mean(full_kv):.3f}" if v else "")
        print(f"| {length} | {'on' if pop else 'off'} | {b:g} | "
              f"{mean(pc) / mean(full_p):.2f} | " + " | ".join(cells) + " |"
              if pc else f"| {length} | {'on' if pop else 'off'} | {b:g} | | " +
              " | ".join(cells) + " |")


if __name__ == "__main__":
  main()
