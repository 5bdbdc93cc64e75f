"""The serving benchmark `benchmarks/bench_serve.py`: its statistics, and a
`--quick` run of our two servers on the tiny model that prints the table
and the ratios and writes the JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


@pytest.fixture
def bench_serve():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_serve

        yield bench_serve
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_percentiles_and_summary(bench_serve):
    assert bench_serve.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert bench_serve.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 90) == pytest.approx(4.6)
    assert bench_serve.percentile([], 50) is None

    def request(ttft, tokens):
        return {
            "ttft_s": ttft,
            "latency_s": 1.0,
            "completion_tokens": tokens,
            "usage_reported": True,
        }

    rounds = [
        {"wall_s": 2.0, "requests": [request(0.1, 10), request(0.3, 10)]},
        {"wall_s": 1.0, "requests": [request(None, 0), request(0.2, 30)]},
        {"wall_s": 4.0, "requests": [request(0.4, 20)]},
    ]
    for one in rounds:
        one["server_cpu_s"] = 1.0
    summary = bench_serve.summarize(rounds)
    assert summary["tokens_per_s_rounds"] == [10.0, 30.0, 5.0]
    assert summary["tokens_per_s"] == 10.0  # the median round
    assert summary["requests"] == 5 and summary["completion_tokens"] == 70
    assert summary["without_text"] == 1  # left out of the TTFT figures
    assert summary["ttft_mean_s"] == pytest.approx(0.25)
    assert summary["server_cpu_s_per_token"] == pytest.approx(3 / 70)


@pytest.mark.once  # subprocess orchestration: the same on every backend
def test_quick_run_of_our_servers_prints_the_table(tmp_path, backend):
    pytest.importorskip("starlette")
    pytest.importorskip("uvicorn")
    pytest.importorskip("openai")
    out = tmp_path / "serve.json"
    cmd = [sys.executable, str(BENCHMARKS / "bench_serve.py"), "--quick"]
    cmd += ["--contenders", "ours_batched,ours_single", "--clients", "1,2"]
    cmd += ["--requests", "1", "--max-tokens", "4", "--json", str(out)]
    env = {**os.environ, "KERAS_BACKEND": backend}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| contender | clients | requests | tokens | tokens/s |" in proc.stdout
    assert "| ours_batched | 2 | 2 |" in proc.stdout
    assert "| clients | ours_batched/ours_single |" in proc.stdout
    assert "unavailable" not in proc.stdout
    result = json.loads(out.read_text())
    assert result["meta"]["keras_backend"] == backend
    assert result["meta"]["model"] == "tiny" and not result["unavailable"]
    for name in ("ours_batched", "ours_single"):
        levels = result["results"][name]["levels"]
        assert sorted(levels) == ["1", "2"]
        assert levels["2"]["requests"] == 2 and levels["2"]["tokens_per_s"] > 0
        assert levels["2"]["usage_reported"]
    assert set(result["ratios"]["ours_batched/ours_single"]) == {"1", "2"}
