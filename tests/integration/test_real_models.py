"""The real models served as a user serves them (issue 37, section 6): `tripod serve --model NAME
--port P` for qwen2.5-coder-1.5b-instruct (its draft workers on qwen2.5-coder-0.5b-instruct, the
catalogue's pair) and for qwen2.5-coder-0.5b-instruct (no catalogue draft: a self-draft), then the
API checks that do not depend on the bundled model's text, with the official `openai` client and
raw HTTP:

  * the catalogue name is the served model's name (/v1/models, the printed curl example), the
    workers are in routing, the draft worker is the one the catalogue pairs (or a self-draft), and
    a SpecPC request goes through it;
  * greedy streaming equals the whole answer, token for token, on /v1/completions (a short prompt
    on the decode worker alone, a longer one through the POP prefill worker) and on
    /v1/chat/completions, whose answer to a coding question is text;
  * usage: prompt_tokens is /tokenize's count of the same prompt (token ids: their number); for a
    chat, /tokenize's count of the same messages, the same in the whole and the streamed answer,
    and the count of the Qwen2.5 ChatML text the template renders (default system message
    included), which /detokenize gives back; completion_tokens is the number of tokens streamed
    (their logprobs entries), max_tokens when finish_reason is "length";
  * tool calls (Qwen2.5's format): forced calls validate against their schema, whole and streamed
    alike, a tool result goes back into the prompt, and the gRPC Completion API makes the call
    HTTP's answer makes (the scheduler's gRPC port read from /proc);
  * errors in OpenAI's shape: 400s for bad values and types, context_length_exceeded for a prompt
    plus max_tokens past the context, 404 for another model's name, and `tools` refused with a
    400 naming it (docs/scheduler.md: refused rather than ignored), also through the client;
  * a streaming client that hangs up mid-answer: the scheduler's in-flight gauge is back at 0
    within a bounded wait, the request counts as cancelled (not run to its end), the decode worker
    reports nothing running and every KV block free, and the next request is answered.

The models must be fetched (scripts/test does it: scripts/fetch_model qwen2.5-coder-1.5b-instruct
--with-draft); a missing one fails the test with that command. One server per model (module
scope), started on a free port, stopped with SIGTERM (exit 0) and, whatever happened, killed and
reaped with its children; every wait is bounded. Prompts are short and max_tokens at most 24.
Runtime on the 2-core machine (the fast kernels of main, 2026-12-06): 24-30 s for the file alone
(about half each model), 35-49 s beside other integration tests (ctest -j2) or two busy CPU
hogs; each server is up in 2-3 s from a warm page cache.
"""

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import grpc
import openai
import pytest

from cluster import SOURCE_DIR, binary, cpb, cgrpc, wait_until

FETCH_COMMAND = "scripts/fetch_model qwen2.5-coder-1.5b-instruct --with-draft"
# name -> the environment variable ctest points at its file (tests/CMakeLists.txt; the same
# variables as the real_model tier's tests/reference/real_models.py)
MODELS = {
    "qwen2.5-coder-1.5b-instruct": "TRIPOD_MODEL_QWEN15",
    "qwen2.5-coder-0.5b-instruct": "TRIPOD_MODEL_QWEN05",
}
MAX_TOKENS = 24
START_TIMEOUT_S = 300  # the scheduler's /health at 200; a cold page cache reads 1.6 GB first
REQUEST_TIMEOUT_S = 120
QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

with open(os.path.join(SOURCE_DIR, "scripts", "model_catalogue.json"), encoding="utf-8") as f:
  CATALOGUE = json.load(f)["models"]


def cache_dir():
  base = os.environ.get("XDG_CACHE_HOME", "")
  if not os.path.isabs(base):
    base = os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "tripod", "models")


def require_fetched(name):
  """Fails (never skips) when the model's file is nowhere `--model NAME` or ctest looks."""
  entry = CATALOGUE[name]
  places = [os.environ.get(MODELS[name], "")]
  places += [os.path.join(d, entry["file"]) for d in
             (os.environ.get("TRIPOD_MODELS_DIR", ""), os.path.join(SOURCE_DIR, "models"),
              cache_dir()) if d]
  if not any(p and os.path.isfile(p) and os.path.getsize(p) == entry["bytes"] for p in places):
    pytest.fail(f"the real model {name} ({entry['file']}) is not fetched (looked at "
                f"{', '.join(p for p in places if p)}); fetch both with: {FETCH_COMMAND}",
                pytrace=False)


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def children(pid):
  try:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
      return [int(p) for p in f.read().split()]
  except FileNotFoundError:
    return []


