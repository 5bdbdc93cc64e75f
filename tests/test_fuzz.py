"""Property-based tests (hypothesis) over configs, model inputs and
`generate()` arguments of every family: each case either works (finite
outputs of the right shape, ids inside the vocabulary) or raises a
ValueError / TypeError from this library (`bad_inputs.assert_ours`).
Example counts are small: the catalogue in `bad_inputs.CASES` pins the
named cases, these tests look for the ones nobody named."""

import math

import numpy as np
import pytest
from bad_inputs import BASE, FAMILIES, VOCAB, assert_ours, build_models

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies
given, settings, HealthCheck = (
    hypothesis.given,
    hypothesis.settings,
    hypothesis.HealthCheck,
)

import keras  # noqa: E402

from keras_transformers import TransformerConfig  # noqa: E402

FEW = settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def models():
    return build_models()


def works_or_ours(fn):
    """`fn()`, or None when it raised a library ValueError / TypeError."""
    try:
        return fn()
    except (ValueError, TypeError) as error:
        assert_ours(error)
        return None


def _numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


# ------------------------------------------------------------------ configs
WEIRD = st.one_of(
    st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True, width=32),
    st.sampled_from(["", "layer", "rms", "rotary", "silu", "decoder", "64", "pre"]),
    st.none(),
    st.booleans(),
    st.lists(st.integers(-1, 3), max_size=2),
    st.dictionaries(st.sampled_from(["num_experts", "image_size"]), st.integers(0, 9)),
)
FIELDS = sorted(TransformerConfig.__dataclass_fields__) + ["hidden_size"]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    family=st.sampled_from(sorted(FAMILIES)),
    changes=st.dictionaries(st.sampled_from(FIELDS), WEIRD, min_size=1, max_size=3),
)
def test_config_fuzz(family, changes):
    config = works_or_ours(
        lambda: TransformerConfig.from_dict({**FAMILIES[family], **changes})
    )
    if config is not None:
        assert config.num_params() > 0
        assert TransformerConfig.from_dict(config.to_dict()) == config


# ------------------------------------------------------------- model inputs
DTYPES = ["int32", "int64", "uint8", "float32", "bool"]
SIZES = st.sampled_from([0, 1, 3, 33])


@st.composite
def id_arrays(draw, high=VOCAB + 2):
    shape = draw(st.lists(SIZES, min_size=0, max_size=3))
    dtype = draw(st.sampled_from(DTYPES))
    values = draw(st.integers(-2, high)) if draw(st.booleans()) else 3
    return np.full(shape, values).astype(dtype)


@st.composite
def token_inputs(draw):
    ids = draw(id_arrays())
    kind = draw(st.sampled_from(["bare", "dict", "mask", "bad_mask", "list"]))
    if kind == "bare":
        return ids
    if kind == "list":
        return ids.tolist()
    inputs = {"token_ids": ids}
    if kind != "dict":
        shape = ids.shape if kind == "mask" else ids.shape[:-1] + (2,)
        inputs["padding_mask"] = np.ones(shape, draw(st.sampled_from(DTYPES)))
    return inputs


def _check_output(out, batch):
    out = out["sequence_output"] if isinstance(out, dict) else out
    out = _numpy(out)
    assert out.shape[0] == batch and np.isfinite(out).all()


@pytest.mark.parametrize("family", ["gpt", "mixtral", "bert"])
@FEW
@given(inputs=token_inputs())
def test_token_inputs_fuzz(models, family, inputs):
    out = works_or_ours(lambda: models[family](inputs))
    if out is not None:
        ids = inputs["token_ids"] if isinstance(inputs, dict) else inputs
        _check_output(out, len(ids))


@FEW
@given(
    source=id_arrays(),
    target=id_arrays(),
    mask=st.sampled_from([None, "match", "short"]),
)
def test_seq2seq_inputs_fuzz(models, source, target, mask):
    inputs = {"encoder_token_ids": source, "decoder_token_ids": target}
    if mask is not None:
        inputs["encoder_padding_mask"] = (
            np.ones_like(source) if mask == "match" else np.ones((1, 1))
        )
    out = works_or_ours(lambda: models["seq2seq"](inputs))
    if out is not None:
        _check_output(out, len(source))


