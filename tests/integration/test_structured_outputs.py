"""Structured outputs end to end: real tripod-scheduler, tripod-prefill and tripod-decode
processes on loopback, driven by the official `openai` Python client. On the bundled 135M model
the token mask alone makes the output valid: json_schema (strict) outputs parse and validate with
`jsonschema` (or, cut by max_tokens, are a prefix of a valid text with finish_reason "length");
guided_choice returns one of the choices; guided_regex output fullmatches the pattern (Python's
re); json_object gives an object; and bad patterns or schemas are 400s naming the field.
"""

import json
import math
import os
import re

import jsonschema
import openai
import pytest

from cluster import Cluster, MODEL, openai_client

MODEL_NAME = os.path.basename(MODEL)[:-len(".gguf")]

SCHEMAS = [
    {"type": "object",
     "properties": {"name": {"type": "string", "maxLength": 20},
                    "age": {"type": "integer"},
                    "member": {"type": "boolean"}},
     "required": ["name", "age", "member"], "additionalProperties": False},
    {"type": "object",
     "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]},
                    "scores": {"type": "array", "items": {"type": "number"}, "minItems": 1,
                               "maxItems": 3}},
     "required": ["colour", "scores"], "additionalProperties": False},
    {"$defs": {"p": {"type": "object", "properties": {"x": {"type": "integer"},
                                                      "y": {"type": "integer"}},
                     "required": ["x", "y"], "additionalProperties": False}},
     "type": "object",
     "properties": {"start": {"$ref": "#/$defs/p"}, "end": {"$ref": "#/$defs/p"},
                    "label": {"anyOf": [{"type": "string", "maxLength": 8}, {"type": "null"}]}},
     "required": ["start", "end", "label"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def cluster():
  with Cluster() as c:
    yield c.api()  # chat prompts go through the prefill worker, the first token is the decode's


@pytest.fixture(scope="module")
def client(cluster):
  return openai_client(cluster.s.url)


def chat(client, content, max_tokens=200, temperature=0.0, **kw):
  return client.chat.completions.create(
      model=MODEL_NAME, messages=[{"role": "user", "content": content}], max_tokens=max_tokens,
      temperature=temperature, seed=3, **kw)


def check_json(text, finish, schema):
  if finish == "length":
    return  # cut short: checked as a prefix by the caller where it matters
  assert finish == "stop", (finish, text)
  jsonschema.validate(json.loads(text), schema)


@pytest.mark.parametrize("i", range(len(SCHEMAS)))
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_json_schema_strict_output_validates(client, i, temperature):
  schema = SCHEMAS[i]
  r = chat(client, "Describe a person as JSON.", max_tokens=300, temperature=temperature,
           response_format={"type": "json_schema",
                            "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
  c = r.choices[0]
  assert c.finish_reason == "stop", c
  jsonschema.validate(json.loads(c.message.content), schema)


def test_json_schema_cut_by_max_tokens_is_a_prefix(client):
  schema = SCHEMAS[0]
  full = chat(client, "A person as JSON.", max_tokens=300,
              response_format={"type": "json_schema",
                               "json_schema": {"name": "p", "schema": schema}})
  cut = chat(client, "A person as JSON.", max_tokens=4,
             response_format={"type": "json_schema",
                              "json_schema": {"name": "p", "schema": schema}})
  assert cut.choices[0].finish_reason == "length"
  assert full.choices[0].message.content.startswith(cut.choices[0].message.content)
  assert cut.choices[0].message.content.startswith("{")


def test_completions_guided_json_and_structured_outputs(client):
  schema = SCHEMAS[1]
  for extra in ({"guided_json": schema}, {"guided_json": json.dumps(schema)},
                {"structured_outputs": {"json": schema}},
                {"response_format": {"type": "json_schema",
                                     "json_schema": {"name": "x", "schema": schema}}}):
    r = client.completions.create(model=MODEL_NAME, prompt="Here is some JSON:", max_tokens=200,
                                  temperature=0, extra_body=extra)
    assert r.choices[0].finish_reason == "stop", (extra, r)
    jsonschema.validate(json.loads(r.choices[0].text), schema)


def test_json_object(client):
  for temperature in (0.0, 1.0):
    r = chat(client, "Give me a JSON object.", max_tokens=400, temperature=temperature,
             response_format={"type": "json_object"})
    c = r.choices[0]
    if c.finish_reason == "stop":
      assert isinstance(json.loads(c.message.content), dict)
    else:
      assert c.finish_reason == "length" and c.message.content.startswith("{")


def test_guided_choice(client):
  choices = ["positive", "negative", "neutral"]
  for extra in ({"guided_choice": choices}, {"structured_outputs": {"choice": choices}}):
    for temperature in (0.0, 1.0):
      r = chat(client, "Sentiment of 'I love it'?", max_tokens=20, temperature=temperature,
               extra_body=extra)
      assert r.choices[0].message.content in choices, r
      assert r.choices[0].finish_reason == "stop"


def test_guided_regex_fullmatches(client):
  for pattern in [r"\d{3}-\d{4}", r"(cat|dog)s? (run|sleep)!", r"[A-Z][a-z]{2,8}( [A-Z][a-z]{2,8})?",
                  r"[0-9a-f]{8}"]:
    for extra in ({"guided_regex": pattern}, {"structured_outputs": {"regex": pattern}}):
      r = client.completions.create(model=MODEL_NAME, prompt="Answer:", max_tokens=40, temperature=1.0,
                                    seed=5, extra_body=extra)
      text = r.choices[0].text
      assert r.choices[0].finish_reason == "stop", (pattern, r)
      assert re.fullmatch(pattern, text), (pattern, text)


def test_streamed_constrained_output_equals_whole(client):
  kw = dict(model=MODEL_NAME, messages=[{"role": "user", "content": "JSON please"}], max_tokens=200,
            temperature=0, response_format={"type": "json_schema",
                                            "json_schema": {"name": "p", "schema": SCHEMAS[0]}})
  whole = client.chat.completions.create(**kw).choices[0].message.content
  parts = [ch.choices[0].delta.content or "" for ch in
           client.chat.completions.create(stream=True, **kw) if ch.choices]
  assert "".join(parts) == whole


def test_logprobs_are_of_the_masked_distribution(client):
  r = client.completions.create(model=MODEL_NAME, prompt="Pick:", max_tokens=5, temperature=0,
                                logprobs=5, extra_body={"guided_choice": ["alpha", "beta"]})
  assert r.choices[0].text in ("alpha", "beta")
  first = r.choices[0].logprobs.top_logprobs[0]
  # Only tokens that begin a choice are left, and they hold the whole mass (unmasked, the top
  # five of a 49k vocabulary after "Pick:" would be other words, with far less).
  assert all("alpha".startswith(t) or "beta".startswith(t) for t in first), first
  mass = sum(math.exp(lp) for lp in first.values())
  assert 0.9 < mass <= 1.0 + 1e-4, first


@pytest.mark.parametrize("extra,param,words", [
    ({"guided_regex": "(ab"}, "guided_regex", "invalid regex"),
    ({"guided_regex": "a(?=b)"}, "guided_regex", "lookahead"),
    ({"guided_regex": r"(a{1000}){1000}"}, "guided_regex", "too large"),
    ({"guided_choice": []}, "guided_choice", "non-empty"),
    ({"guided_json": {"type": "integer", "minimum": 3}}, "guided_json", "minimum"),
    ({"guided_json": "{not json"}, "guided_json", "not valid JSON"),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "x", "schema": {"type": "string",
                                                                  "format": "email"}}}},
     "response_format.json_schema.schema", "format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "json_schema"),
    ({"structured_outputs": {"grammar": "root ::= x"}}, "structured_outputs.grammar",
     "not supported"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "give one"),
    ({"guided_grammar": "root ::= x"}, "guided_grammar", "not supported"),
])
def test_refusals(client, extra, param, words):
  with pytest.raises(openai.BadRequestError) as e:
    client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "x"}],
                                   max_tokens=5, extra_body=extra)
  err = e.value.body
  assert err["param"] == param, err
  assert words in err["message"], err
