"""Compiled training paths: `compile(jit_compile=True)` trains and evaluates
every family with the same losses as eager execution.

PyTorch compiles through `torch.compile` (Dynamo + Inductor): one
compilation per train / test function, no recompilation at later steps,
and no graph break inside the model (the one break left is Keras' own
`loss.backward()` call, which Dynamo does not trace). TensorFlow compiles
through XLA. JAX always compiles, so it has nothing to compare.

Every family runs through `torch.compile` in the suite (a compiled path
that no run checks breaks unseen): Dynamo's tracing, guards and graph
breaks, and AOTAutograd's joint forward / backward graph are what a model
can break. Inductor's C++ code generation takes 50-80 s per family on 2
cold-cache cores, so one family (`INDUCTOR_FAMILY`) runs the full Inductor
pipeline and the others compile with `backend="aot_eager"` (the same
Dynamo and AOTAutograd graphs, run by eager kernels): 22 s instead.
"""

import contextlib
import gc
import logging

import keras
import numpy as np
import pytest

from keras_transformers.models import (
    BertBackbone,
    BertClassifier,
    GPTCausalLM,
    MixtralCausalLM,
    Seq2SeqLM,
    ViTClassifier,
)
from keras_transformers.training.losses import MaskedSparseCategoricalCrossentropy
from tests.contracts import assert_close, graph_ancestors, without_inductor

BATCH, STEPS, LENGTH = 4, 3, 8


def _tokens(rng, vocabulary, length=LENGTH):
    return rng.integers(3, vocabulary, (BATCH * STEPS, length)).astype("int32")


def _causal_lm(cls, preset):
    def make(rng):
        model = cls.from_preset(preset, num_layers=1)
        ids = _tokens(rng, model.config.vocabulary_size, LENGTH + 1)
        mask = np.ones((len(ids), LENGTH), bool)
        mask[0, 5:] = False  # a padded row
        x = {"token_ids": ids[:, :-1], "padding_mask": mask}
        return (
            model,
            x,
            ids[:, 1:],
            MaskedSparseCategoricalCrossentropy(from_logits=True),
        )

    return make


def _bert(rng):
    backbone = BertBackbone.from_preset(
        "bert_tiny", num_layers=1, dropout=0.0, attention_dropout=0.0
    )
    model = BertClassifier(backbone, num_classes=2, classifier_dropout=0.0)
    ids = _tokens(rng, backbone.config.vocabulary_size)
    x = {
        "token_ids": ids,
        "padding_mask": np.ones(ids.shape, bool),
        "segment_ids": np.zeros(ids.shape, "int32"),
    }
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, x, np.arange(len(ids)) % 2, loss


def _vit(rng):
    model = ViTClassifier.from_preset("vit_tiny_28", num_classes=4, num_layers=1)
    x = rng.uniform(0, 255, (BATCH * STEPS, 28, 28, 1)).astype("float32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, x, np.arange(len(x)) % 4, loss


def _seq2seq(rng):
    model = Seq2SeqLM.from_preset("transformer_tiny", num_layers=1)
    source = _tokens(rng, model.config.vocabulary_size)
    target = _tokens(rng, model.config.vocabulary_size, LENGTH + 1)
    x = {
        "encoder_token_ids": source,
        "encoder_padding_mask": np.ones(source.shape, bool),
        "decoder_token_ids": target[:, :-1],
        "decoder_padding_mask": np.ones((len(target), LENGTH), bool),
    }
    return model, x, target[:, 1:], MaskedSparseCategoricalCrossentropy(ignore_class=0)


INDUCTOR_FAMILY = "llama"
FAMILIES = {
    "gpt2": _causal_lm(GPTCausalLM, "gpt2_tiny"),
    "llama": _causal_lm(GPTCausalLM, "gpt_llama_tiny"),
    "mixtral": _causal_lm(MixtralCausalLM, "mixtral_tiny"),
    "bert": _bert,
    "vit": _vit,
    "seq2seq": _seq2seq,
}


class _BatchLosses(keras.callbacks.Callback):
    """Each training step's loss, and a probe's value after each step."""

    def __init__(self, probe=None):
        super().__init__()
        self.losses, self.probes, self.probe = [], [], probe

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))
        if self.probe is not None:
            self.probes.append(self.probe())