def alive(pid):
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (FileNotFoundError, IndexError):
    return False


def _die_with_parent():
  """In the child before exec: SIGTERM when this test process dies, even by SIGKILL (a ctest
  timeout), so that tripod serve stops its workers then too (they get theirs from it)."""
  ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Serve:
  """`tripod serve --model NAME --port P`, its URL line read from stdout, its stderr in a file."""

  def __init__(self, name):
    self.name = name
    self.kids = set()
    self.log_file = tempfile.NamedTemporaryFile(prefix=f"tripod_serve_{name}_", suffix=".log",
                                                delete=False)
    self.port = free_port()
    self.proc = subprocess.Popen(
        [binary("tripod"), "serve", "--model", name, "--port", str(self.port)],
        stdout=subprocess.PIPE, stderr=self.log_file, stdin=subprocess.DEVNULL, text=True,
        start_new_session=True, preexec_fn=_die_with_parent)
    self.lines = []
    threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

  def log(self, chars=6000):
    with open(self.log_file.name, "rb") as f:
      return f.read().decode(errors="replace")[-chars:]

  def start(self):
    """Waits (bounded) for the URL line and /health 200; returns the URL line."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not self.lines:
      if self.proc.poll() is not None:
        raise AssertionError(f"tripod serve --model {self.name} exited with "
                             f"{self.proc.returncode} before serving; its log:\n{self.log()}")
      if time.monotonic() > deadline:
        raise AssertionError(f"tripod serve --model {self.name} printed no URL within "
                             f"{START_TIMEOUT_S} s; its log:\n{self.log()}")
      time.sleep(0.1)
    self.url = f"http://127.0.0.1:{self.port}"
    wait_until(lambda: self.http("GET", "/health")[0] == 200,
               max(1.0, deadline - time.monotonic()), "the scheduler's /health at 200")
    self.kids.update(children(self.proc.pid))
    return self.lines[0]

  def http(self, method, path, body=None, timeout=REQUEST_TIMEOUT_S):
    """(status, parsed JSON body or text) of one request; connection errors read as status 0."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(self.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
      with urllib.request.urlopen(req, timeout=timeout) as r:
        status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
      status, text = e.code, e.read().decode()
    except OSError:
      return 0, None
    try:
      return status, json.loads(text)
    except ValueError:
      return status, text

  def metric(self, name, labels="", role="scheduler"):
    """The value of one sample of the scheduler's /metrics, or of the decode worker's (its
    address from serve's log); None if absent."""
    if role == "scheduler":
      status, text = self.http("GET", "/metrics")
    else:
      m = re.search(rf"tripod serve: {role}-0: gRPC \S+, HTTP (\S+) ", self.log(200000))
      assert m, self.log()
      with urllib.request.urlopen(f"http://{m.group(1)}/metrics", timeout=30) as r:
        status, text = r.status, r.read().decode()
    assert status == 200, text
    want = f'{name}{{{labels + "," if labels else ""}role="{role}"}}'
    for line in text.splitlines():
      if line.startswith(want + " "):
        return float(line.split()[-1])
    return None

  def stop(self):
    """SIGTERM (tripod serve stops its children, exits 0); then, whatever happened, SIGKILL to
    what is left and reap it. Returns the exit status of the SIGTERM stop (None: killed)."""
    rc = None
    try:
      if self.proc.poll() is None:
        self.kids.update(children(self.proc.pid))
        self.proc.send_signal(signal.SIGTERM)
        try:
          rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
          pass
    finally:
      if self.proc.poll() is None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
      for k in self.kids:  # own process groups: not reached by the killpg above
        if alive(k):
          try:
            os.kill(k, signal.SIGKILL)
          except ProcessLookupError:
            pass
      for k in self.kids:
        deadline = time.monotonic() + 10
        while alive(k) and time.monotonic() < deadline:
          time.sleep(0.05)
      self.log_file.close()
    return rc


