"""Every built-in preset validates, and its `params` figure is true."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import keras_transformers as kt
from keras_transformers import preset_io
from keras_transformers.config.param_count import classifier_params

ROOT = Path(__file__).resolve().parent.parent
ALL = kt.list_presets()

# Published sizes: name -> (params, relative tolerance)
PUBLISHED = {
    # transformers' Dinov2Model counted on the meta device, less its
    # embeddings.mask_token (D), which is not loaded.
    "dinov2_small": (22_056_576 - 384, 1e-9),
    "dinov2_base": (86_580_480 - 768, 1e-9),
    # transformers' DINOv3ViTModel from the published config.json on the
    # meta device, less its embeddings.mask_token (D), which is not loaded.
    "dinov3_vits16": (21_596_544 - 384, 1e-12),
    "dinov3_vitb16": (85_660_416 - 768, 1e-12),
    "gpt2_small": (124e6, 0.01),
    "gpt2_medium": (355e6, 0.01),
    "gpt2_large": (774e6, 0.01),
    "gpt2_xl": (1558e6, 0.01),
    "llama2_7b": (6.74e9, 0.005),
    "llama2_13b": (13.0e9, 0.01),
    "llama3_8b": (8.03e9, 0.005),
    # Exact: transformers' LlamaForCausalLM built from the published
    # config.json under torch.device("meta"), numel summed (tied for 3.2).
    "llama3.1_8b": (8_030_261_248, 1e-12),
    "llama3.2_1b": (1_235_814_400, 1e-12),
    "llama3.2_3b": (3_212_749_824, 1e-12),
    # Exact: transformers' Gemma2ForCausalLM / Gemma3ForCausalLM (Gemma 3 4B:
    # its text_config) built from the published config.json under
    # torch.device("meta"), numel summed (tied head once).
    "gemma2_2b": (2_614_341_888, 1e-12),
    "gemma2_9b": (9_241_705_984, 1e-12),
    "gemma3_270m": (268_098_176, 1e-12),
    "gemma3_1b": (999_885_952, 1e-12),
    "gemma3_4b": (3_880_263_168, 1e-12),
    # transformers' Gemma4ForCausalLM (text only) from the published
    # text_config under torch.device("meta"), numel summed (tied head once).
    "gemma4_e2b": (4_628_569_344, 1e-12),
    "gemma4_e4b": (7_463_013_376, 1e-12),
    "gemma4_31b": (30_697_345_280, 1e-12),
    "gemma4_26b_a4b": (25_233_141_760, 1e-12),
    # Exact: transformers' GPTNeoXForCausalLM built from the published
    # config.json under torch.device("meta"), numel summed.
    "pythia_160m": (162_322_944, 1e-12),
    "pythia_410m": (405_334_016, 1e-12),
    # Exact: transformers' Olmo2ForCausalLM built from the published
    # config.json under torch.device("meta"), numel summed.
    "olmo2_1b": (1_484_916_736, 1e-12),
    "olmo2_7b": (7_298_617_344, 1e-12),
    # Exact: transformers' SmolLM3ForCausalLM built from the published
    # config.json under torch.device("meta"), numel summed (tied head once).
    "smollm3_3b": (3_075_098_624, 1e-12),
    # Exact: transformers' GptOssForCausalLM built from the published
    # config.json under torch.device("meta"), numel summed.
    "gpt_oss_20b": (20_914_757_184, 1e-12),
    "gpt_oss_120b": (116_829_156_672, 1e-12),
    # BART: transformers' BartForConditionalGeneration parameter count (built
    # on the meta device, shared embedding once) less the 2 offset rows of
    # each position table, plus final_logits_bias (a buffer there).
    "bart_base": (139_420_416 - 2 * 2 * 768 + 50_265, 1e-9),
    "bart_large": (406_291_456 - 2 * 2 * 1024 + 50_265, 1e-9),
    # T5: transformers' T5ForConditionalGeneration built from the published
    # config.json under torch.device("meta"), the shared embedding once;
    # FLAN-T5 (v1.1) adds its own lm_head (transformers ties it to `shared`
    # until a checkpoint with a different lm_head.weight loads).
    "t5_small": (60_506_624, 1e-12),
    "t5_base": (222_903_552, 1e-12),
    "flan_t5_base": (222_903_552 + 32_128 * 768, 1e-12),
    # Exact: transformers' Qwen2Moe / Qwen3MoeForCausalLM built from the
    # published config.json under torch.device("meta"), numel summed.
    "qwen1.5_moe_a2.7b": (14_315_784_192, 1e-12),
    "qwen3_30b_a3b": (30_532_122_624, 1e-12),
    # Exact: transformers' Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM built
    # from Qwen3_5TextConfig() / Qwen3_5MoeTextConfig() (the 9B and
    # 35B-A3B text models) under torch.device("meta"), numel summed.
    "qwen3.5_9b": (8_953_803_264, 1e-12),
    "qwen3.5_35b_a3b": (34_660_610_688, 1e-12),
    # Exact: transformers' DebertaV2Model built from the published
    # config.json under torch.device("meta"), numel summed (184M, 141M, 71M).
    "deberta_v3_base": (183_831_552, 1e-12),
    "deberta_v3_small": (141_304_320, 1e-12),
    "deberta_v3_xsmall": (70_682_112, 1e-12),
    # transformers' DistilBertModel on the meta device (no pooler); its
    # XLMRobertaModel less the 2 offset rows of the position table.
    "distilbert_base": (66_362_880, 1e-12),
    "xlm_roberta_base": (278_043_648 - 2 * 768, 1e-12),
    # Exact: transformers' ElectraModel (no pooler) and AlbertModel (with
    # its pooler) built from the published config.json under
    # torch.device("meta"), numel summed (ALBERT's shared block once).
    "electra_small_discriminator": (13_483_008, 1e-12),
    "electra_base_discriminator": (108_891_648, 1e-12),
    "albert_base_v2": (11_683_584, 1e-12),
    "albert_large_v2": (17_683_968, 1e-12),
    # Exact: transformers' ModernBertModel built from the published
    # config.json under torch.device("meta"), numel summed.
    "modernbert_base": (149_014_272, 1e-12),
    "modernbert_large": (394_781_696, 1e-12),
    # Exact: transformers' EsmModel (no pooler) built from the published
    # config.json under torch.device("meta"), less its contact head
    # (num_layers * num_heads + 1), which is not converted.
    "esm2_t6_8m": (7_408_960, 1e-12),
    "esm2_t12_35m": (33_269_280, 1e-12),
    "esm2_t33_650m": (649_400_320, 1e-12),
}
# Image classifiers are published with their 1000-class head.
PUBLISHED_WITH_HEAD = {
    # transformers' DeiTForImageClassificationWithTeacher on the meta device.
    "deit_base_distilled_16": (87_338_192, 1e-9),
    "vit_tiny_16": (5.7e6, 0.01),
    "vit_small_16": (22e6, 0.01),
    "vit_base_16": (86e6, 0.01),
    "vit_large_16": (307e6, 0.01),  # the paper's Table 1; HF's checkpoint: 304.3M
    "vit_huge_14": (632e6, 0.001),
}


def test_every_family_prefix_has_a_tiny_preset():
    for family in {p["family"] for p in ALL.values()}:
        prefix = "transformer" if family == "transformer" else family
        assert any(
            n.startswith(prefix) and "tiny" in n
            for n, p in ALL.items()
            if p["family"] == family
        )


@pytest.mark.parametrize("name", sorted(ALL))
def test_preset_validates_and_params_match(name):
    data = preset_io.read_builtin(name)
    assert (
        {"family", "config", "metadata"}
        <= set(data)
        <= {
            "family",
            "config",
            "metadata",
            "task",
        }
    )
    assert {"description", "params", "reference"} <= set(data["metadata"])
    config = kt.load_config(name)
    assert data["metadata"]["params"] == config.num_params()
    if name in PUBLISHED:
        expected, tol = PUBLISHED[name]
        assert abs(config.num_params() - expected) / expected < tol
    if "num_classes" in data.get("task", {}):  # classifier head(s)
        task = data["task"]
        distilled = task.get("distillation_head", False)
        head = classifier_params(config, task["num_classes"], distilled)
        assert data["metadata"]["params_with_head"] == config.num_params() + head
    if name in PUBLISHED_WITH_HEAD:
        expected, tol = PUBLISHED_WITH_HEAD[name]
        assert abs(data["metadata"]["params_with_head"] - expected) / expected < tol


@pytest.mark.parametrize("name", [n for n, p in ALL.items() if p["params"] < 5e6])
def test_small_presets_build_with_matching_params(name):
    model = kt.from_preset(name)
    backbone = getattr(model, "backbone", model)  # `params` counts the backbone
    # Trainable weights: MoE layers also hold E + 3 router statistics each.
    trainable = sum(int(np.prod(w.shape)) for w in backbone.trainable_weights)
    assert trainable == ALL[name]["params"]
    if "params_with_head" in ALL[name]:
        assert model.count_params() == ALL[name]["params_with_head"]


@pytest.mark.once
def test_gpt2_small_builds_with_124m_params():
    model = kt.models.GPTCausalLM.from_preset("gpt2_small")
    assert model.count_params() == 124_439_808


def test_list_presets_filters_and_errors():
    gpt = kt.list_presets("gpt")
    assert "gpt2_small" in gpt and all(p["family"] == "gpt" for p in gpt.values())
    with pytest.raises(ValueError, match="family"):
        kt.list_presets("rnn")


def test_load_config_overrides_and_json_file(tmp_path):
    config = kt.load_config("gpt2_tiny", max_sequence_length=64)
    assert config.max_sequence_length == 64
    path = tmp_path / "mine.json"
    path.write_text(
        json.dumps({"family": "gpt", "config": config.to_dict(), "metadata": {}})
    )
    assert kt.load_config(str(path)) == config


def test_not_a_preset_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        kt.from_preset(str(tmp_path))


def test_a_preset_path_that_does_not_exist(tmp_path):
    for handle in (str(tmp_path / "no_such_run"), "./runs/no_such_run"):
        with pytest.raises(FileNotFoundError, match="that path does not exist"):
            kt.from_preset(handle)
    with pytest.raises(ValueError, match="Unknown preset 'gpt2_tinyy'"):
        kt.from_preset("gpt2_tinyy")


@pytest.mark.once
def test_wheel_ships_presets(tmp_path):
    """A non-editable install finds the presets from another directory."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(ROOT),
        ],
        check=True,
    )
    assert (
        target / "keras_transformers" / "preset_files" / "gpt" / "gpt2_small.json"
    ).exists()
    code = (
        "import keras_transformers as kt, sys;"
        "assert 'site' in kt.__file__, kt.__file__;"
        "m = kt.models.GPTBackbone.from_preset('gpt2_small', num_layers=1);"
        "print(kt.load_config('gpt2_small').num_params())"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("124439808")
