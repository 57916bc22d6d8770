#!/usr/bin/env python3
"""What structured outputs cost a served model's decode throughput (bench/serve.py's requests).

Starts `tripod serve` once on --model, then sends --num_prompts streaming completions at
--concurrency in flight (greedy, ignore_eos, the same token-id prompts every time) under each
constraint of --configs:

  json_schema   response_format json_schema (strict): an object with a title, a text and a list of
                tags, the shape of a typical extraction schema (small DFA, free strings)
  json_object   response_format json_object (any JSON object)
  guided_regex  vLLM's guided_regex: prose characters, at least 16, no end otherwise

A constraint lets the end token through once its output is complete, and the model may take it,
so constrained outputs are often shorter than --output_tokens. Each constrained run is therefore
paired with an unconstrained run of the same prompts in which request i generates exactly as many
tokens as it did constrained (max_tokens = that count, ignore_eos): the same tokens per request,
the same batch as it fills and drains, everything the same but the constraint. The pair's ratio
(ratio_output_tok_s: constrained / matched output tokens per second; above 0.9 means the
constraint costs less than 10%) is what counts; ratio_cpu is the same from the CPU time the
server's processes used per output token (matched / constrained), which other processes on the
machine disturb less than the wall clock (a busy machine's speed drifts from minute to minute).
The counts come from a first constrained pass (not measured), which also compiles the constraint
and fills its masks cache, as a server that sees a schema again has them.

The pairs run in rounds, the order within each pair and of the configurations reversed every
other round, so that the machine's drift hits both sides. Prints a JSON line per run, then one
summary line per configuration: medians over rounds, and the ratios of every round.

  build/venv/bin/python bench/structured_serve.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --rounds 3 --out docs/results/structured_serve_smollm.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import serve as load  # noqa: E402  bench/serve.py

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "text": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["title", "text", "tags"],
    "additionalProperties": False,
}

CONFIGS = {
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "note", "strict": True, "schema": SCHEMA}}},
    "json_object": {"response_format": {"type": "json_object"}},
    "guided_regex": {"guided_regex": "[A-Za-z0-9 ,.;:'()-]{16,}"},
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"),
                   help="what `tripod serve --model` takes (default: the bundled model)")
    p.add_argument("--tripod", default=str(REPO / "build" / "release" / "tripod"),
                   help="the tripod binary (default %(default)s)")
    p.add_argument("--serve_flag", action="append", default=[], metavar="FLAG",
                   help="a flag passed on to `tripod serve` (repeatable)")
    p.add_argument("--configs", default="json_schema,json_object,guided_regex",
                   help=f"constrained configurations, of {','.join(CONFIGS)}")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every configuration")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num_prompts", type=int, default=16, help="requests per run")
    p.add_argument("--prompt_tokens", type=int, default=64)
    p.add_argument("--output_tokens", type=int, default=128)
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="extra fields for every line (e.g. machine=zen5)")
    p.add_argument("--out", default="", help="also append the lines to this file")
    a = p.parse_args(argv)
    a.configs = [c for c in a.configs.split(",") if c]
    for c in a.configs:
        if c not in CONFIGS:
            p.error(f"--configs: unknown configuration {c!r}")
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    for lab in a.label:
        if "=" not in lab:
            p.error(f"--label {lab!r}: want KEY=VALUE")
    return a


class Server:
    """`tripod serve --port=0`, its URL from its first stdout line; SIGTERM (then SIGKILL) at the
    end, to its process group."""

    def __init__(self, cmd: list[str]):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True)
        line: dict = {}
        t = threading.Thread(target=lambda: line.update(url=self.proc.stdout.readline()),
                             daemon=True)
        t.start()
        t.join(timeout=300)
        m = re.search(r"(http://127\.0\.0\.1:\d+/v1)\b", line.get("url", ""))
        if not m:
            self.stop()
            raise RuntimeError(f"tripod serve did not start: {line.get('url', '')!r}")
        self.url = m.group(1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


async def one_pass(args, url: str, server_pid: int, prompts: list[list[int]], extra: dict,
                   max_tokens: list[int]) -> dict:
    """The prompts at --concurrency in flight, request i asking for max_tokens[i]: output tokens
    per second over the span from the first request sent to the last token received, and the CPU
    time the server's processes used per output token."""
    base = load.parse_args(["--base_url", url, "--no_strict", "--output_tokens", "1"])
    base.extra_body = extra
    limits = load.httpx.Limits(max_connections=args.concurrency + 2,
                               max_keepalive_connections=args.concurrency + 2)
    async with load.httpx.AsyncClient(limits=limits, timeout=load.httpx.Timeout(600.0),
                                      trust_env=False) as client:
        r = await client.get(url + "/models")
        r.raise_for_status()
        base.model = r.json()["data"][0]["id"]
        sem = asyncio.Semaphore(args.concurrency)

        async def one(prompt: list[int], n: int):
            a = argparse.Namespace(**vars(base))
            a.output_tokens = n
            async with sem:
                return await load.one_request(client, a, prompt)

        load_1m = os.getloadavg()[0]
        cpu0 = load.tree_cpu([server_pid])
        results = await asyncio.gather(*(one(p, n) for p, n in zip(prompts, max_tokens)))
        cpu = load.tree_cpu([server_pid]) - cpu0
    ok = [x for x in results if x.ok]
    first = min(x.sent_at for x in results)
    span = max(max((x.last_token_at for x in ok), default=first) - first, 1e-9)
    tokens = sum(x.output_tokens for x in ok)
    tpots = sorted((x.e2e - x.ttft) / (x.output_tokens - 1) for x in ok if x.output_tokens > 1)
    line = {
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "output_tok_s": round(tokens / span, 2),
        "total_output_tokens": tokens,
        "mean_output_tokens": round(tokens / len(ok), 1) if ok else None,
        "tpot_p50_ms": round(1000 * tpots[len(tpots) // 2], 2) if tpots else None,
        "server_cpu_s": round(cpu, 2),
        "server_cpu_ms_per_token": round(1000 * cpu / tokens, 3) if tokens else None,
        "duration_s": round(span, 3),
        "load_1m": round(load_1m, 2),
        "tokens": [x.output_tokens if x.ok else 0 for x in results],
    }
    errors = sorted({x.error for x in results if not x.ok})
    if errors:
        line["errors"] = errors[:3]
    return line


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    labels = {k: load.label_value(v) for k, v in (kv.split("=", 1) for kv in args.label)}
    out = open(args.out, "a") if args.out else None
    common = {"model": Path(args.model).name, "concurrency": args.concurrency,
              "num_prompts": args.num_prompts, "prompt_tokens": args.prompt_tokens,
              "output_tokens": args.output_tokens}

    def emit(d: dict) -> None:
        s = json.dumps({"bench": "structured_serve", **labels, **common, **d},
                       separators=(",", ":"))
        print(s, flush=True)
        if out:
            out.write(s + "\n")
            out.flush()

    server = Server([args.tripod, "serve", "--port=0", f"--model={args.model}",
                     *args.serve_flag])
    try:
        async def prompts_of() -> list[list[int]]:
            a = load.parse_args(["--base_url", server.url])
            async with load.httpx.AsyncClient(timeout=load.httpx.Timeout(120.0),
                                              trust_env=False) as client:
                ids = await load.tokenize_corpus(
                    client, a, args.num_prompts * args.prompt_tokens + args.num_prompts)
            return load.make_prompts(ids, args.num_prompts, args.prompt_tokens)

        prompts = asyncio.run(prompts_of())
        pid = server.proc.pid
        full = [args.output_tokens] * len(prompts)
        # The constrained outputs' lengths (and the constraints compiled, their masks cached).
        lengths = {}
        for c in args.configs:
            first = asyncio.run(one_pass(args, server.url, pid, prompts, CONFIGS[c], full))
            if first["failed"]:
                raise RuntimeError(f"{c}: {first.get('errors')}")
            lengths[c] = first["tokens"]
            emit({"config": c, "pass": "lengths", **first})
        ratios: dict[str, list[float]] = {c: [] for c in args.configs}
        cpu_ratios: dict[str, list[float]] = {c: [] for c in args.configs}
        runs: dict[str, list[dict]] = {c: [] for c in args.configs}
        for r in range(args.rounds):
            for c in (args.configs if r % 2 == 0 else args.configs[::-1]):
                pair = {}
                for kind in (("constrained", "matched") if r % 2 == 0
                             else ("matched", "constrained")):
                    extra = CONFIGS[c] if kind == "constrained" else {}
                    line = asyncio.run(one_pass(args, server.url, pid, prompts, extra, lengths[c]))
                    pair[kind] = line
                    emit({"config": c, "pass": kind, "round": r,
                          **{k: v for k, v in line.items() if k != "tokens"}})
                if pair["matched"]["output_tok_s"] > 0:
                    ratios[c].append(pair["constrained"]["output_tok_s"]
                                     / pair["matched"]["output_tok_s"])
                m, k = (pair["matched"]["server_cpu_ms_per_token"],
                        pair["constrained"]["server_cpu_ms_per_token"])
                if m and k:
                    cpu_ratios[c].append(m / k)
                runs[c].append(pair)
        for c in args.configs:
            emit({"summary": True, "config": c, "rounds": args.rounds,
                  "mean_output_tokens": round(sum(lengths[c]) / len(lengths[c]), 1),
                  "constrained_output_tok_s": statistics.median(
                      p["constrained"]["output_tok_s"] for p in runs[c]),
                  "matched_output_tok_s": statistics.median(
                      p["matched"]["output_tok_s"] for p in runs[c]),
                  "ratio_output_tok_s": round(statistics.median(ratios[c]), 3)
                  if ratios[c] else None,
                  "ratios_output_tok_s": [round(x, 3) for x in ratios[c]],
                  "ratio_cpu": round(statistics.median(cpu_ratios[c]), 3)
                  if cpu_ratios[c] else None,
                  "ratios_cpu": [round(x, 3) for x in cpu_ratios[c]]})
    finally:
        server.stop()
        if out:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
