"""lm-evaluation-harness, a third-party client, against `tripod serve` (issue 41, part 6).

`lm_eval` (the CLI of the `lm-eval` package, its `local-completions` model) runs the two tasks of
eval/lm_eval_tasks (local JSON lines files, read by the `datasets` json builder with the Hugging
Face hub and datasets offline) against `tripod serve --pop 1/3` of the bundled model, exactly as
docs/pop.md ("Measuring POP's cost on your own task") tells a user to:

  * tripod_mc, multiple choice scored by log-likelihood: lm-eval's echo + logprobs requests. Each
    choice's log-likelihood in lm-eval's per-sample log equals (1e-3) the sum computed directly
    from Tripod's echo of the text prompt (the continuation's tokens found by their text offsets,
    not by lm-eval's token counts), every prediction and `acc` the same. The server's default POP
    does not apply to these (docs/scheduler.md, "Echo and prompt log-probabilities").
  * tripod_gen, short answers by greedy generation (generate_until, exact match): once with the
    server's default POP 1/3 and once with `--gen_kwargs '{"tripod": {"pop": "off"}}'`. Each
    generation equals the direct greedy completion of the same prompt (rendered here from the
    task's YAML) with the same stop sequence and `tripod.pop` "1/3" resp. "off", and
    `exact_match` the score computed from those. POP ran for the first run's generations and not
    the second's (the prefill worker's tripod:prefill_flops_saved_total). Whether POP changed
    any answer is printed (`pytest -s`), not asserted: it depends on the model.

lm-eval finds the server's tokenizer by itself (GET /tokenizer_info, then /tokenize and
/detokenize): no Hugging Face tokenizer, `transformers` or `torch` is needed.

lm-eval comes from scripts/requirements-test-nodeps.txt, which scripts/setup installs with
`pip --no-deps`: lm-eval and what this use of it imports (datasets with pyarrow and pandas,
sacrebleu, aiohttp, tenacity, pytablewriter for the CLI's table, ...), each pinned. `lm-eval[api]`
with all its dependencies would also bring scipy and scikit-learn (only for the F1 and MCC
metrics), nltk, rouge-score and evaluate, which these tasks never import, and cost half as much
again in the venv (the sizes and install times: docs/benchmarks.md, "Test settings").
"""

import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

import jinja2
import pytest
import yaml

from cluster import MODEL, SOURCE_DIR, Serve

TASKS_DIR = os.path.join(SOURCE_DIR, "eval", "lm_eval_tasks")
POP = "1/3"
TOL = 1e-3
LM_EVAL_TIMEOUT_S = 300


