#!/usr/bin/env bash
# Serving speed of Tripod (`tripod serve`) beside llama.cpp's llama-server on the same model file
# and thread count, one server after the other (never both at once), each workload measured by two
# independent harnesses: bench/serve.py (the same prompt token ids for every server) and NVIDIA's
# AIPerf (`aiperf profile`: synthetic text prompts of the same token counts, cut by the model's own
# tokenizer, rebuilt from the GGUF file). One JSON line per harness, server and workload, each
# against a fresh server. Builds nothing: the llama-server binary is yours (LLAMA_SERVER); without
# it only Tripod runs.
#   [LLAMA_SERVER=/path/to/llama-server] [THREADS=cores] [TRIPOD_THREADS=] [MODEL=...gguf] \
#     [TRIPOD=build/release/tripod] [TRIPOD_FLAGS=] [PORT=18400] [TTFT_PROMPTS=8] [AIPERF=path|off] \
#     [LLAMA_SERVER_FLAGS="..."] [QUIET_PCT=10] [QUIET_WAIT=600] [AIPERF_NICE=19] \
#     [WORKLOADS="c16_p512_o128 ttft_p2048"] bench/compare_llamaserver.sh
# Workloads:
#   c16_p512_o128  16 requests at once, 512-token prompts, 128 output tokens each (ignore_eos):
#                  output tokens/s, TTFT, TPOT. llama-server: -np 16 and 16 x (512+128+64) tokens
#                  of context, so every request has its own slot.
#   ttft_p2048     TTFT_PROMPTS single 2048-token prompts, one at a time, 8 output tokens: TTFT
#                  p50. llama-server: -np 1 -c 4096.
# Each workload runs after one warm-up request. Both servers get the same cores: llama-server
# -t THREADS -tb THREADS (default: every core) --cont-batching and LLAMA_SERVER_FLAGS, Tripod its
# defaults (POP 1/3 on the prefill worker, precision auto, the cores split between its prefill and
# decode worker, an idle one's lent to the other); run it under `taskset -c` to give both fewer
# cores. TRIPOD_THREADS=N passes --threads N (N threads in each worker, sharing the cores) instead;
# TRIPOD_FLAGS="..." adds flags to `tripod serve` (e.g. --lend_cores=false).
# AIPerf: AIPERF=/path/to/aiperf, or by default build/aiperf-venv/bin/aiperf, installed there on
# first use from scripts/requirements-bench.txt (PyPI, about 1.2 GB; scripts/setup does not). It
# runs at nice AIPERF_NICE (19): its processes poll, and at normal priority they took a large share
# of a core from llama-server and doubled what it measured (docs/benchmarks.md, "Benchmark
# harnesses"); serve.py's client needs almost none.
# TRIPOD_PROFILE=1 adds each Tripod worker's per-op table (bench/profile_tables.py: time in each
# op, the gaps between ops, the busy share) after each Tripod line; the profiler's own cost is a
# clock read and a map update per op.
# AIPERF=off measures with bench/serve.py only. In its lines output_tok_s is AIPerf's output token
# throughput, ttft its time to first token, tpot_p50_ms the median of its per-request inter-token
# latency ((E2E - TTFT) / (tokens - 1), as serve.py's TPOT), prompt_tokens and output_tokens the
# means it measured (output tokens as the server counted them).
# The machine's other work: llama-server's threads spin at barriers, so any other busy process on
# its cores costs it far more than its share (docs/benchmarks.md, "Benchmark harnesses").
# Before each measurement the script waits (up to QUIET_WAIT seconds, polling every 30 s) until
# the CPUs were less than QUIET_PCT percent busy over 5 s with the server idle, then measures
# anyway; each line carries load_1m (the 1-minute load average at the start), client_cpu_s (the
# harness's own CPU seconds: serve.py's over the measured requests, AIPerf's processes' over their
# whole run, start-up included) and others_cpu_pct (the share of all CPUs' time taken by processes
# other than the server and the harness while it measured). Compare figures only where
# others_cpu_pct is near 0.
set -euo pipefail
cd "$(dirname "$0")/.."

