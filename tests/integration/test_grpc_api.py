"""The gRPC Completion API against the HTTP API on one server: real tripod-scheduler,
tripod-prefill and tripod-decode processes on loopback (fp32 workers, POP off), the same request
sent both ways. gRPC's adapter maps its fields to the request HTTP's parser makes, so its answers
must be HTTP's:

  * n > 1: greedy choices equal HTTP's, text for text, and each other's token ids; usage counts
    the prompt once; Generate tags every chunk with its choice and ends each choice once.
    best_of picks what HTTP picks (seeded sampling); best_of on Generate and n past --max_n are
    refused as HTTP refuses them.
  * echo + logprobs with max_tokens 0 (lm-evaluation-harness's loglikelihood): the prompt's
    log-probabilities equal HTTP's within 1e-6, the first unset; vLLM's prompt_logprobs ranks
    equal HTTP's; a stream sends the echoed prompt first.
  * Structured outputs: a json_schema-constrained chat answer parses and validates (jsonschema)
    and equals HTTP's; guided_choice gives one of the choices; a bad schema is INVALID_ARGUMENT
    whose message is HTTP's 400 body.
  * include_stop_str_in_output: the text ends with the stop string, as HTTP's.
  * Tools on the bundled SmolLM (no tool format in its template): refused as HTTP refuses them.
    Tool calls themselves need a Qwen file: test_real_models.py.
"""

import json
import os

import grpc
import jsonschema
import pytest

from cluster import Cluster, corpus_prompt, cpb, openai_client, MODEL

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]
MAX_N = 4
TIMEOUT = 300


@pytest.fixture(scope="module")
def cluster():
  with Cluster() as c:
    yield c.api(pop="0", max_n=MAX_N)


@pytest.fixture(scope="module")
def client(cluster):
  return openai_client(cluster.s.url)


def grpc_error(call):
  """(code, the JSON error body) of a refused call."""
  with pytest.raises(grpc.RpcError) as e:
    call()
  return e.value.code(), json.loads(e.value.details())


def http_error(cluster, path, body):
  status, text, _ = cluster.s.http("POST", path, body)
  assert status == 400, text
  return json.loads(text)


def by_choice(chunks):
  """{index: (text, finish_reason)} of a Generate stream."""
  out = {}
  for c in chunks:
    text, finish = out.get(c.index, ("", ""))
    assert not finish, f"choice {c.index} went on after its end"
    out[c.index] = (text + c.text, c.finish_reason)
  return out


def test_choices_and_best_of_equal_http(cluster, client):
  ids = corpus_prompt(40, offset=1200)
  req = cpb.CompletionRequest(prompt_ids=cpb.TokenIds(ids=ids), max_tokens=8, temperature=0,
                              ignore_eos=True, n=3)
  whole = cluster.s.stub.Complete(req, timeout=TIMEOUT)
  http = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=8, temperature=0,
                                   n=3, extra_body={"ignore_eos": True})
  assert [c.index for c in whole.choices] == [0, 1, 2]
  assert [c.text for c in whole.choices] == [c.text for c in http.choices]
  assert all(list(c.token_ids) == list(whole.choices[0].token_ids) for c in whole.choices)
  assert len(whole.choices[0].token_ids) == 8
  # The single-choice fields are choice 0's.
  assert whole.text == whole.choices[0].text and whole.token_ids == whole.choices[0].token_ids
  assert whole.usage.prompt_tokens == http.usage.prompt_tokens == 40  # the prompt once
  assert whole.usage.completion_tokens == http.usage.completion_tokens == 24

  chunks = list(cluster.s.stub.Generate(req, timeout=TIMEOUT))
  assert by_choice(chunks) == {c.index: (c.text, "length") for c in whole.choices}
  assert chunks[-1].usage.completion_tokens == 24 and chunks[-1].timing.total_s > 0

  # best_of: the candidate HTTP picks, for the same seed.
  seeded = dict(max_tokens=6, temperature=1.0, seed=17)
  best = cluster.s.stub.Complete(
      cpb.CompletionRequest(prompt_ids=cpb.TokenIds(ids=ids), best_of=3, **seeded),
      timeout=TIMEOUT)
  http_best = client.completions.create(model=MODEL_NAME, prompt=ids, best_of=3, **seeded)
  assert len(best.choices) == 1 and best.choices[0].text == http_best.choices[0].text

  for grpc_call, body, param in [
      (lambda: list(cluster.s.stub.Generate(
          cpb.CompletionRequest(prompt="x", best_of=2), timeout=TIMEOUT)),
       {"prompt": "x", "best_of": 2, "stream": True}, "best_of"),
      (lambda: cluster.s.stub.Complete(cpb.CompletionRequest(prompt="x", n=MAX_N + 1),
                                       timeout=TIMEOUT),
       {"prompt": "x", "n": MAX_N + 1}, "n"),
  ]:
    code, err = grpc_error(grpc_call)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert err == http_error(cluster, "/v1/completions", dict(body, model=MODEL_NAME))
    assert err["error"]["param"] == param


