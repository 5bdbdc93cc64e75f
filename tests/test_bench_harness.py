"""The benchmark harness `benchmarks/bench.py`: its FLOP count, and
`--quick` runs on the current backend, each row or contender in a process of
its own, that write the documented JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).parents[1] / "benchmarks"


@pytest.fixture
def rows():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import _rows

        yield _rows
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_processes_pool_every_timed_round(rows):
    import _processes  # beside _rows, on the path the fixture set

    first = {"train_samples_s_per_step": [1.0, 2.0], "train_s_per_step": 1.5}
    first.update(train_items_per_s=10.0, memory_mib=5, train_cpu_user_s_per_step=1.0)
    second = {"train_samples_s_per_step": [3.0, 4.0], "train_s_per_step": 3.5}
    second.update(train_items_per_s=5.0, memory_mib=7, train_cpu_user_s_per_step=3.0)
    pooled = _processes.pool_processes([first, second])
    assert pooled["train_samples_s_per_step"] == [1.0, 2.0, 3.0, 4.0]
    assert pooled["train_s_per_step"] == 2.5  # median of all four
    assert pooled["train_items_per_s"] == pytest.approx(6.0)  # 10 * 1.5 / 2.5
    assert pooled["memory_mib"] == 7 and pooled["train_cpu_user_s_per_step"] == 2.0


def test_train_flops_formula(rows):
    # 6 per parameter per token, plus 12 * layers * width * context per token.
    assert rows.train_flops(1_000_000, 1000, 2, 64, 100) == 6e9 + 12 * 2 * 64 * 100e3


def test_step_flops_of_published_rows(rows):
    gpt = rows.BY_NAME["gpt2_small"]  # tied embeddings: every parameter counts
    params = 124_439_808
    tokens = gpt.batch * gpt.seq
    expected = 6 * params * tokens + 12 * 12 * 768 * gpt.seq * tokens
    assert rows.step_flops(gpt, gpt.config(), params) == expected

    moe, dense = rows.BY_NAME["moe_smollm2"], rows.BY_NAME["moe_smollm2_dense"]
    cfg = moe.config()
    assert (cfg.hidden_dim, cfg.num_layers, cfg.moe.num_experts) == (576, 8, 8)
    # Total parameters of the MoE model; only 2 of 8 experts (and no input
    # table) count: the same FLOPs as the dense twin (SwiGLU of 2 x 1536).
    embed, expert = 49152 * 576, 3 * 576 * 1536
    attention_norms = 8 * (2 * 576 * 576 + 2 * 576 * 192 + 2 * 576)
    shared = 2 * embed + attention_norms + 576
    moe_params = shared + 8 * (8 * expert + 576 * 8)
    dense_params = shared + 8 * 2 * expert
    moe_flops = rows.step_flops(moe, cfg, moe_params)
    dense_flops = rows.step_flops(dense, dense.config(), dense_params)
    router = 6 * 8 * 576 * 8 * moe.batch * moe.seq
    assert moe_flops - router == pytest.approx(dense_flops)

    bert = rows.BY_NAME["bert_base"]  # a classifier: its word table is a lookup
    tokens, params = bert.batch * bert.seq, 109_483_778
    attention = 12 * 12 * 768 * bert.seq * tokens
    expected = 6 * (params - 30522 * 768) * tokens + attention
    assert rows.step_flops(bert, bert.config(), params) == expected

    t5 = rows.BY_NAME["t5_small"]  # encoder on 512 source, decoder on 128 target
    assert rows.step_flops(t5, t5.config(), 60_506_624) > 6 * 60_506_624 * 8 * 128


def test_floor_counts_every_product_of_a_step(rows):
    import bench_floor  # beside _rows, on the path the fixture set

    gpt = rows.BY_NAME["gpt2_small"]
    shapes = bench_floor.with_backward(bench_floor.products(gpt, gpt.config()))
    flops = sum(2 * b * m * k * n * count for (b, m, k, n), count in shapes.items())
    # The products' weights: the tied vocabulary table (the logits) and, per
    # layer, query/key/value, output and the two feed-forward kernels; the
    # position table, norms and biases are not products.
    weights = 50257 * 768 + 12 * (768 * 3 * 768 + 768 * 768 + 2 * 768 * 3072)
    tokens = gpt.batch * gpt.seq
    assert flops == 6 * weights * tokens + 12 * 12 * 768 * gpt.seq * tokens


def test_floor_quick_run_compares_with_a_bench_json(tmp_path):
    results = tmp_path / "run.json"
    steps = {"ours": {"train_s_per_step": 0.5}, "hf": {"train_s_per_step": 0.6}}
    results.write_text(
        json.dumps({"meta": {}, "rows": {"gpt2_tiny": {"contenders": steps}}})
    )
    out = tmp_path / "floor.json"
    cmd = [sys.executable, str(BENCHMARKS / "bench_floor.py"), "--quick"]
    cmd += ["--results", f"cpu={results}", "--json", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    row = json.loads(out.read_text())["rows"]["gpt2_tiny"]
    assert row["floor_s"] > 0 and row["tflops"] > 0 and row["shapes"]
    assert 0 < row["peak_fraction"] < 2
    assert row["steps"] == {"cpu/ours": 0.5, "cpu/hf": 0.6}
    assert "cpu hf" in proc.stdout and "x floor" in proc.stdout


def quick_run(tmp_path, backend, *options):
    """`bench.py --quick --repeats 1 *options` on `backend`: (stdout, JSON)."""
    out = tmp_path / "bench.json"
    env = {**os.environ, "KERAS_BACKEND": backend}
    cmd = [sys.executable, str(BENCHMARKS / "bench.py"), "--quick", "--repeats", "1"]
    cmd += [*options, "--json", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads(out.read_text())


@pytest.mark.once  # the process orchestration is the same on every backend
def test_quick_run_writes_json_with_each_row_in_its_own_process(tmp_path, backend):
    """A `--quick` run of two rows (training and generation), each row in a
    process of its own (`--row-processes`), writes the documented JSON:
    the run's facts from this process, each row's results from its own."""
    options = ["--rows", "gpt2_tiny,bert_tiny", "--contenders", "ours"]
    stdout, result = quick_run(tmp_path, backend, *options, "--row-processes")
    assert "load average at start" in stdout
    meta = result["meta"]
    assert meta["backend"] == backend
    assert meta["threads"]["cores"] >= 1
    assert meta["load_start"] is not None and meta["load_end"] is not None
    peak = meta["matmul_peak"]
    assert peak["tflops"] > 0 and peak["tflops"] == max(peak["by_library"].values())
    if meta["accelerator"] is None:  # every CPU-only process measures NumPy's
        assert "numpy" in peak["by_library"] and peak["dtype"] == "float32"
    assert meta["dtype"] == "float32" and meta["rows"] == ["gpt2_tiny", "bert_tiny"]
    rows = result["rows"]
    assert sorted(rows) == ["bert_tiny", "gpt2_tiny"]
    for row in rows.values():
        assert "error" not in row, row.get("error")
        assert row["contenders"]["ours"]["train_s_per_step"] > 0
    processes = {row["process"] for row in rows.values()}
    assert len(processes) == 2 and meta["process"] not in processes
    # The last training table (before the generation table) is the merged one.
    last_table = stdout[stdout.rindex("| s/step |") :].split("(training")[0]
    assert "gpt2_tiny" in last_table and "bert_tiny" in last_table
    row = rows["gpt2_tiny"]
    assert row["flops_per_step"] > 0
    ours = row["contenders"]["ours"]
    assert ours["params"] > 0
    assert ours["train_s_per_step"] > 0 and ours["train_first_step_s"] > 0
    assert ours["train_items_per_s"] > 0 and 0 < ours["train_peak_fraction"]
    assert ours["memory_mib"] > 0
    assert ours["train_cpu_user_s_per_step"] > 0
    assert ours["train_cpu_system_s_per_step"] >= 0
    assert ours["train_minor_faults_per_step"] >= 0
    for b in (1, row["batch"]):
        assert ours[f"gen_b{b}_prefill_s"] > 0
        assert ours[f"gen_b{b}_tokens_per_s"] > 0


@pytest.mark.once  # the process orchestration is the same on every backend
def test_contender_processes_run_each_contender_in_its_own_process(tmp_path, backend):
    options = ["--rows", "gpt2_tiny", "--contenders", "ours,kerashub,hf"]
    stdout, result = quick_run(
        tmp_path,
        backend,
        *options,
        "--mode",
        "train",
        "--contender-processes",
        "--process-rounds",
        "1",  # pooling rounds: test_processes_pool_every_timed_round
    )
    row = result["rows"]["gpt2_tiny"]
    assert "error" not in row and not row.get("errors"), row
    assert list(row["contenders"]) == ["ours", "kerashub", "hf"]
    processes = row["processes"]  # one process per contender and round
    pids = [pid for name in processes for pid in processes[name]]
    assert len(pids) == 3 and len(set(pids)) == 3
    assert result["meta"]["process"] not in pids
    # Hugging Face runs without the TensorFlow or JAX runtime beside it.
    assert row["process_backends"] == {
        "ours": backend,
        "kerashub": backend,
        "hf": "torch",
    }
    # The best peak measured in any process of the run is the denominator.
    assert row["matmul_peak"]["tflops"] >= result["meta"]["matmul_peak"]["tflops"]
    for r in row["contenders"].values():
        assert len(r["train_samples_s_per_step"]) == 1  # one timed round each
        assert r["train_s_per_step"] > 0 and 0 < r["train_peak_fraction"] <= 1
    assert 0 < row["ratios"]["train:ours/kerashub"]
    last_table = stdout[stdout.rindex("| contender |") :]
    assert "kerashub" in last_table and "kernel %" in last_table  # merged


def test_attention_bench_times_default_and_blockwise(rows, capsys):
    import bench_attention  # beside _rows, on the path the fixture set

    bench_attention.main(["--lengths", "32", "--blocks", "8", "--no-torch"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    length, *times = line.split(" | ")
    assert length == "32" and len(times) == 2
    assert all(float(ms) > 0 for ms in times)
