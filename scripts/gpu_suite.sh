#!/usr/bin/env bash
# Runs the test suite (without `large`) on a GPU machine, one pytest per
# backend given as arguments (default: jax torch), side by side, each with
# pytest-xdist workers, and writes a JUnit XML and log per backend to
# ${OUT:-gpu_results}. The parity tests keep full float32 matmuls on GPU
# (tests/conftest.py sets JAX's matmul precision; PyTorch's default is full).
# Usage: bash scripts/gpu_suite.sh [SECONDS] [BACKEND...]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_results}; mkdir -p "$out"
limit=${1:-240}; shift || true
backends=("$@"); [ ${#backends[@]} -eq 0 ] && backends=(jax torch)
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
workers=$(( $(nproc) / ${#backends[@]} - 1 )); [ "$workers" -lt 1 ] && workers=1
for backend in "${backends[@]}"; do
    KERAS_BACKEND=$backend timeout -s INT "$limit" python3 -m pytest tests -q \
        -p no:cacheprovider -m "not large" -n "$workers" --tb=line \
        --junitxml="$out/$backend.xml" > "$out/$backend.log" 2>&1 &
done
wait
for backend in "${backends[@]}"; do
    echo "=== $backend: $(tail -1 "$out/$backend.log")"
done
