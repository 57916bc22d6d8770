"""The compression methods through the whole service: real tripod-scheduler, tripod-draft,
tripod-prefill (POP 1/3, pruned) and tripod-decode processes on loopback, driven by the official
`openai` client with `tripod: {"method": ..., "budget": ...}`.

  * every method runs and says so in the response's tripod.method (applied, the budget resolved
    from a fraction, the KV entries sent and bytes saved, SpecPC's kept prompt);
  * the greedy text equals what the single-process tools give for the same importance map:
    `tripod draft` (the draft worker's map) then `tripod prefill --trim ... --generate` (trimming
    methods) or the POP prefill of the kept tokens (SpecPC, keep-last: the prompt's last tokens);
  * a budget that keeps everything leaves the output exactly as without a method, and skips the
    draft hop; so does a fraction on a prompt within the scheduler's floor (--method_min_tokens,
    which this cluster sets to 0 elsewhere: its prompt is shorter than the default floor);
  * a draft worker that is missing or too slow falls back to no method, and the response says why;
  * bad methods and budgets are 400s; /metrics counts requests by method and outcome, the KV
    bytes saved, the prompt tokens dropped and the draft time.
"""

import json
import os
import socket
import subprocess

import openai
import pytest

import cluster as C

MODEL_NAME = os.path.basename(C.MODEL)[:-len(".gguf")]
N = 400
FRACTION = 0.25
BUDGET = round(FRACTION * N)  # 100
MAX_TOKENS = 8
CHUNK = 64
DRAFT_LAYERS = 8


@pytest.fixture(scope="module")
def cluster():
  with C.Cluster() as c:
    c.p = c.prefill(precision="fp32", pop_ratio="1/3", chunk=CHUNK)
    c.d = c.decode(precision="fp32", kv_budget_mb=256)
    c.r = c.draft(precision="fp32", draft_layers=DRAFT_LAYERS, chunk=CHUNK)
    c.s = c.scheduler(prefill=[c.p], decode=[c.d], draft=[c.r], direct_prefill_tokens=8,
                      method_min_tokens=0)
    C.wait_until(lambda: json.loads(c.s.http_get("/health")[1])["healthy_draft_workers"] == 1,
                 60, "the draft worker in routing")
    yield c


@pytest.fixture(scope="module")
def client(cluster):
  return openai.OpenAI(base_url=cluster.s.url + "/v1", api_key="unused", max_retries=0,
                       timeout=300)


@pytest.fixture(scope="module")
def prompt():
  return C.corpus_prompt(N, offset=300)


def complete(client, prompt, method=None, budget=None, stream=False):
  extra = {"ignore_eos": True}
  if method is not None:
    extra["tripod"] = {"method": method, "budget": budget}
  r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=MAX_TOKENS,
                                temperature=0, extra_body=extra, stream=stream)
  if not stream:
    return r.choices[0].text, r.model_extra["tripod"], r.usage
  text, tripod, usage = "", None, None
  for chunk in r:
    if chunk.choices:
      text += chunk.choices[0].text
    extra_fields = chunk.model_extra or {}
    if extra_fields.get("tripod") is not None:
      tripod = extra_fields["tripod"]
    if chunk.usage is not None:
      usage = chunk.usage
  return text, tripod, usage


def detokenize(sched, ids):
  status, body, _ = sched.http("POST", "/detokenize", {"tokens": ids})
  assert status == 200, body
  return json.loads(body)["prompt"]


