"""The OpenAI-compatible API end to end: real tripod-scheduler, tripod-prefill and tripod-decode
processes on loopback, driven by the official `openai` Python client, raw HTTP and a grpcio
client of tripod.v1.Completion.

Exactness: with `tripod: {"pop": "off"}` and fp32 workers, greedy output through the scheduler
(disaggregated: Reserve -> Prefill.Run -> Generate) equals `tripod generate --precision fp32`.
"""

import concurrent.futures
import json
import os
import socket
import threading
import time

import grpc
import openai
import pytest

from cluster import (Cluster, all_blocks_free, corpus_prompt, cpb, openai_client,
                     reference_tokens, stream_and_kill, wait_until, MODEL)

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]


@pytest.fixture(scope="module")
def cluster():
  with Cluster() as c:
    # POP off for the exactness checks (per request), the scheduler's default 1/3 otherwise.
    yield c.api(pop="1/3")


@pytest.fixture(scope="module")
def client(cluster):
  return openai_client(cluster.s.url)


def detokenize(sched, ids):
  status, body, _ = sched.http("POST", "/detokenize", {"tokens": ids})
  assert status == 200, body
  return json.loads(body)["prompt"]


def test_models_and_health(cluster, client):
  models = client.models.list()
  assert [m.id for m in models.data] == [MODEL_NAME]
  status, body = cluster.s.http_get("/health")
  h = json.loads(body)
  assert status == 200 and h["healthy_decode_workers"] == 1 and h["healthy_prefill_workers"] == 1


@pytest.mark.parametrize("n_prompt", [5, 64, 300])
def test_greedy_pop_off_equals_reference(cluster, client, n_prompt):
  prompt = corpus_prompt(n_prompt, offset=100)
  want = reference_tokens(prompt, 12, precision="fp32")
  r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=12, temperature=0,
                                extra_body={"tripod": {"pop": "off"}})
  assert r.choices[0].text == detokenize(cluster.s, want)
  assert r.usage.prompt_tokens == n_prompt
  assert r.usage.completion_tokens == len(want)
  timing = r.model_extra["tripod"]
  # Short prompts go straight to the decode worker; longer ones through the prefill worker.
  assert timing["route"] == ("decode_only" if n_prompt < 8 else "disaggregated")
  if n_prompt >= 8:
    assert timing["prefill_s"] > 0 and timing["first_token_s"] > 0


def test_pop_controls_through_the_api(cluster, client):
  """tripod.pop_variant: POP's controls at 1/3 run on the disaggregated route (the prefill worker
  and the decode worker both apply them) and change the greedy output (its tokens or their
  log-probabilities: the first token's logits come from another model in every control) against
  POP 1/3; "pop" leaves it bit-identical, and so does any control at ratio 0 against POP off; a
  short prompt runs its control on the decode worker alone."""
  prompt = corpus_prompt(64, offset=300)

  def run(tripod, p=prompt):
    r = client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=16, temperature=0,
                                  logprobs=0, extra_body={"ignore_eos": True, "tripod": tripod})
    assert r.usage.completion_tokens == 16
    c = r.choices[0]
    return (c.text, c.logprobs.token_logprobs), r.model_extra["tripod"]["route"]

  pop, route = run({"pop": "1/3"})
  assert route == "disaggregated"
  assert run({"pop": "1/3", "pop_variant": "pop"}) == (pop, route)
  for variant in ("noboundary", "nokv", "shortgpt"):
    out, route = run({"pop": "1/3", "pop_variant": variant})
    assert route == "disaggregated", variant
    assert out[1][0] != pop[1][0] and out != pop, (variant, out, pop)
    out, route = run({"pop": "1/3", "pop_variant": variant}, prompt[:5])
    assert route == "decode_only" and out[0], variant
    # At ratio 0 a control acts on no layer: the full model's output, bit for bit.
    assert run({"pop": "0", "pop_variant": variant}) == run({"pop": "off"}), variant
  wait_until(lambda: all_blocks_free(cluster.d), 30, "every KV block free after the controls")