threads=${THREADS:-$(nproc)}
tripod_threads=()
[[ -n "${TRIPOD_THREADS:-}" ]] && tripod_threads=(--threads "$TRIPOD_THREADS")
read -r -a tripod_flags <<<"${TRIPOD_FLAGS:-}"
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
tripod=${TRIPOD:-build/release/tripod}
port=${PORT:-18400}
ttft_prompts=${TTFT_PROMPTS:-8}
quiet_pct=${QUIET_PCT:-10}
quiet_wait=${QUIET_WAIT:-600}
aiperf_nice=${AIPERF_NICE:-19}
read -r -a llama_flags <<<"${LLAMA_SERVER_FLAGS:-}"
read -r -a workloads <<<"${WORKLOADS:-c16_p512_o128 ttft_p2048}"
for w in "${workloads[@]}"; do
  [[ "$w" == c16_p512_o128 || "$w" == ttft_p2048 ]] ||
    { echo "compare_llamaserver: unknown workload $w (WORKLOADS)" >&2; exit 2; }
done
python=build/venv/bin/python
aiperf=${AIPERF:-build/aiperf-venv/bin/aiperf}

for v in "$threads" "$port" "$ttft_prompts"; do
  if ! [[ "$v" =~ ^[1-9][0-9]*$ ]]; then
    echo "compare_llamaserver: THREADS, PORT and TTFT_PROMPTS must be positive integers" >&2
    exit 2
  fi
done
for v in "$quiet_pct" "$quiet_wait" "$aiperf_nice"; do
  if ! [[ "$v" =~ ^[0-9]+$ ]]; then
    echo "compare_llamaserver: QUIET_PCT, QUIET_WAIT and AIPERF_NICE must be integers >= 0" >&2
    exit 2
  fi
done
[[ -f "$model" ]] || { echo "compare_llamaserver: model $model not found (scripts/setup, or set MODEL)" >&2; exit 2; }
[[ -x "$tripod" ]] || { echo "compare_llamaserver: $tripod not found; build it (scripts/serve builds it)" >&2; exit 2; }
[[ -x "$python" ]] || { echo "compare_llamaserver: $python not found; run scripts/setup" >&2; exit 2; }
if [[ -z "${LLAMA_SERVER:-}" ]]; then
  echo "compare_llamaserver: LLAMA_SERVER not set: measuring Tripod only" >&2
elif [[ ! -x "$LLAMA_SERVER" ]]; then
  echo "compare_llamaserver: LLAMA_SERVER=$LLAMA_SERVER is not an executable file" >&2
  exit 2
fi
if [[ "$aiperf" == off ]]; then
  echo "compare_llamaserver: AIPERF=off: measuring with bench/serve.py only" >&2
elif [[ ! -x "$aiperf" ]]; then
  if [[ -n "${AIPERF:-}" ]]; then
    echo "compare_llamaserver: AIPERF=$AIPERF is not an executable file" >&2
    exit 2
  fi
  echo "compare_llamaserver: installing AIPerf into build/aiperf-venv" \
    "(scripts/requirements-bench.txt)" >&2
  rm -rf build/aiperf-venv
  python3 -m venv build/aiperf-venv
  build/aiperf-venv/bin/pip install -q --disable-pip-version-check \
    -r scripts/requirements-bench.txt
fi

tmp=$(mktemp -d)
server_pid=""
server_port=$port
stop_server() {
  [[ -n "$server_pid" ]] || return 0
  kill -TERM "$server_pid" 2>/dev/null || true
  for _ in $(seq 1 300); do # 30 s, then SIGKILL
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}
trap 'stop_server; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

