"""The real Gemma 3 270M (`gemma3_text`: sliding and full attention layers
with a rotary base each, q/k norms, a 262k-token vocabulary), loaded through
an `hf://` handle from an offline hub cache, generates `transformers`'
greedy tokens from the same weights."""

import shutil

import numpy as np
import pytest

import keras_transformers

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.once
PROMPT = "The capital of France is"
ANSWER = " the capital of the country of France."  # ../shared/DATA.md


def _offline_hub(monkeypatch, cache, repo_id, directory):
    """`hf://{repo_id}` resolves to `directory` through a hub cache laid out
    by hand (`models--org--name/refs/main`, `snapshots/<commit>/`), offline."""
    constants = pytest.importorskip("huggingface_hub.constants")
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("c" * 40)
    shutil.copytree(directory, repo / "snapshots" / ("c" * 40))
    for name, value in (("HF_HUB_CACHE", str(cache)), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def test_gemma3_270m_from_the_hub_generates_transformers_tokens(
    gemma3_270m_dir, tmp_path, monkeypatch
):
    tokenizer = transformers.AutoTokenizer.from_pretrained(gemma3_270m_dir)
    ids = tokenizer(PROMPT)["input_ids"]  # with its <bos>
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        gemma3_270m_dir, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        expected = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=10)[
            0, len(ids) :
        ].tolist()
    del hf
    _offline_hub(monkeypatch, tmp_path / "hub", "google/gemma-3-270m", gemma3_270m_dir)
    lm = keras_transformers.from_preset("hf://google/gemma-3-270m")
    config = lm.backbone.config
    assert config.layer_types.count("full_attention") == 3 and config.qk_norm
    ours = np.asarray(lm.generate([ids], max_new_tokens=len(expected)))[0, len(ids) :]
    assert ours.tolist() == expected
    assert lm.tokenizer.decode(expected).startswith(ANSWER)
    # Text in: the prompt gets the tokenizer's <bos>, as transformers' does.
    text = lm.generate(PROMPT, max_new_tokens=len(expected))
    assert text == tokenizer.decode(ids[1:] + expected)
