"""The device check's part 5 on the CPU (bench/gpu_random_model.py, bench/gpu_serve_bench.py): the
random-weight model has the real file's header, tensors and types, loads and serves; the
benchmark measures all three services and writes its lines."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import gguf
from cluster import MODEL, SOURCE_DIR, binary

BENCH = os.path.join(SOURCE_DIR, "bench")
sys.path.insert(0, BENCH)
import gpu_random_model  # noqa: E402


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
  d = tmp_path_factory.mktemp("shape")
  header, out = d / "shape.header.xz", d / "random.gguf"
  gpu_random_model.main(["header", "--gguf", MODEL, "--out", str(header)])
  gpu_random_model.main(["model", "--header", str(header), "--out", str(out)])
  return out


def test_the_random_model_has_the_real_files_layout(random_model):
  real, made = gguf.GGUFReader(MODEL), gguf.GGUFReader(str(random_model))
  assert os.path.getsize(random_model) == os.path.getsize(MODEL)
  assert [(t.name, list(t.shape), t.tensor_type, t.data_offset) for t in made.tensors] == \
      [(t.name, list(t.shape), t.tensor_type, t.data_offset) for t in real.tensors]
  assert sorted(made.fields) == sorted(real.fields)
  assert len(made.fields["tokenizer.ggml.tokens"].data) == \
      len(real.fields["tokenizer.ggml.tokens"].data)
  for t in made.tensors:
    w = gguf.dequantize(t.data, t.tensor_type)
    assert np.isfinite(w).all(), t.name
    if t.name.endswith("_norm.weight"):
      assert (w == 1).all(), t.name
    else:
      assert 0 < np.abs(w).max() < 0.05 and abs(w.mean()) < 2e-3, t.name


def test_a_header_that_is_not_gguf_is_refused(tmp_path):
  bad = tmp_path / "bad.gguf"
  bad.write_bytes(b"GGML" + bytes(64))
  with pytest.raises(ValueError, match="not a GGUF file"):
    gpu_random_model.main(["header", "--gguf", str(bad), "--out", str(tmp_path / "h.xz")])


def test_the_service_bench_measures_every_run_on_the_cpu(random_model, tmp_path):
  out = tmp_path / "bench.jsonl"
  r = subprocess.run(
      [sys.executable, os.path.join(BENCH, "gpu_serve_bench.py"),
       f"--bin={os.path.dirname(binary('tripod'))}", f"--model={random_model}", "--backend=cpu",
       "--ttft_tokens=96", "--ttft_requests=2", "--streams=2,3", "--prompt_tokens=24",
       "--max_tokens=5", "--copy_gbs=20", "--serve_arg=--threads=1", f"--out={out}"],
      capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  runs = {j["run"]: j for j in lines}
  assert sorted(runs) == ["graphs", "one process", "summary", "two processes"]
  two, one = runs["two processes"], runs["one process"]
  for j in (two, one, runs["graphs"]):
    assert j["part"] == "serve_bench" and "error" not in j
    assert len(j["ttft_s"]) == 2 and 0 < j["ttft_p50_s"] < 60
  # The two-process service moved the prompt's KV (all but the last token, f16) and the one-process
  # service none.
  kv_per_token = runs["summary"]["kv_bytes_per_token"]
  assert two["kv_bytes_per_request"] == 95 * kv_per_token
  assert one["kv_bytes_per_request"] == 0 and one["streams"] == {}
  for n in ("2", "3"):
    s = two["streams"][n]
    assert s["output_tokens"] == int(n) * 5 and s["output_tok_s"] > 0
    assert 0 < s["of_bound"] == pytest.approx(s["output_tok_s"] / s["bound_tok_s"])
  summary = runs["summary"]
  assert summary["ttft_two_over_one"] == pytest.approx(two["ttft_p50_s"] / one["ttft_p50_s"])
  # Greedy and batch-invariant on the CPU: the second two-process service gives the same texts.
  assert summary["graphs_equal_2"] == 2 and summary["graphs_equal_3"] == 3