def test_logit_bias(cluster, client):
  """+100 forces a token at every step, -100 bans the greedy choice; through both workers and
  the decode worker alone, completions and chat."""
  for n_prompt in (5, 40):
    prompt = corpus_prompt(n_prompt, offset=300)
    want = reference_tokens(prompt, 6, precision="fp32")
    forced = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=6,
                                       temperature=0, logit_bias={"1000": 100},
                                       extra_body={"ignore_eos": True, "tripod": {"pop": "off"}})
    assert forced.choices[0].text == detokenize(cluster.s, [1000] * 6)
    banned = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=1,
                                       temperature=0, logit_bias={str(want[0]): -100},
                                       extra_body={"tripod": {"pop": "off"}})
    assert banned.choices[0].text != detokenize(cluster.s, want[:1])
  chat = client.chat.completions.create(
      model=MODEL_NAME, messages=[{"role": "user", "content": "Say something."}], max_tokens=4,
      temperature=0.8, seed=3, logit_bias={"1000": 100})
  assert chat.choices[0].message.content == detokenize(cluster.s, [1000] * 4)
  status, err, _ = error_of(cluster.s.http("POST", "/v1/completions", {
      "model": MODEL_NAME, "prompt": "x", "logit_bias": {"49152": 1}}))
  assert status == 400 and err["param"] == "logit_bias" and "vocabulary" in err["message"]


def test_stop_token_ids_and_min_tokens(cluster, client):
  """vLLM's stop_token_ids end the completion at a token (its text kept), min_tokens holds it
  back: token 1000 forced by its bias stops at once, or at the fourth token with min_tokens 3."""
  prompt = corpus_prompt(40, offset=500)
  for min_tokens, n in ((None, 1), (3, 4)):
    extra = {"stop_token_ids": [1000], "ignore_eos": True, "tripod": {"pop": "off"}}
    if min_tokens is not None:
      extra["min_tokens"] = min_tokens
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                  logit_bias={"1000": 100}, logprobs=0, extra_body=extra)
    c = r.choices[0]
    assert c.finish_reason == "stop" and r.usage.completion_tokens == n, r
    assert c.logprobs.tokens[-1] == detokenize(cluster.s, [1000])
    assert c.text.endswith(detokenize(cluster.s, [1000]))
  for body, param in (({"min_tokens": 17, "max_tokens": 16}, "min_tokens"),
                      ({"stop_token_ids": [49152]}, "stop_token_ids")):
    status, err, _ = error_of(cluster.s.http("POST", "/v1/completions",
                                             {"model": MODEL_NAME, "prompt": "x", **body}))
    assert status == 400 and err["param"] == param, err


def test_streaming_equals_whole(cluster, client):
  prompt = corpus_prompt(100, offset=7)
  whole = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10,
                                    temperature=0)
  chunks = list(client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=10,
                                          temperature=0, stream=True,
                                          stream_options={"include_usage": True}))
  text = "".join(c.choices[0].text for c in chunks if c.choices)
  assert text == whole.choices[0].text
  finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
  assert len(finals) == 1 and finals[0].choices[0].finish_reason == whole.choices[0].finish_reason
  assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == \
      whole.usage.completion_tokens


def test_tools_need_a_template_with_a_tool_format(cluster, client):
  # SmolLM2's ChatML has none: tools, calls and tool results would be dropped from the prompt.
  tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
  user = {"role": "user", "content": "hi"}
  call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
  for kw, param in [({"messages": [user], "tools": [tool]}, "tools"),
                    ({"messages": [user, {"role": "assistant", "tool_calls": [call]}]},
                     "messages"),
                    ({"messages": [user, {"role": "tool", "tool_call_id": "c", "content": "1"}]},
                     "messages")]:
    with pytest.raises(openai.BadRequestError) as e:
      client.chat.completions.create(model=MODEL_NAME, max_tokens=4, **kw)
    assert e.value.body["param"] == param and "tool format" in e.value.body["message"], kw
  # "none" leaves the tools out of the prompt: nothing to render, so it is served.
  r = client.chat.completions.create(model=MODEL_NAME, messages=[user], tools=[tool],
                                     tool_choice="none", max_tokens=2)
  assert r.choices[0].message.tool_calls is None