@FEW
@given(
    shape=st.tuples(
        st.sampled_from([0, 1, 2]),
        st.sampled_from([0, 4, 6, 8, 12]),
        st.sampled_from([4, 8]),
        st.sampled_from([1, 2, 3, 4]),
    ),
    rank=st.sampled_from([3, 4, 5]),
    dtype=st.sampled_from(["float32", "float16", "uint8", "int32"]),
    value=st.sampled_from([0.0, 255.0, 1e30, math.nan, -math.inf]),
)
def test_image_inputs_fuzz(models, shape, rank, dtype, value):
    shape = (shape + (1,))[:rank] if rank <= 4 else (1, *shape)
    with np.errstate(invalid="ignore", over="ignore"):
        images = np.full(shape, value).astype(dtype)
    out = works_or_ours(lambda: models["vit"](images))
    if out is not None:
        _check_output(out, shape[0])


# ------------------------------------------------------- generate() arguments
def _bad_or(*valid):
    """None (argument left out), one of `valid`, or an odd value."""
    odd = st.sampled_from([0, -1, 1.5, math.nan, math.inf, "x", [1], True, 10**6])
    return st.one_of(st.none(), st.sampled_from(valid), odd)


PROMPTS = st.sampled_from(
    [
        [[3, 4, 5]],
        [[3], [4, 5, 6]],
        np.array([[7, 8]], "int32"),
        np.array([9, 10], "int64"),
        {"token_ids": np.array([[3, 4]]), "padding_mask": np.array([[1, 0]])},
        [],
        [[]],
        [[VOCAB]],
        [[-1]],
        [[1.0, 2.0]],
        "text",
        [[1], "a"],
        None,
        7,
        np.ones((1, 1, 2), "int32"),
        [[3] * 40],
    ]
)
GENERATE = dict(
    max_new_tokens=_bad_or(1, 2),
    sampler=_bad_or("greedy", "top_k"),
    temperature=_bad_or(0.7),
    top_k=_bad_or(3),
    top_p=_bad_or(0.9),
    stop_token_ids=_bad_or(None, [2]),
    seed=_bad_or(0),
    repetition_penalty=_bad_or(1.0),
    min_new_tokens=_bad_or(0),
    stop_strings=_bad_or("."),
)


@st.composite
def generate_kwargs(draw, names):
    """Up to two of the arguments `names`, each valid or odd."""
    chosen = draw(st.lists(st.sampled_from(names), max_size=2, unique=True))
    drawn = {name: draw(GENERATE[name]) for name in chosen}
    return {k: v for k, v in drawn.items() if v is not None}


def _check_generated(out):
    out = np.asarray(out)
    assert out.ndim == 2 and out.dtype.kind == "i"
    assert ((out >= 0) & (out < VOCAB)).all()


@pytest.mark.parametrize("family", ["gpt", "mixtral"])
@FEW
@given(prompts=PROMPTS, kwargs=generate_kwargs(sorted(GENERATE)))
def test_generate_fuzz(models, family, prompts, kwargs):
    kwargs.setdefault("max_new_tokens", 2)
    out = works_or_ours(lambda: models[family].generate(prompts, **kwargs))
    if out is not None:
        _check_generated(out)


@FEW
@given(
    prompts=PROMPTS,
    kwargs=generate_kwargs(["max_new_tokens", "seed", "stop_token_ids"]),
    num_beams=_bad_or(1, 2),
    length_penalty=_bad_or(0.6),
)
def test_seq2seq_generate_fuzz(models, prompts, kwargs, num_beams, length_penalty):
    for name, value in (("num_beams", num_beams), ("length_penalty", length_penalty)):
        if value is not None:
            kwargs[name] = value
    kwargs.setdefault("max_new_tokens", 2)
    out = works_or_ours(lambda: models["seq2seq"].generate(prompts, **kwargs))
    if out is not None:
        _check_generated(out)


def test_base_config_is_valid():
    assert TransformerConfig.from_dict(BASE).num_params() > 0
