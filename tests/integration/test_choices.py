"""n > 1 and best_of through the OpenAI-compatible API: real tripod-scheduler, tripod-prefill and
tripod-decode processes on loopback (and `tripod serve`), driven by the official `openai` client.

The prompt is prefilled once (by the prefill worker, or by the decode worker for short prompts)
and the choices decode on one decode worker from its shared KV. Exactness: with fp32 workers and
`pop: off`, every greedy choice equals the n = 1 output and `tripod generate`'s.
"""

import json
import os
import re
import threading
import time

import openai
import pytest

from cluster import (Cluster, Serve, all_blocks_free, corpus_prompt, detokenize, open_sse,
                     reference_tokens, stream_and_kill, wait_until, MODEL)

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]
MAX_N = 8


@pytest.fixture(scope="module")
def cluster():
  with Cluster() as c:
    c.p = c.prefill(precision="fp32", pop_ratio="0")
    c.d = c.decode(precision="fp32", kv_budget_mb=256)
    # Prompts of 8 tokens or more go through the prefill worker.
    c.s = c.scheduler(prefill=[c.p], decode=[c.d], direct_prefill_tokens=8, pop="0", max_n=MAX_N)
    yield c


@pytest.fixture(scope="module")
def client(cluster):
  return openai.OpenAI(base_url=f"{cluster.s.url}/v1", api_key="unused", max_retries=0,
                       timeout=300)


# 40 tokens go through the prefill worker (disaggregated), 5 straight to the decode worker.
ROUTES = [(40, "disaggregated"), (5, "decode_only")]


@pytest.mark.parametrize("n_prompt,route", ROUTES)
def test_seeded_choices_are_reproducible_and_differ(cluster, client, n_prompt, route):
  prompt = corpus_prompt(n_prompt, offset=200)

  def run(seed):
    return client.completions.create(model=MODEL_NAME, prompt=prompt, n=3, max_tokens=12,
                                     temperature=1.0, seed=seed, extra_body={"ignore_eos": True})

  r = run(11)
  assert [c.index for c in r.choices] == [0, 1, 2]
  texts = [c.text for c in r.choices]
  assert len(set(texts)) > 1, texts  # each choice its own sampler stream
  assert all(c.finish_reason == "length" for c in r.choices)
  assert r.usage.prompt_tokens == n_prompt  # the prompt once
  assert r.usage.completion_tokens == 3 * 12  # every choice's tokens
  assert r.model_extra["tripod"]["route"] == route
  assert [c.text for c in run(11).choices] == texts  # the same seed, the same choices
  assert [c.text for c in run(12).choices] != texts
  wait_until(lambda: all_blocks_free(cluster.d), 30, "every KV block free after the choices")


@pytest.mark.parametrize("n_prompt,route", ROUTES + [(64, "disaggregated")])
def test_greedy_choices_equal_the_single_answer(cluster, client, n_prompt, route):
  """Exactness pin: temperature 0 with n = 2 gives two identical choices, each the n = 1 answer
  and the reference tokens; asked twice (the second time from the prefix cache)."""
  prompt = corpus_prompt(n_prompt, offset=500)
  want = detokenize(cluster.s, reference_tokens(prompt, 16, precision="fp32"))
  one = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=16, temperature=0,
                                  extra_body={"ignore_eos": True})
  assert one.choices[0].text == want
  for _ in range(2):
    two = client.completions.create(model=MODEL_NAME, prompt=prompt, n=2, max_tokens=16,
                                    temperature=0, extra_body={"ignore_eos": True})
    assert [c.text for c in two.choices] == [want, want]
    assert two.model_extra["tripod"]["route"] == route
    assert two.usage.completion_tokens == 32
  chat = [client.chat.completions.create(model=MODEL_NAME, max_tokens=8, temperature=0, n=n,
                                         messages=[{"role": "user", "content": "Name a color."}])
          for n in (1, 3)]
  assert [c.index for c in chat[1].choices] == [0, 1, 2]
  assert {c.message.content for c in chat[1].choices} == {chat[0].choices[0].message.content}
  wait_until(lambda: all_blocks_free(cluster.d), 30, "every KV block free")


