"""Exports other runtimes load: each model kind x format, on every backend.

Where Keras writes the format on the current backend, the artifact runs in
its runtime (TensorFlow's serving signature, the LiteRT interpreter,
onnxruntime) and gives the model's outputs; where it does not, export
raises `ExportError` naming what works instead. A missing converter or
runtime package skips with its name.
"""

import importlib.util

import keras
import numpy as np
import pytest

from keras_transformers import export
from keras_transformers.models import (
    BertClassifier,
    GPTCausalLM,
    MixtralCausalLM,
    Seq2SeqLM,
    ViTClassifier,
)

BATCH, LENGTH = 2, 8
RUNTIMES = {"tf_saved_model": "tensorflow", "onnx": "onnxruntime", "litert": None}


def _text(config, rng, prefix=""):
    ids = rng.integers(1, config.vocabulary_size, (BATCH, LENGTH)).astype("int32")
    mask = np.ones((BATCH, LENGTH), "int32")
    mask[1, -3:] = 0  # a padded row
    return {f"{prefix}token_ids": ids, f"{prefix}padding_mask": mask}


def _random_head(layer, rng):
    """A head of unit-scale weights (the presets' is near zero or zero), so
    that equal outputs mean something."""
    kernel = rng.normal(size=tuple(layer.kernel.shape)).astype("float32")
    layer.kernel.assign(kernel)


def _gpt(rng):
    model = GPTCausalLM.from_preset("gpt_llama_tiny")
    return model, _text(model.config, rng)


def _bert(rng):
    model = BertClassifier.from_preset("bert_tiny", num_classes=3)
    _random_head(model.classifier, rng)
    inputs = _text(model.config, rng)
    inputs["segment_ids"] = np.zeros((BATCH, LENGTH), "int32")
    inputs["segment_ids"][:, LENGTH // 2 :] = 1
    return model, inputs


def _vit(rng):
    model = ViTClassifier.from_preset("vit_tiny_28", num_classes=4)
    _random_head(model.classifier, rng)
    vision = model.config.vision
    shape = (BATCH, vision.image_size, vision.image_size, vision.num_channels)
    return model, {"images": (rng.random(shape) * 255).astype("float32")}


def _seq2seq(rng):
    model = Seq2SeqLM.from_preset("transformer_tiny")
    inputs = {**_text(model.config, rng, "encoder_")}
    inputs.update(_text(model.config, rng, "decoder_"))
    return model, inputs


def _mixtral(rng):
    model = MixtralCausalLM.from_preset("mixtral_tiny")
    return model, _text(model.config, rng)


KINDS = {
    "gpt": _gpt,
    "bert": _bert,
    "vit": _vit,
    "seq2seq": pytest.param(_seq2seq, marks=pytest.mark.large),
    "mixtral": pytest.param(_mixtral, marks=pytest.mark.large),
}


@pytest.fixture(scope="module", params=list(KINDS.values()), ids=list(KINDS))
def case(request):
    keras.utils.set_random_seed(0)
    model, inputs = request.param(np.random.default_rng(0))
    expected = keras.ops.convert_to_numpy(model(inputs, training=False))
    return model, inputs, expected


def _run_saved_model(path, inputs):
    import tensorflow as tf

    serve = tf.saved_model.load(path).signatures["serving_default"]
    outputs = serve(**{name: tf.constant(value) for name, value in inputs.items()})
    return [value.numpy() for value in outputs.values()]


def _run_onnx(path, inputs):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # no notes on unused initializers
    session = onnxruntime.InferenceSession(path, options)
    assert {i.name for i in session.get_inputs()} == set(inputs)
    return session.run(None, inputs)


def _litert_interpreter():
    if importlib.util.find_spec("ai_edge_litert") is not None:
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter
    if importlib.util.find_spec("tensorflow") is not None:
        import tensorflow as tf

        return tf.lite.Interpreter
    return None


def _run_litert(path, inputs):
    interpreter = _litert_interpreter()(model_path=path)
    runner = interpreter.get_signature_runner()
    return list(runner(**inputs).values())


RUN = {
    "tf_saved_model": _run_saved_model,
    "onnx": _run_onnx,
    "litert": _run_litert,
}


def _skip_without_runtime(format):
    if format == "litert":
        if _litert_interpreter() is None:
            pytest.skip("no LiteRT interpreter (pip install ai-edge-litert)")
        return
    name = RUNTIMES[format]
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"the {format} runtime {name} is not installed")


