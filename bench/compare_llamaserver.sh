#!/usr/bin/env bash
# Serving speed of Tripod (`tripod serve`) beside llama.cpp's llama-server on the same model file
# and thread count, one server after the other (never both at once), measured by bench/serve.py
# with the same prompt token ids; one JSON line per server and workload. Builds nothing: the
# llama-server binary is yours (LLAMA_SERVER); without it only Tripod runs.
#   [LLAMA_SERVER=/path/to/llama-server] [THREADS=cores] [TRIPOD_THREADS=] [MODEL=...gguf] \
#     [TRIPOD=build/release/tripod] [PORT=18400] [TTFT_PROMPTS=8] bench/compare_llamaserver.sh
# Workloads:
#   c16_p512_o128  16 requests at once, 512-token prompts, 128 output tokens each (ignore_eos):
#                  output tokens/s, TTFT, TPOT. llama-server: -np 16 and 16 x (512+128+64) tokens
#                  of context, so every request has its own slot.
#   ttft_p2048     TTFT_PROMPTS single 2048-token prompts, one at a time, 8 output tokens: TTFT
#                  p50. llama-server: -np 1 -c 4096.
# Each workload runs after one warm-up request. Both servers get the same cores: llama-server
# -t THREADS -tb THREADS (default: every core), Tripod its defaults (POP 1/3 on the prefill
# worker, precision auto, the cores split between its prefill and decode worker); run it under
# `taskset -c` to give both fewer cores. TRIPOD_THREADS=N passes --threads N (N threads in each
# worker, sharing the cores) instead.
set -euo pipefail
cd "$(dirname "$0")/.."

threads=${THREADS:-$(nproc)}
tripod_threads=()
[[ -n "${TRIPOD_THREADS:-}" ]] && tripod_threads=(--threads "$TRIPOD_THREADS")
model=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
tripod=${TRIPOD:-build/release/tripod}
port=${PORT:-18400}
ttft_prompts=${TTFT_PROMPTS:-8}
python=build/venv/bin/python

for v in "$threads" "$port" "$ttft_prompts"; do
  if ! [[ "$v" =~ ^[1-9][0-9]*$ ]]; then
    echo "compare_llamaserver: THREADS, PORT and TTFT_PROMPTS must be positive integers" >&2
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

fields=bench,server,workload,concurrency,prompt_tokens,output_tokens,output_tok_s,ttft_p50_s
fields=$fields,ttft_p99_s,tpot_p50_ms,failed
# bench_one SERVER WORKLOAD [serve.py flags]: one JSON line; the same ids for every server.
bench_one() {
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
    --label server="$server" --label workload="$workload" --fields "$fields" "$@" || rc=$?
  # 3: the line was printed, with failures counted in it; anything else is no result.
  if [[ $rc -ne 0 && $rc -ne 3 ]]; then
    echo "compare_llamaserver: bench/serve.py failed on $server $workload (exit $rc)" >&2
    return 1
  fi
}
c16=(--burst --num_prompts 16 --prompt_tokens 512 --output_tokens 128)
ttft=(--concurrency 1 --num_prompts "$ttft_prompts" --prompt_tokens 2048 --output_tokens 8)

echo "compare_llamaserver: threads=$threads model=$model load:$(cut -d' ' -f1-3 /proc/loadavg)" >&2
status=0

# Tripod: one `tripod serve` for both workloads (its decode worker's KV holds them both).
"$tripod" serve --port "$port" "${tripod_threads[@]}" --model "$model" >"$tmp/tripod.out" \
  2>"$tmp/tripod.log" &
server_pid=$!
if await_health "http://127.0.0.1:$port/health" 300; then
  bench_one tripod c16_p512_o128 "${c16[@]}" || status=1
  bench_one tripod ttft_p2048 "${ttft[@]}" || status=1
else
  tail -n 20 "$tmp/tripod.log" >&2
  status=1
fi
stop_server

if [[ -n "${LLAMA_SERVER:-}" ]]; then
  # llama-server: a fresh one per workload, each sized for it.
  run_llama() {
    local workload=$1 slots=$2 ctx=$3
    shift 3
    server_port=$(bindable_port "$port") || { status=1; return; }
    [[ "$server_port" == "$port" ]] ||
      echo "compare_llamaserver: port $port still held (TIME_WAIT); llama-server on $server_port" >&2
    "$LLAMA_SERVER" -m "$model" -t "$threads" -tb "$threads" -np "$slots" -c "$ctx" \
      --host 127.0.0.1 --port "$server_port" >"$tmp/llama.log" 2>&1 &
    server_pid=$!
    if await_health "http://127.0.0.1:$server_port/health" 300; then
      bench_one llama-server "$workload" "$@" || status=1
    else
      tail -n 20 "$tmp/llama.log" >&2
      status=1
    fi
    stop_server
  }
  run_llama c16_p512_o128 16 $((16 * (512 + 128 + 64))) "${c16[@]}"
  run_llama ttft_p2048 1 4096 "${ttft[@]}"
fi
exit $status
