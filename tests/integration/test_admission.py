"""Admission before parsing (issue 42): a scheduler flooded with large bodies refuses those past
--max_preparing / --max_preparing_bytes at the door with 429 and Retry-After, its memory stays
bounded by those limits (not by what the clients send), and /health keeps answering.

Real processes on loopback: a decode worker and a scheduler with one API thread, so that bodies
(/tokenize of megabytes of text) pile up at its door. For FLOOD_S seconds FLOOD_THREADS threads
each open BODIES_PER_ROUND connections one after another, send a BODY_BYTES body on each and
keep it open waiting for the answer (every fifth body is malformed: 400 on the API thread), then
read every answer that has come and hang up on the rest. Without the limits every body of a
round would wait in memory for the API thread: FLOOD_THREADS x BODIES_PER_ROUND x BODY_BYTES,
about 1.4 GB.
"""

import json
import socket
import subprocess
import threading
import time

import pytest

from cluster import MODEL, Cluster, binary, wait_until

FLOOD_THREADS = 12
BODIES_PER_ROUND = 40
FLOOD_S = 5.0
BODY_BYTES = 3 << 20
MAX_PREPARING = 6
MAX_PREPARING_BYTES = 16 << 20
MIB = 1 << 20


def proc_kib(pid, field):
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise KeyError(field)


def request_bytes(port, path, body):
  head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
          f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
  return head + body


def answer_of(sock, wait_s):
  """(status, headers, body) of the answer on sock if it comes within wait_s, else None."""
  sock.settimeout(wait_s)
  data = b""
  try:
    while True:
      piece = sock.recv(1 << 16)
      if not piece:
        break
      data += piece
  except (socket.timeout, ConnectionResetError):
    pass
  if b"\r\n\r\n" not in data:
    return None
  head, body = data.split(b"\r\n\r\n", 1)
  lines = head.decode().split("\r\n")
  headers = {k.strip().lower(): v.strip() for k, v in
             (line.split(":", 1) for line in lines[1:] if ":" in line)}
  return int(lines[0].split()[1]), headers, body


def metric(text, name, **labels):
  total = 0.0
  for line in text.splitlines():
    if not line.startswith(name + "{") and not line.startswith(name + " "):
      continue
    if all(f'{k}="{v}"' in line for k, v in labels.items()):
      total += float(line.rsplit(" ", 1)[1])
  return total


