"""Models the processes refuse at start, before any worker runs (issue 37): a GGUF of an
architecture Tripod does not serve (tripod serve, a worker main, tripod generate), a draft model
whose vocabulary is not the target's (tripod serve --draft_model), self-draft flags given with a
separate draft, and a --model word that is neither a file nor a catalogue name. The GGUFs are
metadata only, written with the gguf package."""

import subprocess

import gguf
import pytest

from cluster import MODEL, binary


def write_gguf(path, arch, tokens):
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(2)
  w.add_embedding_length(64)
  w.add_feed_forward_length(128)
  w.add_head_count(4)
  w.add_token_list(tokens)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return str(path)


def run(*args, timeout=120):
  return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def gemma(tmp_path):
  return write_gguf(tmp_path / "gemma.gguf", "gemma3", ["<bos>", "a", "b"])


def test_serve_refuses_an_unserved_architecture_before_starting_workers(gemma):
  r = run(binary("tripod"), "serve", "--port=0", f"--model={gemma}")
  assert r.returncode == 1, r.stderr
  assert f"{gemma}: unsupported architecture 'gemma3'" in r.stderr
  assert "llama (and mistral), qwen2 and qwen3" in r.stderr
  assert "decode-0" not in r.stderr  # no worker was started


@pytest.mark.parametrize("role", ["decode", "prefill", "draft"])
def test_a_worker_refuses_an_unserved_architecture_at_start(gemma, role):
  r = run(binary(role), f"--model={gemma}", "--listen=127.0.0.1:0",
          "--http_listen=127.0.0.1:0")
  assert r.returncode != 0
  assert "unsupported architecture 'gemma3'" in r.stderr and gemma in r.stderr, r.stderr


def test_generate_refuses_an_unserved_architecture(gemma):
  r = run(binary("tripod"), "generate", "--prompt=hi", f"--model={gemma}")
  assert r.returncode != 0
  assert "unsupported architecture 'gemma3'" in r.stderr, r.stderr


def test_serve_refuses_a_draft_of_another_vocabulary(tmp_path):
  draft = write_gguf(tmp_path / "draft.gguf", "llama", ["<s>", "a", "b"])
  r = run(binary("tripod"), "serve", "--port=0", f"--model={MODEL}", f"--draft_model={draft}")
  assert r.returncode == 1, r.stderr
  assert f"draft model {draft} cannot serve target" in r.stderr
  assert "their vocabularies differ (3 tokens against 49152" in r.stderr
  assert "decode-0" not in r.stderr


def test_serve_refuses_self_draft_flags_with_a_separate_draft():
  r = run(binary("tripod"), "serve", "--port=0", f"--model={MODEL}", f"--draft_model={MODEL}",
          "--draft_layers=4")
  assert r.returncode == 1, r.stderr
  assert "give --draft_model=self for a self-draft" in r.stderr


def test_a_word_that_is_no_model_is_refused_everywhere():
  for cmd in ([binary("tripod"), "generate", "--prompt=hi"], [binary("tripod"), "serve"],
              [binary("decode")], [binary("scheduler"), "--decode=127.0.0.1:1"]):
    r = run(*cmd, "--model=qwen-9000")
    assert r.returncode != 0, cmd
    assert "--model 'qwen-9000' is neither a file nor a model of the catalogue" in r.stderr, \
        (cmd, r.stderr)
    assert "qwen2.5-coder-1.5b-instruct" in r.stderr, r.stderr