def test_chat_whole_and_streamed(cluster, client):
  messages = [{"role": "user", "content": "Name three colours."}]
  whole = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16,
                                         temperature=0)
  assert whole.choices[0].message.role == "assistant"
  assert whole.choices[0].message.content
  assert whole.choices[0].finish_reason in ("stop", "length")
  stream = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=16,
                                          temperature=0, stream=True)
  pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
  assert "".join(pieces) == whole.choices[0].message.content


def test_logprobs(cluster, client):
  r = client.completions.create(model=MODEL_NAME, prompt="The capital of France is",
                                max_tokens=4, temperature=0, logprobs=3)
  lp = r.choices[0].logprobs
  assert len(lp.tokens) == r.usage.completion_tokens == len(lp.token_logprobs)
  for top, chosen in zip(lp.top_logprobs, lp.token_logprobs):
    assert len(top) == 3 and chosen <= 0
    assert max(top.values()) >= chosen - 1e-4  # greedy: the chosen token is the most likely


def test_32_concurrent_streams(cluster, client):
  prompts = [corpus_prompt(40 + i, offset=11 * i) for i in range(32)]

  def run(p):
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=8,
                                            temperature=0.8, seed=1, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    return chunks[-1].usage, sum(1 for c in chunks if c.choices and c.choices[0].text)

  with concurrent.futures.ThreadPoolExecutor(32) as pool:
    results = list(pool.map(run, prompts))
  for (usage, _), p in zip(results, prompts):
    assert usage.prompt_tokens == len(p) and usage.completion_tokens == 8
  wait_until(lambda: all_blocks_free(cluster.d), 30, "every KV block free after the burst")


def error_of(resp):
  status, body, headers = resp
  j = json.loads(body)
  assert set(j) == {"error"} and set(j["error"]) == {"message", "type", "param", "code"}, body
  assert j["error"]["message"]
  return status, j["error"], headers


