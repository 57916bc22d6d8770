"""Echo, prompt log-probabilities, refused fields and `created`, end to end: real tripod-scheduler,
tripod-prefill and tripod-decode processes on loopback (fp32 workers), driven by the official
`openai` client and raw HTTP, in two set-ups: disaggregated (a prefill worker in routing, the
scheduler's default POP 1/3) and decode-only (no prefill worker).

  * lm-evaluation-harness's loglikelihood request (token-id prompt, echo, logprobs 1,
    max_tokens 0): the prompt comes back with a log-probability for every token but the first,
    no completion; a request with prompt log-probabilities runs decode-only whatever its length.
  * Teacher forcing: the prompt log-probabilities of P followed by its greedy continuation equal
    (1e-3) those the decode worker reported while generating it, alternatives included; and they
    agree with the float64 NumPy reference of tests/reference (numpy_forward.py).
  * vLLM's prompt_logprobs on completions and chat; echo without logprobs; a stream with echo
    sends the prompt first and adds up to the whole answer.
  * Every field the server does not implement is a 400 naming it; prompt log-probabilities with a
    pruned plan or a method are a 400 naming the conflict.
  * `created` is when the request came, the same in every chunk of a stream.
"""

import json
import math
import os
import sys
import time

import openai
import pytest

from cluster import Cluster, all_blocks_free, corpus_prompt, cpb, wait_until, MODEL, SOURCE_DIR
from test_api import detokenize

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]
TOL = 1e-3
STARTED = time.time()


@pytest.fixture(scope="module", params=["disaggregated", "decode_only"])
def cluster(request):
  with Cluster() as c:
    decode = c.decode(precision="fp32", kv_budget_mb=256)
    prefill = []
    if request.param == "disaggregated":
      prefill = [c.prefill(precision="fp32", pop_ratio="0")]
    c.s = c.scheduler(prefill=prefill, decode=[decode], direct_prefill_tokens=8, pop="1/3")
    c.d = decode
    c.mode = request.param
    yield c


@pytest.fixture(scope="module")
def client(cluster):
  return openai.OpenAI(base_url=cluster.s.url + "/v1", api_key="unused", max_retries=0,
                       timeout=300)


def test_loglikelihood_request(cluster, client):
  """What lm-evaluation-harness sends to score a continuation."""
  ids = corpus_prompt(60, offset=700)
  r = client.completions.create(model=MODEL_NAME, prompt=ids, echo=True, logprobs=1, max_tokens=0,
                                temperature=0)
  c = r.choices[0]
  assert c.text == detokenize(cluster.s, ids)
  assert c.finish_reason == "length"
  assert r.usage.prompt_tokens == len(ids) and r.usage.completion_tokens == 0
  assert r.model_extra["tripod"]["route"] == "decode_only"
  lp = c.logprobs
  assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(ids)
  assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
  assert all(x <= 0 for x in lp.token_logprobs[1:])
  assert all(1 <= len(t) <= 2 for t in lp.top_logprobs[1:])
  assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
  assert "".join(lp.tokens) == c.text
  # The same prompt as text: the same numbers.
  r2 = client.completions.create(model=MODEL_NAME, prompt=c.text, echo=True, logprobs=1,
                                 max_tokens=0)
  if r2.usage.prompt_tokens == len(ids):
    assert r2.choices[0].logprobs.token_logprobs == lp.token_logprobs
  wait_until(lambda: all_blocks_free(cluster.d), 30, "every KV block free")


