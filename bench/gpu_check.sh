#!/usr/bin/env bash
# The CUDA backend's device check (issue: CUDA backend), in two halves:
#   bench/gpu_check.sh pack   here, on the build machine: builds bench/gpu_check for sm_90 (the
#                             release preset finds nvcc), makes the CPU's fp32 reference of the
#                             bundled model (bench/gpu_reference), and puts the binary, the
#                             shared libraries it needs that a CUDA image lacks (abseil, xxhash),
#                             the reference and the model, split in two parts, under .gpu/.
#   bench/gpu_check.sh run    on the GPU machine: joins the model (the first part copied to
#                             /tmp/tripod_gpu by an earlier call, see below), runs the check,
#                             prints its tables and writes $OUT/gpu_check.jsonl when OUT is set.
# The GPU machine cannot build the project (no abseil, gRPC, oneDNN there) and takes at most
# 64 MiB per call, less than the model: a first call carries .gpu/model.1 and copies it to
# /tmp/tripod_gpu (bench/gpu_check.sh stage), the second carries the rest and runs.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-}"
case "$mode" in
  pack)
    cmake --preset release >/dev/null
    cmake --build build/release -j "$(nproc)" --target bench_gpu_check bench_gpu_reference
    rm -rf .gpu && mkdir -p .gpu/lib
    model="${TRIPOD_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
    [[ -f "$model" ]] || { echo "no model at $model: run scripts/setup" >&2; exit 1; }
    build/release/bench/gpu_reference --model "$model" --out .gpu/reference.json
    cp build/release/bench/gpu_check .gpu/
    # Every library but the C/C++ runtime and CUDA's own (the GPU machine has those).
    ldd build/release/bench/gpu_check | awk '$3 ~ /^\// {print $3}' |
      grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|librt|libdl|libcublas|libcublasLt)\.so' |
      xargs -r -I{} cp -L {} .gpu/lib/
    size=$(stat -c %s "$model")
    half=$(( (size / 2 + 4095) / 4096 * 4096 ))
    head -c "$half" "$model" > .gpu/model.1
    tail -c +$((half + 1)) "$model" > .gpu/model.2
    sha256sum "$model" | cut -d' ' -f1 > .gpu/model.sha256
    du -sh .gpu .gpu/*
    ;;
  stage)
    mkdir -p /tmp/tripod_gpu && cp .gpu/model.1 /tmp/tripod_gpu/ && ls -la /tmp/tripod_gpu
    ;;
  run)
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
    args=()
    if [[ -f /tmp/tripod_gpu/model.1 && -f .gpu/model.2 ]]; then
      cat /tmp/tripod_gpu/model.1 .gpu/model.2 > /tmp/tripod_gpu/model.gguf
      if [[ "$(sha256sum /tmp/tripod_gpu/model.gguf | cut -d' ' -f1)" == "$(cat .gpu/model.sha256)" ]]; then
        args+=(--model /tmp/tripod_gpu/model.gguf --reference .gpu/reference.json)
      else
        echo "model parts do not join to the packed model: the model check will fail"
      fi
    else
      echo "the model's first part is not staged: the model check will fail"
    fi
    export LD_LIBRARY_PATH="$PWD/.gpu/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    out=()
    [[ -n "${OUT:-}" ]] && out=(--out "$OUT/gpu_check.jsonl")
    .gpu/gpu_check "${args[@]}" "${out[@]}" "${@:2}"
    ;;
  *)
    echo "usage: bench/gpu_check.sh pack | stage | run [gpu_check flags]" >&2
    exit 2
    ;;
esac