@pytest.mark.parametrize("body,param", [
    ({"model": MODEL_NAME, "prompt": "x", "temperature": "hot"}, "temperature"),
    ({"model": MODEL_NAME, "prompt": "x", "n": 0}, "n"),
    ({"model": MODEL_NAME, "prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL_NAME, "prompt": 17}, "prompt"),
    ({"model": MODEL_NAME, "prompt": "x", "top_p": 1.5}, "top_p"),
    ({"model": MODEL_NAME, "prompt": "x", "tripod": {"pop": "1/3", "pop_variant": "nokv2"}},
     "tripod.pop_variant"),
    ({"model": MODEL_NAME, "prompt": "x", "tripod": {"pop_variant": "shortgpt"}},
     "tripod.pop_variant"),
])
def test_400s(cluster, body, param):
  status, err, _ = error_of(cluster.s.http("POST", "/v1/completions", body))
  assert status == 400 and err["param"] == param and err["type"] == "invalid_request_error"


def test_bad_json_and_unknown_model_and_context(cluster):
  status, err, _ = error_of(cluster.s.http("POST", "/v1/completions", "{not json"))
  assert status == 400
  status, err, _ = error_of(cluster.s.http("POST", "/v1/completions",
                                           {"model": "gpt-9", "prompt": "x"}))
  assert status == 404 and err["code"] == "model_not_found"
  status, err, _ = error_of(cluster.s.http("POST", "/v1/completions",
                                           {"model": MODEL_NAME, "prompt": [1] * 9000}))
  assert status == 400 and err["code"] == "context_length_exceeded"
  # A body over the limit (8 MiB) is refused on its Content-Length, before it is read: the
  # client sends the headers and a first piece, and reads the answer.
  with socket.create_connection((cluster.s.host, cluster.s.http_port), timeout=30) as s:
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(9 << 20).encode() + b"\r\n\r\n{" + b" " * 1000)
    answer = b""
    while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
      piece = s.recv(65536)
      if not piece:
        break
      answer += piece
  head, _, body = answer.partition(b"\r\n\r\n")
  assert head.startswith(b"HTTP/1.1 413"), answer
  assert json.loads(body)["error"]["message"]
  status, err, headers = error_of(cluster.s.http("GET", "/v1/completions"))
  assert status == 405 and headers.get("Allow") == "POST"
  status, err, _ = error_of(cluster.s.http("GET", "/v2/nothing"))
  assert status == 404


def test_api_key_429_and_503(cluster):
  with Cluster() as c:
    keyed = c.scheduler(decode=[cluster.d], api_key="sesame", name="keyed")
    status, err, headers = error_of(keyed.http("POST", "/v1/completions",
                                               {"model": MODEL_NAME, "prompt": "x"}))
    assert status == 401 and err["type"] == "authentication_error"
    status, err, _ = error_of(keyed.http("GET", "/v1/models",
                                         headers={"Authorization": "Bearer wrong"}))
    assert status == 401
    assert keyed.http("GET", "/v1/models", headers={"Authorization": "Bearer sesame"})[0] == 200
    # /health: the bare status open without a key (probes), the workers' detail only with it.
    status, body = keyed.http_get("/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}, body
    status, body, _ = keyed.http("GET", "/health", headers={"Authorization": "Bearer wrong"})
    assert status == 200 and json.loads(body) == {"status": "ok"}, body
    status, body, _ = keyed.http("GET", "/health", headers={"Authorization": "Bearer sesame"})
    h = json.loads(body)
    assert status == 200 and h["healthy_decode_workers"] == 1, body
    assert [w["address"] for w in h["workers"]] == [cluster.d.address], body
    # gRPC: the key in the authorization metadata.
    req = cpb.CompletionRequest(prompt="Hi", max_tokens=2)
    with pytest.raises(grpc.RpcError) as e:
      keyed.stub.Complete(req, timeout=60)
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert json.loads(e.value.details())["error"]["type"] == "authentication_error"
    ok = keyed.stub.Complete(req, metadata=(("authorization", "Bearer sesame"),), timeout=60)
    assert ok.usage.completion_tokens >= 1

    # One request at the workers, none waiting: a second concurrent one gets 429 + Retry-After.
    tight = c.scheduler(decode=[cluster.d], max_inflight=1, max_queue=0, name="tight")
    long_body = {"model": MODEL_NAME, "prompt": "Count:", "max_tokens": 200, "ignore_eos": True}
    t = threading.Thread(target=tight.http, args=("POST", "/v1/completions", long_body))
    t.start()
    try:
      wait_until(lambda: json.loads(tight.http_get("/health")[1])["running"] == 1, 30,
                 "the first request running")
      status, err, headers = error_of(tight.http("POST", "/v1/completions", long_body))
      assert status == 429 and int(headers["Retry-After"]) >= 1
    finally:
      t.join(timeout=120)

    # No decode worker answers: /health is 503 and requests get 503.
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()
    nowhere = c.scheduler(decode=[f"127.0.0.1:{port}"], wait_ready=False, name="nowhere")
    wait_until(lambda: nowhere.http_get("/health")[0] == 503, 30, "scheduler up, not ready")
    status, err, _ = error_of(nowhere.http("POST", "/v1/completions",
                                           {"model": MODEL_NAME, "prompt": "x"}))
    assert status == 503


def test_keys_and_prompts_stay_out_of_logs_metrics_and_health(cluster):
  """Issue 23: API keys are never logged, and /metrics and /health carry no request content."""
  key, wrong, canary = "sk-canary-key-5150", "sk-wrong-canary-8812", "zebracanary quokkacanary"
  with Cluster() as c:
    keyed = c.scheduler(prefill=[cluster.p], decode=[cluster.d], api_key=key,
                        direct_prefill_tokens=4, name="keyed")
    for auth in (key, wrong):
      for stream in (False, True):
        keyed.http("POST", "/v1/completions",
                   {"model": MODEL_NAME, "prompt": canary * 4, "max_tokens": 4,
                    "stream": stream, "stop": ["stopcanary"]},
                   headers={"Authorization": f"Bearer {auth}"})
    keyed.http("POST", "/v1/chat/completions",
               {"model": MODEL_NAME, "messages": [{"role": "user", "content": canary}],
                "max_tokens": 4}, headers={"Authorization": f"Bearer {key}"})
    seen = []
    for w in (keyed, cluster.p, cluster.d):
      for path in ("/metrics", "/health"):
        status, body = w.http_get(path)
        seen.append((f"{w.name} {path}", body))
      with open(w.log_path, errors="replace") as f:
        seen.append((f"{w.name} log", f.read()))
    for where, text in seen:
      for secret in (key, wrong, "zebracanary", "quokkacanary", "stopcanary"):
        assert secret not in text, f"{secret!r} appears in {where}"
    assert any("tripod:request_success_total" in t for _, t in seen)  # the bodies were read


def test_max_model_len_and_connections_per_client(cluster):
  with Cluster() as c:
    short = c.scheduler(decode=[cluster.d], max_model_len=64, max_connections_per_client=2,
                        name="short")
    models = json.loads(short.http_get("/v1/models")[1])
    assert models["data"][0]["max_model_len"] == 64
    ok = short.http("POST", "/v1/completions",
                    {"model": MODEL_NAME, "prompt": [1] * 40, "max_tokens": 24})
    assert ok[0] == 200, ok
    status, err, _ = error_of(short.http("POST", "/v1/completions",
                                         {"model": MODEL_NAME, "prompt": [1] * 40,
                                          "max_tokens": 25}))
    assert status == 400 and err["code"] == "context_length_exceeded" and "64" in err["message"]
    status, err, _ = error_of(short.http("POST", "/v1/completions",
                                         {"model": MODEL_NAME, "prompt": [1] * 64}))
    assert status == 400 and err["code"] == "context_length_exceeded"
    # Text too long for the context whatever its tokens (no token of this vocabulary covers more
    # than 162 bytes) is refused from its length, before it is encoded; text just under that is
    # encoded, and refused for its tokens.
    for body, param in (({"prompt": "a" * (64 * 162)}, "prompt"),
                        ({"messages": [{"role": "user", "content": "b" * (32 * 162)},
                                       {"role": "user", "content": "c" * (32 * 162)}]},
                         "messages")):
      path = "/v1/chat/completions" if param == "messages" else "/v1/completions"
      status, err, _ = error_of(short.http("POST", path, {"model": MODEL_NAME, **body}))
      assert status == 400 and err["code"] == "context_length_exceeded", err
      assert err["param"] == param and "is at least 64 tokens" in err["message"], err
    status, err, _ = error_of(short.http("POST", "/v1/completions",
                                         {"model": MODEL_NAME, "prompt": "a" * (63 * 162)}))
    assert status == 400 and err["code"] == "context_length_exceeded", err
    assert "resulted in" in err["message"], err
    # Two connections held open by this client; the third is answered 429 with the reason.
    held = [socket.create_connection((short.host, short.http_port), timeout=30) for _ in range(2)]
    try:
      wait_until(lambda: short.http_get("/health")[0] == 429, 30, "the third connection refused")
      status, err, _ = error_of(short.http("GET", "/v1/models"))
      assert status == 429 and "too many connections" in err["message"]
    finally:
      for h in held:
        h.close()
    wait_until(lambda: short.http_get("/health")[0] == 200, 30, "served again once they close")
  for bad in ("1", str(1 << 20), "-5"):
    with Cluster() as c:
      with pytest.raises(RuntimeError) as e:
        c.scheduler(decode=[cluster.d], max_model_len=bad, wait_ready=False, name="bad")
      assert "--max_model_len" in str(e.value)


def test_encoding_a_long_text_holds_no_io_thread(cluster):
  """/tokenize of 7 MB of one letter takes the tokenizer a second or more (no pre-token
  boundary, one long merge); it runs on the API's work threads, so that meanwhile the one HTTP I/O
  thread still answers /metrics and /health."""
  done = threading.Event()
  result = {}

  def tokenize():
    try:
      result["answer"] = cluster.s.http("POST", "/tokenize", {"prompt": "a" * 7_000_000},
                                        timeout=120)
    finally:
      done.set()

  t = threading.Thread(target=tokenize)
  t.start()
  try:
    def preparing():
      body = cluster.s.http_get("/metrics")[1]
      line = [l for l in body.splitlines() if l.startswith("tripod:http_requests_preparing{")]
      return line and float(line[0].split()[-1]) >= 1
    wait_until(lambda: preparing() or done.is_set(), 60, "the /tokenize request in hand")
    assert not done.is_set(), "the encoding was over before /metrics could see it"
    status, _ = cluster.s.http_get("/health")
    assert status == 200
    assert not done.is_set(), "/health waited for the encoding"
  finally:
    t.join(timeout=120)
  status, body, _ = result["answer"]
  assert status == 200 and json.loads(body)["count"] > 7_000_000 // 162


def test_grpc_complete_and_generate(cluster):
  prompt = corpus_prompt(50, offset=3)
  req = cpb.CompletionRequest(model=MODEL_NAME, prompt_ids=cpb.TokenIds(ids=prompt),
                              max_tokens=10, temperature=0)
  whole = cluster.s.stub.Complete(req, timeout=120)
  chunks = list(cluster.s.stub.Generate(req, timeout=120))
  assert "".join(c.text for c in chunks) == whole.text
  assert chunks[-1].finish_reason == whole.finish_reason and chunks[-1].usage.completion_tokens \
      == whole.usage.completion_tokens == len(whole.token_ids)
  # n past the scheduler's --max_n (16): refused as over HTTP (test_grpc_api.py: n > 1 itself).
  with pytest.raises(grpc.RpcError) as e:
    cluster.s.stub.Complete(cpb.CompletionRequest(prompt="x", n=17), timeout=60)
  assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
  assert json.loads(e.value.details())["error"]["param"] == "n"


def test_client_hangup_cancels_everywhere(cluster):
  """A streaming client that leaves mid-answer: the decode worker drops the sequence and frees
  its blocks (bounded wait)."""
  prompt = corpus_prompt(200, offset=50)
  body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2000,
                     "ignore_eos": True, "stream": True}).encode()
  s = socket.create_connection((cluster.s.host, cluster.s.http_port), timeout=60)
  s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
  got = b""
  while got.count(b"data: ") < 3:
    piece = s.recv(65536)
    assert piece, got
    got += piece
  assert cluster.d.health().running == 1
  s.close()
  wait_until(lambda: all_blocks_free(cluster.d), 10, "the decode worker freed the sequence")


