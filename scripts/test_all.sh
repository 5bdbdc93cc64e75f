#!/usr/bin/env bash
# Installs the package with its test extras, then runs the whole test suite
# once per Keras backend. Exits non-zero if any backend fails or runs no test
# (pytest exit code 5 counts as a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0" -e ".[jax,torch,tests]" || exit 1
status=0
for backend in jax tensorflow torch; do
    echo "=== KERAS_BACKEND=${backend} ==="
    KERAS_BACKEND=${backend} python -m pytest -q -p no:cacheprovider "$@"
    rc=$?
    if [ "$rc" -ne 0 ]; then
        echo "=== ${backend}: pytest exited ${rc} ($([ "$rc" -eq 5 ] && echo 'no test ran' || echo 'failures')) ==="
        status=1
    fi
done
exit $status
