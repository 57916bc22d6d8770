#!/usr/bin/env bash
# Side-by-side speed of Tripod's forward pass (bench/forward) and two llama.cpp peers on the same
# model and thread count, measured in one run: llama.cpp's llama-bench (LLAMA_BENCH) and
# ik_llama.cpp's (IK_LLAMA_BENCH, run with -rtr 1: its weights repacked at load for its own
# kernels, that fork's fast CPU path). Either peer may be left out, not both. Prints one JSON line
# per metric, with each peer's figure and Tripod's ratio against the better of them. Builds nothing.
#   [LLAMA_BENCH=/path/to/llama-bench] [IK_LLAMA_BENCH=/path/to/ik/llama-bench] [THREADS=2] \
#     [REPS=3] [MODEL=models/...gguf] [TRIPOD_BENCH=build/release/bench/forward] \
#     [PRECISION=auto] [KV=auto] bench/compare_llamacpp.sh [MODEL=path]
# The settings may also be given as NAME=VALUE arguments (bench/compare_llamacpp.sh MODEL=x.gguf).
# MODEL: a GGUF file's path.
# KV: the KV cache type of every side (auto: Tripod's default and the peers' f16; q8_0: all
# q8_0, the peers with -ctk/-ctv q8_0 and flash attention, which their quantised V cache needs).
# Metrics: pp128, pp512, pp2048 (prefill tokens/s), tg128 (decode tokens/s at short context) and
# tg128_d2048 (decode after a 2048-token context: llama-bench -d 2048 where it has -d/--n-depth,
# ik_llama.cpp's -gp 2048,128; skipped for a peer whose llama-bench has neither).
# Every side is a mean over REPS runs (llama-bench's avg_ts; bench/forward's *_mean fields).
# Tripod's tg128 decodes after its 128-token prompt (context 128..256), llama-bench's from empty.
# Each line: tripod, llamacpp, ik_llamacpp (null where that peer was not run or gave no figure),
# best (the better peer's name), ratio (tripod / the better peer's figure), and ratio_llamacpp,
# ratio_ik_llamacpp against each.
set -euo pipefail
cd "$(dirname "$0")/.."

for arg in "$@"; do
  case "$arg" in
    LLAMA_BENCH=* | IK_LLAMA_BENCH=* | THREADS=* | REPS=* | MODEL=* | TRIPOD_BENCH=* | \
      PRECISION=* | KV=*)
      export "${arg?}"
      ;;
    *)
      echo "compare_llamacpp: unknown argument '$arg' (want NAME=VALUE; see the script's head)" >&2
      exit 2
      ;;
  esac
done

if [[ -z "${LLAMA_BENCH:-}" && -z "${IK_LLAMA_BENCH:-}" ]]; then
  echo "compare_llamacpp: set LLAMA_BENCH=/path/to/llama-bench and/or" \
    "IK_LLAMA_BENCH=/path/to/ik_llama.cpp/llama-bench (this script builds nothing)" >&2
  exit 2
fi
for peer in LLAMA_BENCH IK_LLAMA_BENCH; do
  if [[ -n "${!peer:-}" && ! -x "${!peer}" ]]; then
    echo "compare_llamacpp: $peer=${!peer} is not an executable file" >&2
    exit 2
  fi
done
threads=${THREADS:-2}
reps=${REPS:-3}
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
tripod_bench=${TRIPOD_BENCH:-build/release/bench/forward}
precision=${PRECISION:-auto}
kv=${KV:-auto}
llama_kv=()
case "$kv" in
  auto | f16) ;;
  q8_0) llama_kv=(-ctk q8_0 -ctv q8_0 -fa 1) ;;
  *)
    echo "compare_llamacpp: KV must be auto, f16 or q8_0 (got '$kv')" >&2
    exit 2
    ;;
esac
for v in "$threads" "$reps"; do
  if ! [[ "$v" =~ ^[1-9][0-9]*$ ]]; then
    echo "compare_llamacpp: THREADS and REPS must be positive integers (got '$v')" >&2
    exit 2
  fi
done
if [[ ! -x "$tripod_bench" ]]; then
  echo "compare_llamacpp: Tripod bench $tripod_bench not found; build target bench_forward" \
    "or set TRIPOD_BENCH" >&2
  exit 2
fi
if [[ ! -f "$model" ]]; then
  echo "compare_llamacpp: model $model not found (run scripts/setup or set MODEL)" >&2
  exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Runs a command with stdout to $1 and stderr to $1.log; shows the log if the command fails.
run_to() {
  local out=$1
  shift
  if ! "$@" >"$out" 2>"$out.log"; then
    echo "compare_llamacpp: failed: $*" >&2
    tail -n 20 "$out.log" >&2
    exit 1
  fi
}

