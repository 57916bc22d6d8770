#!/usr/bin/env bash
# The CUDA backend's device check (issue: CUDA backend), in three steps over two calls:
#   bench/gpu_check.sh pack   here, on the build machine: builds bench/gpu_check for sm_90 (the
#                             release preset finds nvcc) and the service's binaries, makes the
#                             CPU's fp32 reference of the bundled model (bench/gpu_reference),
#                             and puts under .gpu/: the check's binary, the shared libraries it
#                             needs that a CUDA image lacks (abseil, xxhash), the reference, the
#                             service's binaries and libraries (workers.tar.xz) and the model,
#                             xz-compressed and split in two parts.
#   bench/gpu_check.sh stage  first call on the GPU machine (carry .gpu/model.1 and
#                             .gpu/workers.tar.xz): copies them to /tmp/tripod_gpu.
#   bench/gpu_check.sh run    second call, at once (the machine stays warm 30 s; carry
#                             .gpu/model.2 .gpu/gpu_check .gpu/lib .gpu/reference.json
#                             .gpu/model.sha256 .gpu/shape.header.xz): joins and unpacks the
#                             model, runs the check, prints its tables, then the service on the
#                             GPU (bench/gpu_serve_check.py: exact answers), then its speed on a
#                             random-weight model of the shape model's shape, made there
#                             (bench/gpu_random_model.py, bench/gpu_serve_bench.py); JSON lines to
#                             $OUT when OUT is set. `run --skip_check` leaves out the engine check
#                             (parts 1-3).
# The shape model (pack): SHAPE_MODEL, a GGUF or a catalogue name (default
# qwen2.5-coder-1.5b-instruct, fetched into the cache when missing); only its header is carried.
# The GPU machine cannot build the project (no abseil, gRPC, oneDNN there), takes at most 64 MiB
# per call (the repository's files included), and has python3 (its standard library unpacks the
# .xz files, whether or not xz is there) and NCCL only as PyTorch's wheel (found at run time).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
case "$mode" in
  pack)
    cmake --preset release >/dev/null
    cmake --build build/release -j "$(nproc)" --target bench_gpu_check bench_gpu_reference \
      tripod tripod-prefill tripod-decode tripod-scheduler
    rm -rf .gpu && mkdir -p .gpu/lib
    model="${TRIPOD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
    [[ -f "$model" ]] || { echo "no model at $model: run scripts/setup" >&2; exit 1; }
    build/release/bench/gpu_reference --model "$model" --out .gpu/reference.json
    cp build/release/bench/gpu_check .gpu/
    # Every library but the C/C++ runtime and CUDA's own (the GPU machine has those; NCCL is
    # there as a Python wheel).
    skip='/(libc|libm|libstdc\+\+|libgcc_s|libpthread|librt|libdl|libcublas|libcublasLt|libnccl)\.so'
    ldd build/release/bench/gpu_check | awk '$3 ~ /^\// {print $3}' | grep -v -E "$skip" |
      xargs -r -I{} cp -L {} .gpu/lib/
    # The service: tripod (serve) and the workers it starts, stripped, with their libraries.
    w=$(mktemp -d) && mkdir -p "$w/workers/lib"
    bins=(tripod tripod-prefill tripod-decode tripod-scheduler)
    for b in "${bins[@]}"; do strip -o "$w/workers/$b" "build/release/$b"; done
    for b in "${bins[@]}"; do ldd "build/release/$b"; done | awk '$3 ~ /^\// {print $3}' |
      sort -u | grep -v -E "$skip" | xargs -r -I{} cp -L {} "$w/workers/lib/"
    tar -C "$w" -cJf .gpu/workers.tar.xz workers && rm -rf "$w"
    # The model, compressed, split so that each call stays under 64 MiB with the repository's
    # files: the first part fills the first call (with workers.tar.xz), the rest goes with the
    # check's binary.
    xz -T0 -6 -c "$model" > .gpu/model.xz
    tree=$(git ls-files -z | xargs -0 stat -c %s | awk '{s+=$1} END {print s}')
    # Half a MiB to spare in call 1: the two calls together have barely 1 MiB more than they
    # carry (the tree travels with each), so call 2 gets the rest of the margin.
    room=$(( 64 * 1048576 - tree - $(stat -c %s .gpu/workers.tar.xz) - 524288 ))
    head -c "$room" .gpu/model.xz > .gpu/model.1
    tail -c +$((room + 1)) .gpu/model.xz > .gpu/model.2
    rm .gpu/model.xz
    sha256sum "$model" | cut -d' ' -f1 > .gpu/model.sha256
    shape="${SHAPE_MODEL:-qwen2.5-coder-1.5b-instruct}"
    if [[ ! -f "$shape" ]]; then
      scripts/fetch_model "$shape" >&2
      # fetch_model links the cached file into models/.
      shape=models/$(python3 -c 'import json, sys
print(json.load(open("scripts/model_catalogue.json"))["models"][sys.argv[1]]["file"])' "$shape")
    fi
    python3 bench/gpu_random_model.py header --gguf "$shape" --out .gpu/shape.header.xz
    du -sh .gpu/* .gpu
    echo "call 1 carries $(( (tree + $(stat -c %s .gpu/model.1 .gpu/workers.tar.xz | paste -sd+ | bc)) / 1048576 )) MiB," \
      "call 2 $(( (tree + $(du -sb .gpu/model.2 .gpu/gpu_check .gpu/lib .gpu/reference.json .gpu/shape.header.xz | awk '{s+=$1} END {print s}')) / 1048576 )) MiB"
    ;;
  stage)
    mkdir -p /tmp/tripod_gpu && cp .gpu/model.1 .gpu/workers.tar.xz /tmp/tripod_gpu/ &&
      ls -la /tmp/tripod_gpu
    ;;
  run)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
    py=python3
    args=()
    g=/tmp/tripod_gpu
    if [[ -f $g/model.1 && -f .gpu/model.2 ]]; then
      cat $g/model.1 .gpu/model.2 > $g/model.xz
      $py -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        $g/model.xz $g/model.gguf
      if [[ "$(sha256sum $g/model.gguf | cut -d' ' -f1)" == "$(cat .gpu/model.sha256)" ]]; then
        args+=(--model $g/model.gguf --reference .gpu/reference.json)
      else
        echo "model parts do not join to the packed model: the model check will fail"
      fi
    else
      echo "the model's first part is not staged: the model check will fail"
    fi
    export LD_LIBRARY_PATH="$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    out=()
    [[ -n "${OUT:-}" ]] && out=(--out "$OUT/gpu_check.jsonl")
    status=0
    check_args=("${@:2}")
    skip_check=0
    if [[ "${check_args[0]:-}" == "--skip_check" ]]; then
      skip_check=1
      check_args=("${check_args[@]:1}")
    fi
    if ((skip_check)); then
      echo "parts 1-3 (the engine check): skipped"
    else
      .gpu/gpu_check "${args[@]}" "${out[@]}" "${check_args[@]}" || status=$?
    fi
    # The service on the GPU, when its binaries were staged and NCCL's library is found.
    echo
    echo "4. the service on the GPU (tripod serve --backend cuda)"
    nccl=$($py -c 'import glob, os, nvidia.nccl as n; print(os.path.dirname(glob.glob(os.path.join(list(n.__path__)[0], "lib", "libnccl.so*"))[0]))' 2>/dev/null ||
      dirname "$(find / -name 'libnccl.so.2' -print -quit 2>/dev/null)" 2>/dev/null || true)
    if [[ ! -f $g/workers.tar.xz || ! -f $g/model.gguf ]]; then
      echo "  not staged (workers.tar.xz, the model): skipped"
      status=1
    elif [[ -z "$nccl" || ! -d "$nccl" ]]; then
      echo "  no libnccl.so.2 on this machine: skipped"
      status=1
    else
      $py -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' $g/workers.tar.xz $g
      serve_out=()
      [[ -n "${OUT:-}" ]] && serve_out=(--out "$OUT/gpu_serve.jsonl")
      LD_LIBRARY_PATH="$g/workers/lib:$nccl:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" \
        $py bench/gpu_serve_check.py --bin $g/workers --model $g/model.gguf \
        --reference .gpu/reference.json "${serve_out[@]}" || status=$?
      echo
      echo "5. the service's speed on a random-weight model of the shape model's shape"
      if [[ ! -f .gpu/shape.header.xz ]]; then
        echo "  no .gpu/shape.header.xz carried: skipped"
        status=1
      else
        $py bench/gpu_random_model.py model --header .gpu/shape.header.xz --out $g/shape.gguf
        bench_out=()
        [[ -n "${OUT:-}" ]] && bench_out=(--out "$OUT/gpu_serve_bench.jsonl" --gpu_check_jsonl "$OUT/gpu_check.jsonl")
        LD_LIBRARY_PATH="$g/workers/lib:$nccl:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}" \
          $py bench/gpu_serve_bench.py --bin $g/workers --model $g/shape.gguf \
          "${bench_out[@]}" || status=$?
      fi
    fi
    exit $status
    ;;
  *)
    echo "usage: bench/gpu_check.sh pack | stage | run [gpu_check flags]" >&2
    exit 2
    ;;
esac
