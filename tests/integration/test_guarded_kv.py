"""The workers' GPU KV paths, checked on machines without a GPU: tripod-prefill and tripod-decode
with `--backend cpu-guarded-kv` keep their KV where host code faults on any touch (a GPU's memory,
stood in for by a mapping without access rights; common/compute/guarded_kv_backend.h). Every KV
byte that leaves or lands must then go through the stores' copies, as it must on a GPU: the
prefill worker's chunks out, the decode worker's chunks into a reservation, the prefix cache's
block copy, trimmed KV with a first slot per layer. A byte touched directly kills the worker.

  * greedy tokens (POP 0, fp32) equal `tripod generate`'s, guarded on both sides and on either
    side against a plain CPU worker (the chunks are the same bytes);
  * a prompt of whole blocks asked twice: the second takes every block but the last from the
    prefix cache and copies that one on the "device", with the same tokens;
  * PyramidKV's trimmed KV into a guarded reservation: the in-process path's tokens;
  * the scheduler over guarded workers, through the `openai` client, streamed: the reference text;
  * every block free at the end, and no worker died.
"""

import json
import os
import subprocess

import openai
import pytest

import cluster as C
from test_trimming import pyramid_budgets

GUARDED = "cpu-guarded-kv"
MAX_TOKENS = 10


@pytest.fixture(scope="module")
def workers():
  with C.Cluster() as cl:
    # Prompt chunks of 40: the KV leaves in ranges that end inside blocks, so the decode side's
    # staged writes keep the rows already there.
    common = dict(threads=1, precision="fp32")
    gp = cl.prefill(name="prefill-guarded", backend=GUARDED, pop_ratio="0", chunk=40, **common)
    gd = cl.decode(name="decode-guarded", backend=GUARDED, kv_budget_mb=64, **common)
    hp = cl.prefill(name="prefill-cpu", pop_ratio="0", chunk=40, **common)
    hd = cl.decode(name="decode-cpu", kv_budget_mb=64, **common)
    yield cl, gp, gd, hp, hd
    for w in (gp, gd, hp, hd):
      assert w.proc.poll() is None, f"{w.name} died: see {w.log_path}"


def test_workers_say_their_backend(workers):
  _, gp, gd, hp, _ = workers
  with open(gp.log_path) as f:
    assert "(guarded KV)" in f.read()
  with open(gd.log_path) as f:
    assert "(guarded KV)" in f.read()
  with open(hp.log_path) as f:
    assert "(guarded KV)" not in f.read()


@pytest.mark.parametrize("pair", ["guarded>guarded", "guarded>cpu", "cpu>guarded"])
def test_transfers_give_the_reference_tokens(workers, pair):
  _, gp, gd, hp, hd = workers
  src, dst = pair.split(">")
  prefill = gp if src == "guarded" else hp
  decode = gd if dst == "guarded" else hd
  prompt = C.corpus_prompt(150, offset=11)
  want = C.reference_tokens(prompt, MAX_TOKENS, precision="fp32")
  tokens, last, run = C.disaggregated(prefill, decode, prompt, max_tokens=MAX_TOKENS,
                                      request_id=hash(pair) & 0xffff)
  assert run.bytes_sent > 0
  assert tokens == want
  C.wait_until(lambda: C.all_blocks_free(decode), 30, "all KV blocks free")


def test_a_cached_prompt_of_whole_blocks_is_copied_on_the_device(workers):
  _, _, gd, _, _ = workers
  prompt = C.corpus_prompt(64, offset=500)  # four 16-slot blocks
  want = C.reference_tokens(prompt, MAX_TOKENS, precision="fp32")
  first, last1 = C.generate(gd, prompt, max_tokens=MAX_TOKENS, request_id=40)
  second, last2 = C.generate(gd, prompt, max_tokens=MAX_TOKENS, request_id=41)
  assert first == want and second == want
  assert last1.usage.cached_tokens == 0
  assert last2.usage.cached_tokens == 63  # all but the last token; its block a copy
  C.wait_until(lambda: C.all_blocks_free(gd), 30, "all KV blocks free")


def test_pyramidkv_lands_in_a_guarded_reservation(workers):
  """Each layer's chunks start at its own first slot, mid-block: the staged writes must keep the
  rest of those blocks, and the tokens equal the in-process path's (plain CPU memory)."""
  _, gp, gd, _, _ = workers
  n, budget, window = 96, 24, 8
  prompt = C.corpus_prompt(n, offset=40)
  n_layers = gp.health().model.n_layers
  budgets = pyramid_budgets(budget, window, n_layers, n - 1)  # what the in-process path takes
  slots = max(budgets)
  h = gp.health()
  res = gd.stub.Reserve(C.dpb.ReserveRequest(prompt_tokens=n, plan_key=h.plan_key, kv_slots=slots,
                                             layer_first_slot=[slots - b for b in budgets]),
                        metadata=C.METADATA, timeout=30)
  trim = C.ppb.Trimming(method=C.ppb.TRIM_PYRAMIDKV, budget=budget, window=window,
                        layer_budgets=budgets)
  run = gp.stub.Run(C.ppb.PrefillRequest(request_id=50, prompt=prompt, decode_address=gd.address,
                                         transfer_id=res.transfer_id, trimming=trim),
                    metadata=C.METADATA, timeout=C.CALL_TIMEOUT_S)
  tokens, _ = C.generate(gd, prompt, transfer_id=res.transfer_id, max_tokens=MAX_TOKENS,
                         request_id=50, ignore_eos=True)
  out = subprocess.run(
      [C.binary("tripod"), "prefill", f"--model={C.MODEL}", "--ids=" + ",".join(map(str, prompt)),
       "--pop_ratio=0", "--precision=fp32", "--compare_full=false", f"--generate={MAX_TOKENS}",
       "--trim=pyramidkv", f"--trim_budget={budget}", f"--trim_window={window}", "--chunk=40"],
      capture_output=True, text=True, timeout=C.CALL_TIMEOUT_S, check=True)
  want = json.loads(out.stdout)
  assert want["kv_bytes"] == run.bytes_sent
  assert tokens == want["generated_ids"] and len(tokens) == MAX_TOKENS
  C.wait_until(lambda: C.all_blocks_free(gd), 30, "all KV blocks free")


def test_the_scheduler_streams_the_reference_text_from_guarded_workers(workers):
  cl, gp, gd, _, _ = workers
  sched = cl.scheduler(prefill=[gp], decode=[gd], direct_prefill_tokens=8, name="sched-guarded")
  client = openai.OpenAI(base_url=sched.url + "/v1", api_key="unused", max_retries=0, timeout=300)
  prompt = C.corpus_prompt(200, offset=900)
  want = C.reference_tokens(prompt, MAX_TOKENS, precision="fp32")
  status, body, _ = sched.http("POST", "/detokenize", {"tokens": want})
  assert status == 200, body
  text = ""
  model = os.path.basename(C.MODEL)[:-len(".gguf")]
  for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                         temperature=0, stream=True,
                                         extra_body={"tripod": {"pop": "off"}}):
    text += chunk.choices[0].text if chunk.choices else ""
  assert text == json.loads(body)["prompt"]
  C.wait_until(lambda: C.all_blocks_free(gd), 30, "all KV blocks free")