def test_echo_and_prompt_logprobs_equal_http(cluster, client):
  ids = corpus_prompt(30, offset=1500)
  got = cluster.s.stub.Complete(
      cpb.CompletionRequest(prompt_ids=cpb.TokenIds(ids=ids), echo=True, logprobs=2,
                            max_tokens=0), timeout=TIMEOUT)
  want = client.completions.create(model=MODEL_NAME, prompt=ids, echo=True, logprobs=2,
                                   max_tokens=0)
  assert got.choices[0].text == want.choices[0].text and got.finish_reason == "length"
  assert len(got.choices[0].token_ids) == 0 and got.usage.completion_tokens == 0
  lps = got.prompt_logprobs
  assert [p.id for p in lps] == ids
  assert [p.token for p in lps] == want.choices[0].logprobs.tokens
  assert not lps[0].HasField("logprob") and want.choices[0].logprobs.token_logprobs[0] is None
  for i in range(1, len(ids)):
    assert lps[i].HasField("logprob")
    assert abs(lps[i].logprob - want.choices[0].logprobs.token_logprobs[i]) <= 1e-6, i
    top, seen = want.choices[0].logprobs.top_logprobs[i], set()
    for t in lps[i].top:  # two ids may decode alike: HTTP keeps the likelier (first)
      if t.token not in seen:
        seen.add(t.token)
        assert abs(top[t.token] - t.logprob) <= 1e-6, (i, t.token)

  # vLLM's prompt_logprobs beside a completion: the same ranks and numbers as HTTP's field.
  got = cluster.s.stub.Complete(
      cpb.CompletionRequest(prompt_ids=cpb.TokenIds(ids=ids), prompt_logprobs=1, max_tokens=2,
                            temperature=0), timeout=TIMEOUT)
  status, text, _ = cluster.s.http("POST", "/v1/completions", {
      "model": MODEL_NAME, "prompt": ids, "prompt_logprobs": 1, "max_tokens": 2,
      "temperature": 0})
  assert status == 200, text
  want = json.loads(text)["choices"][0]
  assert got.text == want["text"] and want["prompt_logprobs"][0] is None
  for i in range(1, len(ids)):
    entry = want["prompt_logprobs"][i][str(ids[i])]
    assert got.prompt_logprobs[i].rank == entry["rank"]
    assert abs(got.prompt_logprobs[i].logprob - entry["logprob"]) <= 1e-6

  # A stream: the echoed prompt and its log-probabilities first, then the completion.
  req = cpb.CompletionRequest(prompt_ids=cpb.TokenIds(ids=ids), echo=True, logprobs=1,
                              max_tokens=3, temperature=0)
  chunks = list(cluster.s.stub.Generate(req, timeout=TIMEOUT))
  whole = cluster.s.stub.Complete(req, timeout=TIMEOUT)
  assert chunks[0].text == detokenized(cluster, ids) and len(chunks[0].prompt_logprobs) == 30
  assert "".join(c.text for c in chunks) == whole.text
  assert [p.logprob for p in chunks[0].prompt_logprobs] == [p.logprob
                                                            for p in whole.prompt_logprobs]


def detokenized(cluster, ids):
  status, text, _ = cluster.s.http("POST", "/detokenize", {"tokens": ids})
  assert status == 200, text
  return json.loads(text)["prompt"]


PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer"},
                         "member": {"type": "boolean"}},
          "required": ["name", "age", "member"], "additionalProperties": False}
ASK = "Describe a club member as JSON."


def test_structured_outputs_equal_http(cluster, client):
  messages = cpb.ChatMessages(messages=[cpb.ChatMessage(role="user", content=ASK)])
  got = cluster.s.stub.Complete(
      cpb.CompletionRequest(messages=messages, max_tokens=160, temperature=0,
                            response_format=cpb.ResponseFormat(
                                type="json_schema", name="person", schema=json.dumps(PERSON),
                                strict=True)), timeout=TIMEOUT)
  want = client.chat.completions.create(
      model=MODEL_NAME, messages=[{"role": "user", "content": ASK}], max_tokens=160,
      temperature=0, response_format={"type": "json_schema", "json_schema": {
          "name": "person", "schema": PERSON, "strict": True}})
  assert got.text == want.choices[0].message.content
  assert got.finish_reason == want.choices[0].finish_reason == "stop", got.text
  jsonschema.validate(json.loads(got.text), PERSON)

  got = cluster.s.stub.Complete(
      cpb.CompletionRequest(prompt="Pick one:", max_tokens=8, temperature=0,
                            guided_choice=cpb.GuidedChoice(choices=["alpha", "beta"])),
      timeout=TIMEOUT)
  want = client.completions.create(model=MODEL_NAME, prompt="Pick one:", max_tokens=8,
                                   temperature=0, extra_body={"guided_choice": ["alpha", "beta"]})
  assert got.text in ("alpha", "beta") and got.text == want.choices[0].text

  bad = {"type": "string", "format": "email"}
  code, err = grpc_error(lambda: cluster.s.stub.Complete(
      cpb.CompletionRequest(messages=messages, response_format=cpb.ResponseFormat(
          type="json_schema", schema=json.dumps(bad))), timeout=TIMEOUT))
  assert code == grpc.StatusCode.INVALID_ARGUMENT
  assert err == http_error(cluster, "/v1/chat/completions", {
      "model": MODEL_NAME, "messages": [{"role": "user", "content": ASK}],
      "response_format": {"type": "json_schema", "json_schema": {"schema": json.dumps(bad)}}})
  assert err["error"]["param"] == "response_format.json_schema.schema"


def test_include_stop_str_equals_http(cluster, client):
  ids = corpus_prompt(20, offset=1800)
  plain = cluster.s.stub.Complete(
      cpb.CompletionRequest(prompt_ids=cpb.TokenIds(ids=ids), max_tokens=12, temperature=0,
                            ignore_eos=True), timeout=TIMEOUT)
  words = plain.text.split()
  assert len(words) >= 3, plain.text
  stop = words[2]
  got = cluster.s.stub.Complete(
      cpb.CompletionRequest(prompt_ids=cpb.TokenIds(ids=ids), max_tokens=12, temperature=0,
                            ignore_eos=True, stop=[stop], include_stop_str_in_output=True),
      timeout=TIMEOUT)
  want = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=12, temperature=0,
                                   stop=[stop], extra_body={"ignore_eos": True,
                                                            "include_stop_str_in_output": True})
  assert got.text == want.choices[0].text and got.text.endswith(stop)
  assert got.finish_reason == "stop"


def test_tools_refused_by_a_template_without_them(cluster):
  weather = {"name": "get_weather", "description": "The weather now",
             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
  code, err = grpc_error(lambda: cluster.s.stub.Complete(cpb.CompletionRequest(
      messages=cpb.ChatMessages(messages=[cpb.ChatMessage(role="user", content="Oslo?")]),
      tools=[cpb.Tool(name=weather["name"], description=weather["description"],
                      parameters=json.dumps(weather["parameters"]))],
      max_tokens=4), timeout=TIMEOUT))
  assert code == grpc.StatusCode.INVALID_ARGUMENT
  assert err == http_error(cluster, "/v1/chat/completions", {
      "model": MODEL_NAME, "messages": [{"role": "user", "content": "Oslo?"}],
      "tools": [{"type": "function", "function": weather}], "max_tokens": 4})