# run_peer NAME BINARY [extra flags]: NAME_pp.json (pp128/512/2048, tg128) and NAME_depth.json
# (tg128 after a 2048-token context, or [] where this llama-bench cannot run it).
run_peer() {
  local name=$1 bin=$2
  shift 2
  run_to "$tmp/${name}_pp.json" "$bin" -m "$model" -t "$threads" -r "$reps" -o json \
    -p 128,512,2048 -n 128 "${llama_kv[@]}" "$@"
  local help
  help=$("$bin" --help 2>&1 || true)
  if grep -q -- '--n-depth' <<<"$help"; then
    run_to "$tmp/${name}_depth.json" "$bin" -m "$model" -t "$threads" -r "$reps" -o json \
      -p 0 -n 128 -d 2048 "${llama_kv[@]}" "$@"
  elif grep -q -- '-gp <pp,tg>' <<<"$help"; then # ik_llama.cpp: tg128 after a 2048-token prompt
    run_to "$tmp/${name}_depth.json" "$bin" -m "$model" -t "$threads" -r "$reps" -o json \
      -p 0 -n 0 -gp 2048,128 "${llama_kv[@]}" "$@"
  else
    echo "[]" >"$tmp/${name}_depth.json"
  fi
}

echo "compare_llamacpp: threads=$threads precision=$precision kv=$kv model=$model load:$(cut -d' ' -f1-3 /proc/loadavg)" >&2
peers=()
if [[ -n "${LLAMA_BENCH:-}" ]]; then
  run_peer llamacpp "$LLAMA_BENCH"
  peers+=(llamacpp)
fi
if [[ -n "${IK_LLAMA_BENCH:-}" ]]; then
  run_peer ik_llamacpp "$IK_LLAMA_BENCH" -rtr 1
  peers+=(ik_llamacpp)
fi
run_to "$tmp/tripod.jsonl" "$tripod_bench" --model "$model" --threads "$threads" \
  --lengths 128,512,2048 --decode_tokens 128 --reps "$reps" --precision "$precision" \
  --kv_cache_dtype "$kv"

python3 - "$tmp" "$threads" "$model" "${peers[@]}" <<'EOF'
import json
import os
import re
import sys

tmp, threads, model, peers = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
all_peers = ("llamacpp", "ik_llamacpp")


def load_peer(name):
    """llama-bench -o json: one array of test objects, each with n_prompt, n_gen, avg_ts and
    (llama.cpp) n_depth. ik_llama.cpp's -gp test has n_prompt and n_gen both set, and its label
    in "test" (tg128@pp2048): keyed here as the depth test (0, n_gen, n_prompt)."""
    out = {}
    for part in ("pp", "depth"):
        with open(f"{tmp}/{name}_{part}.json") as f:
            for t in json.load(f):
                key = (t["n_prompt"], t["n_gen"], t.get("n_depth", 0))
                if re.fullmatch(r"tg\d+@pp\d+", str(t.get("test", ""))):
                    key = (0, t["n_gen"], t["n_prompt"])
                out[key] = t["avg_ts"]
    return out


figures = {name: load_peer(name) for name in peers}

# bench/forward: one JSON object per line, per prompt length.
tripod = {}
with open(f"{tmp}/tripod.jsonl") as f:
    for line in f:
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            tripod[r["prompt_tokens"]] = r

metrics = [
    ("pp128", (128, 0, 0), 128, "prefill_tok_s_mean"),
    ("pp512", (512, 0, 0), 512, "prefill_tok_s_mean"),
    ("pp2048", (2048, 0, 0), 2048, "prefill_tok_s_mean"),
    ("tg128", (0, 128, 0), 128, "decode_tok_s_mean"),
    ("tg128_d2048", (0, 128, 2048), 2048, "decode_tok_s_mean"),
]


def ratio(x, y):
    return round(x / y, 3) if y else None


missing = False
for metric, lkey, length, field in metrics:
    got = {name: figures[name].get(lkey) for name in peers}
    for name, y in got.items():
        # The depth test is optional (an old llama-bench has no way to run it); the rest must be.
        if y is None and metric != "tg128_d2048":
            print(f"compare_llamacpp: {name}'s llama-bench gave no {metric}", file=sys.stderr)
            missing = True
    have = {name: y for name, y in got.items() if y is not None}
    if not have:
        continue
    if length not in tripod:
        print(f"compare_llamacpp: Tripod bench gave no {length}-token line", file=sys.stderr)
        missing = True
        continue
    x = tripod[length][field]
    best = max(have, key=have.get)
    line = {"bench": "vs_llamacpp", "metric": metric, "threads": threads,
            "model": os.path.basename(model), "tripod": round(x, 2)}
    for name in all_peers:
        line[name] = round(got[name], 2) if got.get(name) is not None else None
    line["best"] = best
    line["ratio"] = ratio(x, have[best])
    for name in all_peers:
        line[f"ratio_{name}"] = ratio(x, got[name]) if got.get(name) is not None else None
    print(json.dumps(line, separators=(",", ":")))
sys.exit(1 if missing else 0)
EOF