def test_greedy_choices_from_the_prefix_cache(cluster):
  """On the decode worker alone (a scheduler without prefill workers), a prompt asked again
  attaches its cached blocks and the choices fork from them: still the reference tokens."""
  sched = cluster.scheduler(decode=[cluster.d], name="decode_only", max_n=MAX_N)
  api = openai.OpenAI(base_url=f"{sched.url}/v1", api_key="unused", max_retries=0, timeout=300)
  prompt = corpus_prompt(70, offset=2100)  # 4 whole blocks of 16 and 6 tokens
  want = detokenize(cluster.s, reference_tokens(prompt, 12, precision="fp32"))
  for attempt in range(2):
    r = api.completions.create(model=MODEL_NAME, prompt=prompt, n=3, max_tokens=12,
                               temperature=0, extra_body={"ignore_eos": True})
    assert [c.text for c in r.choices] == [want] * 3
    assert r.model_extra["tripod"]["route"] == "decode_only"
    cached = r.usage.prompt_tokens_details.cached_tokens
    assert cached == (64 if attempt else 0), r.usage
  wait_until(lambda: all_blocks_free(cluster.d), 30, "every KV block free")


@pytest.mark.parametrize("chat", [False, True])
def test_stream_tags_each_choice(cluster, client, chat):
  """Streamed n = 2: each delta names its choice, each choice finishes once with its own
  finish_reason, the texts are the whole answer's (same seed), usage counts both."""
  prompt = corpus_prompt(40, offset=900)
  args = dict(model=MODEL_NAME, n=2, max_tokens=10, temperature=0.9, seed=5,
              extra_body={"ignore_eos": True})
  if chat:
    args["messages"] = [{"role": "user", "content": detokenize(cluster.s, prompt)}]
    whole = client.chat.completions.create(**args)
    want = [c.message.content for c in whole.choices]
  else:
    args["prompt"] = prompt
    whole = client.completions.create(**args)
    want = [c.text for c in whole.choices]
  create = client.chat.completions.create if chat else client.completions.create
  stream = create(stream=True, stream_options={"include_usage": True}, **args)
  texts, finishes, usage = {0: "", 1: ""}, {0: [], 1: []}, None
  for chunk in stream:
    if chunk.usage is not None:
      usage = chunk.usage
    for c in chunk.choices:
      texts[c.index] += (c.delta.content or "") if chat else c.text
      if c.finish_reason is not None:
        finishes[c.index].append(c.finish_reason)
  assert finishes == {0: ["length"], 1: ["length"]}
  assert [texts[0], texts[1]] == want
  assert usage.completion_tokens == 20 and usage.prompt_tokens == whole.usage.prompt_tokens


def test_best_of_returns_the_highest_cumulative_logprob(cluster, client):
  """best_of = 3 generates the candidates n = 3 would (same seed: seed + index each) and returns
  the one whose sampled tokens' log-probabilities sum highest; usage counts all three."""
  prompt = corpus_prompt(40, offset=1300)
  args = dict(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=1.0, seed=21, logprobs=1,
              extra_body={"ignore_eos": True})
  every = client.completions.create(n=3, **args)
  sums = [sum(c.logprobs.token_logprobs) for c in every.choices]
  assert len(set(sums)) == 3, sums
  best = client.completions.create(n=1, best_of=3, **args)
  assert len(best.choices) == 1 and best.choices[0].index == 0
  assert best.choices[0].text == every.choices[sums.index(max(sums))].text
  assert best.usage.completion_tokens == 3 * 8  # as vLLM counts: every candidate
  two = client.completions.create(n=2, best_of=3, **args)
  order = sorted(range(3), key=lambda i: -sums[i])[:2]
  assert [c.text for c in two.choices] == [every.choices[i].text for i in order]
  assert [c.index for c in two.choices] == [0, 1]


