"""Trimmed KV between real processes: Prefill.Run with a trimming policy sends only the kept
entries (each chunk with its kept positions) to a decode worker that reserved that many slots,
and the decode worker generates from them, for every method:

  * the networked path's greedy tokens equal the single-process path's (`tripod prefill --trim
    ... --generate N`: the same engine trims, a DecodeEngine imports the snapshot in process);
  * the payload sent falls to the budget: budget / (n - 1) of the untrimmed transfer's bytes;
  * PyramidKV sends each layer its own budget into a reservation that names each layer's first
    slot;
  * under POP (a pruned prefill worker) SpecKV and SnapKV score the skipped layers with queries
    from their own stream, as the in-process engine does;
  * a policy that cannot hold is refused before any work (INVALID_ARGUMENT), and the decode worker
    ends with every KV block free.
"""

import json
import subprocess

import grpc
import pytest

import cluster as C

N = 96
BUDGET = 24
WINDOW = 8
MAX_TOKENS = 8
LOOKAHEAD = [13, 17, 19, 23]
KEEP = [0, 1, 2, 10, 20, 30, 40, 50, 60, 70, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92,
        94]


@pytest.fixture(scope="module")
def workers():
  with C.Cluster() as cl:
    prefill = cl.prefill(threads=1, pop_ratio="0", chunk=32)
    decode = cl.decode(threads=1, kv_budget_mb=64)
    yield prefill, decode


@pytest.fixture(scope="module")
def prompt():
  return C.corpus_prompt(N, offset=40)


def trimming(method):
  t = C.ppb.Trimming(method=method, budget=BUDGET, window=WINDOW)
  if method == C.ppb.TRIM_SPECKV:
    t.lookahead.extend(LOOKAHEAD)
  if method == C.ppb.TRIM_DRAFTMAP:
    t.keep.extend(KEEP)
  return t


def pyramid_budgets(budget, window, n_layers, m, beta=20):
  """PyramidKV's per-layer budgets as docs/algorithms.md gives them, written here independently of
  common/kv/pyramid_budgets.cc: a linear fall from 2(C - w) - lo to lo = (C - w) / beta summing
  to n_layers * (C - w), each capped at the m - w positions outside the window."""
  total = budget - window
  lo = total // beta
  hi = 2 * total - lo
  exact = [hi - (hi - lo) * l / (n_layers - 1) for l in range(n_layers)]
  counts = [int(x) for x in exact]
  for l in range(n_layers * total - sum(counts)):
    counts[l] += 1
  cap = m - window
  excess = sum(max(0, c - cap) for c in counts)
  counts = [min(c, cap) for c in counts]
  for l in range(n_layers):
    add = min(cap - counts[l], excess)
    counts[l] += add
    excess -= add
  return [c + window for c in counts]


def networked(prefill, decode, prompt, trim, request_id, slots=None, layer_first=()):
  h = prefill.health()
  if slots is None:
    slots = 0 if trim is None else BUDGET
  res = decode.stub.Reserve(C.dpb.ReserveRequest(prompt_tokens=len(prompt), plan_key=h.plan_key,
                                                 kv_slots=slots,
                                                 layer_first_slot=list(layer_first)),
                            metadata=C.METADATA, timeout=30)
  run = prefill.stub.Run(
      C.ppb.PrefillRequest(request_id=request_id, prompt=prompt, decode_address=decode.address,
                           transfer_id=res.transfer_id, trimming=trim),
      metadata=C.METADATA, timeout=C.CALL_TIMEOUT_S)
  tokens, last = C.generate(decode, prompt, transfer_id=res.transfer_id, max_tokens=MAX_TOKENS,
                            request_id=request_id, ignore_eos=True)
  return tokens, run


def in_process(prompt, name, pop_ratio="0"):
  args = [C.binary("tripod"), "prefill", f"--model={C.MODEL}",
          "--ids=" + ",".join(map(str, prompt)), f"--pop_ratio={pop_ratio}",
          "--compare_full=false",
          f"--generate={MAX_TOKENS}", f"--trim={name}", f"--trim_budget={BUDGET}",
          f"--trim_window={WINDOW}", "--trim_lookahead=" + ",".join(map(str, LOOKAHEAD)),
          "--trim_keep=" + ",".join(map(str, KEEP)), "--chunk=32"]
  out = subprocess.run(args, capture_output=True, text=True, timeout=C.CALL_TIMEOUT_S, check=True)
  return json.loads(out.stdout)


@pytest.mark.parametrize("method,name", [
    (C.ppb.TRIM_STREAMINGLLM, "streamingllm"),
    (C.ppb.TRIM_SPECKV, "speckv"),
    (C.ppb.TRIM_SNAPKV, "snapkv"),
    (C.ppb.TRIM_DRAFTMAP, "draftmap"),
])
def test_trimmed_transfer_generates_the_in_process_tokens(workers, prompt, method, name):
  prefill, decode = workers
  _, full_run = networked(prefill, decode, prompt, None, request_id=1)
  tokens, run = networked(prefill, decode, prompt, trimming(method), request_id=2)
  want = in_process(prompt, name)
  assert want["kv_slots"] == BUDGET
  assert tokens == want["generated_ids"], name
  assert len(tokens) == MAX_TOKENS
  ratio = run.bytes_sent / full_run.bytes_sent
  assert abs(ratio - BUDGET / (N - 1)) < 0.02, (run.bytes_sent, full_run.bytes_sent)
  C.wait_until(lambda: C.all_blocks_free(decode), 30, "all KV blocks free")


