#!/usr/bin/env python3
"""Serving benchmark for any OpenAI-compatible server (Tripod, llama-server, vLLM, ...).

Sends streaming POST /v1/completions requests of exactly --prompt_tokens prompt tokens and
--output_tokens generated tokens (ignore_eos), either all at once (--burst) or as a Poisson
process (--rate R requests/s), at most --concurrency in flight, and prints one JSON object:
TTFT, TPOT, ITL and end-to-end latency (mean/p50/p90/p99), request and output-token
throughput, failures. Run with build/venv's Python (httpx2 comes with the openai client):

  build/venv/bin/python bench/serve.py --base_url http://127.0.0.1:8000/v1 --burst \\
      --num_prompts 16 --prompt_tokens 512 --output_tokens 128 --label server=tripod

Prompts are token ids (a list of ints is a valid OpenAI `prompt`), windows of the tokenized
data/corpus/eval.txt starting at different places, so that no two share a prefix a cache could
reuse, and so that every server gets the same ids and the same count, whatever it would do to
text (BOS, special tokens). The ids come from the server's POST /tokenize (llama-server's
{"content"} and vLLM's {"prompt"} bodies are both sent), or from --token_ids_file (a JSON list
of ints; --save_token_ids writes one), so two servers can be given identical prompts.

Timing: TTFT is from sending to the first streamed chunk carrying a choice; ITL the gaps
between such chunks; TPOT (E2E - TTFT) / (output tokens - 1), per request; output tokens are the
server's usage.completion_tokens when it reports them, else the chunks counted. Throughput is
over the span from the first request sent to the last token received. A request fails on a
transport error, a non-200 status, an error event in the stream, or (--strict, default) fewer
output tokens than asked or a reported prompt size other than --prompt_tokens.

The machine's other work: a server whose threads spin at barriers (llama.cpp's CPU threadpool,
-t = cores) loses most of its speed to any other busy process on the same cores (measured on 2
vCPUs: llama-server's single-stream decode 9 to 108 tokens/s within minutes, as others' compiles
came and went), so a figure taken beside other work says little. The line reports what else ran:
load_1m (the 1-minute load average before the measured requests), client_cpu_s (this process),
server_cpu_s (the --server_pid processes and their descendants), and others_cpu_pct (the share of
all CPUs' time in the measured span used by anything else: the interference). --quiet_pct P waits
(up to --quiet_wait seconds, polling) before the measured requests until the CPUs were less than P
percent busy over 5 s; the line's quiet_wait_s says how long, and quiet false that it gave up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2 as httpx

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO / "data" / "corpus" / "eval.txt"


@dataclass
class Result:
    ok: bool = False
    error: str = ""
    ttft: float = 0.0  # seconds
    e2e: float = 0.0  # seconds
    itl: list[float] = field(default_factory=list)  # seconds between content chunks
    output_tokens: int = 0
    prompt_tokens_reported: int | None = None
    sent_at: float = 0.0  # perf_counter
    last_token_at: float = 0.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--base_url", default="http://127.0.0.1:8000/v1",
                   help="the API's base URL, ending in /v1 (default %(default)s)")
    p.add_argument("--model", default="", help="model name to send (default: GET /v1/models' first)")
    p.add_argument("--api_key", default=os.environ.get("OPENAI_API_KEY", ""),
                   help="bearer token (default: $OPENAI_API_KEY; none if empty)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--rate", type=float, default=0.0,
                      help="Poisson arrivals at this many requests per second")
    mode.add_argument("--burst", action="store_true",
                      help="send every request at once (the default when --rate is not given)")
    p.add_argument("--num_prompts", type=int, default=16, help="requests measured")
    p.add_argument("--concurrency", type=int, default=0,
                   help="requests in flight at most (default: no cap)")
    p.add_argument("--prompt_tokens", type=int, default=512, help="prompt length in tokens")
    p.add_argument("--output_tokens", type=int, default=128, help="tokens generated per request")
    p.add_argument("--warmup", type=int, default=0,
                   help="requests sent one by one before measuring, not counted")
    p.add_argument("--corpus", default=str(DEFAULT_CORPUS), help="text the prompts are cut from")
    p.add_argument("--token_ids_file", default="",
                   help="JSON list of token ids to cut prompts from instead of POST /tokenize")
    p.add_argument("--save_token_ids", default="", help="write the ids used to this JSON file")
    p.add_argument("--seed", type=int, default=0, help="seeds the Poisson arrivals")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds a request may take at most (default %(default)s)")
    p.add_argument("--no_strict", dest="strict", action="store_false",
                   help="accept short outputs and unexpected reported prompt sizes")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="add a field to the JSON line (repeatable; numbers stay numbers)")
    p.add_argument("--server_pid", type=int, action="append", default=[], metavar="PID",
                   help="the server's process (repeatable): its CPU time, with its descendants', "
                        "is counted apart from the other processes' (others_cpu_pct)")
    p.add_argument("--quiet_pct", type=float, default=0.0,
                   help="before the measured requests, wait until the CPUs were less than this "
                        "percent busy over 5 s (default: no wait)")
    p.add_argument("--quiet_wait", type=float, default=600.0,
                   help="seconds --quiet_pct waits at most, polling every 30 s (default %(default)s)")
    p.add_argument("--fields", default="",
                   help="comma-separated fields to print, in this order (default: all)")
    p.add_argument("--extra_body", default="",
                   help="a JSON object whose keys are added to every request's body (e.g. "
                        "'{\"response_format\": {\"type\": \"json_object\"}}'); with --no_strict "
                        "for outputs that may end before --output_tokens")
    a = p.parse_args(argv)
    for name in ("num_prompts", "prompt_tokens", "output_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    if a.concurrency < 0 or a.warmup < 0 or a.rate < 0 or a.timeout <= 0:
        p.error("--concurrency, --warmup and --rate must not be negative; --timeout positive")
    if a.quiet_pct < 0 or a.quiet_wait < 0:
        p.error("--quiet_pct and --quiet_wait must not be negative")
    for lab in a.label:
        if "=" not in lab:
            p.error(f"--label {lab!r}: want KEY=VALUE")
    a.base_url = a.base_url.rstrip("/")
    try:
        a.extra_body = json.loads(a.extra_body) if a.extra_body else {}
    except ValueError as e:
        p.error(f"--extra_body: {e}")
    if not isinstance(a.extra_body, dict):
        p.error("--extra_body must be a JSON object")
    return a


def label_value(text: str):
    try:
        return json.loads(text) if text[:1] in "-0123456789" else text
    except ValueError:
        return text


def server_root(base_url: str) -> str:
    # llama-server and vLLM serve /tokenize beside /v1, not under it.
    return base_url[: -len("/v1")] if base_url.endswith("/v1") else base_url


async def tokenize_corpus(client: httpx.AsyncClient, args, needed: int) -> list[int]:
    """Token ids of the corpus's text, at least `needed` of them (or the whole corpus)."""
    text = Path(args.corpus).read_text(encoding="utf-8")
    ids: list[int] = []
    pos, piece = 0, 32768  # characters per request: small bodies any server takes
    url = server_root(args.base_url) + "/tokenize"
    while len(ids) < needed and pos < len(text):
        chunk = text[pos: pos + piece]
        pos += piece
        body = {"content": chunk, "prompt": chunk, "add_special": False,
                "add_special_tokens": False}
        if args.model:
            body["model"] = args.model
        r = await client.post(url, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"POST {url}: HTTP {r.status_code}: {r.text[:300]} (give "
                               "--token_ids_file instead)")
        toks = r.json().get("tokens")
        if not isinstance(toks, list):
            raise RuntimeError(f"POST {url}: no 'tokens' list in {r.text[:300]}")
        # llama-server's with_pieces form gives {"id":..,"piece":..} objects.
        ids.extend(int(t["id"]) if isinstance(t, dict) else int(t) for t in toks)
    return ids