def test_each_choice_stops_on_its_own(cluster, client):
  """Stop strings and max_tokens apply per choice: choices that meet the stop string end early
  with "stop" and without it, the others run to max_tokens."""
  prompt = corpus_prompt(40, offset=1700)
  r = client.completions.create(model=MODEL_NAME, prompt=prompt, n=6, max_tokens=24,
                                temperature=1.2, seed=3, stop=["e"],
                                extra_body={"ignore_eos": True})
  assert [c.index for c in r.choices] == list(range(6))
  reasons = {c.finish_reason for c in r.choices}
  assert "stop" in reasons, [c.text for c in r.choices]
  for c in r.choices:
    assert "e" not in c.text
    assert c.finish_reason in ("stop", "length")
  free = client.completions.create(model=MODEL_NAME, prompt=prompt, n=6, max_tokens=24,
                                   temperature=1.2, seed=3, extra_body={"ignore_eos": True})
  for stopped, whole in zip(r.choices, free.choices):
    cut = whole.text.find("e")
    if cut >= 0:
      assert (stopped.text, stopped.finish_reason) == (whole.text[:cut], "stop")
    else:
      assert (stopped.text, stopped.finish_reason) == (whole.text, "length")


def error_of(resp):
  status, body, _ = resp
  j = json.loads(body)
  assert set(j) == {"error"} and set(j["error"]) == {"message", "type", "param", "code"}, body
  return status, j["error"]


