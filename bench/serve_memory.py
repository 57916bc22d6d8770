#!/usr/bin/env python3
"""Memory a served model costs: the sum over a server's processes of the memory none of them
shares with another (USS), idle after one request, against the GGUF file's size.

Starts a server command (by default `tripod serve` on a free port), waits for its API, sends one
chat completion, waits --idle_s, then reads /proc/PID/smaps_rollup of the server and all its
descendants: USS = Private_Clean + Private_Dirty (+ Private_Hugetlb), RSS and PSS beside it.
Pages of the model file that several workers map count in none of their USS (they are shared);
a private copy of the weights (or pages only one process maps) counts in full. Prints one JSON
object. With --llama_server BIN it also measures llama-server on the same file (its best flags
for one host: mmap, -np 4), for the record.

  build/venv/bin/python bench/serve_memory.py --model qwen2.5-coder-1.5b-instruct
  build/venv/bin/python bench/serve_memory.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --llama_server <path to llama-server>

The goal of the real-models issue: USS sum <= 1.5 x the GGUF's size + the KV pools the server
reserves (the decode worker's --kv_budget_mb, reported beside it as kv_reserved_bytes).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """pid and every process below it (from /proc/*/stat's parent ids)."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields follow the last ')'.
        fields = stat[stat.rindex(")") + 2:].split()
        parent[int(d.name)] = int(fields[1])
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


def rollup(pid: int) -> dict[str, int]:
    """smaps_rollup's fields in bytes, plus uss; empty if the process is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return {}
    vals: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "kB":
            vals[parts[0].rstrip(":")] = int(parts[1]) * 1024
    vals["uss"] = vals.get("Private_Clean", 0) + vals.get("Private_Dirty", 0) + vals.get(
        "Private_Hugetlb", 0)
    vals["comm"] = comm  # type: ignore[assignment]
    return vals


def wait_http(url: str, deadline: float, proc: subprocess.Popen) -> None:
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"no answer from {url}")


def one_request(base: str, timeout: float) -> dict:
    with urllib.request.urlopen(f"{base}/v1/models", timeout=timeout) as r:
        model = json.loads(r.read())["data"][0]["id"]
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}],
        "max_tokens": 24,
        "temperature": 0,
    }).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out = json.loads(r.read())
    out["_seconds"] = time.time() - t0
    return out


def measure(cmd: list[str], port: int, health: str, idle_s: float, timeout: float) -> dict:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(base + health, time.time() + timeout, proc)
        resp = one_request(base, timeout)
        time.sleep(idle_s)
        procs = [r for r in (rollup(p) for p in descendants(proc.pid)) if r]
        return {
            "request_s": round(resp["_seconds"], 3),
            "completion_tokens": resp.get("usage", {}).get("completion_tokens"),
            "processes": [{"comm": r["comm"], "uss": r["uss"], "pss": r.get("Pss", 0),
                           "rss": r.get("Rss", 0)} for r in procs],
            "uss_sum": sum(r["uss"] for r in procs),
            "pss_sum": sum(r.get("Pss", 0) for r in procs),
            "rss_sum": sum(r.get("Rss", 0) for r in procs),
        }
    finally:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)


def resolve_model(tripod: Path, name: str) -> Path:
    """A path as given, else the catalogue name's file (models/, then the cache)."""
    p = Path(name)
    if p.exists():
        return p
    for d in [REPO / "models",
              Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "tripod" / "models"]:
        for f in sorted(d.glob(f"{name}*.gguf")) if d.is_dir() else []:
            return f
    raise SystemExit(f"serve_memory: no file for model '{name}' (fetch it: scripts/fetch_model)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--tripod", default=str(REPO / "build" / "release" / "tripod"))
    ap.add_argument("--kv_budget_mb", type=int, default=512,
                    help="the decode worker's KV budget tripod serve reserves (its default)")
    ap.add_argument("--llama_server", default="", help="also measure this llama-server binary")
    ap.add_argument("--idle_s", type=float, default=3.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--extra", default="", help="extra arguments for tripod serve")
    args = ap.parse_args()

    model = resolve_model(Path(args.tripod), args.model)
    size = model.stat().st_size
    port = free_port()
    cmd = [args.tripod, "serve", "--port", str(port), "--model", args.model] + args.extra.split()
    result = {"bench": "serve_memory", "model": args.model, "file": str(model),
              "file_bytes": size, "kv_reserved_bytes": args.kv_budget_mb << 20}
    tri = measure(cmd, port, "/health", args.idle_s, args.timeout)
    result["tripod"] = tri
    result["tripod_uss_over_file"] = round(tri["uss_sum"] / size, 3)
    result["tripod_goal_bytes"] = int(1.5 * size) + result["kv_reserved_bytes"]
    result["tripod_meets_goal"] = tri["uss_sum"] <= result["tripod_goal_bytes"]
    if args.llama_server:
        port = free_port()
        cmd = [args.llama_server, "-m", str(model), "--port", str(port), "-t", "2", "-np", "4",
               "-c", "8192"]
        ls = measure(cmd, port, "/health", args.idle_s, args.timeout)
        result["llama_server"] = ls
        result["llama_server_uss_over_file"] = round(ls["uss_sum"] / size, 3)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