# Waits until GET $1 answers 200 (at most $2 seconds) while the server process lives.
await_health() {
  local url=$1 limit=$2
  "$python" - "$url" "$limit" "$server_pid" <<'EOF'
import os, sys, time, urllib.request
url, limit, pid = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
end = time.monotonic() + limit
while time.monotonic() < end:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"compare_llamaserver: the server exited before {url} answered")
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            if r.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
sys.exit(f"compare_llamaserver: {url} did not answer 200 within {limit:.0f} s")
EOF
}

# The first port from $1 up (at most 100 tried) that binds without SO_REUSEADDR: llama-server's
# cpp-httplib sets only SO_REUSEPORT, so it cannot bind a port whose last server left TIME_WAIT
# connections behind (the health probes' and the benchmark's) for a minute after it stopped.
bindable_port() {
  "$python" - "$1" <<'EOF'
import socket, sys
first = int(sys.argv[1])
for p in range(first, min(first + 100, 65536)):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", p))
        except OSError:
            continue
    print(p)
    sys.exit(0)
sys.exit(f"compare_llamaserver: no port from {first} to {first + 99} binds")
EOF
}

# Waits until the CPUs were less than QUIET_PCT % busy over 5 s, at most QUIET_WAIT seconds.
wait_quiet() {
  [[ "$quiet_pct" -gt 0 ]] || return 0
  "$python" - "$quiet_pct" "$quiet_wait" <<'EOF'
import sys, time
sys.path.insert(0, "bench")
from serve import host_cpu
pct, limit = float(sys.argv[1]), float(sys.argv[2])
start = time.monotonic()
while True:
    b0, t0 = host_cpu()
    time.sleep(5)
    b1, t1 = host_cpu()
    busy, waited = 100 * (b1 - b0) / max(t1 - t0, 1e-9), time.monotonic() - start
    if busy < pct:
        sys.exit(0)
    if waited + 30 > limit:
        print(f"compare_llamaserver: the CPUs are {busy:.0f}% busy after {waited:.0f} s of "
              "waiting; measuring anyway (see others_cpu_pct)", file=sys.stderr)
        sys.exit(0)
    time.sleep(25)
EOF
}

fields=bench,harness,server,workload,concurrency,prompt_tokens,output_tokens,output_tok_s
fields=$fields,ttft_p50_s,ttft_p99_s,tpot_p50_ms,failed,load_1m,client_cpu_s,others_cpu_pct
# serve_py SERVER WORKLOAD [serve.py flags]: one JSON line; the same ids for every server.
serve_py() {
  local server=$1 workload=$2
  shift 2
  local ids=()
  if [[ -s "$tmp/ids.json" ]]; then
    ids=(--token_ids_file "$tmp/ids.json")
  else
    ids=(--save_token_ids "$tmp/ids.json")
  fi
  local rc=0
  "$python" bench/serve.py --base_url "http://127.0.0.1:$server_port/v1" --warmup 1 "${ids[@]}" \
    --server_pid "$server_pid" --label harness=serve.py --label server="$server" \
    --label workload="$workload" --fields "$fields" "$@" || rc=$?
  # 3: the line was printed, with failures counted in it; anything else is no result.
  if [[ $rc -ne 0 && $rc -ne 3 ]]; then
    echo "compare_llamaserver: bench/serve.py failed on $server $workload (exit $rc)" >&2
    return 1
  fi
}

# The model's tokenizer for AIPerf's prompts and counts, rebuilt from the GGUF's vocabulary by the
# tests' reference builder (tokenizer.json, and a tokenizer_config.json that loads it as is).
if [[ "$aiperf" != off ]]; then
  "$python" - "$model" "$tmp/tokenizer" <<'EOF'
import json, os, sys
sys.path.insert(0, "tests/reference")
import tok_hf_reference as ref
v = ref.read_vocab(sys.argv[1])
os.makedirs(sys.argv[2], exist_ok=True)
ref.build(v).save(os.path.join(sys.argv[2], "tokenizer.json"))
tokens = v["tokens"]
with open(os.path.join(sys.argv[2], "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False,
               "add_eos_token": False, "model_max_length": 1 << 20,
               "bos_token": tokens[v["bos"]] if v["bos"] is not None else None,
               "eos_token": tokens[v["eos"]] if v["eos"] is not None else None}, f)