@pytest.mark.parametrize("extra,param", [
    ({"n": 0}, "n"),
    ({"n": -1}, "n"),
    ({"n": 1.5}, "n"),
    ({"n": "2"}, "n"),
    ({"n": MAX_N + 1}, "n"),  # past --max_n
    ({"n": 2, "best_of": MAX_N + 1}, "best_of"),
    ({"n": 3, "best_of": 2}, "best_of"),
    ({"best_of": 2, "stream": True}, "best_of"),
])
def test_refusals_name_their_param(cluster, extra, param):
  for path, body in (("/v1/completions", {"prompt": "x"}),
                     ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
    status, err = error_of(cluster.s.http("POST", path, {"model": MODEL_NAME, **body, **extra}))
    assert status == 400 and err["param"] == param and err["type"] == "invalid_request_error", err


def test_client_hangup_ends_every_choice(cluster):
  s, got = open_sse(cluster.s, "/v1/completions",
                    {"model": MODEL_NAME, "prompt": corpus_prompt(100, offset=50), "n": 3,
                     "max_tokens": 2000, "ignore_eos": True, "stream": True}, 9)
  assert b'"index":2' in got
  assert cluster.d.health().running == 3
  s.close()
  wait_until(lambda: all_blocks_free(cluster.d), 10, "the decode worker freed every choice")


def complete_and_kill(client, args, workers):
  """A whole (not streamed) completion whose decode worker is SIGKILLed once it has run a
  moment. Returns (the response, the killed worker)."""
  result = {}

  def run():
    result["r"] = client.completions.create(**args)

  t = threading.Thread(target=run)
  t.start()
  try:
    victim = wait_until(lambda: next((w for w in workers if w.health().running > 0), None), 60,
                        "a decode worker running the request")
    time.sleep(0.3)
    victim.kill()
  finally:
    t.join(timeout=300)
  return result["r"], victim


def test_every_choice_moves_when_its_decode_worker_dies():
  """The decode worker dies while it generates n = 3 greedy choices: every unfinished choice
  continues on the other decode worker from its own tokens (docs/scheduler.md, "Several
  choices"). On fp32 (batch-invariant) workers each choice is exactly the uninterrupted run's,
  streamed with its index and finished once; usage counts the prompt once and every token; the
  move is counted. The same for a whole answer, for best_of (the best of the moved candidates)
  and for a constrained stream (each choice's automaton state walked over its own tokens). With
  --migration_limit 0 the same death ends the request with an error."""
  with Cluster() as c:
    workers = [c.decode(name=f"decode-{k}", precision="fp32", kv_budget_mb=64, threads=1)
               for k in range(5)]
    s = c.scheduler(decode=workers, direct_prefill_tokens=4096, name="migrating_choices")
    api = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0, timeout=120)
    prompt = corpus_prompt(40, offset=3)
    args = dict(model=MODEL_NAME, prompt=prompt, n=3, max_tokens=64, temperature=0,
                extra_body={"ignore_eos": True})
    want = api.completions.create(**args)
    want_texts = {c.index: c.text for c in want.choices}
    assert sorted(want_texts) == [0, 1, 2] and len(set(want_texts.values())) == 1
    assert want.usage.completion_tokens == 3 * 64

    texts, finishes, usage, tripod, victim = stream_and_kill(api, args, workers, after=9)
    assert victim is not None
    assert texts == want_texts
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert usage.prompt_tokens == want.usage.prompt_tokens
    assert usage.completion_tokens == 3 * 64
    assert tripod["route"] == "migrated", tripod
    _, metrics = s.http_get("/metrics")
    assert 'tripod:request_migrations_total{role="scheduler"} 1' in metrics, metrics
    alive = [w for w in workers if w is not victim]

    # A whole answer, then best_of: the moved candidates compete as the uninterrupted ones do.
    r, victim2 = complete_and_kill(api, args, alive)
    assert {c.index: c.text for c in r.choices} == want_texts
    assert [c.finish_reason for c in r.choices] == ["length"] * 3
    assert r.usage.completion_tokens == 3 * 64
    assert r.model_extra["tripod"]["route"] == "migrated"
    alive = [w for w in alive if w is not victim2]
    best_args = dict(args, n=1, best_of=3, logprobs=1)
    best_want = api.completions.create(**best_args)
    r, victim3 = complete_and_kill(api, best_args, alive)
    assert [c.text for c in r.choices] == [best_want.choices[0].text] == [want_texts[0]]
    assert r.choices[0].logprobs.tokens == best_want.choices[0].logprobs.tokens
    assert r.usage.completion_tokens == 3 * 64  # every candidate's tokens
    assert r.model_extra["tripod"]["route"] == "migrated"
    _, metrics = s.http_get("/metrics")
    assert 'tripod:request_migrations_total{role="scheduler"} 3' in metrics, metrics
    alive = [w for w in alive if w is not victim3]

    # A constrained stream: each moved choice's automaton goes on from its own tokens.
    regex_args = dict(args, extra_body={"ignore_eos": True, "guided_regex": "[a-z ]{30,}"})
    regex_want = {c.index: c.text for c in api.completions.create(**regex_args).choices}
    texts, finishes, usage, tripod, _ = stream_and_kill(api, regex_args, alive, after=9)
    assert texts == regex_want
    assert all(re.fullmatch("[a-z ]*", t) for t in texts.values()), texts
    assert tripod["route"] == "migrated", tripod
    _, metrics = s.http_get("/metrics")
    assert 'tripod:request_migrations_total{role="scheduler"} 4' in metrics, metrics
    survivor = next(w for w in alive if w.proc.poll() is None)
    wait_until(lambda: all_blocks_free(survivor), 30, "the survivor's blocks free")

    # Without migration the same death ends the stream with an error the client raises.
    d = c.decode(name="decode-last", kv_budget_mb=64)
    s0 = c.scheduler(decode=[survivor, d], direct_prefill_tokens=8, migration_limit=0,
                     name="not_migrating")
    api0 = openai.OpenAI(base_url=f"{s0.url}/v1", api_key="unused", max_retries=0, timeout=120)
    t0 = time.monotonic()
    with pytest.raises(openai.APIError) as err:
      stream_and_kill(api0, dict(args, n=2, max_tokens=5000), [survivor, d], after=3)
    assert time.monotonic() - t0 < 60 and "decode worker" in str(err.value), err.value
    _, metrics = s0.http_get("/metrics")
    assert 'tripod:request_migrations_total{role="scheduler"} 0' in metrics, metrics


def test_tripod_serve_choices():
  """`tripod serve` (its local cluster) answers n = 2: greedy choices equal n = 1's, streamed
  choices carry their indices."""
  with Serve("--draft_workers=0") as serve:
    client = openai.OpenAI(base_url=serve.url, api_key="unused", max_retries=0, timeout=300)
    prompt = corpus_prompt(60, offset=40)
    one = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True, "tripod": {"pop": "off"}})
    two = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=8, temperature=0,
                                    n=2, extra_body={"ignore_eos": True, "tripod": {"pop": "off"}})
    assert [c.text for c in two.choices] == [one.choices[0].text] * 2
    indices = set()
    for chunk in client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=4, n=3,
                                           temperature=0.7, stream=True,
                                           extra_body={"ignore_eos": True}):
      indices.update(c.index for c in chunk.choices)
    assert indices == {0, 1, 2}