def post(url, body, timeout=120):
  req = urllib.request.Request(url, data=json.dumps(body).encode(),
                               headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(req, timeout=timeout) as r:
    return json.load(r)


def get(url, timeout=30):
  with urllib.request.urlopen(url, timeout=timeout) as r:
    return r.read().decode()


def flops_saved(metrics_url):
  """The prefill worker's tripod:prefill_flops_saved_total."""
  return sum(float(line.rsplit(" ", 1)[1]) for line in get(metrics_url).splitlines()
             if line.startswith("tripod:prefill_flops_saved_total"))


def task(name):
  with open(os.path.join(TASKS_DIR, name + ".yaml")) as f:
    config = yaml.safe_load(f)
  with open(os.path.join(SOURCE_DIR, config["dataset_kwargs"]["data_files"]["test"])) as f:
    docs = [json.loads(line) for line in f]
  return config, docs


@pytest.fixture(scope="module")
def serve():
  with tempfile.TemporaryDirectory(prefix="lm-eval-serve-") as tmp:
    targets = os.path.join(tmp, "targets.json")
    with Serve("--draft_workers=0", f"--pop={POP}", f"--prometheus_targets={targets}") as s:
      deadline = time.monotonic() + 30
      while not os.path.exists(targets):
        assert time.monotonic() < deadline, "tripod serve wrote no Prometheus targets"
        time.sleep(0.1)
      with open(targets) as f:
        by_name = {t["labels"]["process"]: t["targets"][0] for t in json.load(f)}
      s.prefill_metrics = f"http://{by_name['prefill-0']}/metrics"
      s.base = s.url[:-len("/v1")]
      s.name = json.loads(get(s.url + "/models"))["data"][0]["id"]
      yield s


def run_lm_eval(serve, tasks, gen_kwargs=None):
  """The CLI in a subprocess, as docs/pop.md has it; returns {task: [sample, ...]} by doc_id and
  {task: results}."""
  with tempfile.TemporaryDirectory(prefix="lm-eval-") as out:
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", "local-completions",
           "--model_args",
           f"base_url={serve.url}/completions,model={serve.name},num_concurrent=1,max_retries=1",
           "--include_path", "eval/lm_eval_tasks", "--tasks", *tasks,
           "--output_path", out, "--log_samples"]
    if gen_kwargs is not None:
      cmd += ["--gen_kwargs", json.dumps(gen_kwargs)]
    # Nothing from the hub: the tasks' data are files here, the tokenizer is the server's. A
    # fresh cache, so the json builder really runs offline.
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_HOME=os.path.join(out, "hf"), TOKENIZERS_PARALLELISM="false")
    p = subprocess.run(cmd, cwd=SOURCE_DIR, env=env, capture_output=True, text=True,
                       timeout=LM_EVAL_TIMEOUT_S)
    log = p.stdout + p.stderr
    assert p.returncode == 0, log[-6000:]
    assert "Using remote tokenizer" in log, log[-6000:]  # found through /tokenizer_info
    results = {}
    for path in glob.glob(os.path.join(out, "**", "results_*.json"), recursive=True):
      with open(path) as f:
        results.update(json.load(f)["results"])
    samples = {}
    for t in tasks:
      (path,) = glob.glob(os.path.join(out, "**", f"samples_{t}_*.jsonl"), recursive=True)
      with open(path) as f:
        samples[t] = sorted((json.loads(line) for line in f), key=lambda s: s["doc_id"])
    return samples, results


@pytest.fixture(scope="module")
def default_run(serve):
  """Both tasks against the server's default (POP 1/3); the prefill worker's saved FLOPs
  across it."""
  before = flops_saved(serve.prefill_metrics)
  samples, results = run_lm_eval(serve, ["tripod_mc", "tripod_gen"])
  return samples, results, flops_saved(serve.prefill_metrics) - before


