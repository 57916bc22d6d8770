"""A prefill process and a decode process on loopback, driven by a client that plays the
scheduler: the greedy tokens through the two processes equal the single-process paths'.

  * POP ratio 0, fp32: the same tokens as `tripod generate --precision fp32` for 8 real-text
    prompts of 5 to 2000 tokens (the exactness switch, docs/algorithms.md);
  * POP 1/3: the same tokens as the in-process POP path (PrefillEngine's snapshot imported into
    a DecodeEngine: `tripod prefill --generate`);
  * a one-token prompt (no KV to move, only the end message), and Generate with a plain prompt
    (the decode worker prefilling itself);
  * after all of it the decode worker holds no blocks, and both workers' /metrics pass promtool.
"""

import shutil
import subprocess

import pytest

import cluster as C

LENGTHS = [5, 17, 64, 200, 511, 777, 1300, 2000]
MAX_TOKENS = 12


def check_metrics(body, who):
  """`promtool check metrics` on an exposition. Its lint flags every name with a colon (a
  convention for recording rules; the text format and Prometheus accept them), and the names are
  vLLM's `tripod:...` on purpose: that one complaint is let through, any other fails."""
  promtool = shutil.which("promtool")
  assert promtool, "promtool (Debian's prometheus package) is missing: run scripts/setup"
  r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True,
                     timeout=60)
  problems = [l for l in (r.stdout + r.stderr).splitlines()
              if l.strip() and not l.endswith("metric names should not contain ':'")]
  assert r.returncode in (0, 3) and not problems, f"promtool on {who}'s /metrics: {problems}"


@pytest.fixture(scope="module")
def exact():
  with C.Cluster() as cl:
    prefill = cl.prefill(precision="fp32", pop_ratio="0", threads=2, chunk=512)
    decode = cl.decode(precision="fp32", threads=2, kv_budget_mb=128)
    yield prefill, decode


@pytest.fixture(scope="module")
def prompts():
  return [C.corpus_prompt(n, offset=37 * i) for i, n in enumerate(LENGTHS)]


def test_pop0_greedy_tokens_equal_single_process(exact, prompts):
  prefill, decode = exact
  for i, prompt in enumerate(prompts):
    want = C.reference_tokens(prompt, MAX_TOKENS)
    got, last, run = C.disaggregated(prefill, decode, prompt, max_tokens=MAX_TOKENS,
                                     request_id=100 + i)
    assert got == want, f"prompt of {len(prompt)} tokens: {got} != {want}"
    assert last.finish in (C.dpb.FINISH_STOP, C.dpb.FINISH_LENGTH)
    assert last.usage.prompt_tokens == len(prompt)
    assert last.usage.completion_tokens == len(got)
    assert run.prefilled_tokens == len(prompt) - 1
    # Every KV byte of tokens 0..n-2 crossed: 2 (K, V) x layers x heads x head_dim x 4 (f32).
    ident = decode.health().model
    assert run.bytes_sent == (2 * ident.n_layers * ident.n_kv_heads * ident.head_dim * 4 *
                              (len(prompt) - 1))
    assert 0 <= run.tail_s <= run.total_s
  C.wait_until(lambda: C.all_blocks_free(decode), 10, "decode blocks freed")


def test_one_token_prompt_and_local_prefill(exact, prompts):
  prefill, decode = exact
  one = prompts[1][:1]
  got, last, run = C.disaggregated(prefill, decode, one, max_tokens=6, request_id=200)
  assert run.prefilled_tokens == 0 and run.bytes_sent == 0
  assert got == C.reference_tokens(one, 6)
  # The decode worker prefills a plain prompt itself (the scheduler's short-prompt path).
  prompt = prompts[3]
  got, last = C.generate(decode, prompt, max_tokens=MAX_TOKENS, request_id=201)
  assert got == C.reference_tokens(prompt, MAX_TOKENS)
  C.wait_until(lambda: C.all_blocks_free(decode), 10, "decode blocks freed")


def test_health_and_metrics(exact):
  prefill, decode = exact
  ph, dh = prefill.health(), decode.health()
  assert ph.role == C.pb.ROLE_PREFILL and dh.role == C.pb.ROLE_DECODE
  assert ph.protocol_version == dh.protocol_version == int(C.PROTOCOL_VERSION)
  # Same model file, same identity: a scheduler may pair them.
  assert ph.model.sha256 == dh.model.sha256 and len(ph.model.sha256) == 64
  assert dh.total_kv_blocks > 0
  for w in (prefill, decode):
    status, body = w.http_get("/health")
    assert status == 200, body
    status, body = w.http_get("/metrics")
    assert status == 200
    assert f'tripod:prompt_tokens_total{{role="{w.role}"}}' in body
    assert "tripod_decode_" not in body and "tripod_prefill_" not in body
    assert "process_resident_memory_bytes" in body
    check_metrics(body, w.role)
    status, _ = w.http_get("/nope")
    assert status == 404


def test_protocol_version_mismatch_is_a_clear_error(exact):
  import grpc
  prefill, decode = exact
  for stub in (prefill.stub, decode.stub):
    with pytest.raises(grpc.RpcError) as e:
      stub.Health(C.pb.HealthRequest(), metadata=(("tripod-protocol-version", "999"),),
                  timeout=10)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "version" in e.value.details()


def test_pop_third_equals_in_process_pop(prompts):
  with C.Cluster() as cl:
    prefill = cl.prefill(precision="fp32", pop_ratio="1/3", threads=2, chunk=512)
    decode = cl.decode(precision="fp32", threads=2, kv_budget_mb=128)
    assert prefill.health().plan_key != 0
    for i in (0, 2, 5, 7):
      prompt = prompts[i]
      want = C.in_process_pop_tokens(prompt, MAX_TOKENS, "1/3")
      got, _, run = C.disaggregated(prefill, decode, prompt, max_tokens=MAX_TOKENS,
                                    request_id=300 + i)
      assert got == want, f"POP 1/3, prompt of {len(prompt)} tokens: {got} != {want}"
    C.wait_until(lambda: C.all_blocks_free(decode), 10, "decode blocks freed")


def test_sigterm_exits_cleanly():
  with C.Cluster() as cl:
    prefill = cl.prefill(threads=1)
    decode = cl.decode(threads=1, kv_budget_mb=64)
    for w in (prefill, decode):
      w.signal(C.signal.SIGTERM)
      assert w.wait(timeout=30) == 0, w.log()
