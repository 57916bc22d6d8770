"""deploy/prometheus and deploy/grafana, checked by the real tools against a real cluster:
promtool checks the configuration and the rules and runs the alerts' unit tests; then `tripod serve`
writes its scrape targets, a real Prometheus (Debian's) scrapes it with the committed
configuration and rules, requests run (plain and through the draft worker's methods), and every
recording rule, every alert's expression and every dashboard panel's query is evaluated through
Prometheus's HTTP API: each must parse, the rules and panels must return data, and no query may
name a metric that no process exports. Last, scripts/render_dashboard.py draws the dashboard from
that Prometheus."""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import openai
import pytest
import yaml

from cluster import MODEL, Serve, wait_until

SOURCE = os.environ.get("TRIPOD_SOURCE_DIR",
                        os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
PROM = os.path.join(SOURCE, "deploy", "prometheus")
DASHBOARD = os.path.join(SOURCE, "deploy", "grafana", "dashboards", "tripod.json")
MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]

needs_prometheus = pytest.mark.skipif(
    shutil.which("prometheus") is None or shutil.which("promtool") is None,
    reason="Debian's prometheus package (prometheus, promtool) is missing")


def promtool(*args):
  r = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stdout + r.stderr
  return r.stdout + r.stderr


@needs_prometheus
def test_promtool_accepts_the_configuration_and_the_alerts_behave():
  out = promtool("check", "config", os.path.join(PROM, "prometheus.yml"))
  assert "SUCCESS" in out and "2 rule files found" in out, out
  for rules in ("tripod_recording.yml", "tripod_alerts.yml"):
    assert "SUCCESS" in promtool("check", "rules", os.path.join(PROM, "rules", rules))
  assert "SUCCESS" in promtool("test", "rules", os.path.join(PROM, "tests", "tripod_alerts_test.yml"))


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def api(port, path, **params):
  url = f"http://127.0.0.1:{port}/api/v1/{path}?" + urllib.parse.urlencode(params)
  with urllib.request.urlopen(url, timeout=15) as r:
    body = json.load(r)
  assert body["status"] == "success", body
  return body["data"]


def rules():
  """(name, expr, is_alert) of every rule in the committed rule files."""
  out = []
  for f in ("tripod_recording.yml", "tripod_alerts.yml"):
    with open(os.path.join(PROM, "rules", f)) as fh:
      for group in yaml.safe_load(fh)["groups"]:
        for r in group["rules"]:
          out.append((r.get("record") or r["alert"], r["expr"].strip(), "alert" in r))
  return out


def panel_queries():
  with open(DASHBOARD) as f:
    d = json.load(f)
  return [(p["title"], t["expr"]) for p in d["panels"] for t in p["targets"]]


METRIC = re.compile(r"\b(tripod:[a-z_]+(?::[a-z0-9_]+)?|process_[a-z_]+|up)\b")


def names_in(expr):
  return {m for m in METRIC.findall(expr)}


def exported(port):
  """Metric names a process's /metrics declares (histograms with their series suffixes)."""
  with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
    text = r.read().decode()
  names = set()
  for m in re.finditer(r"^# TYPE (\S+) (\S+)", text, re.M):
    names.add(m.group(1))
    if m.group(2) == "histogram":
      names |= {m.group(1) + s for s in ("_bucket", "_sum", "_count")}
  return names