def test_pyramidkv_sends_each_layer_its_own_budget(workers, prompt):
  """PyramidKV: lower layers keep more than upper ones at the same total; the reservation names
  each layer's first slot, only kept entries travel (bytes fall to the mean budget exactly), and
  the tokens equal the in-process path's."""
  prefill, decode = workers
  n_layers = prefill.health().model.n_layers
  budgets = pyramid_budgets(BUDGET, WINDOW, n_layers, N - 1)
  assert budgets[0] > budgets[-1] and sum(budgets) == n_layers * BUDGET
  slots = max(budgets)
  _, full_run = networked(prefill, decode, prompt, None, request_id=30)
  trim = C.ppb.Trimming(method=C.ppb.TRIM_PYRAMIDKV, budget=BUDGET, window=WINDOW,
                        layer_budgets=budgets)
  tokens, run = networked(prefill, decode, prompt, trim, request_id=31, slots=slots,
                          layer_first=[slots - b for b in budgets])
  want = in_process(prompt, "pyramidkv")
  assert want["kv_slots"] == slots
  assert want["kv_bytes"] == run.bytes_sent
  assert tokens == want["generated_ids"]
  assert len(tokens) == MAX_TOKENS
  assert abs(run.bytes_sent / full_run.bytes_sent - BUDGET / (N - 1)) < 1e-9
  C.wait_until(lambda: C.all_blocks_free(decode), 30, "all KV blocks free")


def test_pyramidkv_into_a_reservation_without_its_layer_slots_is_refused(workers, prompt):
  """The reservation must name the per-layer first slots: without them the first chunk of an upper
  layer is a gap, the transfer fails and its blocks are freed."""
  prefill, decode = workers
  n_layers = prefill.health().model.n_layers
  budgets = pyramid_budgets(BUDGET, WINDOW, n_layers, N - 1)
  trim = C.ppb.Trimming(method=C.ppb.TRIM_PYRAMIDKV, budget=BUDGET, window=WINDOW,
                        layer_budgets=budgets)
  with pytest.raises(grpc.RpcError) as e:
    networked(prefill, decode, prompt, trim, request_id=32, slots=max(budgets))
  assert "gap" in e.value.details() or "expects slot" in e.value.details(), e.value.details()
  C.wait_until(lambda: C.all_blocks_free(decode), 30, "all KV blocks free")


@pytest.mark.parametrize("trim,code,words", [
    (C.ppb.Trimming(method=C.ppb.TRIM_SPECKV, budget=0), grpc.StatusCode.INVALID_ARGUMENT,
     "budget must be positive"),
    (C.ppb.Trimming(method=C.ppb.TRIM_SNAPKV, budget=8, window=16),
     grpc.StatusCode.INVALID_ARGUMENT, "window must be in"),
    (C.ppb.Trimming(method=C.ppb.TRIM_DRAFTMAP, budget=3, keep=[5, 2, 9]),
     grpc.StatusCode.INVALID_ARGUMENT, "ascend"),
    (C.ppb.Trimming(method=C.ppb.TRIM_PYRAMIDKV, budget=24, window=8, layer_budgets=[40, 8]),
     grpc.StatusCode.INVALID_ARGUMENT, "per-layer budgets for a model of"),
    (C.ppb.Trimming(method=C.ppb.TRIM_PYRAMIDKV, budget=24, window=8, layer_budgets=[90] * 30),
     grpc.StatusCode.INVALID_ARGUMENT, "sum to"),
    (C.ppb.Trimming(method=C.ppb.TRIM_SNAPKV, budget=24, window=8, layer_budgets=[24] * 30),
     grpc.StatusCode.INVALID_ARGUMENT, "PyramidKV's only"),
])
def test_bad_policies_are_refused(workers, prompt, trim, code, words):
  prefill, decode = workers
  with pytest.raises(grpc.RpcError) as e:
    prefill.stub.Run(C.ppb.PrefillRequest(request_id=9, prompt=prompt,
                                          decode_address=decode.address, transfer_id=12345,
                                          trimming=trim),
                     metadata=C.METADATA, timeout=60)
  assert e.value.code() == code, e.value.details()
  assert words in e.value.details()


@pytest.mark.parametrize("method,name", [
    (C.ppb.TRIM_SPECKV, "speckv"),
    (C.ppb.TRIM_SNAPKV, "snapkv"),
])
def test_scored_trimming_under_pop_generates_the_in_process_tokens(workers, prompt, method,
                                                                   name):
  """A pruned prefill worker (POP 1/3: the skipped layers' K/V stacked, their Q projections
  loaded for scoring) trims with its own plan; the tokens equal the in-process POP engine's."""
  _, decode = workers
  with C.Cluster() as cl:
    pruned = cl.prefill(threads=1, pop_ratio="1/3", chunk=32)
    tokens, run = networked(pruned, decode, prompt, trimming(method), request_id=20)
  want = in_process(prompt, name, pop_ratio="1/3")
  assert want["kv_slots"] == BUDGET
  assert tokens == want["generated_ids"], name
  C.wait_until(lambda: C.all_blocks_free(decode), 30, "all KV blocks free")
