"""The draft worker as a real process on loopback, through its gRPC API (grpcio) and HTTP:

  * Health names the role, the model and the self-draft's plan;
  * Score's importance map equals the single-process `tripod draft` for the same request (scores,
    kept positions, lookahead), holds the budget and the window, and a budget of the whole prompt
    keeps every position;
  * bad requests get INVALID_ARGUMENT (negative fields, an id outside the vocabulary, a first
    layer past the draft) or FAILED_PRECONDITION (another protocol version), and the worker
    serves the next request;
  * requests sent together all complete (the engine runs one at a time, the rest wait);
  * /metrics counts the requests by outcome; SIGTERM stops the process with exit status 0.
"""

import concurrent.futures
import json
import signal
import subprocess

import grpc
import pytest

import cluster as C

DEPTH = 6
WINDOW = 16


@pytest.fixture(scope="module")
def draft():
  with C.Cluster() as cl:
    yield cl.draft(threads=1, draft_layers=DEPTH, precision="fp32", chunk=64)


@pytest.fixture(scope="module")
def prompt():
  return C.corpus_prompt(120, offset=5)


def score(draft, prompt, **kw):
  return draft.stub.Score(C.rpb.ScoreRequest(request_id=7, prompt=prompt, **kw),
                          metadata=C.METADATA, timeout=C.CALL_TIMEOUT_S)


def cli_draft(prompt, budget, lookahead):
  out = subprocess.run(
      [C.binary("tripod"), "draft", f"--model={C.MODEL}", "--ids=" + ",".join(map(str, prompt)),
       f"--draft_layers={DEPTH}", f"--window={WINDOW}", f"--budget={budget}",
       f"--lookahead={lookahead}", "--precision=fp32", "--chunk=64", "--pool=32",
       "--neighbourhood=32"],
      capture_output=True, text=True, timeout=C.CALL_TIMEOUT_S, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def test_health_names_the_draft(draft):
  h = draft.health()
  assert h.role == C.pb.ROLE_DRAFT
  assert h.model.n_layers == 30
  assert h.plan == f"F{DEPTH} S{30 - DEPTH} head"
  assert not h.draining
  status, _ = draft.http_get("/health")
  assert status == 200


def test_score_equals_the_single_process_draft(draft, prompt):
  m = score(draft, prompt, budget=48, window=WINDOW, lookahead=5)
  want = cli_draft(prompt, 48, 5)
  assert m.depth == DEPTH and m.first_layer == DEPTH // 2
  assert len(m.token_scores) == len(prompt)
  assert max(abs(a - b) for a, b in zip(m.token_scores, want["token_scores"])) < 1e-6
  assert list(m.keep) == want["keep"]
  assert list(m.lookahead) == want["lookahead"] and len(m.lookahead) == 5
  assert len(m.keep) == 48 and list(m.keep) == sorted(m.keep)
  assert set(range(len(prompt) - WINDOW, len(prompt))) <= set(m.keep)
  assert m.total_s >= m.prefill_s > 0
  whole = score(draft, prompt, budget=len(prompt), window=WINDOW)
  assert list(whole.keep) == list(range(len(prompt)))
  assert list(whole.lookahead) == []


@pytest.mark.parametrize("fields,words", [
    ({"budget": -1}, "budget must not be negative"),
    ({"lookahead": -2}, "lookahead must not be negative"),
    ({"first_layer": DEPTH}, "past the draft"),
    ({"prompt": [1, 2, 10 ** 6]}, "outside the vocabulary"),
    ({"prompt": []}, "empty prompt"),
])
def test_bad_requests_are_refused_and_the_worker_serves_on(draft, prompt, fields, words):
  req = {"prompt": prompt, "window": WINDOW}
  req.update(fields)
  with pytest.raises(grpc.RpcError) as e:
    draft.stub.Score(C.rpb.ScoreRequest(**req), metadata=C.METADATA, timeout=60)
  assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
  assert words in e.value.details()
  assert len(score(draft, prompt[:20], window=8).token_scores) == 20


def test_another_protocol_version_is_refused(draft, prompt):
  with pytest.raises(grpc.RpcError) as e:
    draft.stub.Score(C.rpb.ScoreRequest(prompt=prompt), timeout=60,
                     metadata=(("tripod-protocol-version", "999"),))
  assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_requests_sent_together_all_complete(draft, prompt):
  with concurrent.futures.ThreadPoolExecutor(6) as pool:
    futures = [pool.submit(score, draft, prompt[:40 + 10 * i], budget=20, window=8)
               for i in range(6)]
    maps = [f.result(timeout=C.CALL_TIMEOUT_S) for f in futures]
  for i, m in enumerate(maps):
    assert len(m.token_scores) == 40 + 10 * i and len(m.keep) == 20


def test_metrics_count_outcomes_and_sigterm_stops(draft, prompt):
  status, body = draft.http_get("/metrics")
  assert status == 200
  text = body.decode() if isinstance(body, bytes) else body
  def count(outcome):
    lines = [l for l in text.splitlines() if l.startswith("tripod:draft_requests_total{")
             and f'outcome="{outcome}"' in l and 'role="draft"' in l]
    assert len(lines) == 1, lines
    return float(lines[0].split()[-1])
  assert count("ok") >= 8
  assert count("invalid_argument") >= 5
  assert 'tripod:prompt_tokens_total{role="draft"}' in text
  draft.signal(signal.SIGTERM)
  assert draft.wait(30) == 0
