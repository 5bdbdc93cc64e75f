#!/usr/bin/env bash
# Installs the package with its test extras, then runs the whole test suite
# once per Keras backend (each in its own processes). Tests marked `once`
# run on PyTorch only (eager: no compilation, so the toy-size example runs
# take the least time there; the README's main job sets its own backend);
# the `large` tier (out of the contributors' fast loop) runs everywhere.
# Test files are spread over every core (pytest-xdist, one worker per core;
# each file's tests stay in one worker), handed out in collection order:
# the longest files first (tests/conftest.py). Each backend prints its 25
# slowest tests; the end prints each backend's wall time and the total
# against the suite's budget (CONTRIBUTING.md). Exits non-zero if any
# backend fails or runs no test (pytest's exit code 5, "no tests ran",
# counts as a failure).
set -uo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q "torch==2.13.0" -e ".[jax,torch,tests]" || exit 1
# Python may write its bytecode caches (some images set
# PYTHONDONTWRITEBYTECODE): each pytest worker and each command a test
# starts would otherwise compile the package's sources, and pytest rewrite
# every test file's asserts, again. Measured: 7 s of CPU per worker.
unset PYTHONDONTWRITEBYTECODE
status=0
times=()
suite_start=$SECONDS
for backend in jax tensorflow torch; do
    marker=()
    [ "$backend" = torch ] || marker=(-m "not once")
    echo "=== KERAS_BACKEND=${backend} ==="
    start=$SECONDS
    KERAS_BACKEND=${backend} python -m pytest -q -p no:cacheprovider \
        -n auto --dist loadfile --no-loadscope-reorder --durations=25 \
        "${marker[@]}" "$@"
    rc=$?
    times+=("${backend} $((SECONDS - start)) s")
    if [ "$rc" -ne 0 ]; then
        [ "$rc" -eq 5 ] && why="no test ran" || why="failures"
        echo "=== ${backend}: pytest exited ${rc} (${why}) ==="
        status=1
    fi
done
total=$((SECONDS - suite_start))
echo "=== wall time: ${times[0]}, ${times[1]}, ${times[2]}; suites ${total} s ==="
[ "$status" -eq 0 ] && echo "=== all backends passed ==="
exit $status