EOF
fi

# aiperf_one SERVER WORKLOAD CONCURRENCY REQUESTS ISL OSL: one JSON line with serve.py's fields.
aiperf_one() {
  local server=$1 workload=$2 conc=$3 n=$4 isl=$5 osl=$6
  local dir="$tmp/aiperf_${server}_$workload" name load cpu0
  name=$("$python" -c 'import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1] + "/v1/models", timeout=30) as r:
    print(json.load(r)["data"][0]["id"])' "http://127.0.0.1:$server_port") || {
    echo "compare_llamaserver: GET /v1/models failed on $server" >&2
    return 1
  }
  load=$(cut -d' ' -f1 /proc/loadavg)
  cpu0=$("$python" -c 'import sys; sys.path.insert(0, "bench"); import serve
print(*serve.host_cpu(), serve.tree_cpu([int(sys.argv[1])]))' "$server_pid")
  if ! HF_HUB_DISABLE_TELEMETRY=1 /usr/bin/time -f "%U %S" -o "$dir.cpu" nice -n "$aiperf_nice" "$aiperf" profile \
    --model "$name" --url "http://127.0.0.1:$server_port" --endpoint-type completions \
    --streaming --tokenizer "$tmp/tokenizer" --isl "$isl" --isl-stddev 0 --osl "$osl" \
    --extra-inputs ignore_eos:true --extra-inputs temperature:0 --concurrency "$conc" \
    --request-count "$n" --warmup-request-count 1 --warmup-concurrency 1 \
    --use-server-token-count --random-seed 0 --ui-type none --no-server-metrics \
    --no-gpu-telemetry --artifact-dir "$dir" >"$dir.log" 2>&1; then
    echo "compare_llamaserver: aiperf failed on $server $workload:" >&2
    tail -n 20 "$dir.log" >&2
    return 1
  fi
  # shellcheck disable=SC2086 # cpu0 is three numbers
  "$python" - "$dir" "$server" "$workload" "$conc" "$load" "$server_pid" $cpu0 "$fields" <<'EOF'
import json, sys
sys.path.insert(0, "bench")
import serve
d, server, workload, conc, load, pid = sys.argv[1:7]
b0, t0, s0 = map(float, sys.argv[7:10])
fields = sys.argv[10].split(",")
b1, t1 = serve.host_cpu()
s1 = serve.tree_cpu([int(pid)])
with open(d + ".cpu") as f:  # the aiperf processes' CPU seconds (GNU time: user, system)
    client = sum(float(x) for x in f.read().split()[-2:])
with open(d + "/profile_export_aiperf.json") as f:
    r = json.load(f)


def stat(name, key, scale=1.0):
    v = (r.get(name) or {}).get(key)
    return round(v * scale, 6) if v is not None else None


failed = int((r.get("error_request_count") or {}).get("avg") or 0)
# Over the whole aiperf run (its start-up and warm-up included), not only the measured requests.
others = max((b1 - b0) - (s1 - s0) - client, 0.0) / max(t1 - t0, 1e-9) * 100
line = {"bench": "serve", "harness": "aiperf", "server": server, "workload": workload,
        "concurrency": int(conc), "prompt_tokens": stat("input_sequence_length", "avg"),
        "output_tokens": stat("output_sequence_length", "avg"),
        "output_tok_s": stat("output_token_throughput", "avg"),
        "ttft_p50_s": stat("time_to_first_token", "p50", 1e-3),
        "ttft_p99_s": stat("time_to_first_token", "p99", 1e-3),
        "tpot_p50_ms": stat("inter_token_latency", "p50"), "failed": failed,
        "load_1m": float(load), "client_cpu_s": round(client, 2),
        "others_cpu_pct": round(others, 1)}
print(json.dumps({k: line.get(k) for k in fields}, separators=(",", ":")), flush=True)
EOF
}

c16=(--burst --num_prompts 16 --prompt_tokens 512 --output_tokens 128)
ttft=(--concurrency 1 --num_prompts "$ttft_prompts" --prompt_tokens 2048 --output_tokens 8)
# measure HARNESS SERVER WORKLOAD: one workload by one harness, against the running server.
measure() {
  local harness=$1 server=$2 workload=$3
  wait_quiet
  case "$harness/$workload" in
    serve.py/c16_p512_o128) serve_py "$server" "$workload" "${c16[@]}" ;;
    serve.py/ttft_p2048) serve_py "$server" "$workload" "${ttft[@]}" ;;
    aiperf/c16_p512_o128) aiperf_one "$server" "$workload" 16 16 512 128 ;;
    aiperf/ttft_p2048) aiperf_one "$server" "$workload" 1 "$ttft_prompts" 2048 8 ;;
  esac
}
harnesses=(serve.py)
[[ "$aiperf" == off ]] || harnesses+=(aiperf)