@pytest.fixture(scope="module", params=list(MODELS), ids=["1.5b", "0.5b"])
def srv(request):
  require_fetched(request.param)
  for attempt in range(3):  # the free port may be taken between free_port() and the bind
    s = Serve(request.param)
    try:
      s.url_line = s.start()
      break
    except BaseException:
      s.stop()
      log = s.log()
      os.unlink(s.log_file.name)
      if attempt == 2 or "ddress already in use" not in log:
        raise
  s.client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0,
                           timeout=REQUEST_TIMEOUT_S)
  failed_before = request.session.testsfailed
  stopped = False
  try:
    yield s
    if request.session.testsfailed > failed_before:  # past pytest's capture, into ctest's log
      print(f"\n---- tripod serve --model {s.name}: the end of its log ----\n{s.log()}",
            file=sys.__stderr__, flush=True)
    stopped = True
    rc = s.stop()
    assert rc == 0, f"tripod serve exited with {rc} on SIGTERM; its log:\n{s.log()}"
    leftover = [k for k in s.kids if alive(k)]
    assert not leftover, f"children of tripod serve left running: {leftover}"
  finally:
    if not stopped:
      s.stop()
    os.unlink(s.log_file.name)


def error_of(resp, status):
  got, body = resp
  assert got == status, (got, body)
  assert isinstance(body, dict) and set(body) == {"error"}, body
  err = body["error"]
  assert set(err) == {"message", "type", "param", "code"} and err["message"], body
  return err


# ---- the service as started --------------------------------------------------------------------


def test_served_under_its_catalogue_name_with_the_catalogue_draft(srv):
  name = srv.name
  assert [m.id for m in srv.client.models.list().data] == [name]
  # The printed example must work as printed.
  m = re.search(r"Tripod is serving (\S+) at (http://127\.0\.0\.1:(\d+)/v1)\b", srv.url_line)
  assert m and int(m.group(3)) == srv.port, srv.url_line
  assert m.group(1) == name, srv.url_line
  wait_until(lambda: len(srv.lines) >= 2, 10, "the curl example printed")
  assert f'"model": "{name}"' in srv.lines[1], srv.lines
  status, health = srv.http("GET", "/health")
  assert status == 200 and health["model"] == name, health
  assert (health["healthy_decode_workers"], health["healthy_prefill_workers"],
          health["healthy_draft_workers"]) == (1, 1, 1), health
  log = srv.log(200000)
  model_file = CATALOGUE[name]["file"]
  assert re.search(rf"tripod serve: model \S+/{re.escape(model_file)};", log), log
  draft = CATALOGUE[name].get("draft")
  if draft:  # the 1.5B: its draft workers run the 0.5B in full
    assert re.search(rf"tripod serve: draft model \S+/{re.escape(CATALOGUE[draft]['file'])}\n",
                     log), log
  else:  # the 0.5B has no catalogue draft: a self-draft of its first layers
    assert "tripod serve: draft model a self-draft of the model\n" in log, log


CODE_PROMPT = (
    "# Python: the running median of a stream of integers, with two heaps.\n"
    "import heapq\n\n\nclass RunningMedian:\n"
    "    def __init__(self):\n        self.low = []  # max-heap (negated)\n"
    "        self.high = []  # min-heap\n\n    def add(self, x: int) -> None:\n")


def test_specpc_goes_through_the_draft_worker(srv):
  r = srv.client.completions.create(
      model=srv.name, prompt=CODE_PROMPT, max_tokens=4, temperature=0,
      extra_body={"tripod": {"method": "specpc", "budget": 32}})  # tokens: under the floor
  method = r.model_extra["tripod"]["method"]
  assert method["applied"] is True, r.model_extra
  assert r.model_extra["tripod"]["draft_s"] > 0, r.model_extra
  assert 1 <= r.usage.completion_tokens <= 4


# ---- streaming equals whole; usage ---------------------------------------------------------------