@pytest.mark.parametrize("format", export.FORMATS)
def test_artifact_runs_in_its_runtime_with_the_models_outputs(
    case, format, tmp_path, backend
):
    model, inputs, expected = case
    path = str(tmp_path / {"litert": "m.tflite", "onnx": "m.onnx"}.get(format, "m"))
    kwargs = {"batch_size": BATCH, "sequence_length": LENGTH}
    if (format, backend) in export.UNSUPPORTED:
        with pytest.raises(export.ExportError, match="Instead, export") as info:
            model.export(path, format=format, **kwargs)
        assert backend in str(info.value)
        return
    missing = [
        name
        for name in export.REQUIRED[format, backend]
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        with pytest.raises(ImportError, match="pip install"):
            model.export(path, format=format, **kwargs)
        pytest.skip(f"{format} on {backend} needs {', '.join(missing)}")
    _skip_without_runtime(format)
    model.export(path, format=format, **kwargs)
    (output,) = RUN[format](path, inputs)
    assert output.shape == expected.shape
    np.testing.assert_allclose(output, expected, rtol=1e-5, atol=1e-5)


def test_input_specs_follow_the_input_names():
    model = Seq2SeqLM.from_preset("transformer_tiny")
    specs = export.input_specs(model, 3, 10, decoder_sequence_length=5)
    assert {name: (spec.shape, spec.dtype) for name, spec in specs.items()} == {
        "encoder_token_ids": ((3, 10), "int32"),
        "encoder_padding_mask": ((3, 10), "int32"),
        "decoder_token_ids": ((3, 5), "int32"),
        "decoder_padding_mask": ((3, 5), "int32"),
    }
    vit = ViTClassifier.from_preset("vit_tiny_28", num_classes=2)
    assert export.input_specs(vit)["images"].shape == (1, 28, 28, 1)


def test_bad_arguments_raise_before_converting(tmp_path):
    model = GPTCausalLM.from_preset("gpt_llama_tiny")
    with pytest.raises(export.ExportError, match="sequence_length=None"):
        export.export_model(model, tmp_path / "m.onnx", format="onnx")
    with pytest.raises(export.ExportError, match="at most max_sequence_length"):
        export.input_specs(model, sequence_length=10**6)
    with pytest.raises(export.ExportError, match="Supported formats"):
        model.export(tmp_path / "m", format="tflite", sequence_length=4)
    if ("litert", keras.config.backend()) not in export.UNSUPPORTED:
        with pytest.raises(export.ExportError, match="end with '.tflite'"):
            model.export(tmp_path / "m.lite", format="litert", sequence_length=4)


def test_a_failed_conversion_is_one_clear_error(tmp_path, monkeypatch, backend):
    format = "onnx"  # every backend can write it

    def fails(*args, **kwargs):
        raise RuntimeError("unsupported op Foo\n  deep converter details")

    monkeypatch.setattr(export, "_check_packages", lambda *args: None)
    monkeypatch.setattr(keras.Model, "export", fails)
    model = GPTCausalLM.from_preset("gpt_llama_tiny")
    with pytest.raises(export.ExportError) as info:
        model.export(tmp_path / "m.onnx", format=format, sequence_length=4)
    message = str(info.value)
    assert "GPTCausalLM" in message and backend in message
    assert "RuntimeError: unsupported op Foo" in message
    assert "deep converter details" not in message
    assert info.value.__suppress_context__


def test_a_missing_converter_names_the_package(monkeypatch, backend):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "onnx" else real(name, *args),
    )
    with pytest.raises(ImportError, match="pip install .*onnx"):
        export.check_supported("onnx", backend)


def test_support_table():
    assert export.supported_backends("onnx") == ["tensorflow", "jax", "torch"]
    assert export.supported_backends("tf_saved_model") == ["tensorflow", "jax"]
    assert export.supported_backends("litert") == ["tensorflow", "torch"]
    with pytest.raises(export.ExportError, match="Instead, export 'litert' under"):
        export.check_supported("litert", "jax")


def test_onnx_friendly_arange_gives_the_same_values():
    from keras_transformers.backend.export import onnx_friendly_arange

    expected = keras.ops.convert_to_numpy(keras.ops.arange(5))
    with onnx_friendly_arange():
        got = keras.ops.convert_to_numpy(keras.ops.arange(5))
        stepped = keras.ops.convert_to_numpy(keras.ops.arange(1, 7, 2))
    assert got.dtype == expected.dtype and (got == expected).all()
    assert stepped.tolist() == [1, 3, 5]
