#!/usr/bin/env python3
"""Draws deploy/grafana/dashboards/tripod.json's panels from a Prometheus, with matplotlib: the
README's picture of the dashboard (Grafana is not packaged for Debian). Every panel's queries run
over the last --minutes through /api/v1/query_range, one line per series, labelled by the panel's
legend format.

  scripts/render_dashboard.py --prometheus http://127.0.0.1:9090 --out docs/images/dashboard.png
"""

import argparse
import json
import math
import os
import re
import time
import urllib.parse
import urllib.request

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def query_range(base, expr, start, end, step):
  q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
  with urllib.request.urlopen(f"{base}/api/v1/query_range?{q}", timeout=30) as r:
    body = json.load(r)
  if body.get("status") != "success":
    raise RuntimeError(f"{expr}: {body}")
  return body["data"]["result"]


def legend(fmt, labels):
  return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or "value"


def render(base, dashboard, out, minutes, step):
  with open(dashboard) as f:
    panels = json.load(f)["panels"]
  end = time.time()
  start = end - 60 * minutes
  cols = 3
  rows = math.ceil(len(panels) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 2.9 * rows), squeeze=False)
  drawn = 0
  for ax, panel in zip(axes.flat, panels):
    for t in panel["targets"]:
      for series in query_range(base, t["expr"], start, end, step):
        xs = [(float(v[0]) - end) / 60 for v in series["values"]]
        ys = [float(v[1]) for v in series["values"]]
        ax.plot(xs, ys, label=legend(t.get("legendFormat", ""), series["metric"]), linewidth=1.2)
        drawn += 1
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    ax.set_title(panel["title"] + (f"  [{unit}]" if unit not in ("", "short") else ""),
                 fontsize=9)
    ax.tick_params(labelsize=7)
    ax.set_xlabel("minutes", fontsize=7)
    ax.grid(alpha=0.3)
    if ax.lines:
      ax.legend(fontsize=6, loc="upper left")
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  fig.suptitle("Tripod (deploy/grafana/dashboards/tripod.json), drawn from Prometheus", fontsize=11)
  fig.tight_layout(rect=(0, 0, 1, 0.97))
  fig.savefig(out, dpi=80)
  return drawn


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--prometheus", default="http://127.0.0.1:9090")
  ap.add_argument("--dashboard", default=os.path.join(ROOT, "deploy/grafana/dashboards/tripod.json"))
  ap.add_argument("--out", default=os.path.join(ROOT, "docs/images/dashboard.png"))
  ap.add_argument("--minutes", type=float, default=10)
  ap.add_argument("--step", type=float, default=5)
  a = ap.parse_args()
  n = render(a.prometheus.rstrip("/"), a.dashboard, a.out, a.minutes, a.step)
  print(f"{a.out}: {n} series")


if __name__ == "__main__":
  main()
