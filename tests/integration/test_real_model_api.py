"""The scheduler's HTTP API on a real model file, Qwen2.5-Coder 0.5B (real_model tier).

What it checks, with a real tripod-scheduler process and no worker (all of it is answered before
routing: a decode address that nothing listens on keeps the scheduler up and /health at 503):
  * /tokenize of chat messages equals Hugging Face `tokenizers` ids of the GGUF's own
    tokenizer.chat_template rendered by jinja2 (default system message included), with and
    without add_generation_prompt: the scheduler's whole template path on the real file;
  * what that template's tools branch would render is refused with a 400 in OpenAI's error
    shape, never rendered without it: `tools`, `functions`, `tool_choice` "required" or a named
    function, tool calls in an assistant message, tool messages; on /v1/chat/completions
    (streaming or not) and /tokenize;
  * no-op values (`tool_choice` "none"/"auto", empty `tools`) are not refused (they reach
    routing and get the 503 of a scheduler without workers).
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


def jinja(template, messages, add_generation_prompt):
  import jinja2.sandbox
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
  return env.from_string(template).render(messages=messages,
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
REFUSED = [
    ({"tools": [TOOL]}, "tools"),
    ({"tools": [TOOL], "tool_choice": "auto"}, "tools"),
    ({"functions": [TOOL["function"]]}, "functions"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, "tool_choice"),
    ({"messages": [USER, {"role": "assistant", "content": None, "tool_calls": [CALL]}]},
     "messages[1].tool_calls"),
    ({"messages": [USER, {"role": "assistant", "tool_calls": [CALL]},
                   {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]},
     "messages[1].tool_calls"),
    ({"messages": [USER, {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]},
     "messages[1].role"),
]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra,param", REFUSED)
def test_tool_features_are_refused(sched, extra, param, stream):
  body = {"model": NAME, "messages": [USER], "max_tokens": 8, "stream": stream}
  body.update(extra)
  status, err = error_of(sched.http("POST", "/v1/chat/completions", body))
  assert status == 400 and err["type"] == "invalid_request_error", err
  assert err["param"] == param and "not supported" in err["message"], err


def test_tool_messages_refused_by_tokenize(sched):
  for messages, param in [([USER, {"role": "assistant", "tool_calls": [CALL]}],
                           "messages[1].tool_calls"),
                          ([USER, {"role": "tool", "content": "12 C"}], "messages[1].role")]:
    status, err = error_of(sched.http("POST", "/tokenize", {"model": NAME, "messages": messages}))
    assert status == 400 and err["param"] == param, err


@pytest.mark.parametrize("extra", [{"tool_choice": "none"}, {"tool_choice": "auto"},
                                   {"tools": []}, {"tools": None, "tool_choice": None}])
def test_no_op_tool_fields_reach_routing(sched, extra):
  body = {"model": NAME, "messages": [USER], "max_tokens": 8}
  body.update(extra)
  status, err = error_of(sched.http("POST", "/v1/chat/completions", body))
  assert status == 503, err  # past validation: no decode worker to route to
