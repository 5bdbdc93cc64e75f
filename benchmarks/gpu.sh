#!/usr/bin/env bash
# bench.py on a GPU machine, once per Keras backend its Python holds, in
# bfloat16, published rows by default. Logs and JSON go to $OUT.
#
#   bash benchmarks/gpu.sh                         # train + generate, all contenders
#   MODE=train CONTENDERS=ours,hf bash benchmarks/gpu.sh
#
# Variables: BACKENDS (default: jax torch, plus tensorflow where it imports),
# ROWS (published), CONTENDERS (ours,kerashub,hf), MODE (train,generate),
# DTYPE (bfloat16), REPEATS (3), STEPS (3), TIMEOUT per backend (s, 600),
# ARGS (more bench.py flags), TAG (log and JSON names: bench_$TAG$backend).
# Where that Python lacks Keras or KerasHub, put their wheels in .whl/ first
# (see scripts/device_check.sh): they are installed to /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
default="jax torch"
python3 -c "import tensorflow" 2>/dev/null && default="jax tensorflow torch"
for backend in ${BACKENDS:-$default}; do
    echo "=== $backend"
    KERAS_BACKEND=$backend timeout "${TIMEOUT:-600}" python3 benchmarks/bench.py \
        --rows "${ROWS:-published}" --contenders "${CONTENDERS:-ours,kerashub,hf}" \
        --mode "${MODE:-train,generate}" --dtype "${DTYPE:-bfloat16}" \
        --repeats "${REPEATS:-3}" --steps "${STEPS:-3}" \
        --json "$OUT/bench_${TAG:-}$backend.json" ${ARGS:-} \
        >"$OUT/bench_${TAG:-}$backend.log" 2>&1
    echo "rc=$?"
    grep -v "^\s*\[" "$OUT/bench_${TAG:-}$backend.log" | tail -60
done