def tokenize(srv, **body):
  status, j = srv.http("POST", "/tokenize", {"model": srv.name, **body})
  assert status == 200, j
  assert j["count"] == len(j["tokens"]), j
  return j["tokens"]


def detokenize(srv, ids):
  status, j = srv.http("POST", "/detokenize", {"model": srv.name, "tokens": ids})
  assert status == 200, j
  return j["prompt"]


@pytest.mark.parametrize("prompt,route", [("def is_prime(n):", "decode_only"),
                                          (CODE_PROMPT, "disaggregated")],
                         ids=["short", "prefilled"])
def test_completion_streaming_equals_whole(srv, prompt, route):
  args = dict(model=srv.name, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, logprobs=1)
  whole = srv.client.completions.create(**args)
  chunks = list(srv.client.completions.create(**args, stream=True,
                                              stream_options={"include_usage": True}))
  w = whole.choices[0]
  assert whole.model_extra["tripod"]["route"] == route, whole.model_extra
  assert w.text.strip(), w
  streamed_text = "".join(c.choices[0].text for c in chunks if c.choices)
  streamed_tokens = [t for c in chunks if c.choices and c.choices[0].logprobs
                     for t in c.choices[0].logprobs.tokens]
  assert streamed_text == w.text
  assert streamed_tokens == w.logprobs.tokens
  finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
  assert finals == [w.finish_reason]
  usage = chunks[-1].usage
  assert chunks[-1].choices == [] and usage is not None
  # usage: the prompt as /tokenize counts it, the completion as streamed
  n_prompt = len(tokenize(srv, prompt=prompt))
  assert whole.usage.prompt_tokens == usage.prompt_tokens == n_prompt
  assert whole.usage.completion_tokens == usage.completion_tokens == len(streamed_tokens)
  assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
  if w.finish_reason == "length":
    assert usage.completion_tokens == MAX_TOKENS
  else:
    assert w.finish_reason == "stop" and 1 <= usage.completion_tokens < MAX_TOKENS


def test_token_id_prompt_usage(srv):
  ids = tokenize(srv, prompt="def add(a, b):\n    return")
  r = srv.client.completions.create(model=srv.name, prompt=ids, max_tokens=3, temperature=0,
                                    extra_body={"ignore_eos": True})
  assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 3
  assert r.choices[0].finish_reason == "length"


def chatml(messages):
  """Qwen2.5's template (tokenizer.chat_template of both files) for plain text messages, with
  the generation prompt: its default system message when the chat has none."""
  if messages[0]["role"] != "system":
    messages = [{"role": "system", "content": QWEN_SYSTEM}] + messages
  text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
  return text + "<|im_start|>assistant\n"


CHAT = [{"role": "user", "content": "Write a Python function that returns the square of a number."}]


def test_chat_streaming_equals_whole_and_usage(srv):
  args = dict(model=srv.name, messages=CHAT, max_tokens=MAX_TOKENS, temperature=0, logprobs=True)
  whole = srv.client.chat.completions.create(**args)
  chunks = list(srv.client.chat.completions.create(**args, stream=True,
                                                   stream_options={"include_usage": True}))
  w = whole.choices[0]
  assert w.message.role == "assistant"
  assert w.message.content and w.message.content.strip(), w  # the answer is text
  assert "def " in w.message.content or "square" in w.message.content.lower(), w.message.content
  streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
  assert streamed == w.message.content
  streamed_tokens = [t.token for c in chunks if c.choices and c.choices[0].logprobs
                     for t in c.choices[0].logprobs.content]
  assert streamed_tokens == [t.token for t in w.logprobs.content]
  finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
  assert finals == [w.finish_reason]
  usage = chunks[-1].usage
  assert chunks[-1].choices == [] and usage is not None
  # prompt_tokens: the same twice, /tokenize's count of the messages, and the count of the
  # rendered ChatML text (which is what /detokenize makes of the messages' ids)
  ids = tokenize(srv, messages=CHAT)
  assert whole.usage.prompt_tokens == usage.prompt_tokens == len(ids)
  status, back = srv.http("POST", "/detokenize", {"model": srv.name, "tokens": ids})
  assert status == 200 and back["prompt"] == chatml(CHAT), back
  assert tokenize(srv, prompt=chatml(CHAT)) == ids
  assert whole.usage.completion_tokens == usage.completion_tokens == len(streamed_tokens)
  if w.finish_reason == "length":
    assert usage.completion_tokens == MAX_TOKENS
  else:
    assert w.finish_reason == "stop" and 1 <= usage.completion_tokens < MAX_TOKENS


