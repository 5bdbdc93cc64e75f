#!/usr/bin/env bash
# The test suite and the benchmarks on a GPU machine, for the backends its
# Python holds (the lent H100 had PyTorch and JAX, no TensorFlow).
#
#   bash scripts/device_check.sh tests   # both suites, in parallel workers
#   bash scripts/device_check.sh bench   # benchmarks/gpu.sh: bench.py, bf16
#
# Where that Python lacks Keras and KerasHub, put their wheels in .whl/
# first (made on another machine with `pip download --no-deps
# --python-version 3.12 --only-binary=:all: -d .whl keras==3.15.1 namex
# optree keras-hub keras-nlp kagglehub kagglesdk`, with the target's
# platform tags); the script installs them to /tmp/site. Logs and JSON go to
# $OUT (default ./device_out). See benchmarks/README.md, "On a GPU".
set -uo pipefail
cd "$(dirname "$0")/.."
source scripts/device_env.sh
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
            -v -p no:cacheprovider -n "${WORKERS:-6}" -m "not once" "${skip[@]}" \
            --junitxml="$OUT/tests_$backend.xml" \
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
    # bench.py's published rows in bfloat16, once per backend (benchmarks/gpu.sh).
    exec bash benchmarks/gpu.sh
    ;;
esac
