#!/usr/bin/env python3
"""The per-op tables that TRIPOD_PROFILE=1 makes each process print at exit, as JSON lines.

Reads a log (a file, or standard input) that holds one or more tables, such as the stderr of a
`tripod serve` run under TRIPOD_PROFILE=1 (one table per worker process, each headed by the
worker's logger name and pid), and prints one JSON line per table:
  {"process": "tripod-decode", "pid": 123, "backend": "...", "ops_s": 41.2,
   "gaps_s": [step, wait, idle], "gaps": [n, n, n], "busy_share": 0.93,
   "ops": [{"op": "linear 1536x1536 m<=16", "calls": .., "rows": .., "ms": ..}, ...]}
busy_share is the ops' time over the ops' and the gaps' under 1 s (the idle gaps, over 1 s, left
out): how much of its burst a process spent in kernels rather than between them.
  bench/profile_tables.py [--label key=value ...] [LOG]
"""
import argparse
import json
import re
import sys

HEAD = re.compile(r"^TRIPOD_PROFILE (.*): ([0-9.]+) s in backend ops(?: \[(\S+) pid (\d+)\])?$")
GAPS = re.compile(r"^  between ops: ([0-9.]+) s in (\d+) gaps under 1 ms, ([0-9.]+) s in (\d+) of "
                  r"1 ms to 1 s, ([0-9.]+) s in (\d+) over 1 s$")
ROW = re.compile(r"^  (.+?)\s+(\d+)\s+(\d+)\s+([0-9.]+)\s+[0-9.]+%$")


def parse(lines):
    tables, cur = [], None
    for line in lines:
        line = line.rstrip("\n")
        m = HEAD.match(line)
        if m:
            cur = {"process": m.group(3) or "", "pid": int(m.group(4) or 0),
                   "backend": m.group(1), "ops_s": float(m.group(2)), "gaps_s": None,
                   "gaps": None, "ops": []}
            tables.append(cur)
            continue
        if cur is None:
            continue
        m = GAPS.match(line)
        if m:
            cur["gaps_s"] = [float(m.group(i)) for i in (1, 3, 5)]
            cur["gaps"] = [int(m.group(i)) for i in (2, 4, 6)]
            continue
        m = ROW.match(line)
        if m:
            cur["ops"].append({"op": m.group(1), "calls": int(m.group(2)),
                               "rows": int(m.group(3)), "ms": float(m.group(4))})
        elif not line.startswith("  op "):
            cur = None  # the table ended (another process's log line)
    for t in tables:
        if t["gaps_s"] is not None:
            busy = t["ops_s"] + t["gaps_s"][0] + t["gaps_s"][1]
            t["busy_share"] = round(t["ops_s"] / busy, 4) if busy > 0 else None
    return tables


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", nargs="?", help="the log (default: standard input)")
    ap.add_argument("--label", action="append", default=[], help="key=value added to each line")
    args = ap.parse_args()
    labels = {}
    for kv in args.label:
        k, sep, v = kv.partition("=")
        if not sep:
            sys.exit(f"profile_tables: --label wants key=value, got {kv!r}")
        labels[k] = v
    if args.log:
        with open(args.log, errors="replace") as f:
            tables = parse(f)
    else:
        tables = parse(sys.stdin)
    if not tables:
        sys.exit("profile_tables: no TRIPOD_PROFILE table in the log (was TRIPOD_PROFILE=1 set, "
                 "and did the processes exit cleanly?)")
    for t in tables:
        print(json.dumps({**labels, **t}))


if __name__ == "__main__":
    main()
