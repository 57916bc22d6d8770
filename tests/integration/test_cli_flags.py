"""`tripod generate` and `tripod logits` refuse out-of-range flags before loading anything: a
clear message naming the flag and a non-zero exit (they used to run, print nothing and exit 0)."""

import subprocess

import pytest

from cluster import MODEL, binary

BAD = [
    (["generate", "--max-tokens", "-3", "--prompt", "hi"], "--max_tokens must be >= 1, got -3"),
    (["generate", "--max_tokens=0", "--prompt", "hi"], "--max_tokens must be >= 1, got 0"),
    (["generate", "--prompt", ""], "--prompt is empty"),
    (["generate", "--ids="], "--ids is empty"),
    (["generate", "--prompt", "hi", "--ids", "1,2"], "give one of --prompt, --ids and --chat"),
    (["generate", "--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "--prompt", "hi", "--top-p", "1.5"], "top_p"),
    (["generate", "--prompt", "hi", "--chunk", "0"], "--chunk must be >= 1, got 0"),
    (["generate", "--prompt", "hi", "--context", "-5"], "--context must be >= 0"),
    (["generate", "--prompt", "hi", "--threads", "-2"], "--threads must be >= 0"),
    (["generate", "--prompt", "hi", "--backend", "tpu"], "unknown backend 'tpu'"),
    (["logits", "--ids", "1,2", "--out", "/tmp/x", "--chunk", "-1"], "--chunk must be >= 1"),
    (["generate", "--max_tokens", "lots", "--prompt", "hi"], "max_tokens"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_out_of_range_flags_are_refused(args, message):
  r = subprocess.run([binary("tripod"), *args, f"--model={MODEL}"], capture_output=True,
                     text=True, timeout=120)
  assert r.returncode != 0, (r.stdout, r.stderr)
  assert message in r.stderr, r.stderr
  assert r.stdout == "", r.stdout


def test_a_valid_request_still_runs():
  r = subprocess.run([binary("tripod"), "generate", "--prompt", "One, two,", "--max-tokens", "3",
                      "--temperature", "0", "--print_ids", f"--model={MODEL}"],
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr
  assert len(r.stdout.split()) == 3, r.stdout
