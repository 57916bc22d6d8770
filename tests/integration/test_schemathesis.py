"""Property-based checks of the scheduler's HTTP API against its OpenAPI description
(docs/openapi.yaml) with schemathesis: requests generated from the spec's request schemas
(positive: valid by the spec; negative: invalid by it) go to a live cluster (one prefill worker,
one decode worker, a scheduler), and every answer must be
  * no 5xx (not_a_server_error),
  * a status code the spec documents for the operation (status_code_conformance),
  * of a content type the spec documents for it (content_type_conformance),
  * a body the spec's schema for that status and content type accepts
    (response_schema_conformance; for text/event-stream, every event: each chunk, the error
    event, and the closing [DONE]).

Bounded: a fixed number of examples per operation and mode, generated deterministically
(Hypothesis's derandomize: the same examples as long as this file's test code is unchanged), no
shrinking; four in five generated bodies name the served model (the rest keep the generated name,
a 404); generation kept short: max_tokens and max_completion_tokens above MAX_NEW are lowered to
MAX_NEW, and absent ones set to it, unless the value is beyond the context length (a hostile but
valid 2^31 is refused as context_length_exceeded, which this test keeps). A failure prints the
request as a curl command; with -s every operation prints how its answers were spread.

test_regressions replays, with the same checks, requests the fuzzing once found failing.
About 1 minute on 2 busy cores.
"""

import json
import os
import time

import hypothesis
import hypothesis.strategies as st
import pytest
import requests
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (content_type_conformance,
                                               response_schema_conformance,
                                               status_code_conformance)

from cluster import Cluster, MODEL, SOURCE_DIR

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]
SPEC = os.path.join(SOURCE_DIR, "docs", "openapi.yaml")
MAX_NEW = 4            # tokens generated at most by an accepted completion
CONTEXT = 8192         # the model's context length (checked against /v1/models below)
REQUEST_TIMEOUT_S = 60
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
# Examples per operation: completions carry the interesting bodies; the rest are cheap.
EXAMPLES = {
    ("POST", "/v1/completions"): 100,
    ("POST", "/v1/chat/completions"): 60,
    ("POST", "/tokenize"): 40,
    ("POST", "/detokenize"): 40,
    ("GET", "/tokenizer_info"): 3,
    ("GET", "/v1/models"): 3,
    ("GET", "/health"): 3,
    ("GET", "/metrics"): 3,
}
NEGATIVE_EXAMPLES = 40  # per operation that takes a body

# No config file discovered; failures print the requests as sent (no "[Filtered]" for keys
# that look like secrets, such as max_tokens).
schema = schemathesis.openapi.from_path(
    SPEC, config=schemathesis.Config.from_dict({"output": {"sanitization": {"enabled": False}}}))


def operations():
  params = []
  for result in schema.get_all_operations():
    op = result.ok()
    key = (op.method.upper(), op.path)
    assert key in EXAMPLES, f"an operation this test does not know: {key}"
    params.append(pytest.param(op, GenerationMode.POSITIVE, EXAMPLES[key],
                               id=f"{op.method.upper()} {op.path} positive"))
    if op.body:
      params.append(pytest.param(op, GenerationMode.NEGATIVE, NEGATIVE_EXAMPLES,
                                 id=f"{op.method.upper()} {op.path} negative"))
  assert {(p.values[0].method.upper(), p.values[0].path) for p in params} == set(EXAMPLES)
  return params


@pytest.fixture(scope="module")
def cluster():
  with Cluster() as c:
    # Full weights on the prefill worker: any tripod.pop a request asks for can run there.
    prefill = c.prefill(pop_ratio="0")
    decode = c.decode(kv_budget_mb=64)
    sched = c.scheduler(prefill=[prefill], decode=[decode], direct_prefill_tokens=8)
    c.p, c.d, c.s = prefill, decode, sched
    status, body, _ = sched.http("GET", "/v1/models")
    assert status == 200 and json.loads(body)["data"][0]["max_model_len"] == CONTEXT, body
    yield c


def cap_generation(body):
  """Keeps an accepted completion short: the token limits to at most MAX_NEW (absent: MAX_NEW),
  except values past the context, which the server refuses before generating anything."""
  if not isinstance(body, dict):
    return body
  body = dict(body)
  for key in ("max_tokens", "max_completion_tokens"):
    v = body.get(key)
    if v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and
                     MAX_NEW < v <= CONTEXT):
      body[key] = MAX_NEW
  return body


@pytest.mark.parametrize("operation,mode,examples", operations())
def test_api_conforms_to_openapi(cluster, operation, mode, examples):
  session = requests.Session()
  strategy = operation.as_strategy(generation_mode=mode)
  base_url = cluster.s.url

  @hypothesis.settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                       phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
                       suppress_health_check=list(hypothesis.HealthCheck),
                       print_blob=False)
  @hypothesis.given(case=strategy, data=st.data())
  def run(case, data):
    if operation.body and isinstance(case.body, dict):
      # Most requests name the served model, so that they get past the model check.
      if "model" in case.body and data.draw(st.sampled_from([True] * 4 + [False]),
                                             label="served model"):
        case.body["model"] = MODEL_NAME
      case.body = cap_generation(case.body)
    try:
      response = case.call_and_validate(base_url=base_url, session=session, checks=CHECKS,
                                        timeout=REQUEST_TIMEOUT_S)
      ctype = response.headers.get("content-type", [""])[0].split(";")[0]
      key = f"{response.status_code} {ctype}"
      if response.status_code >= 400:
        try:
          key += " " + str(response.json()["error"]["code"] or response.json()["error"]["param"])
        except Exception:
          pass
      seen[key] = seen.get(key, 0) + 1
    except Exception:
      print("request:", case.as_curl_command(), flush=True)
      raise

  seen = {}
  started = time.monotonic()
  run()
  print(f"{operation.method.upper()} {operation.path} {mode.value}: {examples} examples in "
        f"{time.monotonic() - started:.1f} s; answers: {dict(sorted(seen.items()))}")


# Requests the fuzzing above once found failing, replayed every run (with the same checks).
REGRESSIONS = [
    # The greedy first token is a piece of a UTF-8 character: the decode worker sent it in a
    # proto3 string field (GenerateResponse.text), the scheduler could not parse the message and
    # answered 500 "the decode worker's stream ended without a finish".
    pytest.param("/v1/completions", {"model": MODEL_NAME, "prompt": "\U0002A44D'\u0090p\u00e3\u00f1",
                                     "max_tokens": 1, "temperature": 0}, id="split_utf8_whole"),
    pytest.param("/v1/completions", {"model": MODEL_NAME, "prompt": "\U0002A44D'\u0090p\u00e3\u00f1",
                                     "max_tokens": 3, "temperature": 0, "stream": True},
                 id="split_utf8_stream"),
    # A top_p in (0, 1] that is 0 as a float (5e-324 is the smallest double): was a 400 "'top_p'
    # must be in (0, 1], got 4.94066e-324".
    pytest.param("/v1/chat/completions", {"model": MODEL_NAME, "max_tokens": 2, "top_p": 5e-324,
                                          "messages": [{"role": "user", "content": "Hi"}]},
                 id="subnormal_top_p"),
]


@pytest.mark.parametrize("path,body", REGRESSIONS)
def test_regressions(cluster, path, body):
  case = schema[path]["POST"].Case(body=body, media_type="application/json")
  response = case.call_and_validate(base_url=cluster.s.url, checks=CHECKS,
                                    timeout=REQUEST_TIMEOUT_S)
  assert response.status_code == 200, response.text
  assert "error" not in response.text, response.text
