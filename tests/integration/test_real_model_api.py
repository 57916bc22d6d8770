"""The scheduler's HTTP API on a real model file, Qwen2.5-Coder 0.5B (real_model tier).

What it checks, with a real tripod-scheduler process and no worker (all of it is answered before
routing: a decode address that nothing listens on keeps the scheduler up and /health at 503):
  * /tokenize of chat messages equals Hugging Face `tokenizers` ids of the GGUF's own
    tokenizer.chat_template rendered by jinja2 (default system message included), with and
    without add_generation_prompt: the scheduler's whole template path on the real file;
  * the template's tools branch: /tokenize of chats with `tools`, assistant tool calls and tool
    results equals the same ids of the template rendered by jinja2 with Hugging Face's `tojson`
    (json.dumps, keys in the client's order), arguments given as JSON text rendered as the
    object they hold (as vLLM does);
  * what Tripod does not do is refused with a 400 in OpenAI's error shape: the legacy
    `functions`, `function_call` and role "function"; malformed tools; on /v1/chat/completions
    (streaming or not);
  * tools with any `tool_choice` ("required" and a named function compile to an output
    constraint), and empty or null tool fields, pass validation (they reach routing and get the
    503 of a scheduler without workers).
The model path comes from TRIPOD_MODEL_QWEN05 (ctest sets it); a missing file fails the test.
About 10 s.
"""

import json
import os
import socket
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))

import real_models  # noqa: E402
import tok_hf_reference  # noqa: E402
from cluster import Cluster, wait_until  # noqa: E402

MODEL_PATH = real_models.find("qwen05")  # raises (the module fails) when the file is missing
NAME = "qwen-real"


@pytest.fixture(scope="module")
def sched():
  dead = socket.socket()
  dead.bind(("127.0.0.1", 0))
  port = dead.getsockname()[1]
  dead.close()
  with Cluster() as c:
    s = c.scheduler(decode=[f"127.0.0.1:{port}"], wait_ready=False, model=MODEL_PATH,
                    served_model_name=NAME, name="real")
    wait_until(lambda: s.http_get("/health")[0] == 503, 60, "scheduler up, no worker ready")
    yield s


@pytest.fixture(scope="module")
def reference():
  v = tok_hf_reference.read_vocab(MODEL_PATH)
  return v["chat_template"], tok_hf_reference.build(v, nfc=True)


def hf_tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  """The `tojson` filter of Hugging Face's chat-template environment (Jinja's own sorts keys and
  escapes HTML characters)."""
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                    sort_keys=sort_keys)


def jinja(template, messages, add_generation_prompt, tools=None):
  import jinja2.sandbox
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  env.filters["tojson"] = hf_tojson
  return env.from_string(template).render(messages=messages, tools=tools,
                                          add_generation_prompt=add_generation_prompt)


def error_of(resp):
  status, body, _ = resp
  j = json.loads(body)
  assert set(j) == {"error"} and set(j["error"]) == {"message", "type", "param", "code"}, body
  return status, j["error"]


CHATS = [
    [{"role": "user", "content": "Write a function that checks whether a number is prime."}],
    [{"role": "system", "content": "You answer in one line."},
     {"role": "user", "content": "Sort [3, 1, 2] in Python."},
     {"role": "assistant", "content": "sorted([3, 1, 2])"},
     {"role": "user", "content": "And in reverse?"}],
]


@pytest.mark.parametrize("gen", [False, True])
@pytest.mark.parametrize("chat", range(len(CHATS)))
def test_tokenize_chat_equals_jinja2_and_hf(sched, reference, chat, gen):
  template, hf = reference
  messages = CHATS[chat]
  text = jinja(template, messages, gen)
  assert ("You are Qwen, created by Alibaba Cloud." in text) == (messages[0]["role"] != "system")
  want = hf.encode(text, add_special_tokens=False).ids
  status, body, _ = sched.http("POST", "/tokenize", {"model": NAME, "messages": messages,
                                                     "add_generation_prompt": gen})
  assert status == 200, body
  assert json.loads(body)["tokens"] == want


USER = {"role": "user", "content": "What is the weather in Oslo?"}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}
TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
                                         "parameters": {"type": "object", "properties": {}}}}
