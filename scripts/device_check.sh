#!/usr/bin/env bash
# GPU check on a lent device machine (see benchmarks/GPU.md): the test suite
# and the benchmarks on the GPU, for the backends the machine's image holds
# (PyTorch and JAX; its image has no TensorFlow, and a TensorFlow GPU wheel
# is far over what can be carried to it).
#
#   bash scripts/device_check.sh tests   # both suites, in parallel workers
#   bash scripts/device_check.sh bench   # benchmarks, one after another
#
# Keras and KerasHub travel as wheels in .whl/ (Python 3.12, see
# benchmarks/GPU.md); logs and JSON go to $OUT (default ./device_out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device_out}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # several JAX processes share the GPU

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 - <<'EOF'
import importlib.metadata as m
print({n: m.version(n) for n in ("keras", "keras-hub", "jax", "torch", "transformers")})
import jax, torch
print("jax devices:", jax.devices(), " torch cuda:", torch.cuda.is_available())
EOF

case "${1:-tests}" in
tests)
    # Files that need TensorFlow itself (tokenizers, preprocessing layers,
    # tf.distribute) cannot run here.
    skip=(--ignore=tests/test_tokenizer.py --ignore=tests/test_preprocessing.py)
    for backend in ${BACKENDS:-torch jax}; do
        KERAS_BACKEND=$backend timeout "${TEST_TIMEOUT:-480}" python3 -m pytest \
            -v -p no:cacheprovider -n "${WORKERS:-6}" -m "not large" "${skip[@]}" \
            ${TEST_ARGS:-} >"$OUT/tests_$backend.log" 2>&1 &
    done
    wait
    for backend in ${BACKENDS:-torch jax}; do
        echo "=== $backend"
        grep -E "^(FAILED|ERROR)|(FAILED|ERROR) tests|passed|failed" \
            "$OUT/tests_$backend.log" | tail -40
        echo "PASSED lines: $(grep -c PASSED "$OUT/tests_$backend.log")"
    done
    ;;
bench)
    for backend in ${BACKENDS:-torch jax}; do
        for script in ${SCRIPTS:-gpt mixtral bert}; do
            echo "=== $backend $script"
            KERAS_BACKEND=$backend timeout "${BENCH_TIMEOUT:-300}" python3 \
                "benchmarks/bench_$script.py" --repeats "${REPEATS:-5}" \
                --json "$OUT/${script}_$backend.json" ${BENCH_ARGS:-} \
                >"$OUT/${script}_$backend.log" 2>&1
            echo "rc=$?"
            tail -22 "$OUT/${script}_$backend.log"
        done
    done
    ;;
esac
