"""Writes tests/large_tests.txt, the tests the contributors' fast loop
(`pytest -m "not large"`) leaves out, from a suite run's measured times.

Run the whole suite with `KT_TEST_TIMES=/tmp/times.jsonl` (for instance
`KT_TEST_TIMES=/tmp/times.jsonl bash scripts/test_all.sh`; tests/conftest.py
writes one JSON line per test phase), then:

    python scripts/large_tests.py /tmp/times.jsonl

A test is large when its set-up plus call took `--seconds` (2 by default)
or more on some backend (`once` tests are large whether listed or not); the
multi-device cases run inside one test of tests/test_distribution.py.
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "large_tests.txt"
HEADER = """\
# The `large` tier besides the `once` tests: tests that took 2 s or more
# (set-up plus call) on some backend, on a 2-core CPU machine. The fast loop
# (`pytest -m "not large"`) leaves them out; CI runs them. Written by
# `python scripts/large_tests.py TIMES.jsonl` (CONTRIBUTING.md).
"""


def seconds_per_test(path: Path) -> dict[str, float]:
    """Each test's largest set-up plus call time over the backends."""
    per = collections.defaultdict(float)
    seen = set()
    for line in path.read_text().splitlines():
        row = json.loads(line)
        key = (row["backend"], row["test"], row["phase"])
        if key in seen or row["phase"] == "teardown":
            continue
        seen.add(key)
        per[row["backend"], row["test"]] += row["seconds"]
    largest = collections.defaultdict(float)
    for (_, test), seconds in per.items():
        largest[test] = max(largest[test], seconds)
    return largest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("times", type=Path, help="a KT_TEST_TIMES file")
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    times = seconds_per_test(args.times)
    large = sorted(
        test
        for test, seconds in times.items()
        if seconds >= args.seconds and "multidevice" not in test
    )
    OUT.write_text(HEADER + "".join(f"{test}\n" for test in large))
    print(f"{len(large)} of {len(times)} tests written to {OUT}")


if __name__ == "__main__":
    main()