# Keys out of alphabetical order, nesting, non-ASCII, quotes, a control character and numbers:
# what json.dumps and a sorted or escaping serialiser would write differently.
TOOLS = [
    {"type": "function",
     "function": {"name": "get_weather", "description": "Température à \"Oslo\"\tnow",
                  "parameters": {"type": "object",
                                 "properties": {"unit": {"type": "string",
                                                         "enum": ["C", "F"]},
                                                "city": {"type": "string", "minLength": 1}},
                                 "required": ["city"], "additionalProperties": False}}},
    {"function": {"parameters": {"type": "object", "properties": {"n": {"type": "integer"},
                                                                  "x": {"type": "number"}}},
                  "name": "add_one"},
     "type": "function"},
]
TOOL_CHATS = [
    [USER],
    [{"role": "system", "content": "Use tools when you can."}, USER],
    [USER,
     {"role": "assistant", "content": None,
      "tool_calls": [CALL, {"id": "call_2", "type": "function",
                            "function": {"name": "add_one",
                                         "arguments": "{\"x\": 2.5, \"n\": 1, \"z\": \"é\"}"}}]},
     {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
     {"role": "tool", "tool_call_id": "call_2", "content": "2"},
     {"role": "assistant", "content": "It is 12 C."},
     {"role": "user", "content": "Thanks"}],
    [USER, {"role": "assistant", "content": "Let me look.", "tool_calls": [CALL]},
     {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}],
]


def for_jinja(messages):
  """The messages as vLLM hands them to the template: tool-call arguments as the objects their
  JSON text holds, absent content as None."""
  out = []
  for m in messages:
    m = dict(m)
    if m.get("tool_calls"):
      m["tool_calls"] = [{**c, "function": {**c["function"],
                                            "arguments": json.loads(c["function"]["arguments"])}}
                         for c in m["tool_calls"]]
    out.append(m)
  return out


@pytest.mark.parametrize("with_tools", [False, True])
@pytest.mark.parametrize("chat", range(len(TOOL_CHATS)))
def test_tokenize_with_tools_equals_jinja2_and_hf(sched, reference, chat, with_tools):
  template, hf = reference
  messages = TOOL_CHATS[chat]
  tools = TOOLS if with_tools else None
  text = jinja(template, for_jinja(messages), True, tools)
  assert ("<tools>" in text) == with_tools
  want = hf.encode(text, add_special_tokens=False).ids
  body = {"model": NAME, "messages": messages}
  if with_tools:
    body["tools"] = tools
  status, resp, _ = sched.http("POST", "/tokenize", body)
  assert status == 200, resp
  assert json.loads(resp)["tokens"] == want


REFUSED = [
    ({"functions": [TOOL["function"]]}, "functions"),
    ({"function_call": {"name": "get_weather"}}, "function_call"),
    ({"messages": [USER, {"role": "function", "name": "get_weather", "content": "12 C"}]},
     "messages[1].role"),
    ({"messages": [USER, {"role": "assistant", "function_call": {"name": "get_weather",
                                                                 "arguments": "{}"}}]},
     "messages[1].function_call"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra,param", REFUSED)
def test_tool_features_are_refused(sched, extra, param, stream):
  body = {"model": NAME, "messages": [USER], "max_tokens": 8, "stream": stream}
  body.update(extra)
  status, err = error_of(sched.http("POST", "/v1/chat/completions", body))
  assert status == 400 and err["type"] == "invalid_request_error", err
  assert err["param"] == param and "not supported" in err["message"], err


BAD_TOOLS = [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name"),
    ({"tools": [TOOL, TOOL]}, "tools[1].function.name"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "other"}}},
     "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [{"type": "function"}]}]},
     "messages[1].tool_calls[0]"),
]


@pytest.mark.parametrize("extra,param", BAD_TOOLS)
def test_malformed_tool_fields_are_400s(sched, extra, param):
  body = {"model": NAME, "messages": [USER], "max_tokens": 8}
  body.update(extra)
  status, err = error_of(sched.http("POST", "/v1/chat/completions", body))
  assert status == 400 and err["param"] == param, err


@pytest.mark.parametrize("extra", [{"tool_choice": "none"}, {"tool_choice": "auto"},
                                   {"tools": []}, {"tools": None, "tool_choice": None},
                                   {"tools": [TOOL]}, {"tools": TOOLS, "tool_choice": "auto",
                                                       "parallel_tool_calls": False},
                                   {"tools": [TOOL], "tool_choice": "none"},
                                   {"tools": TOOLS, "tool_choice": "required"},
                                   {"tools": TOOLS, "tool_choice": {"type": "function",
                                                                    "function": {"name": "add_one"}}},
                                   {"messages": TOOL_CHATS[2], "tools": TOOLS}])
def test_no_op_tool_fields_reach_routing(sched, extra):
  body = {"model": NAME, "messages": [USER], "max_tokens": 8}
  body.update(extra)
  status, err = error_of(sched.http("POST", "/v1/chat/completions", body))
  assert status == 503, err  # past validation: no decode worker to route to
