"""The real model files of the real_model test tier, and where the tests find them.

Two Qwen2.5-Coder Instruct GGUFs (architecture qwen2, gpt2 BPE with pre-tokenizer "qwen2", the
ChatML template with tools), fetched into the Tripod model cache before the tests run:
  qwen05: qwen2.5-coder-0.5b-instruct-q4_k_m.gguf  (Q5_0 mostly, with Q8_0, Q4_K, Q6_K)
  qwen15: qwen2.5-coder-1.5b-instruct-q4_k_m.gguf  (Q4_K and Q6_K)
Each path comes from its environment variable (ctest sets both, see tests/CMakeLists.txt), else
from the cache folder ${XDG_CACHE_HOME:-$HOME/.cache}/tripod/models. A file that is not there is
a failure, never a skip: CI fetches the files first, so a missing one means a broken set-up.
"""

import os
import sys

MODELS = {  # key -> (environment variable, file name)
    "qwen05": ("TRIPOD_MODEL_QWEN05", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
    "qwen15": ("TRIPOD_MODEL_QWEN15", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"),
}


def cache_dir():
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "tripod", "models")


def find(key):
  """The file of model `key` (a key of MODELS); FileNotFoundError when it is missing."""
  env, name = MODELS[key]
  p = os.environ.get(env) or os.path.join(cache_dir(), name)
  if not os.path.isfile(p):
    raise FileNotFoundError(f"real model {key} not found at {p} (set {env}, or fetch {name} "
                            f"into {cache_dir()})")
  return p


def path(key):
  """find(key) for the test scripts: a missing file exits with a FAIL line."""
  try:
    return find(key)
  except FileNotFoundError as e:
    print(f"FAIL: {e}", flush=True)
    sys.exit(1)


def parse_keys(text):
  """"qwen05,qwen15" -> ["qwen05", "qwen15"]; unknown keys are an argparse-style error."""
  keys = [k.strip() for k in text.split(",") if k.strip()]
  bad = [k for k in keys if k not in MODELS]
  if bad or not keys:
    raise ValueError(f"unknown model key(s) {bad or text!r}; known: {', '.join(MODELS)}")
  return keys
