"""Real worker processes on loopback for the integration tests, and the client that plays the
scheduler (Decode.Reserve -> Prefill.Run -> Decode.Generate).

Every process is started in its own session with --listen 127.0.0.1:0 and --port_file, so the
kernel picks free ports and parallel test runs never collide; every process is killed and reaped
when its test ends, failed or not (Cluster is a context manager, and an atexit hook catches the
rest). Every wait is bounded.

Stubs are generated from proto/ with grpc_tools at import time, into a temporary directory.
"""

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import grpc
from grpc_tools import protoc

SOURCE_DIR = os.environ.get("TRIPOD_SOURCE_DIR") or os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MODEL = os.environ.get("TRIPOD_MODEL") or os.path.join(SOURCE_DIR, "models",
                                                       "SmolLM2-135M-Instruct.Q4_1.gguf")
PROTOCOL_VERSION = "1"
METADATA = (("tripod-protocol-version", PROTOCOL_VERSION),)
START_TIMEOUT_S = 120
CALL_TIMEOUT_S = 300


def _generate_stubs():
  out = tempfile.mkdtemp(prefix="tripod_stubs_")
  atexit.register(shutil.rmtree, out, True)
  proto_dir = os.path.join(SOURCE_DIR, "proto")
  files = sorted(
      os.path.join("tripod", "v1", f) for f in os.listdir(os.path.join(proto_dir, "tripod", "v1"))
      if f.endswith(".proto"))
  import grpc_tools
  well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
  rc = protoc.main(["protoc", f"-I{proto_dir}", f"-I{well_known}", f"--python_out={out}",
                    f"--grpc_python_out={out}"] + files)
  if rc != 0:
    raise RuntimeError(f"grpc_tools.protoc failed ({rc}) on {files}")
  sys.path.insert(0, out)


_generate_stubs()
from tripod.v1 import common_pb2 as pb  # noqa: E402
from tripod.v1 import completion_pb2 as cpb  # noqa: E402
from tripod.v1 import completion_pb2_grpc as cgrpc  # noqa: E402
from tripod.v1 import decode_pb2 as dpb  # noqa: E402
from tripod.v1 import decode_pb2_grpc as dgrpc  # noqa: E402
from tripod.v1 import draft_pb2 as rpb  # noqa: E402
from tripod.v1 import draft_pb2_grpc as rgrpc  # noqa: E402
from tripod.v1 import kv_chunk_pb2 as kpb  # noqa: E402
from tripod.v1 import prefill_pb2 as ppb  # noqa: E402
from tripod.v1 import prefill_pb2_grpc as pgrpc  # noqa: E402


def binary(name):
  env = {"prefill": "TRIPOD_PREFILL_BIN", "decode": "TRIPOD_DECODE_BIN", "tripod": "TRIPOD_BIN",
         "draft": "TRIPOD_DRAFT_BIN",
         "tokenize": "TRIPOD_TOKENIZE_BIN", "scheduler": "TRIPOD_SCHEDULER_BIN"}[name]
  path = os.environ.get(env)
  if not path or not os.access(path, os.X_OK):
    raise RuntimeError(f"{env} is not set to an executable; run these tests through ctest")
  return path


_live = []  # every Worker started and not yet reaped, for the atexit hook


@atexit.register
def _reap_all():
  for w in list(_live):
    w.kill()


