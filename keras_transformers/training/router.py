"""Mixture-of-experts router statistics in `fit()` / `evaluate()` logs.

Every `SparseMoE` layer writes its latest statistics to non-trainable
variables while training or evaluating. A model with MoE layers owns one
`keras.metrics.Mean` per statistic, fed with the average over its MoE
layers after each step's loss (so the values travel through the compiled
train step on every backend and land in the logs, `History` and
TensorBoard like any metric):

* `router_aux_loss`: load-balancing loss (before its coefficient);
* `router_z_loss`: router z-loss (before its coefficient);
* `dropped_tokens`: share of routed assignments dropped by the capacity;
* `expert_load_<e>`: share of routed assignments sent to expert e
  (1 / num_experts each when balanced).
"""

from __future__ import annotations

import keras
from keras import ops


def moe_layers(model) -> list:
    """The `SparseMoE` layers of `model`, in block order."""
    from keras_transformers.layers.moe import SparseMoE

    return [
        layer
        for layer in model._flatten_layers(include_self=False)
        if isinstance(layer, SparseMoE)
    ]


class RouterMetrics:
    """Mean trackers of the router statistics of `layers` (all with the
    same number of experts)."""

    def __init__(self, layers):
        self.layers = list(layers)
        experts = self.layers[0].num_experts
        names = ["router_aux_loss", "router_z_loss", "dropped_tokens"]
        names += [f"expert_load_{e}" for e in range(experts)]
        self.metrics = [keras.metrics.Mean(name=name) for name in names]

    def values(self):
        """The statistics averaged over layers, in `metrics` order."""
        mean = lambda attr: ops.mean(  # noqa: E731
            ops.stack([getattr(layer, attr).value for layer in self.layers]),
            axis=0,
        )
        load = mean("expert_load")
        scalars = [mean("aux_loss"), mean("z_loss"), mean("dropped_fraction")]
        return scalars + [load[e] for e in range(ops.shape(load)[0])]

    def update(self):
        for metric, value in zip(self.metrics, self.values()):
            metric.update_state(value)


def track_routers(model) -> None:
    """Gives a task model the router statistics of its backbone's MoE
    layers: `model._router` (a `RouterMetrics`, None without MoE layers)
    and `model.router_metrics` (its means, which Keras then logs). Call
    `update_routers(model)` after each step's loss."""
    layers = moe_layers(model.backbone)
    model._router = RouterMetrics(layers) if layers else None
    model.router_metrics = model._router.metrics if layers else []


def update_routers(model) -> None:
    """Feeds the latest router statistics to `model`'s metrics (see
    `track_routers`); nothing for a model without MoE layers."""
    if model._router is not None:
        model._router.update()