echo "compare_llamaserver: threads=$threads model=$model harnesses=${harnesses[*]} load:$(cut -d' ' -f1-3 /proc/loadavg)" >&2
status=0

# Tripod: a fresh `tripod serve` for each workload and harness.
run_tripod() {
  local workload=$1 harness=$2
  server_port=$port
  "$tripod" serve --port "$port" "${tripod_threads[@]}" "${tripod_flags[@]}" --model "$model" >"$tmp/tripod.out" \
    2>"$tmp/tripod.log" &
  server_pid=$!
  if await_health "http://127.0.0.1:$port/health" 300; then
    measure "$harness" tripod "$workload" || status=1
  else
    tail -n 20 "$tmp/tripod.log" >&2
    status=1
  fi
  stop_server
  # Under TRIPOD_PROFILE=1 (inherited by the workers) each worker printed its per-op table as it
  # stopped: one more JSON line per worker, labelled like the measurement's.
  if [[ -n "${TRIPOD_PROFILE:-}" && "${TRIPOD_PROFILE}" != 0 ]]; then
    "$python" bench/profile_tables.py --label bench=tripod_profile --label harness="$harness" \
      --label server=tripod --label workload="$workload" "$tmp/tripod.log" || status=1
  fi
}
for workload in "${workloads[@]}"; do
  for harness in "${harnesses[@]}"; do
    run_tripod "$workload" "$harness"
  done
done

if [[ -n "${LLAMA_SERVER:-}" ]]; then
  # llama-server: a fresh one per workload and harness, each sized for the workload.
  run_llama() {
    local workload=$1 harness=$2 slots=$3 ctx=$4
    server_port=$(bindable_port "$port") || { status=1; return; }
    [[ "$server_port" == "$port" ]] ||
      echo "compare_llamaserver: port $port still held (TIME_WAIT); llama-server on $server_port" >&2
    "$LLAMA_SERVER" -m "$model" -t "$threads" -tb "$threads" -np "$slots" -c "$ctx" \
      --cont-batching "${llama_flags[@]}" --host 127.0.0.1 --port "$server_port" \
      >"$tmp/llama.log" 2>&1 &
    server_pid=$!
    if await_health "http://127.0.0.1:$server_port/health" 300; then
      measure "$harness" llama-server "$workload" || status=1
    else
      tail -n 20 "$tmp/llama.log" >&2
      status=1
    fi
    stop_server
  }
  for workload in "${workloads[@]}"; do
    for harness in "${harnesses[@]}"; do
      case "$workload" in
        c16_p512_o128) run_llama "$workload" "$harness" 16 $((16 * (512 + 128 + 64))) ;;
        ttft_p2048) run_llama "$workload" "$harness" 1 4096 ;;
      esac
    done
  done
fi
exit $status