class Worker:
  """One process (tripod-prefill, tripod-decode, tripod-draft or tripod-scheduler) with its stub
  and HTTP port."""

  def __init__(self, role, args, name=None, env=None, netns=None, connect=True, prefix=(),
               credentials=None):
    self.role = role
    self.name = name or role
    self.dir = tempfile.mkdtemp(prefix=f"tripod_{self.name}_")
    self.port_file = os.path.join(self.dir, "ports.json")
    self.log_path = os.path.join(self.dir, "log.txt")
    listen = args.pop("listen", "127.0.0.1:0")
    http_listen = args.pop("http_listen", "127.0.0.1:0")
    cmd = [binary(role), f"--listen={listen}", f"--http_listen={http_listen}",
           f"--port_file={self.port_file}", f"--model={MODEL}"]
    cmd += [f"--{k}={v}" for k, v in args.items()]
    if netns:
      cmd = ["ip", "netns", "exec", netns] + cmd
    cmd = list(prefix) + cmd  # e.g. a mount namespace with its own /etc/hosts
    self.cmd = cmd
    penv = dict(os.environ)
    penv.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    penv.update(env or {})
    self._log = open(self.log_path, "wb")
    self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=penv,
                                 start_new_session=True)
    _live.append(self)
    self.host = listen.rsplit(":", 1)[0]
    self.grpc_port = self.http_port = None
    self.channel = None
    try:
      self._wait_ports()
    except Exception:
      self.kill()
      raise
    self.address = f"{self.host}:{self.grpc_port}"
    if not connect:  # in another network namespace: this process cannot reach it
      return
    options = [("grpc.max_receive_message_length", 8 << 20),
               ("grpc.max_send_message_length", 8 << 20)]
    # credentials: grpc.ssl_channel_credentials(...) for a worker that runs mutual TLS.
    self.channel = (grpc.insecure_channel(self.address, options=options) if credentials is None
                    else grpc.secure_channel(self.address, credentials, options=options))
    self.stub = {"prefill": pgrpc.PrefillStub, "decode": dgrpc.DecodeStub,
                 "draft": rgrpc.DraftStub, "scheduler": cgrpc.CompletionStub}[role](self.channel)
    self.url = f"http://{self.host}:{self.http_port}"

  def _wait_ports(self):
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        raise RuntimeError(f"{self.name} exited with {self.proc.returncode} at start:\n"
                           f"{self.log()}")
      if os.path.exists(self.port_file):
        with open(self.port_file) as f:
          ports = json.load(f)
        self.grpc_port, self.http_port = ports["grpc_port"], ports["http_port"]
        return
      time.sleep(0.05)
    raise TimeoutError(f"{self.name} did not listen within {START_TIMEOUT_S} s:\n{self.log()}")

  def log(self):
    self._log.flush()
    with open(self.log_path, "rb") as f:
      return f.read().decode(errors="replace")[-4000:]

  def health(self, timeout=10):
    return self.stub.Health(pb.HealthRequest(), metadata=METADATA, timeout=timeout)

  def http_get(self, path, timeout=10):
    """(status, body) of GET http://host:http_port/path."""
    return self.http("GET", path, timeout=timeout)[:2]

  def http(self, method, path, body=None, headers=None, timeout=60):
    """(status, body text, headers) of one HTTP request; body: bytes, str or a JSON value."""
    url = f"http://{self.host}:{self.http_port}{path}"
    hdrs = dict(headers or {})
    if body is not None and not isinstance(body, (bytes, str)):
      body = json.dumps(body)
      hdrs.setdefault("Content-Type", "application/json")
    if isinstance(body, str):
      body = body.encode()
    req = urllib.request.Request(url, data=body, method=method, headers=hdrs)
    try:
      with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
      return e.code, e.read().decode(), dict(e.headers)

  def signal(self, sig):
    if self.proc.poll() is None:
      os.killpg(self.proc.pid, sig)

  def wait(self, timeout):
    return self.proc.wait(timeout=timeout)

  def kill(self):
    """SIGKILL the process group and reap it (idempotent)."""
    if self.channel is not None:
      self.channel.close()
      self.channel = None
    if self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    try:
      self.proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
      pass
    if not self._log.closed:
      self._log.close()
    if self in _live:
      _live.remove(self)
    shutil.rmtree(self.dir, ignore_errors=True)


def wait_until(pred, timeout, what):
  """Polls pred() until it is truthy; raises with `what` after timeout seconds."""
  deadline = time.monotonic() + timeout
  last = None
  while time.monotonic() < deadline:
    last = pred()
    if last:
      return last
    time.sleep(0.05)
  raise TimeoutError(f"{what}: not within {timeout} s (last: {last})")