def test_chat_with_a_system_message_counts_its_template(srv):
  messages = [{"role": "system", "content": "You answer with code only."},
              {"role": "user", "content": "Reverse a list xs in Python."},
              {"role": "assistant", "content": "xs[::-1]"},
              {"role": "user", "content": "And sort it?"}]
  ids = tokenize(srv, messages=messages)
  assert tokenize(srv, prompt=chatml(messages)) == ids
  r = srv.client.chat.completions.create(model=srv.name, messages=messages, max_tokens=4,
                                         temperature=0)
  assert r.usage.prompt_tokens == len(ids)
  assert 1 <= r.usage.completion_tokens <= 4


# ---- tool calls ----------------------------------------------------------------------------------

WEATHER = {"type": "function",
           "function": {"name": "get_weather", "description": "The weather in a city now",
                        "parameters": {"type": "object",
                                       "properties": {"city": {"type": "string"},
                                                      "unit": {"type": "string",
                                                               "enum": ["celsius", "fahrenheit"]}},
                                       "required": ["city", "unit"],
                                       "additionalProperties": False}}}
ASK = [{"role": "user", "content": "What is the weather in Oslo, in celsius?"}]


def streamed_calls(srv, **kw):
  """(content, {index: (name, arguments)}, finish_reason) of a streamed chat answer."""
  content, calls, finish = "", {}, None
  for chunk in srv.client.chat.completions.create(model=srv.name, stream=True, **kw):
    for ch in chunk.choices:
      d = ch.delta
      content += d.content or ""
      for tc in d.tool_calls or []:
        name, args = calls.get(tc.index, ("", ""))
        calls[tc.index] = (name + (tc.function.name or ""), args + (tc.function.arguments or ""))
      finish = ch.finish_reason or finish
  return content, calls, finish


@pytest.mark.parametrize("choice", ["required", {"type": "function",
                                                 "function": {"name": "get_weather"}}])
def test_a_forced_tool_call_is_valid_and_streams_alike(srv, choice):
  import jsonschema
  kw = dict(messages=ASK, tools=[WEATHER], tool_choice=choice, temperature=0, max_tokens=96,
            parallel_tool_calls=False)
  r = srv.client.chat.completions.create(model=srv.name, **kw)
  c = r.choices[0]
  assert c.finish_reason == "tool_calls", c
  assert c.message.content is None and len(c.message.tool_calls) == 1, c.message
  call = c.message.tool_calls[0]
  assert call.type == "function" and call.id.startswith("call_")
  assert call.function.name == "get_weather"
  args = json.loads(call.function.arguments)
  jsonschema.validate(args, WEATHER["function"]["parameters"])
  assert call.function.arguments == json.dumps(args)  # vLLM's form: json.dumps of the object
  content, calls, finish = streamed_calls(srv, **kw)
  assert (content, finish) == ("", "tool_calls")
  assert calls == {0: ("get_weather", call.function.arguments)}


def test_tool_results_go_back_into_the_prompt(srv):
  call = {"id": "call_1", "type": "function",
          "function": {"name": "get_weather",
                       "arguments": json.dumps({"city": "Oslo", "unit": "celsius"})}}
  messages = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "-3 C, snow"}]
  r = srv.client.chat.completions.create(model=srv.name, messages=messages, tools=[WEATHER],
                                         temperature=0, max_tokens=24)
  ids = tokenize(srv, messages=messages, tools=[WEATHER])
  assert r.usage.prompt_tokens == len(ids)
  assert "<tool_response>\n-3 C, snow\n</tool_response>" in detokenize(srv, ids)
  c = r.choices[0]
  # Whatever the model answers, the whole answer and the stream agree on it.
  content, calls, finish = streamed_calls(srv, messages=messages, tools=[WEATHER], temperature=0,
                                          max_tokens=24)
  assert finish == c.finish_reason and content == (c.message.content or "")
  assert calls == {i: (t.function.name, t.function.arguments)
                   for i, t in enumerate(c.message.tool_calls or [])}


