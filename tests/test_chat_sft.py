"""Supervised fine-tuning data: assistant-only masks from real chat
templates (equal to `transformers`' assistant masks where the template marks
them), completion-only examples, best-fit packing, and packed rows that
compute exactly what the same examples compute unpacked, on every backend."""

import keras
import numpy as np
import pytest
from contracts import compiled_forward, to_numpy

import keras_transformers as kt
from keras_transformers.data import (
    Example,
    completion_example,
    conversation_example,
    pack_rows,
    render_conversation,
    sft_dataset,
)
from keras_transformers.generation.chat import GEMMA_CHAT_TEMPLATE, special_tokens
from keras_transformers.training import MaskedSparseCategoricalCrossentropy

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "It is 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "Six, of course!"},
]
# ChatML (SmolLM2's layout) with the assistant's tokens marked by
# `{% generation %}`, which `transformers` reads for its assistant masks.
CHATML_MARKED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|im_end|>"
    "{% endgeneration %}{% else %}{{ m.content }}<|im_end|>{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _trained_runs(tokenizer, example):
    """The decoded text of each run of trained tokens."""
    runs, start = [], None
    for i, flag in enumerate([*example.trained, False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            runs.append(tokenizer.decode(example.ids[start:i]))
            start = None
    return runs


def _hf_tokenizer_dir(directory):
    from keras_transformers.tokenizer import load_hf_tokenizer

    return load_hf_tokenizer(directory)


def test_smollm2_template_trains_the_assistant_turns(smollm2_dir):
    tokenizer = _hf_tokenizer_dir(smollm2_dir)
    example = conversation_example(tokenizer, CONVERSATION)
    assert _trained_runs(tokenizer, example) == [
        "It is 4.<|im_end|>",
        "Six, of course!<|im_end|>",
    ]
    text, _ = render_conversation(
        CONVERSATION, tokenizer.chat_template, **special_tokens(tokenizer)
    )
    assert tokenizer.decode(example.ids) == text


def test_assistant_mask_equals_transformers(smollm2_dir):
    transformers = pytest.importorskip("transformers")
    theirs = transformers.AutoTokenizer.from_pretrained(smollm2_dir)
    out = theirs.apply_chat_template(
        CONVERSATION,
        chat_template=CHATML_MARKED,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=True,
    )
    ours = conversation_example(
        _hf_tokenizer_dir(smollm2_dir), CONVERSATION, chat_template=CHATML_MARKED
    )
    assert ours.ids == list(out["input_ids"])
    assert [int(t) for t in ours.trained] == list(out["assistant_masks"])


def test_gemma_layout_trains_the_model_turns(gemma3_270m_dir):
    tokenizer = _hf_tokenizer_dir(gemma3_270m_dir)
    example = conversation_example(
        tokenizer, CONVERSATION, chat_template=GEMMA_CHAT_TEMPLATE
    )
    assert _trained_runs(tokenizer, example) == [
        "It is 4.<end_of_turn>",
        "Six, of course!<end_of_turn>",
    ]
    assert example.ids[0] == tokenizer.bos_token_id


def test_completion_examples(smollm2_dir):
    tokenizer = _hf_tokenizer_dir(smollm2_dir)
    chat = completion_example(tokenizer, CONVERSATION[:2], "It is 4.")
    assert _trained_runs(tokenizer, chat) == ["It is 4.<|im_end|>"]
    plain = completion_example(tokenizer, "2+2=", " 4")
    assert _trained_runs(tokenizer, plain) == [" 4<|im_end|>"]  # SmolLM2's eos
    assert plain.ids[: len(tokenizer.encode("2+2="))] == tokenizer.encode("2+2=")


TOY = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


def test_render_conversation_errors():
    with pytest.raises(ValueError, match="no assistant turn"):
        render_conversation([{"role": "user", "content": "Hi"}], TOY)
    with pytest.raises(ValueError, match="starts with an assistant"):
        render_conversation([{"role": "assistant", "content": "Hi"}], TOY)
    rewrites = (  # marks the last turn: earlier renderings are no prefix
        "{% for m in messages %}{{ m.content }}{% if loop.last %}!{% endif %}"
        "{% endfor %}"
    )
    turns = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(ValueError, match="completion_example"):
        render_conversation(turns, rewrites)
    with pytest.raises(ValueError, match="no chat template"):
        conversation_example(type("Plain", (), {"chat_template": None})(), turns)


def test_pack_rows_best_fit_decreasing():
    assert pack_rows([5, 3, 4, 2, 6], 8) == [[4, 3], [0, 1], [2]]
    rows = pack_rows([7, 1, 1, 6, 2, 3], 8)
    assert sorted(i for row in rows for i in row) == list(range(6))
    assert len(rows) == 3


def _examples(rng, n=6, vocabulary=120):
    out = []
    for _ in range(n):
        length = int(rng.integers(4, 12))
        ids = rng.integers(3, vocabulary, length).tolist()
        prompt = int(rng.integers(1, length - 1))
        out.append(Example(ids, [False] * prompt + [True] * (length - prompt)))
    return out


def test_sft_dataset_layout(rng):
    examples = _examples(rng)
    plain = sft_dataset(examples, sequence_length=16)
    assert plain.x["token_ids"].shape == (6, 16) and "document_ids" not in plain.x
    first = examples[0]
    n = len(first.ids) - 1
    np.testing.assert_array_equal(plain.x["token_ids"][0, :n], first.ids[:-1])
    np.testing.assert_array_equal(plain.y[0, :n], first.ids[1:])
    np.testing.assert_array_equal(plain.sample_weight[0, :n], first.trained[1:])
    assert (
        not plain.x["padding_mask"][0, n:].any()
        and not plain.sample_weight[0, n:].any()
    )
    packed = sft_dataset(examples, sequence_length=16, pack=True)
    rows = packed.x["document_ids"]
    assert len(rows) < 6 and rows.max() >= 2
    assert packed.sample_weight.sum() == plain.sample_weight.sum()
    np.testing.assert_array_equal(packed.x["padding_mask"], rows > 0)
    cut = sft_dataset([Example(list(range(3, 30)), [True] * 27)], sequence_length=8)
    assert cut.num_truncated == 1 and cut.x["token_ids"].shape == (1, 8)
    with pytest.raises(ValueError, match="sequence_length"):
        sft_dataset(examples, sequence_length=0)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        sft_dataset([Example([5], [True])], sequence_length=8)
    with pytest.raises(ValueError, match="No example has a trained token"):
        sft_dataset([Example([5, 6, 7], [True, False, False])], sequence_length=8)


def _loss(logits, data):
    loss = MaskedSparseCategoricalCrossentropy()
    return float(keras.ops.convert_to_numpy(loss(data.y, logits, data.sample_weight)))


@pytest.mark.parametrize(
    "preset, overrides",
    [
        ("gpt2_tiny", {}),  # learned positions
        ("gpt_llama_tiny", {}),  # rotary
        ("gpt_llama_tiny", {"attention_block_size": 4}),  # blockwise attention
        ("mixtral_tiny_sliding", {}),  # sliding windows, experts
    ],
)
def test_packed_rows_equal_unpacked(rng, preset, overrides):
    model = kt.from_preset(preset, **overrides)
    examples = _examples(rng)
    plain = sft_dataset(examples, sequence_length=24)
    packed = sft_dataset(examples, sequence_length=24, pack=True)
    assert packed.x["document_ids"].max() >= 3  # rows of three or more examples
    # On JAX one compiled forward pass per shape (eager JAX compiles each op).
    logits = to_numpy(compiled_forward(model, packed.x))
    alone = to_numpy(compiled_forward(model, plain.x))
    np.testing.assert_allclose(_loss(logits, packed), _loss(alone, plain), rtol=2e-6)
    # Each packed example's logits are its unpacked ones.
    groups = pack_rows([len(e.ids) - 1 for e in examples], 24)
    for row, group in enumerate(groups):
        at = 0
        for i in group:
            n = len(examples[i].ids) - 1
            np.testing.assert_allclose(
                logits[row, at : at + n], alone[i, :n], atol=2e-5, rtol=1e-5
            )
            at += n


def test_fit_on_packed_rows_lowers_the_loss(rng):
    model = kt.from_preset("gpt_llama_tiny")
    data = sft_dataset(_examples(rng, n=8), sequence_length=24, pack=True)
    model.compile(
        optimizer=keras.optimizers.Adam(3e-3),
        loss=MaskedSparseCategoricalCrossentropy(),
    )
    history = model.fit(
        data.x,
        data.y,
        sample_weight=data.sample_weight,
        epochs=4,
        batch_size=4,
        verbose=0,
    )
    assert history.history["loss"][-1] < history.history["loss"][0]


def test_packed_rows_errors():
    model = kt.from_preset("gpt_llama_tiny")
    ids = np.ones((1, 6), "int32")
    with pytest.raises(ValueError, match="document_ids"):
        model({"token_ids": ids, "document_ids": np.ones((1, 5), "int32")})
    xl = kt.from_preset("gpt_transfo_xl_tiny")
    with pytest.raises(ValueError, match="unpacked rows"):
        xl({"token_ids": ids, "document_ids": np.ones((1, 6), "int32")})