def _fit(model, x, y, loss, jit_compile, probe=None):
    # SGD: Adam's first steps turn float32 noise in near-zero gradients into
    # full-size updates, which no tolerance on the weights survives.
    model.compile(
        optimizer=keras.optimizers.SGD(0.1), loss=loss, jit_compile=jit_compile
    )
    record = _BatchLosses(probe)
    history = model.fit(
        x,
        y,
        batch_size=BATCH,
        epochs=1,
        shuffle=False,
        verbose=0,
        validation_data=(x, y),
        callbacks=[record],
    )
    return record, history.history["val_loss"][-1]


def _compiled_matches_eager(family, rng, probe=None):
    """Fits one model eagerly and an identical one compiled; returns the
    compiled run's record after checking losses and weights agree."""
    make = FAMILIES[family]
    keras.utils.set_random_seed(0)
    eager, x, y, loss = make(rng)
    keras.utils.set_random_seed(0)
    compiled, _, _, _ = make(np.random.default_rng(0))
    compiled(x if not isinstance(x, dict) else {k: v[:1] for k, v in x.items()})
    eager(x if not isinstance(x, dict) else {k: v[:1] for k, v in x.items()})
    compiled.set_weights(eager.get_weights())

    eager_record, eager_val = _fit(eager, x, y, loss, jit_compile=False)
    record, val = _fit(compiled, x, y, loss, jit_compile=True, probe=probe)
    assert_close(record.losses, eager_record.losses, atol=1e-4, rtol=1e-5)
    assert_close(val, eager_val, atol=1e-4, rtol=1e-5)
    for a, b in zip(compiled.get_weights(), eager.get_weights()):
        assert_close(a, b, atol=1e-4)
    return record


@contextlib.contextmanager
def _model_graph_breaks():
    """Collects the graph breaks `torch.compile` takes outside Keras' own
    `loss.backward()` call and optimizer update (its SGD reads the learning
    rate as a number), that is, in the models."""
    import torch

    found = []
    keras_own = ("loss.backward()", "self.optimizer.apply(")

    class Handler(logging.Handler):
        def emit(self, record):
            message = record.getMessage()
            if "Graph break in user code" in message and not any(
                own in message for own in keras_own
            ):
                found.append(message)

    handler = Handler()
    logger = logging.getLogger("torch._dynamo")
    torch._logging.set_logs(graph_breaks=True)
    logger.addHandler(handler)
    try:
        yield found
    finally:
        logger.removeHandler(handler)
        torch._logging.set_logs()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_torch_compile_fit_matches_eager_without_recompiles(
    family, rng, backend, monkeypatch
):
    if backend != "torch":
        pytest.skip("torch.compile is PyTorch's compiler")
    import torch
    from torch._dynamo.utils import counters

    if family != INDUCTOR_FAMILY:
        without_inductor(monkeypatch)

    torch._dynamo.reset()
    counters.clear()
    with _model_graph_breaks() as breaks:
        record = _compiled_matches_eager(
            family, rng, probe=lambda: counters["stats"]["unique_graphs"]
        )
    # Every graph is compiled during the first step; later steps reuse them.
    assert len(set(record.probes)) == 1, record.probes
    assert not breaks, breaks[0]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_xla_fit_matches_eager(family, rng, backend):
    if backend != "tensorflow":
        pytest.skip("XLA through tf.function(jit_compile=True) is TensorFlow's")
    _compiled_matches_eager(family, rng)