def scheduler_grpc_port(srv):
  """The gRPC port tripod serve's scheduler listens on (the kernel picks it): its listening TCP
  socket that is not the HTTP port."""
  for pid in children(srv.proc.pid):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      if b"tripod-scheduler" not in f.read():
        continue
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
      try:
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
      except OSError:
        continue
      if link.startswith("socket:["):
        inodes.add(link[len("socket:["):-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
      with open(table) as f:
        for line in f.readlines()[1:]:
          cols = line.split()
          if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
            ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    ports.discard(srv.port)
    assert len(ports) == 1, ports
    return ports.pop()
  raise AssertionError("tripod serve has no tripod-scheduler child")


def test_a_forced_tool_call_over_grpc_equals_http(srv):
  """gRPC Completion with the same tools and a named tool_choice: the call HTTP's answer makes,
  whole and streamed (each call whole, with its index)."""
  kw = dict(messages=ASK, tools=[WEATHER], temperature=0, max_tokens=96,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
  want = srv.client.chat.completions.create(model=srv.name, **kw).choices[0].message.tool_calls
  fn = WEATHER["function"]
  req = cpb.CompletionRequest(
      messages=cpb.ChatMessages(messages=[cpb.ChatMessage(**m) for m in ASK]), temperature=0,
      max_tokens=96, tool_choice=cpb.ToolChoice(function="get_weather"),
      tools=[cpb.Tool(name=fn["name"], description=fn["description"],
                      parameters=json.dumps(fn["parameters"]))])
  with grpc.insecure_channel(f"127.0.0.1:{scheduler_grpc_port(srv)}") as channel:
    stub = cgrpc.CompletionStub(channel)
    got = stub.Complete(req, timeout=REQUEST_TIMEOUT_S)
    chunks = list(stub.Generate(req, timeout=REQUEST_TIMEOUT_S))
  assert got.finish_reason == "tool_calls" and got.text == "", got
  assert [(c.name, c.arguments) for c in got.choices[0].tool_calls] == \
      [(c.function.name, c.function.arguments) for c in want]
  assert got.choices[0].tool_calls[0].id.startswith("call_")
  streamed = [(c.index, c.name, c.arguments) for ch in chunks for c in ch.tool_calls]
  assert streamed == [(i, c.name, c.arguments) for i, c in enumerate(got.choices[0].tool_calls)]
  assert "".join(ch.text for ch in chunks) == "" and chunks[-1].finish_reason == "tool_calls"


# ---- errors --------------------------------------------------------------------------------------


def test_errors_in_openai_shape(srv):
  name = srv.name
  status, models = srv.http("GET", "/v1/models")
  context = models["data"][0]["max_model_len"]
  assert status == 200 and context >= 4096, models
  msgs = [{"role": "user", "content": "hi"}]
  for path, body, param in [
      ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature"),
      ("/v1/completions", {"prompt": "x", "temperature": 2.5}, "temperature"),
      ("/v1/completions", {"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
      ("/v1/completions", {"prompt": "x", "stop": 5}, "stop"),
      ("/v1/completions", {"prompt": {"text": "x"}}, "prompt"),
      ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
      ("/v1/chat/completions", {"messages": "hi"}, "messages"),
      ("/v1/chat/completions", {"messages": msgs, "top_p": "all"}, "top_p"),
  ]:
    err = error_of(srv.http("POST", path, {"model": name, **body}), 400)
    assert err["type"] == "invalid_request_error" and err["param"] == param, (body, err)
  # prompt + max_tokens past the context, and a prompt past it alone
  # (the error names the field sent)
  for path, body, param in [
      ("/v1/completions", {"prompt": "def f():", "max_tokens": context}, "max_tokens"),
      ("/v1/chat/completions", {"messages": msgs, "max_tokens": context}, "max_tokens"),
      ("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": context},
       "max_completion_tokens"),
      ("/v1/completions", {"prompt": [16] * (context + 1), "max_tokens": 1}, "prompt")]:
    err = error_of(srv.http("POST", path, {"model": name, **body}), 400)
    assert err["code"] == "context_length_exceeded" and err["param"] == param, (body, err)
  # another model's name
  for path, body in [("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions",
                                                             {"messages": msgs})]:
    err = error_of(srv.http("POST", path, {"model": "gpt-4o", **body}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model", err
  # tools where they do not belong, and their legacy form: refused, whole or streamed
  tool = {"type": "function", "function": {"name": "get_time", "description": "The time now",
                                           "parameters": {"type": "object", "properties": {}}}}
  for stream in (False, True):
    err = error_of(srv.http("POST", "/v1/completions",
                            {"model": name, "prompt": "x", "tools": [tool], "stream": stream}),
                   400)
    assert err["param"] == "tools" and "not supported" in err["message"], err
  # the same through the client
  with pytest.raises(openai.BadRequestError) as e:
    srv.client.chat.completions.create(model=name, messages=msgs, functions=[tool["function"]],
                                       max_tokens=4)
  assert e.value.body["param"] == "functions"
  with pytest.raises(openai.BadRequestError) as e:
    srv.client.completions.create(model=name, prompt="x", temperature=7)
  assert e.value.body["param"] == "temperature"
  with pytest.raises(openai.NotFoundError) as e:
    srv.client.completions.create(model=name + "-other", prompt="x", max_tokens=1)
  assert e.value.body["code"] == "model_not_found"
  assert srv.metric("tripod:num_requests_running") == 0


# ---- a client that hangs up ----------------------------------------------------------------------


def decode_idle(srv):
  status, h = srv.http("GET", "/health")
  ws = [w for w in h["workers"] if w["role"] == "decode"] if status == 200 else []
  return bool(ws) and all(w["running"] == 0 and w["queued"] == 0 and
                          w["free_kv_blocks"] == w["total_kv_blocks"] for w in ws)


def test_client_hangup_frees_its_work(srv):
  wait_until(lambda: srv.metric("tripod:num_requests_running") == 0, 30, "no request in flight")
  counters = {(role, reason): srv.metric("tripod:request_success_total",
                                          f'finish_reason="{reason}"', role)
              for role in ("scheduler", "decode") for reason in ("cancelled", "length")}
  generated = srv.metric("tripod:generation_tokens_total", role="decode")
  body = json.dumps({"model": srv.name, "prompt": "def fizzbuzz(n):", "max_tokens": MAX_TOKENS,
                     "ignore_eos": True, "temperature": 0, "stream": True}).encode()
  with socket.create_connection(("127.0.0.1", srv.port), timeout=REQUEST_TIMEOUT_S) as s:
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: {") < 1:  # the first token's event
      piece = s.recv(65536)
      assert piece, got
      got += piece
    assert b" 200 " in got.split(b"\r\n", 1)[0], got
    assert srv.metric("tripod:num_requests_running") == 1
  # closed with 23 tokens to go
  wait_until(lambda: srv.metric("tripod:num_requests_running") == 0, 15,
             "the scheduler's in-flight gauge back at 0 after the hang-up")
  # Cancelled, in the scheduler and on the decode worker, rather than run to its end there.
  wait_until(lambda: srv.metric("tripod:num_requests_running", role="decode") == 0, 15,
             "the decode worker's running gauge back at 0")
  for (role, reason), before in counters.items():
    want = before + (reason == "cancelled")
    assert srv.metric("tripod:request_success_total", f'finish_reason="{reason}"', role) == \
        want, (role, reason, "the request was not cancelled where it ran")
  extra = srv.metric("tripod:generation_tokens_total", role="decode") - generated
  assert 1 <= extra < MAX_TOKENS, f"{extra} tokens generated for a stream left after the first"
  # Its KV blocks are free (the decode worker's Health, as the scheduler last heard it: 2 s).
  wait_until(lambda: decode_idle(srv), 15, "the decode worker idle with every KV block free")
  r = srv.client.completions.create(model=srv.name, prompt="def fizzbuzz(n):", max_tokens=8,
                                    temperature=0, extra_body={"ignore_eos": True})
  assert r.usage.completion_tokens == 8 and r.choices[0].finish_reason == "length"
  assert r.choices[0].text
