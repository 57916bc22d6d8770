#!/usr/bin/env bash
# Side-by-side speed of Tripod's forward pass (bench/forward) and llama.cpp's llama-bench on the
# same model and thread count, measured in one run; prints one JSON line per metric. Builds nothing.
#   LLAMA_BENCH=/path/to/llama-bench [THREADS=2] [REPS=3] [MODEL=models/...gguf] \
#     [TRIPOD_BENCH=build/release/bench/forward] [PRECISION=auto] [KV=auto] \
#     bench/compare_llamacpp.sh
# KV: the KV cache type of both sides (auto: Tripod's default and llama.cpp's f16; q8_0: both
# q8_0, llama-bench with -ctk/-ctv q8_0 and flash attention, which its quantised V cache needs).
# Metrics: pp128, pp512, pp2048 (prefill tokens/s), tg128 (decode tokens/s at short context) and
# tg128_d2048 (decode after a 2048-token context; only if this llama-bench has -d/--n-depth).
# Both sides are means over REPS runs (llama-bench's avg_ts; bench/forward's *_mean fields).
# Tripod's tg128 decodes after its 128-token prompt (context 128..256), llama-bench's from empty.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -z "${LLAMA_BENCH:-}" ]]; then
  echo "compare_llamacpp: set LLAMA_BENCH=/path/to/llama-bench (this script builds nothing)" >&2
  exit 2
fi
if [[ ! -x "$LLAMA_BENCH" ]]; then
  echo "compare_llamacpp: LLAMA_BENCH=$LLAMA_BENCH is not an executable file" >&2
  exit 2
fi
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

echo "compare_llamacpp: threads=$threads precision=$precision kv=$kv model=$model load:$(cut -d' ' -f1-3 /proc/loadavg)" >&2
run_to "$tmp/llama_pp.json" "$LLAMA_BENCH" -m "$model" -t "$threads" -r "$reps" -o json \
  -p 128,512,2048 -n 128 "${llama_kv[@]}"
# Older llama-bench builds have no -d; then the depth metric is skipped.
if "$LLAMA_BENCH" --help 2>&1 | grep -q -- '--n-depth'; then
  run_to "$tmp/llama_depth.json" "$LLAMA_BENCH" -m "$model" -t "$threads" -r "$reps" -o json \
    -p 0 -n 128 -d 2048 "${llama_kv[@]}"
else
  echo "[]" >"$tmp/llama_depth.json"
fi
run_to "$tmp/tripod.jsonl" "$tripod_bench" --model "$model" --threads "$threads" \
  --lengths 128,512,2048 --decode_tokens 128 --reps "$reps" --precision "$precision" \
  --kv_cache_dtype "$kv"

python3 - "$tmp" "$threads" <<'EOF'
import json
import sys

tmp, threads = sys.argv[1], int(sys.argv[2])

# llama-bench -o json: one array of test objects, each with n_prompt, n_gen, n_depth, avg_ts.
llama = {}
for name in ("llama_pp.json", "llama_depth.json"):
    with open(f"{tmp}/{name}") as f:
        for t in json.load(f):
            key = (t["n_prompt"], t["n_gen"], t.get("n_depth", 0))
            llama[key] = t["avg_ts"]

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
missing = False
for metric, lkey, length, field in metrics:
    if lkey not in llama:
        if metric != "tg128_d2048":  # The depth test is optional; the rest must be there.
            print(f"compare_llamacpp: llama-bench gave no {metric}", file=sys.stderr)
            missing = True
        continue
    if length not in tripod:
        print(f"compare_llamacpp: Tripod bench gave no {length}-token line", file=sys.stderr)
        missing = True
        continue
    x, y = tripod[length][field], llama[lkey]
    print(json.dumps({"bench": "vs_llamacpp", "metric": metric, "threads": threads,
                      "tripod": round(x, 2), "llamacpp": round(y, 2),
                      "ratio": round(x / y, 3) if y > 0 else None},
                     separators=(",", ":")))
sys.exit(1 if missing else 0)
EOF