def test_optimizer_update_runs_outside_the_compiled_graph(backend):
    """`run_eagerly` (the optimizers' `apply` under `torch.compile`) runs its
    function eagerly on every call of a compiled program; elsewhere it is a
    plain call."""
    from keras_transformers.backend.compiled import run_eagerly

    seen = []

    def update(x):
        if backend == "torch":
            import torch

            seen.append(torch.compiler.is_compiling())
        else:
            seen.append(False)
        return x + 1

    def step(x):
        return run_eagerly(update, x * 2) * 3

    if backend == "torch":
        import torch

        step = torch.compile(step)
    x = keras.ops.ones((4,))
    for _ in range(3):
        out = step(x)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), np.full(4, 9.0))
    assert seen == [False, False, False]


def _compiled_tiny_lm(**compile_args):
    """A 1-layer `gpt2_tiny` compiled with `jit_compile=True` and the
    library's loss, and a [4, 8] batch of token ids."""
    model = GPTCausalLM.from_preset("gpt2_tiny", num_layers=1)
    model.compile(
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
        **compile_args,
    )
    return model, np.random.default_rng(0).integers(3, 100, (4, 8)).astype("int32")


def test_torch_compiled_fit_refuses_steps_per_execution(backend):
    """The compiled PyTorch train function keeps Keras' refusal of
    `steps_per_execution > 1` on PyTorch (a clear error, not a silent
    single step)."""
    if backend != "torch":
        pytest.skip("a PyTorch-only limit")
    model, ids = _compiled_tiny_lm(optimizer="sgd", steps_per_execution=2)
    with pytest.raises(ValueError, match="steps_per_execution"):
        model.fit(ids, ids, verbose=0)


def test_torch_compiled_train_step_is_one_graph_without_breaks(backend, monkeypatch):
    """A compiled PyTorch training step is one graph (the forward pass and
    the loss; `torch.compile` compiles its backward with it), traced once,
    with no graph break at all: gradients, the optimizer update and the
    metrics run outside it. (Graphs and breaks are Dynamo's: Inductor's
    code generation is left out here, and checked by the `llama` case.)"""
    if backend != "torch":
        pytest.skip("torch.compile is PyTorch's compiler")
    import torch
    from torch._dynamo.utils import counters

    without_inductor(monkeypatch)

    model, ids = _compiled_tiny_lm(
        optimizer="adamw", metrics=["sparse_categorical_accuracy"]
    )
    torch._dynamo.reset()
    counters.clear()
    before = model.get_weights()
    for _ in range(3):
        logs = model.train_on_batch(ids, ids, return_dict=True)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert set(logs) == {"loss", "sparse_categorical_accuracy"}
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_compiled_training_refuses_torch_that_drops_router_losses():
    """Before torch 2.13 a compiled step leaves `add_loss` losses out: a
    model whose MoE layers add router losses is refused there, with the
    fix; a dense model, or one whose router-loss coefficients are zero,
    is not."""
    from keras_transformers.backend.compiled import check_losses_survive_compiling

    moe = MixtralCausalLM.from_preset("mixtral_tiny", num_layers=2)
    with pytest.raises(ValueError, match=r"torch>=2.13, or compile with jit_compile"):
        check_losses_survive_compiling(moe, "2.11.0+cu130")
    check_losses_survive_compiling(moe, "2.13.0+cpu")
    check_losses_survive_compiling(GPTCausalLM.from_preset("gpt2_tiny"), "2.11.0")
    quiet = {"moe": {"router_aux_loss_coef": 0.0, "router_z_loss_coef": 0.0}}
    silent = MixtralCausalLM.from_preset("mixtral_tiny", num_layers=1, **quiet)
    check_losses_survive_compiling(silent, "2.11.0")


