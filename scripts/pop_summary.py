#!/usr/bin/env python3
"""Markdown tables from eval-pop and pop-importance JSON (docs/results/), for docs/pop.md.

Usage: scripts/pop_summary.py [docs/results/pop_eval.json] [docs/results/pop_importance.json]
"""
import json
import os
import sys


def eval_table(path):
    j = json.load(open(path))
    pt = j["prompt_tokens"]
    print(f"eval-pop: {j['prompts']} prompts of {pt['min']}-{pt['max']} tokens (mean {pt['mean']:.0f}),"
          f" {j['continuation_tokens']} teacher-forced + {j['generate_tokens']} greedy tokens;"
          f" full-model continuation perplexity {j['full']['ppl']:.2f}\n")
    print("| config | skipped | KL(full‖m) | ± se | greedy agreement | first token | ppl |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in j["methods"]:
        print(f"| {m['name']} | {len(m['skipped_layers'])} | {m['kl']:.4f} | {m['kl_se']:.4f} |"
              f" {m['agreement']:.3f} | {m['first_token_agreement']:.2f} | {m['ppl']:.2f} |")
    print("\nBy prompt length (KL / agreement):\n")
    names = [m["name"] for m in j["methods"]]
    buckets = j["methods"][0]["by_length"]
    print("| config | " + " | ".join(f"{b['min_tokens']}-{b['max_tokens']} ({b['prompts']})"
                                     for b in buckets) + " |")
    print("|---|" + "---:|" * len(buckets))
    for m in j["methods"]:
        print(f"| {m['name']} | " + " | ".join(f"{b['kl']:.4f} / {b['agreement']:.2f}"
                                               for b in m["by_length"]) + " |")
    print()


def importance_table(path):
    j = json.load(open(path))
    print(f"pop-importance: {j['samples']} samples, answers of {j['answer_tokens']} tokens,"
          f" eps {j['eps']}, base loss {j['base_loss']:.4f}\n")
    print("| layer | I prefill | I decode | ablation prefill | ablation decode |")
    print("|---:|---:|---:|---:|---:|")
    for l in j["layers"]:
        print(f"| {l['layer']} | {l['prefill_importance']:.3g} | {l['decode_importance']:.3g} |"
              f" {l['prefill_ablation']:+.4f} | {l['decode_ablation']:+.4f} |")
    L = len(j["layers"])
    third = L - L // 3
    for name, key in (("prefill", "prefill_importance"), ("decode", "decode_importance")):
        tot = sum(l[key] for l in j["layers"])
        last = sum(l[key] for l in j["layers"][third:])
        print(f"\n{name}: share of the total importance in the last third (layers {third}-{L-1}):"
              f" {last / tot if tot else 0:.3f}")
    print()


def main():
    root = os.path.join(os.path.dirname(__file__), "..", "docs", "results")
    ev = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "pop_eval.json")
    im = sys.argv[2] if len(sys.argv) > 2 else os.path.join(root, "pop_importance.json")
    if os.path.exists(ev):
        eval_table(ev)
    if os.path.exists(im):
        importance_table(im)


if __name__ == "__main__":
    main()
