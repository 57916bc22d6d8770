"""Workers found by DNS, end to end: the scheduler's --decode_dns names a host that resolves to
two addresses (what a Kubernetes headless Service gives), each a real tripod-decode on its own
loopback address (127.0.0.2 and 127.0.0.3, same port). The scheduler runs in a mount namespace
of its own whose /etc/hosts lists the name (unshare + a bind mount: the machine's own file is
never touched), so the resolution goes through glibc's getaddrinfo as in a cluster. Checks: both
workers join routing and both serve requests; a worker whose address leaves the name leaves
routing; one that comes back joins again.

Needs root (a mount namespace): where the sandbox refuses it, the test is skipped and says why.
"""

import concurrent.futures
import json
import os
import shutil
import socket
import subprocess
import tempfile

import pytest

import cluster as C

NAME = "decode.tripod-test.internal"
ADDRS = ["127.0.0.2", "127.0.0.3"]


def free_port_on_both():
  for _ in range(50):
    socks = []
    try:
      a = socket.socket()
      a.bind((ADDRS[0], 0))
      socks.append(a)
      port = a.getsockname()[1]
      b = socket.socket()
      socks.append(b)
      b.bind((ADDRS[1], port))
      return port
    except OSError:
      continue
    finally:
      for s in socks:
        s.close()
  raise RuntimeError("no port free on both loopback addresses")


def write_hosts(path, addrs):
  # In place (same inode): the bind mount in the scheduler's namespace sees the change.
  with open(path, "r+") as f:
    f.seek(0)
    f.truncate()
    f.write("127.0.0.1 localhost\n" + "".join(f"{a} {NAME}\n" for a in addrs))
    f.flush()


def health(sched):
  status, body = sched.http_get("/health")
  return json.loads(body)


def decode_addresses(sched, healthy_only=True):
  return sorted(w["address"] for w in health(sched)["workers"]
                if w["role"] == "decode" and (w["healthy"] or not healthy_only))


def served(worker):
  """Requests the decode worker finished (its own counter)."""
  _, text = worker.http_get("/metrics")
  total = 0.0
  for line in text.splitlines():
    if line.startswith("tripod:request_success_total{"):
      total += float(line.rsplit(" ", 1)[1])
  return total


@pytest.fixture
def mount_namespace_prefix():
  if os.geteuid() != 0:
    pytest.skip("skipped: a mount namespace needs root")
  if shutil.which("unshare") is None:
    pytest.skip("skipped: util-linux's unshare is not installed")
  probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True, timeout=30)
  if probe.returncode != 0:
    pytest.skip(f"skipped: unshare -m refused here: {probe.stderr.strip()}")
  d = tempfile.mkdtemp(prefix="tripod_dns_")
  hosts = os.path.join(d, "hosts")
  open(hosts, "w").close()
  # unshare -m makes the new namespace's mounts private: the bind mount stays inside it.
  prefix = ["unshare", "-m", "sh", "-c", f'mount --bind "{hosts}" /etc/hosts && exec "$@"', "sh"]
  try:
    yield prefix, hosts
  finally:
    shutil.rmtree(d, ignore_errors=True)


def test_decode_workers_by_dns(mount_namespace_prefix):
  prefix, hosts = mount_namespace_prefix
  port = free_port_on_both()
  with C.Cluster() as c:
    d = [c.decode(listen=f"{a}:{port}", http_listen=f"{a}:0", name=f"decode_{a}",
                  kv_budget_mb=64) for a in ADDRS]
    want = sorted(f"{a}:{port}" for a in ADDRS)
    write_hosts(hosts, ADDRS)
    s = C.Worker("scheduler", {"decode_dns": f"{NAME}:{port}", "health_interval_ms": 200,
                               "direct_prefill_tokens": 1000}, name="dns_scheduler",
                 prefix=prefix)
    c.workers.append(s)
    C.wait_until(lambda: decode_addresses(s) == want, 60, f"both {want} in routing")

    # Least-load routing over both: concurrent requests land on each.
    body = {"model": os.path.basename(C.MODEL)[:-len(".gguf")], "prompt": "The sky is",
            "max_tokens": 24, "ignore_eos": True, "temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
      results = list(pool.map(lambda _: s.http("POST", "/v1/completions", body, timeout=120),
                              range(8)))
    assert all(r[0] == 200 for r in results), [r[:2] for r in results if r[0] != 200]
    counts = [served(w) for w in d]
    assert sum(counts) == 8 and min(counts) >= 1, counts

    # The second address leaves the name: it leaves routing, while its process still runs.
    write_hosts(hosts, ADDRS[:1])
    C.wait_until(lambda: decode_addresses(s, healthy_only=False) == want[:1], 30,
                 f"{want[1]} out of the registry")
    assert d[1].proc.poll() is None
    status, _, _ = s.http("POST", "/v1/completions", body, timeout=120)
    assert status == 200
    # It comes back.
    write_hosts(hosts, ADDRS)
    C.wait_until(lambda: decode_addresses(s) == want, 30, f"{want[1]} back in routing")