def _tf_lm_counting_traces(monkeypatch, step_name="train_step", **compile_args):
    """A 1-layer `gpt2_tiny` compiled for TensorFlow's traced `fit` (AdamW;
    `compile_args` such as metrics), its [4, 8] token ids, and a list that
    grows by one per trace of its `step_name` (`train_step`, `test_step`):
    the graph being traced."""
    import tensorflow as tf

    model, ids = _compiled_tiny_lm()
    model.compile(  # TensorFlow's traced step, not `jit_compile=True`
        optimizer="adamw",
        loss=MaskedSparseCategoricalCrossentropy(from_logits=True),
        **compile_args,
    )
    traces = []
    step = getattr(type(model), step_name)
    monkeypatch.setattr(
        type(model),
        step_name,
        lambda self, d: (
            traces.append(tf.compat.v1.get_default_graph()) or step(self, d)
        ),
    )
    return model, ids, traces


@pytest.mark.parametrize("step_name", ["train_step", "test_step"])
def test_tensorflow_traces_the_first_step_once(backend, monkeypatch, step_name):
    """The model's optimizer and compiled metrics are built before
    TensorFlow traces the train (or test) function: a variable created
    inside the first trace would make `tf.function` trace the whole step
    again."""
    if backend != "tensorflow":
        pytest.skip("tf.function's tracing")
    model, ids, traces = _tf_lm_counting_traces(
        monkeypatch, step_name, metrics=["sparse_categorical_accuracy"]
    )
    if step_name == "train_step":
        model.fit(ids, ids, batch_size=2, epochs=2, verbose=0)
        assert model.optimizer.built
    else:
        model.evaluate(ids, ids, batch_size=2, verbose=0)
    assert len(traces) == 1


def test_tensorflow_keeps_the_traced_step_after_a_fit_fails_later(backend, monkeypatch):
    """A `fit` that raises after completed steps (an interrupting callback)
    leaves its traced train function for the next `fit`: no second trace."""
    if backend != "tensorflow":
        pytest.skip("tf.function's tracing")

    class Interrupt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("interrupted")

    model, ids, traces = _tf_lm_counting_traces(monkeypatch)
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(ids, ids, batch_size=2, verbose=0, callbacks=[Interrupt()])
    model.fit(ids, ids, batch_size=2, verbose=0)
    assert len(traces) == 1
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 3


def test_tensorflow_updates_the_weights_after_the_backward_pass(backend, monkeypatch):
    """In a traced TensorFlow step every write of the optimizer (AdamW's
    weight decay included, which needs no gradient) waits for the
    gradients. Run at the step's start, the decay would write a copy of
    every weight that the backward pass still reads."""
    if backend != "tensorflow":
        pytest.skip("tf.function's graphs")
    model, ids, graphs = _tf_lm_counting_traces(monkeypatch)
    model.fit(ids, ids, batch_size=4, verbose=0)

    writes = ("AssignVariableOp", "AssignSubVariableOp", "AssignAddVariableOp")
    (graph,) = graphs
    updates = [
        op
        for op in graph.get_operations()
        if op.type in writes and op.name.startswith(model.optimizer.name + "/")
    ]
    # AdamW writes each weight twice (decay, update) and its two moments.
    assert len(updates) >= 4 * len(model.trainable_weights)
    for op in updates:
        assert any(a.name.startswith("gradient_tape/") for a in graph_ancestors(op)), (
            op.name
        )


def test_tensorflow_frees_the_traces_of_a_dropped_model(backend):
    """A model fitted (with a Keras optimizer given by name) and dropped
    leaves none of its traced graphs behind: Keras' gradient all-reduce
    kept each train step's graph for the life of the process."""
    if backend != "tensorflow":
        pytest.skip("tf.function's traced graphs")

    def fit_one():
        model = GPTCausalLM.from_preset("gpt2_tiny", num_layers=1)
        model.compile(
            optimizer="adam", loss=MaskedSparseCategoricalCrossentropy(from_logits=True)
        )
        ids = np.random.default_rng(0).integers(3, 100, (4, 8)).astype("int32")
        model.fit(ids, ids, batch_size=2, verbose=0)

    def graphs():
        gc.collect()
        return sum(type(o).__name__ == "FuncGraph" for o in gc.get_objects())

    fit_one()
    before = graphs()
    fit_one()
    assert graphs() == before
