"""`fit`, `evaluate` and `predict` with bad data: token ids past the
vocabulary in NumPy arrays are rejected before any step (a compiled step
cannot read them), and a call that raises (an input check rejecting a
batch) leaves the model usable, with the weights of its last completed
step: Keras' JAX trainer detaches the variables' values during those
loops, and the models attach them again (`backend/jax_state.py`)."""

import keras
import numpy as np
import pytest

from keras_transformers.models import GPTCausalLM, ViTClassifier


def _weights(model):
    return [keras.ops.convert_to_numpy(v).copy() for v in model.weights]


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.fixture
def lm():
    model = GPTCausalLM.from_preset("gpt2_tiny", num_layers=1)
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    return model


IDS = np.arange(16, dtype="int32").reshape(2, 8) % 50 + 1


@pytest.mark.parametrize("method", ["predict", "evaluate", "fit"])
def test_a_rejected_first_batch_keeps_the_weights(lm, method):
    before = _weights(lm)
    call = getattr(lm, method)
    labels = () if method == "predict" else (IDS,)
    with pytest.raises(ValueError, match="integer tensor of token ids"):
        call(IDS.astype("float32"), *labels, verbose=0)
    assert _same(_weights(lm), before)
    expected = keras.ops.convert_to_numpy(lm(IDS))
    np.testing.assert_allclose(lm.predict(IDS, verbose=0), expected, atol=1e-5)
    history = lm.fit(IDS, IDS, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    assert not _same(_weights(lm), before)


@pytest.mark.skipif(
    keras.config.backend() == "tensorflow",
    reason="TensorFlow's generator adapter casts every batch to the first one's dtype",
)
def test_a_batch_rejected_after_training_steps_keeps_their_weights(lm):
    """A generator's second batch fails: the model keeps the first step's
    weights (not those from before `fit`) and trains on."""
    before = _weights(lm)

    def batches():
        yield IDS, IDS
        yield IDS.astype("float32"), IDS

    with pytest.raises(ValueError, match="integer tensor of token ids"):
        lm.fit(batches(), steps_per_epoch=2, epochs=1, verbose=0)
    after_one_step = _weights(lm)
    assert not _same(after_one_step, before)
    assert all(np.isfinite(w).all() for w in after_one_step if w.dtype.kind == "f")
    assert int(keras.ops.convert_to_numpy(lm.optimizer.iterations)) == 1
    lm.fit(IDS, IDS, epochs=1, verbose=0)
    assert int(keras.ops.convert_to_numpy(lm.optimizer.iterations)) == 2


@pytest.mark.parametrize("method", ["predict", "evaluate", "fit"])
def test_numpy_ids_outside_the_vocabulary_or_empty_are_rejected_first(lm, method):
    before = _weights(lm)
    labels = () if method == "predict" else (IDS,)
    vocabulary = lm.config.vocabulary_size
    past = IDS.copy()
    past[1, 3] = vocabulary
    with pytest.raises(ValueError, match=f"id {vocabulary}, outside"):
        getattr(lm, method)(past, *labels, verbose=0)
    with pytest.raises(ValueError, match="id -1, outside"):
        getattr(lm, method)({"token_ids": IDS - 2}, *labels, verbose=0)
    with pytest.raises(ValueError, match="is empty"):
        getattr(lm, method)(IDS[:0], *(y[:0] for y in labels), verbose=0)
    assert _same(_weights(lm), before)


def test_image_models_skip_the_token_id_check():
    """Integer images reach the image check, not a vocabulary check."""
    vit = ViTClassifier.from_preset("vit_tiny_28", num_classes=3, num_layers=1)
    images = np.zeros((2, 28, 28, 3), "uint8")
    with pytest.raises(ValueError, match="`images` must be floats"):
        vit.predict(images, verbose=0)