def test_tokenizer_info_is_what_tokenize_knows(serve):
  info = json.loads(get(serve.base + "/tokenizer_info"))
  eos = post(serve.base + "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
  assert eos["tokens"] and len(eos["tokens"]) == 1, (info, eos)
  assert info["pad_token"] is None and info["vocab_size"] > eos["tokens"][0]
  assert info["model_max_length"] == eos["max_model_len"]


def echo_loglikelihood(serve, context, continuation):
  """From Tripod's echo of the text context + continuation: the sum of the continuation's token
  log-probabilities, whether each of its tokens was the likeliest, and the route taken."""
  r = post(serve.url + "/completions",
           {"model": serve.name, "prompt": context + continuation, "echo": True, "logprobs": 1,
            "max_tokens": 0, "temperature": 0})
  lp = r["choices"][0]["logprobs"]
  n = len(context)
  cont = [i for i, off in enumerate(lp["text_offset"]) if off >= n]
  # The continuation starts on a token boundary (it starts with a space, a word of its own).
  assert cont and "".join(lp["tokens"][cont[0]:]) == continuation, (lp["tokens"], continuation)
  greedy = all(lp["token_logprobs"][i] >= max(lp["top_logprobs"][i].values()) for i in cont)
  return sum(lp["token_logprobs"][i] for i in cont), greedy, r["tripod"]["route"]


def test_loglikelihood_task_equals_tripods_echo(serve, default_run):
  samples, results, _ = default_run
  config, docs = task("tripod_mc")
  assert len(samples["tripod_mc"]) == len(docs) == 10
  render = jinja2.Template(config["doc_to_text"])
  correct = 0
  for s, doc in zip(samples["tripod_mc"], docs):
    context = render.render(**doc)
    lls = []
    for choice, resp in zip(doc["choices"], s["resps"]):
      ll, is_greedy, route = echo_loglikelihood(serve, context, " " + choice)
      # Prompt log-probabilities need the full model: never POP, whatever the server's default.
      assert route == "decode_only", route
      # The per-sample log keeps lm-eval's (log-likelihood, is_greedy) as strings.
      got, got_greedy = float(resp[0][0]), resp[0][1]
      assert abs(got - ll) <= TOL, (s["doc_id"], choice, got, ll)
      assert got_greedy == str(is_greedy), (s["doc_id"], choice, got_greedy)
      lls.append(ll)
    assert len(lls) == len(doc["choices"])
    pred = max(range(len(lls)), key=lambda i: lls[i])
    ours = int(pred == doc["answer"])
    assert s["acc"] == ours, (s["doc_id"], lls, s["resps"])
    assert s["arguments"]["gen_args_0"]["arg_0"] == context, s["arguments"]
    correct += ours
  acc = results["tripod_mc"]["acc,none"]
  assert acc == pytest.approx(correct / len(docs)), (acc, correct)
  print(f"\ntripod_mc acc {acc:.2f} ({correct}/{len(docs)}), as computed directly")


def greedy(serve, prompt, config, pop):
  kw = config["generation_kwargs"]
  r = post(serve.url + "/completions",
           {"model": serve.name, "prompt": prompt, "max_tokens": kw["max_gen_toks"],
            "temperature": 0, "stop": kw["until"], "tripod": {"pop": pop}})
  return r["choices"][0]["text"], r["tripod"]["route"]


def check_generation(serve, samples, results, pop):
  """lm-eval's generations and exact_match against direct greedy completions with tripod.pop;
  returns the direct texts."""
  config, docs = task("tripod_gen")
  assert len(samples) == len(docs) == 6
  render = jinja2.Template(config["doc_to_text"])
  texts, correct = [], 0
  for s, doc in zip(samples, docs):
    prompt = render.render(**doc)
    assert s["arguments"]["gen_args_0"]["arg_0"] == prompt, s["arguments"]
    text, route = greedy(serve, prompt, config, pop)
    # Over 32 tokens: the disaggregated route, where POP runs (with "off", the pruned prefill
    # worker cannot run the full model and the decode worker prefills it).
    assert route == ("disaggregated" if pop != "off" else "decode_only"), route
    assert s["resps"][0][0] == text, (s["doc_id"], pop, s["resps"], text)
    ours = int(text.strip().lower() == doc["answer"].lower())
    assert s["exact_match"] == ours, (s["doc_id"], s["filtered_resps"], doc["answer"])
    texts.append(text)
    correct += ours
  score = results["tripod_gen"]["exact_match,answer"]
  assert score == pytest.approx(correct / len(docs)), (score, correct)
  return texts, score


def test_generation_task_with_and_without_pop(serve, default_run):
  samples, results, saved = default_run
  # The server's default POP ran for lm-eval's generations.
  assert saved > 0
  pop_texts, pop_score = check_generation(serve, samples["tripod_gen"], results, POP)

  before = flops_saved(serve.prefill_metrics)
  off_samples, off_results = run_lm_eval(serve, ["tripod_gen"],
                                         gen_kwargs={"tripod": {"pop": "off"}})
  assert flops_saved(serve.prefill_metrics) == before
  full_texts, full_score = check_generation(serve, off_samples["tripod_gen"], off_results, "off")

  changed = [i for i, (a, b) in enumerate(zip(pop_texts, full_texts)) if a != b]
  print(f"\ntripod_gen exact_match: full model {full_score:.2f}, POP {POP} {pop_score:.2f}; "
        f"answers POP changed: {changed}")
  for i in changed:
    print(f"  doc {i}: full {full_texts[i]!r}, POP {pop_texts[i]!r}")