@needs_prometheus
def test_rules_and_dashboard_against_a_live_cluster(tmp_path):
  # The committed configuration, with 1 s intervals so that rates have samples within seconds.
  conf_dir = tmp_path / "prometheus"
  shutil.copytree(PROM, conf_dir, ignore=shutil.ignore_patterns("*.json"))
  conf = (conf_dir / "prometheus.yml").read_text()
  assert "scrape_interval: 5s" in conf and "evaluation_interval: 5s" in conf
  (conf_dir / "prometheus.yml").write_text(
      conf.replace("scrape_interval: 5s", "scrape_interval: 1s")
      .replace("evaluation_interval: 5s", "evaluation_interval: 1s"))
  targets = conf_dir / "targets" / "local.json"

  prom = None
  # The story below is shorter than the default method floor: no floor, so that the methods run.
  with Serve("--draft_workers=1", f"--prometheus_targets={targets}", "--method_min_tokens=0",
             start_timeout=150) as serve:
    try:
      client = openai.OpenAI(base_url=serve.url, api_key="unused", max_retries=0, timeout=120)
      wait_until(targets.exists, 30, "tripod serve wrote the targets file")
      listed = json.loads(targets.read_text())
      processes = sorted(t["labels"]["process"] for t in listed)
      assert processes == ["decode-0", "draft-0", "prefill-0", "scheduler"], processes

      port = free_port()
      prom = subprocess.Popen(
          ["prometheus", f"--config.file={conf_dir / 'prometheus.yml'}",
           f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

      def all_up():
        try:
          res = api(port, "query", query='up{job="tripod"}')["result"]
        except OSError as e:
          return f"not answering: {e}"
        return (len(res) == 4 and all(r["value"][1] == "1" for r in res)) or res

      try:
        wait_until(lambda: all_up() is True, 60, "Prometheus scrapes all four processes")
      except TimeoutError:
        prom.terminate()
        raise AssertionError(f"{all_up()}; Prometheus said: {prom.communicate(timeout=20)[1][-2000:]}")
      # Requests between scrapes, so that every rate has an increase to see: plain ones, and the
      # compression methods through the draft worker (their counters and the draft histogram).
      story = " ".join(f"Item {i} is a {w}." for i, w in
                       enumerate(["cat", "door", "lamp", "tree", "cup"] * 12))
      for i in range(4):
        r = client.completions.create(model=MODEL_NAME, prompt=f"Count with me: {i}, {i + 1},",
                                      max_tokens=6, temperature=0)
        assert r.usage.completion_tokens >= 1
        for method in ("specpc", "speckv"):
          r = client.completions.create(model=MODEL_NAME, prompt=story, max_tokens=3, temperature=0,
                                        extra_body={"tripod": {"method": method, "budget": 0.5}})
          assert r.model_extra["tripod"]["method"]["applied"] is True, r.model_extra
        time.sleep(1.5)
      time.sleep(3)  # a few more scrapes and rule evaluations after the last request

      known = set()
      for t in listed:
        known |= exported(int(t["targets"][0].rsplit(":", 1)[1]))
      known |= {"up"} | {name for name, _, alert in rules() if not alert}

      failures = []
      for name, expr, alert in rules():
        missing = names_in(expr) - known
        if missing:
          failures.append(f"rule {name}: no process exports {sorted(missing)}")
        data = api(port, "query", query=expr)  # parses, or api() fails
        if alert:
          # An alert's expression is empty while it does not fire: its operand must have data.
          operand = re.split(r"\s(?:>|<|==)\s", expr)[0]
          if not api(port, "query", query=operand)["result"]:
            failures.append(f"alert {name}: {operand} returns no data")
        elif not data["result"]:
          failures.append(f"recording rule {name}: no data")
      for title, expr in panel_queries():
        missing = names_in(expr) - known
        if missing:
          failures.append(f"panel {title!r}: no process exports {sorted(missing)}")
        if not api(port, "query", query=expr)["result"]:
          failures.append(f"panel {title!r}: {expr} returns no data")
      assert not failures, "\n".join(failures)

      # The recording rules Prometheus evaluated itself (not only our queries of their exprs).
      groups = api(port, "rules")["groups"]
      evaluated = {r["name"]: r.get("health") for g in groups for r in g["rules"]}
      assert len(evaluated) == len(rules()), evaluated
      assert all(h == "ok" for h in evaluated.values()), evaluated

      out = tmp_path / "dashboard.png"
      r = subprocess.run(
          [sys.executable,
           os.path.join(SOURCE, "scripts", "render_dashboard.py"),
           f"--prometheus=http://127.0.0.1:{port}", f"--out={out}", "--minutes=2", "--step=1"],
          capture_output=True, text=True, timeout=120)
      assert r.returncode == 0, r.stdout + r.stderr
      assert out.stat().st_size > 10000
      drawn = int(re.search(r": (\d+) series", r.stdout).group(1))
      assert drawn >= len(panel_queries()), r.stdout
    finally:
      if prom is not None:
        prom.terminate()
        try:
          prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
          prom.kill()
          prom.wait(timeout=10)