def make_prompts(ids: list[int], n: int, length: int) -> list[list[int]]:
    """n windows of `length` ids at distinct starts: back to back when the ids hold them all,
    else spread evenly (overlapping, but never sharing a first token position)."""
    last_start = len(ids) - length
    if last_start < n - 1:
        raise RuntimeError(f"only {len(ids)} corpus tokens for {n} prompts of {length}")
    step = length if last_start >= (n - 1) * length else last_start // max(1, n - 1)
    return [ids[i * step: i * step + length] for i in range(n)]


def percentiles(xs: list[float], scale: float, prefix: str, unit: str) -> dict:
    out = {}
    if not xs:
        for k in ("mean", "p50", "p90", "p99"):
            out[f"{prefix}_{k}_{unit}"] = None
        return out
    s = sorted(xs)

    def pct(q: float) -> float:
        # Linear interpolation between the closest ranks (NumPy's default).
        k = (len(s) - 1) * q
        lo, hi = math.floor(k), math.ceil(k)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    out[f"{prefix}_mean_{unit}"] = round(sum(s) / len(s) * scale, 6)
    for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        out[f"{prefix}_{name}_{unit}"] = round(pct(q) * scale, 6)
    return out


CLK_TCK = os.sysconf("SC_CLK_TCK")


def host_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of every CPU since boot, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    total = sum(v[:8])  # user nice system idle iowait irq softirq steal
    return (total - v[3] - v[4]) / CLK_TCK, total / CLK_TCK


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds (user + system) of the live processes `roots` and all their descendants."""
    if not roots:
        return 0.0
    procs = {}  # pid -> (ppid, cpu seconds)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                st = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = st[st.rindex(")") + 2:].split()  # after "pid (comm) "
        procs[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / CLK_TCK)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0.0, [r for r in roots if r in procs], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += procs[pid][1]
        todo.extend(children.get(pid, []))
    return total


def own_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def wait_quiet(pct: float, limit: float) -> tuple[bool, float]:
    """Waits until the CPUs were less than pct percent busy over 5 s, at most `limit` seconds
    (polling every 30 s). Returns (quiet, seconds waited)."""
    start = time.monotonic()
    while True:
        b0, t0 = host_cpu()
        await asyncio.sleep(5.0)
        b1, t1 = host_cpu()
        busy = 100.0 * (b1 - b0) / max(t1 - t0, 1e-9)
        waited = time.monotonic() - start
        if busy < pct:
            return True, round(waited, 1)
        if waited + 30.0 > limit:
            print(f"serve.py: the CPUs are still {busy:.0f}% busy after {waited:.0f} s; "
                  "measuring anyway", file=sys.stderr)
            return False, round(waited, 1)
        print(f"serve.py: the CPUs are {busy:.0f}% busy (want < {pct:g}%); waiting",
              file=sys.stderr)
        await asyncio.sleep(25.0)


async def one_request(client: httpx.AsyncClient, args, prompt: list[int]) -> Result:
    res = Result()
    body = {
        "model": args.model,
        "prompt": prompt,
        "max_tokens": args.output_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    if getattr(args, "other_names", False):
        # llama-server's names for the same (it honours max_tokens too; older builds n_predict).
        # Tripod refuses fields it does not implement, so it is not sent them.
        body["n_predict"] = args.output_tokens
    body.update(getattr(args, "extra_body", None) or {})  # callers with their own args lack it
    chunks = 0
    last = 0.0
    res.sent_at = time.perf_counter()
    try:
        async with client.stream("POST", args.base_url + "/completions", json=body) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                try:
                    ev = json.loads(data)
                except ValueError:
                    res.error = f"bad SSE data: {data[:200]}"
                    return res
                if "error" in ev:
                    res.error = f"error event: {json.dumps(ev['error'])[:200]}"
                    return res
                usage = ev.get("usage")
                if isinstance(usage, dict):
                    if usage.get("completion_tokens") is not None:
                        res.output_tokens = int(usage["completion_tokens"])
                    if usage.get("prompt_tokens") is not None:
                        res.prompt_tokens_reported = int(usage["prompt_tokens"])
                choices = ev.get("choices") or []
                if not choices or choices[0].get("text") is None:
                    continue  # the usage-only chunk, or a server's keep-alive
                if chunks == 0:
                    res.ttft = now - res.sent_at
                else:
                    res.itl.append(now - last)
                chunks += 1
                last = now
    except (httpx.HTTPError, OSError) as e:
        res.error = f"{type(e).__name__}: {e}"
        return res
    if chunks == 0:
        res.error = "no token streamed"
        return res
    res.last_token_at = last
    res.e2e = last - res.sent_at
    if res.output_tokens == 0:
        res.output_tokens = chunks
    if args.strict and res.output_tokens < args.output_tokens:
        res.error = f"{res.output_tokens} output tokens, asked for {args.output_tokens}"
        return res
    if (args.strict and res.prompt_tokens_reported is not None
            and res.prompt_tokens_reported != len(prompt)):
        res.error = f"server counted {res.prompt_tokens_reported} prompt tokens, sent {len(prompt)}"
        return res
    res.ok = True
    return res


async def run(args) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    n_conn = args.concurrency or args.num_prompts
    limits = httpx.Limits(max_connections=n_conn + 2, max_keepalive_connections=n_conn + 2)
    timeout = httpx.Timeout(args.timeout, connect=30.0)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout,
                                 trust_env=False) as client:
        r = await client.get(args.base_url + "/models")
        r.raise_for_status()
        card = r.json()["data"][0]
        args.model = args.model or card["id"]
        args.other_names = card.get("owned_by") != "tripod"
        total = args.num_prompts + args.warmup
        if args.token_ids_file:
            ids = [int(t) for t in json.loads(Path(args.token_ids_file).read_text())]
        else:
            needed = total * args.prompt_tokens + total
            if args.save_token_ids:  # enough for other runs' longer prompts too
                needed = max(needed, 65536)
            ids = await tokenize_corpus(client, args, needed)
        if args.save_token_ids:
            Path(args.save_token_ids).write_text(json.dumps(ids))
        prompts = make_prompts(ids, total, args.prompt_tokens)
        warm, measured = prompts[: args.warmup], prompts[args.warmup:]
        for p in warm:
            w = await one_request(client, args, p)
            if not w.ok:
                print(f"serve.py: warm-up request failed: {w.error}", file=sys.stderr)

        quiet, quiet_waited = True, 0.0
        if args.quiet_pct > 0:
            quiet, quiet_waited = await wait_quiet(args.quiet_pct, args.quiet_wait)
        load_1m = os.getloadavg()[0]
        host0, server0, client0 = host_cpu(), tree_cpu(args.server_pid), own_cpu()

        sem = asyncio.Semaphore(args.concurrency) if args.concurrency else None

        async def limited(p: list[int]) -> Result:
            if sem is None:
                return await one_request(client, args, p)
            async with sem:
                return await one_request(client, args, p)

        rng = random.Random(args.seed)
        tasks = []
        start = time.perf_counter()
        for i, p in enumerate(measured):
            tasks.append(asyncio.create_task(limited(p)))
            if args.rate > 0 and i + 1 < len(measured):
                await asyncio.sleep(rng.expovariate(args.rate))
        results = await asyncio.gather(*tasks)
        host1, server1, client1 = host_cpu(), tree_cpu(args.server_pid), own_cpu()

    ok = [r for r in results if r.ok]
    failed = [r for r in results if not r.ok]
    first_send = min((r.sent_at for r in results), default=start)
    last_token = max((r.last_token_at for r in ok), default=first_send)
    span = max(last_token - first_send, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    tpots = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    line = {
        "bench": "serve",
        "base_url": args.base_url,
        "model": args.model,
        "mode": "poisson" if args.rate > 0 else "burst",
        "rate": args.rate if args.rate > 0 else None,
        "num_prompts": args.num_prompts,
        "concurrency": args.concurrency or args.num_prompts,
        "prompt_tokens": args.prompt_tokens,
        "output_tokens": args.output_tokens,
        "completed": len(ok),
        "failed": len(failed),
        "duration_s": round(span, 6),
        "request_throughput": round(len(ok) / span, 6),
        "output_tok_s": round(out_tokens / span, 3),
        "total_output_tokens": out_tokens,
    }
    line.update(percentiles([r.ttft for r in ok], 1.0, "ttft", "s"))
    line.update(percentiles(tpots, 1000.0, "tpot", "ms"))
    line.update(percentiles([x for r in ok for x in r.itl], 1000.0, "itl", "ms"))
    line.update(percentiles([r.e2e for r in ok], 1.0, "e2e", "s"))
    # What else ran in the span: all CPUs' busy time less the server's and this client's.
    host_busy, host_total = host1[0] - host0[0], host1[1] - host0[1]
    server_cpu, client_cpu = server1 - server0, client1 - client0
    line["load_1m"] = round(load_1m, 2)
    line["quiet"] = quiet
    line["quiet_wait_s"] = quiet_waited
    line["host_busy_pct"] = round(100.0 * host_busy / max(host_total, 1e-9), 1)
    line["client_cpu_s"] = round(client_cpu, 2)
    line["server_cpu_s"] = round(server_cpu, 2) if args.server_pid else None
    line["others_cpu_pct"] = (round(100.0 * max(host_busy - server_cpu - client_cpu, 0.0)
                                    / max(host_total, 1e-9), 1) if args.server_pid else None)
    if failed:
        line["errors"] = sorted({r.error for r in failed})[:5]
    return line


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    try:
        line = asyncio.run(run(args))
    except (RuntimeError, httpx.HTTPError, OSError, ValueError, KeyError) as e:
        print(f"serve.py: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    labels = dict(kv.split("=", 1) for kv in args.label)
    out = {"bench": line.pop("bench")}
    out.update({k: label_value(v) for k, v in labels.items()})
    out.update(line)
    if args.fields:
        out = {k: out.get(k) for k in args.fields.split(",") if k}
    print(json.dumps(out, separators=(",", ":")), flush=True)
    return 0 if line["failed"] == 0 else 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
