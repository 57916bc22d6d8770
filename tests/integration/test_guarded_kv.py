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
  * KV links (Decode.OpenKvLink; the payloads device to device, beside their PushKv headers): set
    up in the background after a first transfer asks, the TCP link, NCCL's protocol without a GPU,
    gives the reference tokens with every payload on the link; a decode worker that offers no link (its KV on the CPU, or no TCP links) gets the
    payloads in the PushKv messages, counted as fallbacks; several transfers share one link in
    order; a link that stalls fails its transfer and is given up for PushKv payloads; the IPC
    link (two processes on one device: a shared buffer) gives the reference tokens too;
  * every block free at the end, and no worker died.
"""

import json
import os
import re
import signal
import subprocess
import threading

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
    for w in cl.workers:
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


def metric(worker, name, labels=""):
  """A sample's value from the worker's /metrics: the first of `name` whose labels hold `labels`."""
  _, body = worker.http_get("/metrics")
  for line in body.splitlines():
    if (line.startswith(name + "{") or line.startswith(name + " ")) and labels in line:
      return float(line.rsplit(" ", 1)[1])
  return 0.0


@pytest.fixture(scope="module")
def linked(workers):
  """A guarded prefill worker that sends payloads on TCP links, and a guarded decode worker that
  takes them."""
  cl = workers[0]
  common = dict(threads=1, precision="fp32")
  lp = cl.prefill(name="prefill-link", backend=GUARDED, pop_ratio="0", chunk=40, kv_link="tcp",
                  **common)
  ld = cl.decode(name="decode-link", backend=GUARDED, kv_budget_mb=64, kv_links="tcp", **common)
  return lp, ld


def link_opened(prefill):
  """Whether the prefill worker has set a KV link up (in the background, after a first transfer
  asked for one)."""
  with open(prefill.log_path) as f:
    return re.search(r"KV link \d+ \(\w+\) to \S+ open", f.read()) is not None


def warm_up(prefill, decode, request_id):
  """A first transfer, whose payloads go in the PushKv messages while the link is set up; then
  the wait for the link."""
  prompt = C.corpus_prompt(30, offset=5000)
  tokens, _, _ = C.disaggregated(prefill, decode, prompt, max_tokens=2, request_id=request_id)
  assert len(tokens) == 2
  C.wait_until(lambda: link_opened(prefill), 30, "the KV link set up")


def test_payloads_take_the_tcp_link_and_give_the_reference_tokens(linked):
  lp, ld = linked
  # The first transfer to a decode worker sets a link up without waiting for it.
  warm_up(lp, ld, request_id=59)
  assert metric(lp, "tripod:kv_link_fallbacks_total") == 1
  prompt = C.corpus_prompt(300, offset=1500)
  want = C.reference_tokens(prompt, MAX_TOKENS, precision="fp32")
  tokens, _, run = C.disaggregated(lp, ld, prompt, max_tokens=MAX_TOKENS, request_id=60)
  assert tokens == want
  assert metric(lp, "tripod:kv_link_transfers_total", 'kind="tcp"') == 1
  assert metric(lp, "tripod:kv_link_fallbacks_total") == 1
  # Every payload byte came, and was counted, though no PushKv message carried one.
  assert run.bytes_sent == 299 * 30 * 2 * 3 * 64 * 4  # slots x layers x K,V x heads x dim x f32
  with open(ld.log_path) as f:
    assert "KV link" in f.read()
  C.wait_until(lambda: C.all_blocks_free(ld), 30, "all KV blocks free")


def test_transfers_in_a_row_and_at_once_share_the_link_in_order(linked):
  lp, ld = linked
  prompts = [C.corpus_prompt(n, offset=2000 + 7 * n) for n in (90, 200, 41)]
  wants = [C.reference_tokens(p, MAX_TOKENS, precision="fp32") for p in prompts]
  got = [None] * len(prompts)
  errors = []

  def one(i):
    try:
      got[i] = C.disaggregated(lp, ld, prompts[i], max_tokens=MAX_TOKENS, request_id=70 + i)[0]
    except Exception as e:  # noqa: BLE001 (reported below)
      errors.append(e)

  threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=C.CALL_TIMEOUT_S)
  assert not errors and got == wants
  assert metric(lp, "tripod:kv_link_transfers_total", 'kind="tcp"') == 4
  C.wait_until(lambda: C.all_blocks_free(ld), 30, "all KV blocks free")


def test_a_decode_worker_without_links_gets_the_payloads_in_pushkv(workers, linked):
  """The CPU decode worker (KV in host memory) and the guarded one that takes no TCP links both
  refuse the link; the transfer goes as always, counted as a fallback, and the refusal is
  remembered (one fallback per transfer, one OpenKvLink per worker)."""
  _, _, gd, _, hd = workers
  lp, _ = linked
  prompt = C.corpus_prompt(120, offset=3000)
  want = C.reference_tokens(prompt, MAX_TOKENS, precision="fp32")
  base = metric(lp, "tripod:kv_link_fallbacks_total")
  for i, decode in enumerate((hd, gd, hd)):
    tokens, _, run = C.disaggregated(lp, decode, prompt, max_tokens=MAX_TOKENS,
                                     request_id=80 + i)
    assert tokens == want and run.bytes_sent > 0
    assert metric(lp, "tripod:kv_link_fallbacks_total") == base + i + 1

  def log():
    with open(lp.log_path) as f:
      return f.read()

  C.wait_until(lambda: log().count("no KV link to") == 2, 30, "both refusals logged")
  assert "keeps its KV in host memory" in log() and "takes no TCP links" in log()


def test_payloads_take_an_ipc_link_through_a_shared_buffer(workers):
  """Two processes on one "device" (the guarded memory's machine): the prefill worker asks for an
  IPC link, and the decode worker with the default --kv_links (nccl,ipc) grants it: a buffer of
  its memory the prefill worker maps by name (a GPU's IPC handle, on a GPU), the payloads device
  to device through it, their lengths and acknowledgements on a TCP connection."""
  cl, _, gd, _, _ = workers
  lp = cl.prefill(name="prefill-ipc", backend=GUARDED, pop_ratio="0", chunk=40, kv_link="ipc",
                  threads=1, precision="fp32")
  warm_up(lp, gd, request_id=90)
  with open(lp.log_path) as f:
    assert re.search(r"KV link \d+ \(ipc\) to \S+ open", f.read())
  prompt = C.corpus_prompt(300, offset=1700)
  want = C.reference_tokens(prompt, MAX_TOKENS, precision="fp32")
  tokens, _, run = C.disaggregated(lp, gd, prompt, max_tokens=MAX_TOKENS, request_id=91)
  assert tokens == want
  assert metric(lp, "tripod:kv_link_transfers_total", 'kind="ipc"') == 1
  assert metric(lp, "tripod:kv_link_fallbacks_total") == 1  # the warm-up's
  assert run.bytes_sent == 299 * 30 * 2 * 3 * 64 * 4
  C.wait_until(lambda: C.all_blocks_free(gd), 30, "all KV blocks free")


def test_prefill_refuses_link_modes_it_cannot_hold(tmp_path):
  for args, words in [(["--kv_link=tcp"], "--kv_link=tcp needs a KV out of the host"),
                      (["--kv_link=ipc"], "--kv_link=ipc needs a KV memory other processes"),
                      (["--kv_link=nccl", f"--backend={GUARDED}"], "--kv_link=nccl needs"),
                      (["--kv_link=fast"], "unknown KV link mode 'fast'")]:
    r = subprocess.run([C.binary("prefill"), f"--model={C.MODEL}", "--listen=127.0.0.1:0",
                        "--http_listen=127.0.0.1:0", *args],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and words in r.stderr, (args, r.stderr[-2000:])


def test_a_link_that_stalls_fails_its_transfer_and_the_next_goes_in_pushkv(workers):
  """A decode worker paused (SIGSTOP) mid-transfer stops reading the link: the prefill worker's
  send times out (--kv_link_timeout_ms), the link is aborted and forgotten, the transfer fails
  (ABORTED: the decode worker is unreachable) naming the link, and once the decode worker runs again the next transfer takes the
  PushKv messages (a fallback), with the reference tokens; the failed transfer's blocks are
  freed."""
  cl = workers[0]
  common = dict(threads=1, precision="fp32")
  p = cl.prefill(name="prefill-stall", backend=GUARDED, pop_ratio="0", kv_link="tcp",
                 kv_link_timeout_ms=1000, send_stall_ms=30000, **common)
  d = cl.decode(name="decode-stall", backend=GUARDED, kv_budget_mb=96, kv_links="tcp", **common)
  small = C.corpus_prompt(60, offset=4000)
  want = C.reference_tokens(small, MAX_TOKENS, precision="fp32")
  warm_up(p, d, request_id=89)
  assert C.disaggregated(p, d, small, max_tokens=MAX_TOKENS, request_id=90)[0] == want
  assert metric(p, "tripod:kv_link_transfers_total", 'kind="tcp"') == 1
  big = C.corpus_prompt(1000, offset=4100)  # 46 MB of f32 KV: more than the sockets buffer
  res = d.stub.Reserve(C.dpb.ReserveRequest(prompt_tokens=len(big), plan_key=p.health().plan_key),
                       metadata=C.METADATA, timeout=30)
  os.kill(d.proc.pid, signal.SIGSTOP)
  try:
    with pytest.raises(C.grpc.RpcError) as err:
      p.stub.Run(C.ppb.PrefillRequest(request_id=91, prompt=big, decode_address=d.address,
                                      transfer_id=res.transfer_id),
                 metadata=C.METADATA, timeout=120)
  finally:
    os.kill(d.proc.pid, signal.SIGCONT)
  # The prefill service's answer for a decode side it cannot reach (the scheduler retries it).
  assert err.value.code() == C.grpc.StatusCode.ABORTED, err.value
  assert "KV link" in err.value.details() and "timed out" in err.value.details()
  tokens, _, run = C.disaggregated(p, d, small, max_tokens=MAX_TOKENS, request_id=92)
  assert tokens == want and run.bytes_sent > 0
  assert metric(p, "tripod:kv_link_fallbacks_total") == 2  # the warm-up's, and this one
  assert metric(p, "tripod:kv_link_transfers_total", 'kind="tcp"') == 2  # the failed one too
  C.wait_until(lambda: C.all_blocks_free(d), 60, "the failed transfer's blocks freed")