def test_flood_of_large_bodies_is_shed_and_memory_stays_bounded():
  with Cluster() as c:
    decode = c.decode(kv_budget_mb=32)
    sched = c.scheduler(decode=[decode], api_threads=1, max_preparing=MAX_PREPARING,
                        max_preparing_bytes=MAX_PREPARING_BYTES)
    pid, port = sched.proc.pid, sched.http_port
    text = ("the quick brown fox jumps over the lazy dog " * (BODY_BYTES // 44 + 1))
    good = request_bytes(port, "/tokenize", json.dumps({"prompt": text[:BODY_BYTES]}).encode())
    bad = request_bytes(port, "/tokenize", b'{"prompt": "' + b"x" * BODY_BYTES)  # unterminated

    # What one body costs while it is tokenized and answered (its text, the pieces, the ids,
    # the JSON answer), measured on its own first.
    rss_before_kib = proc_kib(pid, "VmRSS")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
      sock.sendall(good)
      got = answer_of(sock, 60)
    assert got is not None and got[0] == 200, got
    one_body_mib = (proc_kib(pid, "VmHWM") - rss_before_kib) / 1024

    lock = threading.Lock()
    seen = {"sent": 0, "429": 0, "retry_after": set(), "other": [], "waiting": 0,
            "send_errors": []}
    health = {"answers": 0, "worst_s": 0.0, "failures": []}
    stop = threading.Event()

    def classify(got):
      if got is None:
        seen["waiting"] += 1
      elif got[0] == 429:
        seen["429"] += 1
        seen["retry_after"].add(got[1].get("retry-after"))
        err = json.loads(got[2])["error"]
        if (err["type"], err["code"]) != ("rate_limit_error", "server_busy"):
          seen["other"].append(err)
      else:
        seen["other"].append(got[0])

    def flood(i, deadline):
      n = 0
      while time.monotonic() < deadline:
        socks = []
        for _ in range(BODIES_PER_ROUND):
          n += 1
          try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            socks.append(sock)
            sock.sendall(bad if (i + n) % 5 == 0 else good)
          except OSError as e:  # the server may close on an early answer: neither here nor there
            with lock:
              seen["send_errors"].append(repr(e))
        # Then each answer if it has come; the rest are hung up on.
        for sock in socks:
          got = answer_of(sock, 0.05)
          sock.close()
          with lock:
            seen["sent"] += 1
            classify(got)

    def probe_health():
      while not stop.is_set():
        t0 = time.monotonic()
        try:
          status, _ = sched.http_get("/health", timeout=5)
          if status != 200:
            health["failures"].append(status)
        except OSError as e:
          health["failures"].append(repr(e))
        health["answers"] += 1
        health["worst_s"] = max(health["worst_s"], time.monotonic() - t0)
        time.sleep(0.1)

    prober = threading.Thread(target=probe_health)
    prober.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=flood, args=(i, t0 + FLOOD_S))
               for i in range(FLOOD_THREADS)]
    for t in threads:
      t.start()
    for t in threads:
      t.join(timeout=120)
    flood_s = time.monotonic() - t0
    stop.set()
    prober.join(timeout=30)
    assert not any(t.is_alive() for t in threads + [prober]), "a client thread did not finish"

    hwm_kib = proc_kib(pid, "VmHWM")
    grown_mib = (hwm_kib - rss_before_kib) / 1024
    # What may be live at once: the gate's bytes, every client's body being read (the parser's
    # string plus its read buffer) and the body being tokenized. RSS may be up to twice that:
    # the allocator keeps freed blocks for reuse (glibc raises its mmap and trim thresholds
    # after large blocks are freed); and a margin.
    live_mib = (MAX_PREPARING_BYTES + FLOOD_THREADS * 2 * BODY_BYTES) / MIB + one_body_mib
    bound_mib = 2 * live_mib + 64
    print(f"sent {seen['sent']} in {flood_s:.1f} s, 429: {seen['429']}, no answer yet: "
          f"{seen['waiting']}, other: {seen['other'][:5]}, send errors: "
          f"{len(seen['send_errors'])}; peak "
          f"RSS growth {grown_mib:.0f} MiB (bound {bound_mib:.0f}, one body alone {one_body_mib:.0f}); /health answered "
          f"{health['answers']} times, worst {health['worst_s']:.2f} s")
    assert seen["429"] > 0, seen
    assert seen["retry_after"] and all(r is not None and int(r) >= 1
                                       for r in seen["retry_after"]), seen["retry_after"]
    assert all(o in (200, 400) for o in seen["other"]), seen["other"]
    offered_mib = seen["sent"] * BODY_BYTES / MIB
    assert offered_mib > 2 * bound_mib, f"the flood was too small to show anything: {offered_mib}"
    assert grown_mib < bound_mib, f"peak RSS grew {grown_mib:.0f} MiB, bound {bound_mib:.0f} MiB"
    # /health answered throughout, every probe within its 5 s timeout (the one I/O thread also
    # reads the flood, so a probe may take a second or two).
    assert not health["failures"] and health["answers"] >= max(1, flood_s / 5), health

    # Every path gave its share back: the answered, the refused on the API thread (400) and the
    # hung-up; and the refusals were counted.
    def drained():
      text = sched.http_get("/metrics")[1]
      return (metric(text, "tripod:http_requests_preparing") == 0 and
              metric(text, "tripod:http_requests_preparing_bytes") == 0 and text)
    text = wait_until(drained, 120, "the API threads' backlog gone")
    shed = metric(text, "tripod:http_requests_shed_total", role="scheduler")
    assert shed >= seen["429"] > 0, (shed, seen["429"])
    status, body, _ = sched.http("POST", "/tokenize", {"prompt": "still serving"})
    assert status == 200 and json.loads(body)["count"] >= 1, body
    assert sched.proc.poll() is None


@pytest.mark.parametrize("flag,message", [
    ("--max_preparing=-1", "--max_preparing must not be negative"),
    ("--max_preparing_bytes=0", "--max_preparing_bytes must be > 0"),
])
def test_out_of_range_admission_flags_are_refused(flag, message):
  r = subprocess.run([binary("scheduler"), "--decode=127.0.0.1:1", "--listen=127.0.0.1:0",
                      "--http_listen=127.0.0.1:0", f"--model={MODEL}", flag],
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2, (r.stdout, r.stderr)
  assert message in r.stdout + r.stderr, (r.stdout, r.stderr)
