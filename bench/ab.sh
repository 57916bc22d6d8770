#!/usr/bin/env bash
# Alternated A/B runs of two commands that print JSON lines, for a machine whose speed drifts
# from minute to minute (a shared VM; docs/benchmarks.md, "Benchmark harnesses"): A and B run in
# turns, so a slow stretch hits both, and each pair's ratio B/A is what counts. Prints a line per
# pair and a JSON summary (median of A, of B and of the pair ratios). Builds nothing.
#   bench/ab.sh [-n PAIRS] [-m MATCH] [-b KEY_B] KEY -- COMMAND_A... -- COMMAND_B...
# KEY: the numeric JSON field to compare (e.g. decode_tok_s); KEY_B: B's field where it differs
# (llama-bench -o jsonl calls it avg_ts); MATCH: a fixed string that picks the output line
# (default: the last line carrying the key). PAIRS: 3 unless given.
# Example: A against B binaries of bench/forward at a 2048-token context:
#   bench/ab.sh -n 5 decode_tok_s -- /tmp/a/forward --lengths 2048 -- build/release/bench/forward \
#     --lengths 2048
set -euo pipefail

pairs=3
match=""
key_b=""
while [[ $# -gt 0 && "$1" == -* && "$1" != "--" ]]; do
  case "$1" in
    -n)
      pairs=${2:-}
      shift 2
      ;;
    -m)
      match=${2:-}
      shift 2
      ;;
    -b)
      key_b=${2:-}
      shift 2
      ;;
    *)
      echo "ab: unknown option $1" >&2
      exit 2
      ;;
  esac
done
if ! [[ "$pairs" =~ ^[1-9][0-9]*$ ]]; then
  echo "ab: -n takes a positive integer (got '$pairs')" >&2
  exit 2
fi
key=${1:-}
if [[ -z "$key" || ! "$key" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
  echo "usage: bench/ab.sh [-n PAIRS] [-m MATCH] KEY -- COMMAND_A... -- COMMAND_B..." >&2
  exit 2
fi
shift
key_b=${key_b:-$key}
if [[ ! "$key_b" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
  echo "ab: -b takes a JSON field name (got '$key_b')" >&2
  exit 2
fi
if [[ "${1:-}" != "--" ]]; then
  echo "ab: expected -- before command A" >&2
  exit 2
fi
shift
cmd_a=()
while [[ $# -gt 0 && "$1" != "--" ]]; do
  cmd_a+=("$1")
  shift
done
if [[ $# -eq 0 ]]; then
  echo "ab: expected -- before command B" >&2
  exit 2
fi
shift
cmd_b=("$@")
if [[ ${#cmd_a[@]} -eq 0 || ${#cmd_b[@]} -eq 0 ]]; then
  echo "ab: both commands must be given" >&2
  exit 2
fi

# value_of FIELD COMMAND...: FIELD's value in the chosen output line, or fails showing the output.
value_of() {
  local key=$1
  shift
  local out
  if ! out=$("$@" 2>&1); then
    echo "ab: failed: $*" >&2
    tail -n 20 <<<"$out" >&2
    return 1
  fi
  local line
  line=$(grep -E -- "\"$key\"[[:space:]]*:" <<<"$out" | { if [[ -n "$match" ]]; then grep -F -- "$match"; else cat; fi; } | tail -n 1 || true)
  local v
  v=$(sed -n "s/.*\"$key\"[[:space:]]*:[[:space:]]*\([-0-9.eE+]*\).*/\1/p" <<<"$line")
  if [[ -z "$v" ]]; then
    echo "ab: no \"$key\" in the output of: $*" >&2
    tail -n 5 <<<"$out" >&2
    return 1
  fi
  echo "$v"
}

as=()
bs=()
for ((i = 1; i <= pairs; ++i)); do
  a=$(value_of "$key" "${cmd_a[@]}")
  b=$(value_of "$key_b" "${cmd_b[@]}")
  as+=("$a")
  bs+=("$b")
  awk -v i="$i" -v a="$a" -v b="$b" -v k="$key" -v kb="$key_b" \
    'BEGIN { printf "ab: pair %d: A %s=%s  B %s=%s  B/A %.3f\n", i, k, a, kb, b, (a != 0 ? b / a : 0) }' >&2
done

awk -v k="$key" -v as="${as[*]}" -v bs="${bs[*]}" '
  function sort(x, m,   i, j, t) {
    for (i = 2; i <= m; ++i) for (j = i; j > 1 && x[j - 1] > x[j]; --j) { t = x[j]; x[j] = x[j - 1]; x[j - 1] = t }
  }
  function median(x, m) { sort(x, m); return m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2 }
  BEGIN {
    n = split(as, a, " "); split(bs, b, " ")
    wins = 0
    for (i = 1; i <= n; ++i) { r[i] = a[i] != 0 ? b[i] / a[i] : 0; if (r[i] > 1) ++wins }
    printf "{\"bench\":\"ab\",\"key\":\"%s\",\"pairs\":%d,\"a_median\":%.4g,\"b_median\":%.4g,", k, n, median(a, n), median(b, n)
    rm = median(r, n)
    printf "\"ratio_median\":%.4f,\"ratio_min\":%.4f,\"ratio_max\":%.4f,\"pairs_b_higher\":%d}\n", rm, r[1], r[n], wins
  }'