def run_json(args):
  out = subprocess.run(args, capture_output=True, text=True, timeout=C.CALL_TIMEOUT_S,
                       check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def cli_draft(prompt, budget=0, lookahead=0):
  """The draft worker's importance map, in one process (its defaults: window 64, pool 32,
  neighbourhood 32)."""
  return run_json([C.binary("tripod"), "draft", f"--model={C.MODEL}",
                   "--ids=" + ",".join(map(str, prompt)), f"--draft_layers={DRAFT_LAYERS}",
                   f"--budget={budget}", f"--lookahead={lookahead}", "--precision=fp32",
                   f"--chunk={CHUNK}"])


def cli_trimmed(prompt, trim, extra=()):
  """Greedy ids after the POP 1/3 prefill engine trims its KV in process."""
  return run_json([C.binary("tripod"), "prefill", f"--model={C.MODEL}",
                   "--ids=" + ",".join(map(str, prompt)), "--pop_ratio=1/3", "--precision=fp32",
                   "--compare_full=false", f"--generate={MAX_TOKENS}", f"--chunk={CHUNK}",
                   f"--trim={trim}", f"--trim_budget={BUDGET}", *extra])["generated_ids"]


def expected_ids(prompt, method):
  if method == "specpc":
    keep = cli_draft(prompt, budget=BUDGET)["keep"]
    assert len(keep) == BUDGET and keep[-1] == N - 1
    return C.in_process_pop_tokens([prompt[i] for i in keep], MAX_TOKENS, "1/3")
  if method == "keeplast":
    return C.in_process_pop_tokens(prompt[N - BUDGET:], MAX_TOKENS, "1/3")
  if method == "speckv":
    lookahead = cli_draft(prompt, lookahead=MAX_TOKENS)["lookahead"]
    return cli_trimmed(prompt, "speckv",
                       ["--trim_window=32", "--trim_lookahead=" + ",".join(map(str, lookahead))])
  if method == "draftmap":
    keep = [i for i in cli_draft(prompt, budget=BUDGET + 1)["keep"] if i < N - 1]
    return cli_trimmed(prompt, "draftmap", ["--trim_keep=" + ",".join(map(str, keep))])
  if method in ("snapkv", "pyramidkv"):
    return cli_trimmed(prompt, method, ["--trim_window=32"])
  return cli_trimmed(prompt, "streamingllm")


@pytest.mark.parametrize("method", [
    "speckv", "specpc", "draftmap", "snapkv", "pyramidkv", "streamingllm", "keeplast"])
def test_each_method_serves_what_the_single_process_tools_give(cluster, client, prompt, method):
  text, tripod, usage = complete(client, prompt, method, FRACTION)
  m = tripod["method"]
  assert m["name"] == method
  assert m["applied"] is True and m["fallback"] is None, m
  assert m["budget"] == BUDGET
  assert usage.prompt_tokens == N  # what the client sent
  assert usage.completion_tokens == MAX_TOKENS
  assert tripod["route"] == "disaggregated"
  uses_draft = method in ("speckv", "specpc", "draftmap")
  assert (tripod["draft_s"] is not None) == uses_draft, tripod
  if method in ("specpc", "keeplast"):
    assert m["prompt_tokens"] == BUDGET and m["kv_entries"] is None
  else:
    assert m["prompt_tokens"] == N
    assert m["kv_entries"] == BUDGET
    # The bytes not sent: (N - 1 - BUDGET) entries' worth of what BUDGET entries took.
    assert m["kv_bytes_saved"] > 0
  assert text == detokenize(cluster.s, expected_ids(prompt, method)), method
  C.wait_until(lambda: C.all_blocks_free(cluster.d), 30, "all KV blocks free")


def test_streaming_reports_the_method_on_the_last_chunk(cluster, client, prompt):
  whole, _, _ = complete(client, prompt, "speckv", BUDGET)
  text, tripod, usage = complete(client, prompt, "speckv", BUDGET, stream=True)
  assert text == whole
  assert tripod is not None and tripod["method"]["applied"] is True


@pytest.mark.parametrize("method", [
    "speckv", "specpc", "draftmap", "snapkv", "pyramidkv", "streamingllm", "keeplast"])
def test_a_budget_that_keeps_everything_changes_nothing(cluster, client, prompt, method):
  want, plain, _ = complete(client, prompt)
  assert plain["method"] is None
  text, tripod, _ = complete(client, prompt, method, N)
  assert text == want, method
  m = tripod["method"]
  assert m["applied"] is True and m["kv_entries"] is None and m["prompt_tokens"] == N
  assert tripod["draft_s"] is None  # no draft hop


def test_a_fraction_leaves_a_prompt_within_the_floor_whole(cluster, prompt):
  """The default floor (512 tokens) is above this prompt's N: a fractional budget keeps it all,
  the request runs as without its method and skips the draft hop; a floor under N applies it."""
  want, _, _ = complete(openai.OpenAI(base_url=cluster.s.url + "/v1", api_key="x",
                                      max_retries=0, timeout=300), prompt)
  with C.Cluster() as extra:
    floored = extra.scheduler(prefill=[cluster.p], decode=[cluster.d], draft=[cluster.r],
                              direct_prefill_tokens=8)
    low = extra.scheduler(prefill=[cluster.p], decode=[cluster.d], draft=[cluster.r],
                          direct_prefill_tokens=8, method_min_tokens=N // 2)
    for sched in (floored, low):
      C.wait_until(lambda: json.loads(sched.http_get("/health")[1])["healthy_draft_workers"] == 1,
                   60, "the draft worker in routing")
    c = openai.OpenAI(base_url=floored.url + "/v1", api_key="x", max_retries=0, timeout=300)
    for method in ("speckv", "specpc", "snapkv"):
      text, tripod, _ = complete(c, prompt, method, FRACTION)
      m = tripod["method"]
      assert m["applied"] is True and m["budget"] == N and m["prompt_tokens"] == N, m
      assert m["kv_entries"] is None and tripod["draft_s"] is None, tripod
      assert text == want, method
    c = openai.OpenAI(base_url=low.url + "/v1", api_key="x", max_retries=0, timeout=300)
    _, tripod, _ = complete(c, prompt, "snapkv", FRACTION)
    m = tripod["method"]
    assert m["applied"] is True and m["budget"] == N // 2 and m["kv_entries"] == N // 2, m


def free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_missing_or_slow_draft_workers_fall_back_to_no_method(cluster, prompt):
  want, _, _ = complete(openai.OpenAI(base_url=cluster.s.url + "/v1", api_key="x",
                                      max_retries=0, timeout=300), prompt)
  with C.Cluster() as extra:
    # A draft address nobody answers: never in routing.
    absent = extra.scheduler(prefill=[cluster.p], decode=[cluster.d],
                             draft=[f"127.0.0.1:{free_port()}"], direct_prefill_tokens=8,
                             method_min_tokens=0)
    # A deadline no draft can meet.
    hasty = extra.scheduler(prefill=[cluster.p], decode=[cluster.d], draft=[cluster.r],
                            direct_prefill_tokens=8, draft_timeout_ms=1, method_min_tokens=0)
    C.wait_until(lambda: json.loads(hasty.http_get("/health")[1])["healthy_draft_workers"] == 1,
                 60, "the draft worker in routing")
    for sched, words in ((absent, "no draft worker is available"), (hasty, "timed out")):
      c = openai.OpenAI(base_url=sched.url + "/v1", api_key="x", max_retries=0, timeout=300)
      text, tripod, _ = complete(c, prompt, "specpc", FRACTION)
      m = tripod["method"]
      assert m["applied"] is False and words in m["fallback"], m
      assert m["prompt_tokens"] == N
      assert text == want  # as without a method
      status, body = sched.http_get("/metrics")
      assert ('tripod:method_requests_total{method="specpc",outcome="fallback",role="scheduler"} 1'
              in body), body


@pytest.mark.parametrize("tripod,param,words", [
    ({"method": "h2o", "budget": 10}, "tripod.method", "must be one of"),
    ({"method": "speckv"}, "tripod.budget", "needs a 'tripod.budget'"),
    ({"method": "snapkv", "budget": 1.5}, "tripod.budget", "whole number"),
    ({"budget": 10}, "tripod.budget", "needs a 'tripod.method'"),
])
def test_bad_methods_and_budgets_are_400(client, prompt, tripod, param, words):
  with pytest.raises(openai.BadRequestError) as e:
    client.completions.create(model=MODEL_NAME, prompt=prompt[:20], max_tokens=2,
                              extra_body={"tripod": tripod})
  err = e.value.body
  assert err["param"] == param and words in err["message"], err


def metric(body, name):
  for line in body.splitlines():
    if line.startswith(name + " ") or line.startswith(name + "{"):
      return float(line.rsplit(" ", 1)[1])
  raise AssertionError(f"{name} not in /metrics")


def test_metrics_count_methods_and_savings(cluster, client, prompt):
  complete(client, prompt, "specpc", FRACTION)
  complete(client, prompt, "snapkv", FRACTION)
  status, body = cluster.s.http_get("/metrics")
  assert status == 200
  assert metric(body, 'tripod:method_requests_total{method="specpc",outcome="applied",'
                'role="scheduler"}') >= 1
  assert metric(body, 'tripod:method_requests_total{method="snapkv",outcome="applied",'
                'role="scheduler"}') >= 1
  assert metric(body, 'tripod:kv_transfer_bytes_saved_total{role="scheduler"}') > 0
  assert metric(body, 'tripod:prompt_tokens_dropped_total{role="scheduler"}') >= N - BUDGET
  assert metric(body, 'tripod:request_draft_time_seconds_count{role="scheduler"}') >= 1
  assert metric(body, 'tripod:workers_healthy{role="scheduler",worker_role="draft"}') == 1
