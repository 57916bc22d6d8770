"""`tripod serve`, the README's first command: it starts the scheduler and the workers as child
processes, prints the URL once the API answers, serves the official openai client (a SpecKV request
through the draft worker too), restarts a worker that dies (on the same ports), and stops everything
on SIGTERM (exit 0, no child left)."""

import os
import signal

import openai

from cluster import MODEL, Serve, wait_until

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]


def children(pid):
  try:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
      return [int(p) for p in f.read().split()]
  except FileNotFoundError:
    return []


def comm(pid):
  try:
    with open(f"/proc/{pid}/comm") as f:
      return f.read().strip()
  except FileNotFoundError:
    return ""


def alive(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split()[2] != "Z"
  except FileNotFoundError:
    return False


def test_serve_starts_serves_restarts_and_stops():
  kids = []
  # The story below is shorter than the default method floor: set it to 0, and the draft deadline,
  # through to the scheduler.
  with Serve("--method_min_tokens=0", "--draft_timeout_ms=60000") as serve:
    proc = serve.proc
    try:
      client = openai.OpenAI(base_url=serve.url, api_key="unused", max_retries=0, timeout=120)
      r = client.chat.completions.create(model=MODEL_NAME, max_tokens=8, temperature=0,
                                         messages=[{"role": "user", "content": "Hello!"}])
      assert r.choices[0].message.content and r.usage.completion_tokens >= 1

      # The draft worker serves the compression methods: SpecKV scores the prefill worker's KV
      # and only the budget is sent.
      story = " ".join(f"Item {i} is a {w}." for i, w in
                       enumerate(["cat", "door", "lamp", "tree", "cup"] * 12))
      r = client.completions.create(model=MODEL_NAME, prompt=story, max_tokens=4, temperature=0,
                                    extra_body={"tripod": {"method": "speckv", "budget": 0.5}})
      method = r.model_extra["tripod"]["method"]
      assert method["applied"] is True and method["kv_bytes_saved"] > 0, r.model_extra
      assert r.model_extra["tripod"]["route"] == "disaggregated"

      kids = children(proc.pid)
      names = sorted(comm(k) for k in kids)
      assert names == ["tripod-decode", "tripod-draft", "tripod-prefill", "tripod-schedule"], names
      # Without --pop the prefill worker loads the catalogue's ratio for the model: none.
      prefill = next(k for k in kids if comm(k) == "tripod-prefill")
      with open(f"/proc/{prefill}/cmdline", "rb") as f:
        prefill_args = f.read().split(b"\0")
      assert b"--pop_ratio=0" in prefill_args, prefill_args
      # With the cores lent (two or more), the draft worker is a second member of the prefill
      # worker's slot.
      draft = next(k for k in kids if comm(k) == "tripod-draft")
      with open(f"/proc/{draft}/cmdline", "rb") as f:
        draft_args = f.read().split(b"\0")
      slot = [a for a in prefill_args if a.startswith(b"--core_share_slot=")]
      if len(os.sched_getaffinity(0)) >= 2:
        assert slot, prefill_args
      if slot:
        assert slot[0] in draft_args and b"--core_share_member=1" in draft_args, draft_args
      scheduler = next(k for k in kids if comm(k) == "tripod-schedule")
      with open(f"/proc/{scheduler}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
      assert b"--method_min_tokens=0" in args and b"--draft_timeout_ms=60000" in args, args
      decode = next(k for k in kids if comm(k) == "tripod-decode")
      os.kill(decode, signal.SIGKILL)
      # A new decode worker comes up on the same port; the scheduler routes to it again.
      wait_until(lambda: any(comm(k) == "tripod-decode" and k != decode
                             for k in children(proc.pid)), 60, "the decode worker restarted")

      def served():
        try:
          return client.completions.create(model=MODEL_NAME, prompt="One, two,", max_tokens=3,
                                           temperature=0).usage.completion_tokens == 3
        except openai.APIError:
          return False

      wait_until(served, 90, "a request served after the restart")
      kids = children(proc.pid)
      proc.send_signal(signal.SIGTERM)  # serve alone: it stops its children itself
      assert proc.wait(timeout=60) == 0
      for k in kids:
        wait_until(lambda: not alive(k), 10, f"child {k} gone")
    finally:
      for k in kids:
        if alive(k):
          os.kill(k, signal.SIGKILL)


def thread_cpu_ticks(pid):
  """{tid: utime + stime in clock ticks} of every thread of pid."""
  out = {}
  for tid in os.listdir(f"/proc/{pid}/task"):
    try:
      with open(f"/proc/{pid}/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
      continue
    out[int(tid)] = int(fields[11]) + int(fields[12])  # fields 14 and 15 of stat
  return out


def computing_threads(lend):
  """Serves one long prompt with the decode worker idle; returns how many of the prefill worker's
  threads did a real share of its work (at least a third of the busiest one's CPU time), and
  serve's log."""
  with Serve("--draft_workers=0", f"--lend_cores={'true' if lend else 'false'}") as serve:
    client = openai.OpenAI(base_url=serve.url, api_key="unused", max_retries=0, timeout=300)
    prefill = next(k for k in children(serve.proc.pid) if comm(k) == "tripod-prefill")
    before = thread_cpu_ticks(prefill)
    prompt = " ".join(f"Line {i}: the {w} is on the table." for i, w in
                      enumerate(["cup", "book", "lamp", "pen"] * 40))  # about 1,600 tokens
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1, temperature=0)
    assert r.usage.prompt_tokens > 1000, r.usage
    after = thread_cpu_ticks(prefill)
    used = sorted((after[t] - before.get(t, 0) for t in after), reverse=True)
    assert used[0] >= 10, used  # the prefill took at least 0.1 s of CPU (USER_HZ is 100)
    return sum(1 for u in used if u * 3 >= used[0]), "".join(serve.stderr_lines)


def test_serve_lends_an_idle_workers_cores():
  # With the decode worker idle, a prompt prefills on every core it lends; with --lend_cores=false
  # on the prefill worker's own share only (one core each on two, so one computing thread).
  cores = len(os.sched_getaffinity(0))
  lent, log = computing_threads(lend=True)
  fixed, _ = computing_threads(lend=False)
  if cores >= 2:
    assert "idle ones lent" in log, log[-2000:]
    assert lent >= 2, (lent, fixed)
    assert fixed <= cores // 2, (lent, fixed)
    assert lent > fixed, (lent, fixed)
  else:
    assert lent == fixed == 1, (lent, fixed)