class Serve:
  """`tripod serve` as a user runs it, for a `with` block: started in its own session with
  --port=0 and the given flags, its URL taken from its first stdout line (bounded wait), its stderr
  kept in `stderr_lines` (whole once `stderr_reader` ends); `env` replaces the environment; when
  the block ends it gets SIGTERM, then its process group SIGKILL if it lingers. `url` is the API's
  base (http://127.0.0.1:N/v1)."""

  def __init__(self, *flags, model=None, start_timeout=120, env=None):
    self.cmd = [binary("tripod"), "serve", "--port=0", f"--model={model or MODEL}", *flags]
    self.start_timeout = start_timeout
    self.env = env
    self.stderr_reader = None
    self.proc = None
    self.url = None
    self.stderr_lines = []

  def __enter__(self):
    self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True, env=self.env)
    self.stderr_reader = threading.Thread(
        target=lambda: self.stderr_lines.extend(self.proc.stderr), daemon=True)
    self.stderr_reader.start()
    try:
      line = {}
      t = threading.Thread(target=lambda: line.update(url=self.proc.stdout.readline()),
                           daemon=True)
      t.start()
      t.join(timeout=self.start_timeout)
      m = re.search(r"(http://127\.0\.0\.1:\d+/v1)\b", line.get("url", ""))
      assert m, (line, "".join(self.stderr_lines[-20:]))
      self.url = m.group(1)
    except BaseException:
      self.stop()
      raise
    return self

  def stop(self):
    if self.proc.poll() is None:
      try:
        os.killpg(self.proc.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
    try:
      self.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
      os.killpg(self.proc.pid, signal.SIGKILL)
      self.proc.wait(timeout=30)

  def __exit__(self, *exc):
    self.stop()
    return False


def detokenize(sched, ids):
  """The scheduler's /detokenize of these token ids."""
  status, body, _ = sched.http("POST", "/detokenize", {"tokens": ids})
  assert status == 200, body
  return json.loads(body)["prompt"]


def open_sse(sched, path, body, events):
  """POSTs a streaming request on a raw socket, which the caller may close to hang up, and
  reads until `events` SSE events came. Returns (socket, the bytes read)."""
  data = json.dumps(body).encode()
  s = socket.create_connection((sched.host, sched.http_port), timeout=60)
  s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
  got = b""
  while got.count(b"data: ") < events:
    piece = s.recv(65536)
    assert piece, got
    got += piece
  return s, got


def all_blocks_free(decode):
  h = decode.health()
  return h.free_kv_blocks == h.total_kv_blocks and h.reservations == 0 and h.running == 0


class Cluster:
  """Workers started for one test; stopped and reaped on exit, whatever happened."""

  def __init__(self):
    self.workers = []

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    for w in self.workers:
      w.kill()
    return False

  def prefill(self, **args):
    name = args.pop("name", None)
    w = Worker("prefill", args, name=name, credentials=args.pop("credentials", None))
    self.workers.append(w)
    return w

  def decode(self, **args):
    name = args.pop("name", None)
    w = Worker("decode", args, name=name, credentials=args.pop("credentials", None))
    self.workers.append(w)
    return w

  def draft(self, **args):
    name = args.pop("name", None)
    w = Worker("draft", args, name=name, credentials=args.pop("credentials", None))
    self.workers.append(w)
    return w

  def scheduler(self, prefill=(), decode=(), draft=(), wait_ready=True, **args):
    """A tripod-scheduler routing to these workers (Worker objects or host:port strings); by
    default waits until its /health is 200 (a decode worker in routing)."""
    name = args.pop("name", None)
    addr = lambda ws: ",".join(w if isinstance(w, str) else w.address for w in ws)
    if prefill:
      args["prefill"] = addr(prefill)
    if decode:
      args["decode"] = addr(decode)
    if draft:
      args["draft"] = addr(draft)
    args.setdefault("health_interval_ms", 500)
    w = Worker("scheduler", args, name=name, credentials=args.pop("credentials", None))
    self.workers.append(w)
    if wait_ready:
      wait_until(lambda: w.http_get("/health")[0] == 200, 60, "scheduler ready")
    return w

  def api(self, **scheduler_args):
    """The API tests' cluster, as self.p, self.d, self.s: a prefill worker with the full weights
    (it runs any plan: POP off for exactness checks), an fp32 decode worker, and a scheduler
    that sends prompts over 8 tokens through both."""
    self.p = self.prefill(precision="fp32", pop_ratio="0")
    self.d = self.decode(precision="fp32", kv_budget_mb=256)
    self.s = self.scheduler(prefill=[self.p], decode=[self.d], direct_prefill_tokens=8,
                            max_inflight=64, **scheduler_args)
    return self


def stream_and_kill(client, args, workers, after):
  """Streams a completion (any n); after `after` token chunks SIGKILLs whichever of `workers` is
  running it. Returns ({index: text}, {index: finish_reason}, usage, the tripod object, the
  killed worker); a choice finishing twice fails."""
  stream = client.completions.create(stream=True, stream_options={"include_usage": True}, **args)
  texts, finishes, chunks, usage, tripod, victim = {}, {}, 0, None, None, None
  for chunk in stream:
    for choice in chunk.choices:
      texts[choice.index] = texts.get(choice.index, "") + choice.text
      if choice.finish_reason is not None:
        assert choice.index not in finishes, f"choice {choice.index} finished twice"
        finishes[choice.index] = choice.finish_reason
      chunks += 1
    if chunk.usage is not None:
      usage = chunk.usage
    if (chunk.model_extra or {}).get("tripod") is not None:
      tripod = chunk.model_extra["tripod"]
    if chunks == after and victim is None:
      victim = next(w for w in workers if w.health().running > 0)
      victim.kill()
  return texts, finishes, usage, tripod, victim


def openai_client(url, timeout=300):
  """The official client on a scheduler's URL (http://host:port), without retries."""
  import openai  # only the API tests need it
  return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=timeout)