def test_teacher_forcing_equals_generation(cluster, client):
  """The prompt log-probabilities of P + its greedy continuation, at the continuation's
  positions, against those the scheduler reported while generating it (gRPC Complete, which
  also gives the tokens' ids); and vLLM's prompt_logprobs of P against echo's."""
  ids = corpus_prompt(70, offset=900)
  gen = cluster.s.stub.Complete(
      cpb.CompletionRequest(model=MODEL_NAME, prompt_ids=cpb.TokenIds(ids=ids), max_tokens=8,
                            temperature=0, logprobs=5, ignore_eos=True,
                            tripod=cpb.TripodOptions(pop="off")), timeout=120)
  assert len(gen.token_ids) == 8
  full = ids + list(gen.token_ids)
  r = client.completions.create(model=MODEL_NAME, prompt=full, echo=True, logprobs=5,
                                max_tokens=0)
  lp = r.choices[0].logprobs
  assert len(lp.token_logprobs) == len(full)
  for i, g in enumerate(gen.logprobs):
    pos = len(ids) + i
    assert abs(lp.token_logprobs[pos] - g.logprob) <= TOL, (i, lp.token_logprobs[pos], g.logprob)
    got = lp.top_logprobs[pos]
    for t in g.top:
      assert t.token in got and abs(got[t.token] - t.logprob) <= TOL, (i, t.token, got)
  # The same through vLLM's field, asked beside a generation.
  tok = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=2, temperature=0,
                                  extra_body={"prompt_logprobs": 5})
  plp = tok.choices[0].model_extra["prompt_logprobs"]
  assert plp[0] is None and len(plp) == len(ids)
  for pos in range(1, len(ids)):
    entry = plp[pos][str(ids[pos])]
    assert abs(entry["logprob"] - lp.token_logprobs[pos]) <= TOL, pos
    assert entry["rank"] >= 1 and isinstance(entry["decoded_token"], str)
    assert 1 <= len(plp[pos]) <= 6
  assert tok.usage.completion_tokens == 2


def test_prompt_logprobs_against_the_numpy_reference(cluster, client):
  """The float64 NumPy forward of tests/reference (an implementation of its own, weights
  dequantised by the `gguf` package): the log-softmax of every prompt position."""
  pytest.importorskip("gguf")
  sys.path.insert(0, os.path.join(SOURCE_DIR, "tests", "reference"))
  import numpy as np
  import numpy_forward
  ids = corpus_prompt(24, offset=1300)
  r = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=0, echo=True,
                                logprobs=0)
  got = r.choices[0].logprobs.token_logprobs
  ref = numpy_forward.ReferenceModel(MODEL).logits(ids, all_positions=True)
  ref = ref - ref.max(axis=1, keepdims=True)
  ref = ref - np.log(np.exp(ref).sum(axis=1, keepdims=True))
  diffs = [abs(got[p] - ref[p - 1, ids[p]]) for p in range(1, len(ids))]
  assert max(diffs) <= TOL, max(diffs)  # about 1e-5 measured


def test_prompt_logprobs_field_on_chat_and_stream(cluster, client):
  chat = client.chat.completions.create(
      model=MODEL_NAME, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=3,
      temperature=0, extra_body={"prompt_logprobs": 2})
  plp = chat.model_extra["prompt_logprobs"]
  assert plp[0] is None and len(plp) == chat.usage.prompt_tokens
  assert all(1 <= len(p) <= 3 for p in plp[1:])
  ids = corpus_prompt(40, offset=50)
  chunks = list(client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=4,
                                          temperature=0, stream=True,
                                          extra_body={"prompt_logprobs": 1}))
  first = chunks[0].choices[0]
  assert first.text == "" and len(first.model_extra["prompt_logprobs"]) == len(ids)


@pytest.mark.parametrize("n_prompt", [5, 60])
def test_echo_without_logprobs_and_streamed(cluster, client, n_prompt):
  text = detokenize(cluster.s, corpus_prompt(n_prompt, offset=2000))
  whole = client.completions.create(model=MODEL_NAME, prompt=text, max_tokens=6, temperature=0,
                                    echo=True, extra_body={"ignore_eos": True})
  plain = client.completions.create(model=MODEL_NAME, prompt=text, max_tokens=6, temperature=0,
                                    extra_body={"ignore_eos": True})
  assert whole.choices[0].logprobs is None
  assert whole.choices[0].text == text + plain.choices[0].text
  t0 = int(time.time())
  chunks = list(client.completions.create(model=MODEL_NAME, prompt=text, max_tokens=6,
                                          temperature=0, echo=True, stream=True,
                                          extra_body={"ignore_eos": True}))
  texts = [c.choices[0].text for c in chunks if c.choices]
  assert texts[0] == text  # the prompt first, as vLLM sends it
  assert "".join(texts) == whole.choices[0].text
  created = {c.created for c in chunks}
  assert len(created) == 1 and t0 - 1 <= created.pop() <= time.time() + 1
  # Echo with logprobs, streamed: the prompt's entries in the first chunk.
  chunks = list(client.completions.create(model=MODEL_NAME, prompt=text, max_tokens=3,
                                          temperature=0, echo=True, logprobs=1, stream=True))
  lp0 = chunks[0].choices[0].logprobs
  assert chunks[0].choices[0].text == text and lp0.token_logprobs[0] is None
  assert len(lp0.tokens) == whole.usage.prompt_tokens


