"""A real Prometheus server (Debian's `prometheus` package) scrapes a running cluster: the
scheduler's and both workers' /metrics, and is queried through its HTTP API after requests ran.
The exposition must be what Prometheus ingests (names, labels, histograms), not only what
`promtool check metrics` lints."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request

import pytest

from cluster import Cluster, MODEL, wait_until
from test_disaggregated import check_metrics

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def query(port, expr):
  url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
  with urllib.request.urlopen(url, timeout=10) as r:
    body = json.load(r)
  assert body["status"] == "success", body
  return body["data"]["result"]


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is missing")
def test_prometheus_scrapes_the_cluster():
  with Cluster() as c:
    p = c.prefill(precision="fp32", pop_ratio="1/3")  # POP: its layers-skipped counter moves
    d = c.decode(precision="fp32", kv_budget_mb=64)
    s = c.scheduler(prefill=[p], decode=[d], direct_prefill_tokens=8)
    for i in range(3):
      status, body, _ = s.http("POST", "/v1/completions",
                               {"model": MODEL_NAME, "prompt": f"Once upon a time, number {i},",
                                "max_tokens": 6, "ignore_eos": True, "temperature": 0})
      assert status == 200, body
    for who, w in (("scheduler", s), ("prefill", p), ("decode", d)):
      status, body = w.http_get("/metrics")
      assert status == 200
      check_metrics(body, who)
    tmp = tempfile.mkdtemp(prefix="tripod_prom_")
    port = free_port()
    config = os.path.join(tmp, "prometheus.yml")
    targets = {"scheduler": s, "prefill": p, "decode": d}
    with open(config, "w") as f:
      f.write("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n")
      for job, w in targets.items():
        f.write(f"  - job_name: {job}\n    static_configs:\n"
                f"      - targets: ['127.0.0.1:{w.http_port}']\n")
    log = open(os.path.join(tmp, "log.txt"), "wb")
    prom = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp}/data",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
      def all_up():
        try:
          r = query(port, "up")
        except OSError:
          return False
        return len(r) == 3 and all(x["value"][1] == "1" for x in r)

      wait_until(all_up, 60, "Prometheus scraping all three targets")
      tokens = wait_until(
          lambda: query(port, 'tripod:generation_tokens_total{role="scheduler"}'), 30,
          "the scheduler's token counter")
      assert float(tokens[0]["value"][1]) == 18
      ttft = query(port, 'tripod:time_to_first_token_seconds_count{role="scheduler"}')
      assert float(ttft[0]["value"][1]) == 3
      # The name is shared: the scheduler and the decode worker each count the 3 requests.
      ended = query(port, 'sum by (role) (tripod:request_success_total{finish_reason="length"})')
      assert {r["metric"]["role"]: float(r["value"][1]) for r in ended} == {
          "scheduler": 3, "decode": 3}
      for job in targets:
        got = query(port, f'process_resident_memory_bytes{{job="{job}"}}')
        assert got and float(got[0]["value"][1]) > 0, job
      # The workers' own metrics, under the same names with their role.
      gen = query(port, 'tripod:generation_tokens_total{role="decode"}')
      assert float(gen[0]["value"][1]) == 18
      prompt = query(port, 'tripod:prompt_tokens_total{role="prefill"}')
      assert float(prompt[0]["value"][1]) > 0
      moved = query(port, 'tripod:kv_transfer_bytes_total{role="decode"}')
      assert float(moved[0]["value"][1]) > 0
      sent = query(port, 'tripod:kv_transfer_bytes_total{role="prefill"}')
      assert float(sent[0]["value"][1]) == float(moved[0]["value"][1])
      roles = {r["metric"]["role"] for r in query(port, "tripod:prompt_tokens_total")}
      assert roles == {"scheduler", "prefill", "decode"}, roles
      skipped = query(port, 'tripod:pop_layers_skipped_total{role="prefill"}')
      assert float(skipped[0]["value"][1]) > 0
      saved = query(port, 'tripod:prefill_flops_saved_total{role="prefill"}')
      assert float(saved[0]["value"][1]) > 0
      usage = query(port, 'tripod:kv_cache_usage_perc{role="decode"}')
      assert 0 <= float(usage[0]["value"][1]) <= 1
      queried = query(port, 'tripod:prefix_cache_queries_total{role="decode"}')
      assert float(queried[0]["value"][1]) >= 0
    finally:
      os.killpg(prom.pid, 9)
      prom.wait(timeout=30)
      log.close()
      shutil.rmtree(tmp, ignore_errors=True)