def test_prefill_worker_killed_mid_request(cluster):
  """Two prefill workers; the one running a request is killed: the request still completes
  (retried on the other one, or on the decode worker)."""
  with Cluster() as c:
    p1 = c.prefill(precision="fp32", name="p1", chunk=64)
    p2 = c.prefill(precision="fp32", name="p2", chunk=64)
    s = c.scheduler(prefill=[p1, p2], decode=[cluster.d], direct_prefill_tokens=8,
                    name="two_prefill")
    prompt = corpus_prompt(2000, offset=0)
    result = {}

    def run():
      result["r"] = s.http("POST", "/v1/completions",
                           {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4,
                            "temperature": 0}, timeout=300)

    t = threading.Thread(target=run)
    t.start()
    try:
      busy = wait_until(lambda: next((p for p in (p1, p2) if p.health().running > 0), None), 60,
                        "a prefill worker running the request")
      busy.kill()
    finally:
      t.join(timeout=300)
    status, body, _ = result["r"]
    assert status == 200, body
    r = json.loads(body)
    assert r["usage"]["completion_tokens"] >= 1
    assert r["tripod"]["route"] in ("retried_prefill", "local_fallback")
    _, metrics = s.http_get("/metrics")
    assert 'tripod:prefill_retries_total{role="scheduler",to="' in metrics
    wait_until(lambda: all_blocks_free(cluster.d), 30, "blocks free after the retry")