def test_created_is_when_the_request_came(cluster, client):
  if time.time() - STARTED < 3:
    time.sleep(3)  # the model loaded well before: a load time would show
  t0 = time.time()
  r = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=2)
  assert math.floor(t0) - 1 <= r.created <= time.time() + 1
  r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                     max_tokens=2)
  assert math.floor(t0) - 1 <= r.created <= time.time() + 1
  chunks = list(client.chat.completions.create(
      model=MODEL_NAME, messages=[{"role": "user", "content": "x"}], max_tokens=4, stream=True,
      stream_options={"include_usage": True}))
  assert len({c.created for c in chunks}) == 1
  assert math.floor(t0) - 1 <= chunks[0].created <= time.time() + 1


REFUSED = [
    ("guided_grammar", "root ::= \"a\""),
    ("guided_whitespace_pattern", "[ ]?"),
    ("skip_special_tokens", False),
    ("allowed_token_ids", [1, 2, 3]),
    ("bad_words", ["no"]),
    ("use_beam_search", True),
    ("some_unknown_field", 1),
]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field,value", REFUSED)
def test_unimplemented_fields_are_refused(cluster, path, field, value):
  body = {"model": MODEL_NAME, "max_tokens": 2, field: value}
  if path == "/v1/completions":
    body["prompt"] = "x"
  else:
    body["messages"] = [{"role": "user", "content": "x"}]
  status, text, _ = cluster.s.http("POST", path, body)
  err = json.loads(text)["error"]
  assert status == 400 and err["param"] == field, text
  assert "not supported" in err["message"] and err["type"] == "invalid_request_error"


def test_refusals_through_the_openai_client(cluster, client):
  with pytest.raises(openai.BadRequestError) as e:
    client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                   max_tokens=2, extra_body={"bad_words": ["a", "b"]})
  assert e.value.body["param"] == "bad_words"
  for tripod, param in (({"pop": "1/3"}, "tripod.pop"),
                        ({"method": "snapkv", "budget": 8}, "tripod.method"),
                        ({"pop": "1/3", "pop_variant": "nokv"}, "tripod.pop_variant")):
    with pytest.raises(openai.BadRequestError) as e:
      client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=0, echo=True, logprobs=1,
                                extra_body={"tripod": tripod})
    assert e.value.body["param"] == param and "full model" in e.value.body["message"]
  # No-op values that change nothing pass.
  r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                     max_tokens=2, user="u", store=False, metadata={"k": "v"},
                                     service_tier="auto", parallel_tool_calls=True,
                                     extra_body={"skip_special_tokens": True})
  assert r.usage.completion_tokens >= 1


def test_include_stop_str_in_output(cluster, client):
  """vLLM's include_stop_str_in_output: the matched stop string ends the text."""
  ids = corpus_prompt(30, offset=3000)
  free = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=16, temperature=0,
                                   extra_body={"ignore_eos": True})
  text = free.choices[0].text
  stop = text[len(text) // 2:len(text) // 2 + 3]
  assert stop.strip(), text
  cut = text[:text.index(stop)]
  without = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=16, temperature=0,
                                      stop=[stop], extra_body={"ignore_eos": True})
  with_stop = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=16,
                                        temperature=0, stop=[stop],
                                        extra_body={"ignore_eos": True,
                                                    "include_stop_str_in_output": True})
  assert without.choices[0].text == cut and without.choices[0].finish_reason == "stop"
  assert with_stop.choices[0].text == cut + stop and with_stop.choices[0].finish_reason == "stop"
