"""PEFT adapters of sequence classifiers (`task_type` `SEQ_CLS`): the LoRA
factors plus the trained head (`score` of `GPTClassifier`, `classifier` of
`BertClassifier`, PEFT's `modules_to_save`). Ours -> PEFT and PEFT -> ours
give the logits of `peft.PeftModel` on the `transformers`
`*ForSequenceClassification` of the same base checkpoint; a classifier's
adapter on a causal LM (and the reverse) or another number of classes raise
errors that say what to do."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft", reason="PEFT adapter tests need `peft`")

from hf_parity import hf_outputs, our_outputs, padded_batch, randomize, record  # noqa: E402

from keras_transformers.models import (  # noqa: E402
    BertClassifier,
    GPTCausalLM,
    GPTClassifier,
)

pytestmark = pytest.mark.filterwarnings("ignore:.*newly initialised")

VOCAB, LABELS = 96, 3
BASES = {
    "llama": dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
        tie_word_embeddings=False,
    ),
    "bert": dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        type_vocab_size=2,
        pad_token_id=0,
    ),
}
CLASSES = {"llama": GPTClassifier, "bert": BertClassifier}
HEAD = {"llama": "score", "bert": "classifier"}
TARGETS = {  # ours, PEFT's
    "llama": (("query", "key", "value", "attention_output"), ["q_proj", "o_proj"]),
    "bert": (("query", "value", "output"), ["query", "value", "dense"]),
}
TOLERANCE = 1e-5  # float32 logits of order 1


@pytest.fixture(scope="module")
def base_dirs(tmp_path_factory):
    """The base checkpoints, random-init: a Llama causal LM, a BERT encoder
    with its pooler."""
    root, dirs = tmp_path_factory.mktemp("base"), {}
    for kind, fields in BASES.items():
        config = transformers.AutoConfig.for_model(kind, **fields)
        torch.manual_seed(0)
        auto = transformers.AutoModelForCausalLM if kind == "llama" else None
        model = (auto or transformers.AutoModel).from_config(config)
        dirs[kind] = root / kind
        randomize(model).save_pretrained(dirs[kind])
    return dirs


def hf_classifier(path):
    """transformers' sequence classifier on the base checkpoint at `path`
    (a new head, which the adapter replaces)."""
    return transformers.AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=LABELS, attn_implementation="eager", dtype=torch.float32
    ).eval()


def ours(kind, path, **overrides):
    return CLASSES[kind].from_preset(path, num_classes=LABELS, **overrides)


def randomize_adapter(model, seed=0):
    """Noise of order 1 in every LoRA factor and in the head."""
    rng = np.random.default_rng(seed)
    variables = [
        v
        for layer in model._lora_state.layers
        for v in (layer.lora_kernel_a, layer.lora_kernel_b)
    ]
    for v in variables + list(model._lora_state.head):
        v.assign(rng.normal(0, 0.3, v.shape).astype("float32"))


def peft_adapter(path, directory, target_modules, seed=0):
    """A PEFT `SEQ_CLS` adapter made on `hf_classifier(path)` with non-zero
    `lora_B` and head, saved to `directory`; returns its logits."""
    config = peft.LoraConfig(
        task_type="SEQ_CLS", r=2, lora_alpha=5, target_modules=target_modules
    )
    model = peft.get_peft_model(hf_classifier(path), config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))
    model.save_pretrained(directory)
    ids, mask = padded_batch(VOCAB)
    return hf_outputs(model.eval(), ids, mask)


def peft_logits(path, adapter):
    model = peft.PeftModel.from_pretrained(hf_classifier(path), str(adapter)).eval()
    assert isinstance(model, peft.PeftModelForSequenceClassification)
    return hf_outputs(model, *padded_batch(VOCAB))


@pytest.mark.parametrize("kind", sorted(BASES))
def test_ours_to_peft(base_dirs, tmp_path, kind):
    model = ours(kind, base_dirs[kind])
    model.enable_lora(2, target=TARGETS[kind][0], alpha=3)
    randomize_adapter(model)
    model.save_adapter(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS"
    assert HEAD[kind] in config["modules_to_save"]
    # BERT's `dense` Linears left out stay out: full names as targets.
    assert all(
        m.endswith(("proj", "query", "value", "output.dense"))
        for m in config["target_modules"]
    )
    from safetensors.numpy import load_file

    saved = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert saved[f"base_model.model.{HEAD[kind]}.weight"].shape == (LABELS, 32)
    ids, mask = padded_batch(VOCAB)
    expected = peft_logits(base_dirs[kind], tmp_path / "adapter")
    record(f"{kind} classifier ours->peft", our_outputs(model, ids, mask), expected)
    assert np.abs(expected).max() > 0.5  # the head and factors matter


@pytest.mark.parametrize("kind", sorted(BASES))
def test_peft_to_ours_and_back(base_dirs, tmp_path, kind):
    expected = peft_adapter(base_dirs[kind], tmp_path / "adapter", TARGETS[kind][1])
    ids, mask = padded_batch(VOCAB)
    model = ours(kind, base_dirs[kind])
    model.load_adapter(tmp_path / "adapter")
    record(f"{kind} classifier peft->ours", our_outputs(model, ids, mask), expected)
    trainable = {id(v) for v in model.trainable_weights}
    assert id(getattr(model, HEAD[kind]).kernel) in trainable
    model.save_adapter(tmp_path / "again")
    again = peft_logits(base_dirs[kind], tmp_path / "again")
    record(f"{kind} classifier peft->ours->peft", again, expected)


# ------------------------------------------------------------------ errors
@pytest.fixture(scope="module")
def adapters(base_dirs, tmp_path_factory):
    """A PEFT classifier adapter (3 classes) and a causal-LM one."""
    root = tmp_path_factory.mktemp("adapters")
    peft_adapter(base_dirs["llama"], root / "cls", ["q_proj", "v_proj"])
    lm = transformers.AutoModelForCausalLM.from_pretrained(base_dirs["llama"])
    config = peft.LoraConfig(task_type="CAUSAL_LM", r=2, target_modules=["q_proj"])
    peft.get_peft_model(lm, config).save_pretrained(root / "lm")
    return root


def test_classifier_adapter_on_a_causal_lm(base_dirs, adapters):
    lm = GPTCausalLM.from_preset(base_dirs["llama"])
    with pytest.raises(
        ValueError,
        match=r"sequence-classification adapter.*"
        r"GPTClassifier\.from_preset\(base, num_classes=3\)",
    ):
        lm.load_adapter(adapters / "cls")
    assert getattr(lm, "_lora_state", None) is None


def test_causal_lm_adapter_on_a_classifier(base_dirs, adapters):
    model = ours("llama", base_dirs["llama"])
    with pytest.raises(ValueError, match="no trained `score` head.*GPTCausalLM"):
        model.load_adapter(adapters / "lm")
    assert getattr(model, "_lora_state", None) is None


def test_other_number_of_classes(base_dirs, adapters):
    model = GPTClassifier.from_preset(base_dirs["llama"], num_classes=5)
    with pytest.raises(ValueError, match="3 classes.*num_classes=5.*num_classes=3"):
        model.load_adapter(adapters / "cls")
    assert getattr(model, "_lora_state", None) is None


def test_bert_adapter_on_a_gpt_classifier(base_dirs, tmp_path):
    peft_adapter(base_dirs["bert"], tmp_path / "bert", ["query"])
    model = ours("llama", base_dirs["llama"])
    with pytest.raises(ValueError, match="another kind of model"):
        model.load_adapter(tmp_path / "bert")


def test_other_heads_keep_a_clear_error(tmp_path):
    from keras_transformers.models import BertTokenClassifier

    model = BertTokenClassifier.from_preset("bert_tiny", num_layers=1, num_classes=2)
    model.enable_lora(2)
    with pytest.raises(ValueError, match="sequence classifiers only.*save_lora"):
        model.save_adapter(tmp_path / "adapter")


def test_listed_pre_classifier_loads_and_its_tensors_are_named(
    base_dirs, adapters, tmp_path
):
    """PEFT (0.22 and later) lists DistilBERT's `pre_classifier` in every
    classifier's `modules_to_save`: listed without tensors, the adapter
    loads; with its tensors (trained whole), the error names them."""
    import shutil

    from safetensors.numpy import load_file, save_file

    directory = tmp_path / "listed"
    shutil.copytree(adapters / "cls", directory)
    path = directory / "adapter_config.json"
    config = json.loads(path.read_text())
    config["modules_to_save"] = ["classifier", "score", "pre_classifier"]
    path.write_text(json.dumps(config))
    model = ours("llama", base_dirs["llama"])
    model.load_adapter(directory)
    assert model._lora_state is not None

    weights = directory / "adapter_model.safetensors"
    tensors = load_file(str(weights))
    tensors["base_model.model.pre_classifier.weight"] = np.zeros((32, 32), np.float32)
    save_file(tensors, str(weights))
    model = ours("llama", base_dirs["llama"])
    with pytest.raises(ValueError, match=r"pre_classifier\.weight.*head only"):
        model.load_adapter(directory)
    assert getattr(model, "_lora_state", None) is None
