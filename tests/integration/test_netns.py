"""The KV over a real network interface, not only loopback: the prefill worker in one network
namespace, the decode worker in another, joined by a veth pair (iproute2). The client that plays
the scheduler runs in the prefill's namespace (tests/integration/netns_driver.py) and reaches the
decode worker across the pair too. The greedy tokens must equal the single-process run's, and the
decode side's interface must have received at least the KV's bytes.

Needs root (CAP_NET_ADMIN) and `ip netns`: where the sandbox refuses them, the test is skipped
and says why. The namespaces and the veth pair are removed whatever happens.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

import cluster as C

TAG = f"tp{os.getpid() % 100000}"
NS_A, NS_B = f"{TAG}a", f"{TAG}b"
VETH_A, VETH_B = f"{TAG}va", f"{TAG}vb"
SUBNET = 10 + os.getpid() % 200
ADDR_A, ADDR_B = f"10.{SUBNET}.77.1", f"10.{SUBNET}.77.2"


def ip(*args, ns=None, check=True):
  cmd = ["ip"] + (["netns", "exec", ns, "ip"] if ns else []) + list(args)
  return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture
def namespaces():
  if os.geteuid() != 0:
    pytest.skip("skipped: network namespaces need root (CAP_NET_ADMIN)")
  if shutil.which("ip") is None:
    pytest.skip("skipped: iproute2's `ip` is not installed")
  made = []
  try:
    for ns in (NS_A, NS_B):
      r = ip("netns", "add", ns, check=False)
      if r.returncode != 0:
        pytest.skip(f"skipped: `ip netns add` refused here: {r.stderr.strip()}")
      made.append(ns)
    r = ip("link", "add", VETH_A, "type", "veth", "peer", "name", VETH_B, check=False)
    if r.returncode != 0:
      pytest.skip(f"skipped: veth pairs refused here: {r.stderr.strip()}")
    ip("link", "set", VETH_A, "netns", NS_A)
    ip("link", "set", VETH_B, "netns", NS_B)
    for ns, dev, addr in ((NS_A, VETH_A, ADDR_A), (NS_B, VETH_B, ADDR_B)):
      ip("addr", "add", f"{addr}/24", "dev", dev, ns=ns)
      ip("link", "set", dev, "up", ns=ns)
      ip("link", "set", "lo", "up", ns=ns)
    yield
  finally:
    for ns in made:
      ip("netns", "del", ns, check=False)  # takes the veth pair with it


def rx_bytes(ns, dev):
  out = subprocess.run(["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/rx_bytes"],
                       capture_output=True, text=True, timeout=30, check=True)
  return int(out.stdout)


def test_kv_crosses_a_veth_pair(namespaces):
  prompt = C.corpus_prompt(300, offset=5)
  want = C.reference_tokens(prompt, 8)
  workers = []
  try:
    prefill = C.Worker("prefill", {"listen": f"{ADDR_A}:0", "http_listen": f"{ADDR_A}:0",
                                   "precision": "fp32", "pop_ratio": "0", "threads": 1,
                                   "chunk": 512}, netns=NS_A, connect=False)
    workers.append(prefill)
    decode = C.Worker("decode", {"listen": f"{ADDR_B}:0", "http_listen": f"{ADDR_B}:0",
                                 "precision": "fp32", "threads": 1, "kv_budget_mb": 64},
                      netns=NS_B, connect=False)
    workers.append(decode)
    before = rx_bytes(NS_B, VETH_B)
    driver = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_driver.py")
    args = {"prefill": f"{ADDR_A}:{prefill.grpc_port}", "decode": f"{ADDR_B}:{decode.grpc_port}",
            "prompt": prompt, "max_tokens": 8}
    r = subprocess.run(["ip", "netns", "exec", NS_A, sys.executable, driver, json.dumps(args)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, f"driver failed:\n{r.stdout}\n{r.stderr}\n{prefill.log()}\n{decode.log()}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["tokens"] == want
    received = rx_bytes(NS_B, VETH_B) - before
    assert out["bytes_sent"] > 0
    assert received >= out["bytes_sent"], (received, out["bytes_sent"])
  finally:
    for w in workers:
      w.kill()
