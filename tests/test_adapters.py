"""LoRA adapters in Hugging Face PEFT's format (`save_adapter`,
`load_adapter`): ours -> PEFT and PEFT -> ours give the logits of
`peft.PeftModel` on the `transformers` model of the same checkpoint."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft", reason="PEFT adapter tests need `peft`")

from hf_parity import (  # noqa: E402
    hf_outputs,
    our_outputs,
    padded_batch,
    randomize,
    record,
    reference,
)

import keras_transformers  # noqa: E402
from keras_transformers import hub  # noqa: E402

VOCAB = 96
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    bos_token_id=0,
    eos_token_id=1,
)
TINY = {
    "llama": dict(tie_word_embeddings=False),
    "qwen2": dict(use_sliding_window=False, tie_word_embeddings=True),
    "gemma": dict(head_dim=16, hidden_act="gelu_pytorch_tanh", pad_token_id=0),
}
ALL = ("query", "key", "value", "attention_output", "gate", "intermediate", "output")
TOLERANCE = 3e-5  # float32 logits of order 1-10


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root, dirs = tmp_path_factory.mktemp("hf"), {}
    for kind, extra in TINY.items():
        config = transformers.AutoConfig.for_model(kind, **COMMON, **extra)
        torch.manual_seed(0)
        model = randomize(transformers.AutoModelForCausalLM.from_config(config))
        dirs[kind] = root / kind
        model.save_pretrained(dirs[kind])
    return dirs


def randomize_lora(model, seed=0):
    rng = np.random.default_rng(seed)
    for layer in model._lora_state.layers:
        for v in (layer.lora_kernel_a, layer.lora_kernel_b):
            v.assign(rng.normal(0, 0.2, v.shape).astype("float32"))


def peft_logits(path, adapter, ids, mask):
    model = peft.PeftModel.from_pretrained(reference(path), str(adapter)).eval()
    return hf_outputs(model, ids, mask)


def peft_adapter(path, directory, seed=0, **lora):
    """A PEFT LoRA adapter made on the transformers model at `path`, with
    non-zero `lora_B`, saved to `directory`; returns its logits."""
    model = peft.get_peft_model(reference(path), peft.LoraConfig(**lora))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=generator))
    model.save_pretrained(directory)
    ids, mask = padded_batch(VOCAB)
    return hf_outputs(model.eval(), ids, mask)


@pytest.mark.parametrize(
    "kind, target",
    [("llama", ALL), ("qwen2", ("query", "value", "output")), ("gemma", ALL)],
)
def test_ours_to_peft(hf_dirs, tmp_path, kind, target):
    lm = keras_transformers.from_preset(hf_dirs[kind])
    lm.enable_lora(3, target=target, alpha=5)
    randomize_lora(lm)
    lm.save_adapter(tmp_path / "adapter", base_model_name_or_path="org/base")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["task_type"] == "CAUSAL_LM"
    assert config["r"] == 3 and config["lora_alpha"] == 5
    assert config["base_model_name_or_path"] == "org/base"
    ids, mask = padded_batch(VOCAB)
    expected = peft_logits(hf_dirs[kind], tmp_path / "adapter", ids, mask)
    record(f"ours->peft {kind}", our_outputs(lm, ids, mask), expected, mask, TOLERANCE)


@pytest.mark.parametrize(
    "kind, lora",
    [
        ("llama", dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])),
        (
            "llama",
            dict(
                r=3,
                lora_alpha=5,
                use_rslora=True,
                target_modules=["k_proj", "o_proj", "up_proj", "down_proj"],
            ),
        ),
        (
            "qwen2",
            dict(
                r=2,
                lora_alpha=4,
                target_modules=["q_proj", "gate_proj"],
                rank_pattern={"gate_proj": 5},
                alpha_pattern={"q_proj": 7},
            ),
        ),
    ],
    ids=["llama", "llama_rslora", "qwen2_patterns"],
)
def test_peft_to_ours_and_merged(hf_dirs, tmp_path, kind, lora):
    expected = peft_adapter(hf_dirs[kind], tmp_path / "adapter", **lora)
    ids, mask = padded_batch(VOCAB)
    lm = keras_transformers.from_preset(hf_dirs[kind])
    lm.load_adapter(tmp_path / "adapter")
    record(f"peft->ours {kind}", our_outputs(lm, ids, mask), expected, mask, TOLERANCE)
    # ... saved again: PEFT reads the same adapter back.
    lm.save_adapter(tmp_path / "again")
    again = peft_logits(hf_dirs[kind], tmp_path / "again", ids, mask)
    record(f"peft->ours->peft {kind}", again, expected, mask, TOLERANCE)
    if lora.get("use_rslora"):
        config = json.loads((tmp_path / "again" / "adapter_config.json").read_text())
        scale = config["lora_alpha"] / np.sqrt(config["r"])
        assert config["use_rslora"] and np.isclose(scale, 5 / np.sqrt(3))
    lm.merge_lora()
    merged = our_outputs(lm, ids, mask)
    record(f"peft->ours merged {kind}", merged, expected, mask, TOLERANCE)
    with pytest.raises(ValueError, match="before `merge_lora"):
        lm.save_adapter(tmp_path / "late")


def test_round_trip_ours(hf_dirs, tmp_path):
    lm = keras_transformers.from_preset(hf_dirs["llama"])
    lm.enable_lora(2, target=("key", "gate", "attention_output"), alpha=3)
    randomize_lora(lm, seed=1)
    lm.save_adapter(tmp_path / "adapter")
    other = keras_transformers.from_preset(hf_dirs["llama"])
    other.load_adapter(str(tmp_path / "adapter"))
    ids, mask = padded_batch(VOCAB)
    record("ours->ours", our_outputs(other, ids, mask), our_outputs(lm, ids, mask))
    # Loading onto a model with the same LoRA already enabled: values only.
    other.load_adapter(tmp_path / "adapter")
    record(
        "ours->ours again", our_outputs(other, ids, mask), our_outputs(lm, ids, mask)
    )


def test_fresh_preset_model_with_equal_kernels(tmp_path):
    """A built-in preset's kernels can be equal across layers; the adapter
    still names each one."""
    keras_transformers.models.GPTCausalLM  # noqa: B018
    lm = keras_transformers.from_preset("gpt_llama_tiny", num_layers=2)
    lm.enable_lora(2, target=("query", "output"))
    randomize_lora(lm)
    lm.save_adapter(tmp_path / "adapter")
    with open(tmp_path / "adapter" / "adapter_config.json") as f:
        assert sorted(json.load(f)["target_modules"]) == ["down_proj", "q_proj"]
    from safetensors.numpy import load_file

    names = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert len(names) == 8 and all(
        n.startswith("base_model.model.model.layers.") for n in names
    )


# ------------------------------------------------------------------ errors
def _edit_config(directory, **changes):
    path = directory / "adapter_config.json"
    config = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def saved(hf_dirs, tmp_path_factory):
    directory = tmp_path_factory.mktemp("adapter") / "adapter"
    peft_adapter(hf_dirs["llama"], directory, r=2, target_modules=["q_proj", "v_proj"])
    return directory


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(peft_type="IA3"), "IA3 adapter"),
        (dict(use_dora=True), "DoRA"),
        (dict(bias="all"), "trained biases"),
        (dict(modules_to_save=["lm_head"]), "modules_to_save"),
    ],
)
def test_unsupported_options_are_named(hf_dirs, saved, tmp_path, changes, match):
    import shutil

    directory = tmp_path / "adapter"
    shutil.copytree(saved, directory)
    _edit_config(directory, **changes)
    lm = keras_transformers.from_preset(hf_dirs["llama"])
    with pytest.raises(ValueError, match=match):
        lm.load_adapter(directory)
    assert getattr(lm, "_lora_state", None) is None


def test_missing_files_and_unknown_modules(hf_dirs, saved, tmp_path):
    lm = keras_transformers.from_preset(hf_dirs["llama"])
    with pytest.raises(FileNotFoundError, match="adapter_config.json is missing"):
        lm.load_adapter(tmp_path)
    (tmp_path / "adapter_config.json").write_text(
        (saved / "adapter_config.json").read_text()
    )
    (tmp_path / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(FileNotFoundError, match="never unpickled"):
        lm.load_adapter(tmp_path)
    peft_adapter(hf_dirs["llama"], tmp_path / "head", r=2, target_modules=["lm_head"])
    with pytest.raises(ValueError, match="lm_head"):
        lm.load_adapter(tmp_path / "head")


def test_shape_mismatch_names_the_tensor(hf_dirs, saved, tmp_path):
    from safetensors.numpy import load_file, save_file

    directory = tmp_path / "adapter"
    directory.mkdir()
    (directory / "adapter_config.json").write_text(
        (saved / "adapter_config.json").read_text()
    )
    tensors = load_file(str(saved / "adapter_model.safetensors"))
    name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    tensors[name] = np.zeros((2, 40), np.float32)
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    lm = keras_transformers.from_preset(hf_dirs["llama"])
    with pytest.raises(ValueError, match=name.replace(".", r"\.")):
        lm.load_adapter(directory)


def test_save_needs_lora(hf_dirs, tmp_path):
    lm = keras_transformers.from_preset(hf_dirs["llama"])
    with pytest.raises(ValueError, match="enable_lora"):
        lm.save_adapter(tmp_path / "adapter")


def test_offline_hub_handle(saved, tmp_path, monkeypatch):
    """`hf://` adapters come from the hub cache offline; nothing cached: the
    error says so and where."""
    from huggingface_hub import constants

    cache = tmp_path / "cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(hub.HubAccessError, match="offline") as error:
        keras_transformers.adapters.resolve("hf://org/adapter")
    assert str(cache) in str(error.value)
    snapshot = cache / "models--org--adapter" / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (cache / "models--org--adapter" / "refs").mkdir()
    (cache / "models--org--adapter" / "refs" / "main").write_text("0" * 40)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        (snapshot / name).write_bytes((saved / name).read_bytes())
    assert keras_transformers.adapters.resolve("hf://org/adapter") == snapshot