def test_decode_worker_killed_mid_stream():
  """The decode worker dies while it streams an answer: the stream ends with an error event
  (vLLM's shape), which the openai client raises; nothing hangs; the scheduler takes the worker
  out of routing at once (the next request is a 503 naming the cause, not a hang)."""
  with Cluster() as c:
    d = c.decode(name="doomed", kv_budget_mb=64)
    s = c.scheduler(decode=[d], direct_prefill_tokens=8, name="one_decode")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    stream = client.completions.create(model=MODEL_NAME, prompt=corpus_prompt(40, offset=3),
                                       max_tokens=5000, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    chunks = 0
    started = time.monotonic()
    with pytest.raises(openai.APIError) as err:
      for _ in stream:
        chunks += 1
        if chunks == 3:
          d.kill()
    assert chunks >= 3
    assert time.monotonic() - started < 60
    assert "decode worker" in str(err.value), err.value
    status, body, headers = s.http("POST", "/v1/completions",
                                   {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 2})
    assert status == 503, body
    assert json.loads(body)["error"]["code"] == "no_workers"
    _, metrics = s.http_get("/metrics")
    assert 'tripod:request_success_total{finish_reason="error",role="scheduler"} 1' in metrics, \
        metrics


def test_a_stream_moves_to_another_decode_worker_when_its_own_dies():
  """Request migration (Dynamo's --migration-limit): the decode worker streaming an answer is
  SIGKILLed; the scheduler moves the request to the other decode worker, which prefills the
  prompt and the tokens already streamed and continues. Greedy on fp32 (batch-invariant) workers,
  the client gets exactly the uninterrupted run's text, with every token counted, and the move
  is counted; with --migration_limit 0 the same death ends the stream with an error."""
  with Cluster() as c:
    d1 = c.decode(name="decode-1", precision="fp32", kv_budget_mb=64, threads=1)
    d2 = c.decode(name="decode-2", precision="fp32", kv_budget_mb=64, threads=1)
    s = c.scheduler(decode=[d1, d2], direct_prefill_tokens=4096, name="migrating")
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=120)
    args = dict(model=MODEL_NAME, prompt=corpus_prompt(40, offset=11), max_tokens=96,
                temperature=0, extra_body={"ignore_eos": True})
    want = client.completions.create(**args).choices[0].text
    texts, _, usage, tripod, victim = stream_and_kill(client, args, [d1, d2], after=8)
    text = texts[0]
    assert victim is not None
    assert text == want
    assert usage.completion_tokens == 96 and usage.prompt_tokens > 30
    assert tripod["route"] == "migrated", tripod
    _, metrics = s.http_get("/metrics")
    assert 'tripod:request_migrations_total{role="scheduler"} 1' in metrics
    assert 'tripod:request_success_total{finish_reason="length",role="scheduler"} 2' in metrics
    survivor = d2 if victim is d1 else d1
    wait_until(lambda: all_blocks_free(survivor), 30, "the survivor's blocks free")

    # Without migration the same death is an error event (the stream does not go on).
    d3 = c.decode(name="decode-3", precision="fp32", kv_budget_mb=64, threads=1)
    s0 = c.scheduler(decode=[survivor, d3], direct_prefill_tokens=4096, migration_limit=0,
                     name="not_migrating")
    client0 = openai.OpenAI(base_url=s0.url + "/v1", api_key="unused", max_retries=0,
                            timeout=120)
    with pytest.raises(openai.APIError) as err:
      stream_and_kill(client0, args, [survivor, d3], after=8)
    assert "decode worker" in str(err.value), err.value


