"""A model's weights kept through a failed `fit`, `evaluate` or `predict`.

Keras' JAX trainer detaches the values of a model's variables when its
loop starts (it passes them through the compiled step as one state, and
holds a single copy of the weights that way) and attaches the step's
results when the loop ends. An exception in between, such as an input
check that rejects the first batch, skips the attaching: the variables
are left without values, and every later call of the model fails with
`TypeError: 'NoneType' object is not callable`. `KeepsStateOnError`
attaches the latest values again before the exception propagates, so a
corrected call works on the same model. Other backends never detach
anything; on TensorFlow an error drops the failed call's `tf.function`s
(the train function only if no step completed), so the next call traces
them afresh.
"""

from __future__ import annotations

import keras

_KEPT = "_values_before_purge"


class KeepsStateOnError:
    """Mixin for `keras.Model`s: after an exception in `fit`, `evaluate`
    or `predict` on JAX, the model keeps the weights of its last completed
    step (its weights before the call if no step completed)."""

    def fit(self, *args, **kwargs):
        return _keeping_state(self, super().fit, args, kwargs)

    def evaluate(self, *args, **kwargs):
        return _keeping_state(self, super().evaluate, args, kwargs)

    def predict(self, *args, **kwargs):
        return _keeping_state(self, super().predict, args, kwargs)

    def _purge_model_variables(
        self,
        trainable_variables=False,
        non_trainable_variables=False,
        optimizer_variables=False,
        metrics_variables=False,
    ):
        """Keras' JAX trainer hook that detaches the values: remembers them
        first. The compiled step donates them, so after one step these are
        deleted arrays and hold no memory."""
        groups = (
            (trainable_variables, lambda: self.trainable_variables),
            (non_trainable_variables, lambda: self.non_trainable_variables),
            (optimizer_variables, lambda: self.optimizer.variables),
            (metrics_variables, lambda: self.metrics_variables),
        )
        # Bypasses Keras' attribute tracking (not model state).
        self.__dict__[_KEPT] = [
            (v, v._value) for on, get in groups if on for v in get()
        ]
        super()._purge_model_variables(
            trainable_variables=trainable_variables,
            non_trainable_variables=non_trainable_variables,
            optimizer_variables=optimizer_variables,
            metrics_variables=metrics_variables,
        )


def _keeping_state(model, method, args, kwargs):
    steps = _steps(model)
    try:
        return method(*args, **kwargs)
    except BaseException as error:
        _reattach(model)
        if isinstance(error, Exception) and keras.config.backend() == "tensorflow":
            # A `tf.function` whose first trace failed must not be reused (a
            # later trace that builds the optimizer would be refused). The
            # train function is kept once it has run a step in this call:
            # its trace succeeded, and tracing it again costs seconds.
            if _steps(model) == steps:
                model.train_function = None
            model.test_function = model.predict_function = None
        raise
    finally:
        model.__dict__.pop(_KEPT, None)


def _steps(model):
    """On TensorFlow, the optimizer's completed steps (else None, as before
    it is built)."""
    optimizer = getattr(model, "optimizer", None)
    if (
        keras.config.backend() != "tensorflow"
        or optimizer is None
        or not optimizer.built
    ):
        return None
    return int(keras.ops.convert_to_numpy(optimizer.iterations))


def _alive(value) -> bool:
    return value is not None and not getattr(value, "is_deleted", lambda: False)()


def _reattach(model) -> None:
    """Gives every detached variable its latest live value: the last
    completed step's state (`model._jax_state`), else the value it had
    when the loop detached it."""
    state = getattr(model, "_jax_state", None)
    if state and not getattr(model, "_jax_state_synced", True):
        arrays = [a for group in state.values() for a in (group or ())]
        if all(_alive(a) for a in arrays):
            model.jax_state_sync()
    for variable, value in model.__dict__.get(_KEPT, ()):
        if variable._value is None and _alive(value):
            variable._value = value
    if state is not None:
        model._jax_state = None