def sampling(temperature=0.0, **kw):
  return pb.SamplingParams(temperature=temperature, **kw)


def generate(decode, prompt, transfer_id=0, max_tokens=16, request_id=1, ignore_eos=False,
             timeout=CALL_TIMEOUT_S, **sampling_kw):
  """Runs Decode.Generate to the end: (token ids, last event)."""
  req = dpb.GenerateRequest(request_id=request_id, prompt=prompt, transfer_id=transfer_id,
                            sampling=sampling(**sampling_kw), max_tokens=max_tokens,
                            ignore_eos=ignore_eos)
  tokens, last = [], None
  for ev in decode.stub.Generate(req, metadata=METADATA, timeout=timeout):
    if ev.token >= 0:
      tokens.append(ev.token)
    last = ev
  return tokens, last


def disaggregated(prefill, decode, prompt, max_tokens=16, request_id=1, plan=None, **sampling_kw):
  """What a scheduler does: Reserve on decode, Run on prefill (KV pushed straight to decode),
  Generate on decode. Returns (tokens, last event, PrefillResponse)."""
  h = prefill.health()
  res = decode.stub.Reserve(
      dpb.ReserveRequest(prompt_tokens=len(prompt), plan_key=h.plan_key), metadata=METADATA,
      timeout=30)
  run = prefill.stub.Run(
      ppb.PrefillRequest(request_id=request_id, prompt=prompt, decode_address=decode.address,
                         transfer_id=res.transfer_id, plan=plan),
      metadata=METADATA, timeout=CALL_TIMEOUT_S)
  tokens, last = generate(decode, prompt, transfer_id=res.transfer_id, max_tokens=max_tokens,
                          request_id=request_id, **sampling_kw)
  return tokens, last, run


def reference_tokens(prompt, max_tokens, precision="fp32", extra=()):
  """Greedy ids from the single-process `tripod generate`."""
  out = subprocess.run(
      [binary("tripod"), "generate", f"--model={MODEL}", "--ids=" + ",".join(map(str, prompt)),
       f"--max_tokens={max_tokens}", "--temperature=0", f"--precision={precision}", "--print_ids",
       *extra],
      capture_output=True, text=True, timeout=CALL_TIMEOUT_S, check=True)
  return [int(t) for t in out.stdout.split()]


def corpus_prompt(n_tokens, offset=0):
  """n_tokens real-text token ids from data/corpus/eval.txt (tokenized by the project's
  tokenizer), starting `offset` tokens in."""
  path = os.path.join(SOURCE_DIR, "data", "corpus", "eval.txt")
  with open(path, encoding="utf-8") as f:
    text = f.read()[:200000]
  with tempfile.TemporaryDirectory(prefix="tripod_tok_") as tmp:
    src, dst = os.path.join(tmp, "in.json"), os.path.join(tmp, "out.json")
    with open(src, "w") as f:
      json.dump({"texts": [text], "parse_special": False}, f)
    subprocess.run([binary("tokenize"), "encode", MODEL, src, dst], check=True, timeout=120,
                   capture_output=True)
    with open(dst) as f:
      ids = json.load(f)["ids"][0]
  if offset + n_tokens > len(ids):
    raise ValueError(f"the corpus holds {len(ids)} tokens, asked for {offset + n_tokens}")
  return ids[offset:offset + n_tokens]


def in_process_pop_tokens(prompt, max_tokens, ratio, precision="fp32"):
  """Greedy ids of the in-process POP path: `tripod prefill --generate N` prefills with the POP
  engine, imports its KV snapshot into a DecodeEngine and decodes."""
  out = subprocess.run(
      [binary("tripod"), "prefill", f"--model={MODEL}", "--ids=" + ",".join(map(str, prompt)),
       f"--pop_ratio={ratio}", f"--precision={precision}", "--compare_full=false",
       f"--generate={max_tokens}"],
      capture_output=True, text=True, timeout=CALL_TIMEOUT_S, check=True)
  return json.loads(out.stdout)["generated_ids"]