def test_a_prefill_longer_than_the_decode_workers_default_lease_still_transfers():
  """The scheduler's reservation lasts as long as it lets the prefill run (--prefill_timeout), not
  the decode worker's default lease: a prefill that outlasts that default still hands its KV over
  instead of falling back to a prefill on the decode worker."""
  with Cluster() as c:
    p = c.prefill(precision="fp32", pop_ratio="0", threads=1)
    d = c.decode(precision="fp32", kv_budget_mb=256, lease_ms=200)
    s = c.scheduler(prefill=[p], decode=[d], direct_prefill_tokens=8, name="short_lease")
    prompt = corpus_prompt(1500, offset=3)
    status, body, _ = s.http("POST", "/v1/completions",
                             {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 2,
                              "temperature": 0}, timeout=300)
    assert status == 200, body
    r = json.loads(body)
    assert r["tripod"]["route"] == "disaggregated", r["tripod"]
    # The fp32 prefill of 1500 tokens on one thread takes well over the 200 ms default lease.
    assert r["tripod"]["prefill_s"] > 0.2, r["tripod"]
    _, metrics = s.http_get("/metrics")
    retries = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
               if line.startswith("tripod:prefill_retries_total{")]
    assert sum(retries) == 0, [l for l in metrics.splitlines() if "retries" in l]
    wait_until(lambda: all_blocks_free(d), 30, "blocks free after the request")
