"""Random-number state saved with a model's weights.

Keras layers draw dropout masks (and MoE router jitter, augmentation) from
`keras.random.SeedGenerator`s whose state advances every training step.
Keras leaves that state out of `save_weights` and `.keras` files, so a model
restored from a checkpoint draws different masks than the run that wrote it
and training does not continue identically. Models that mix in
`SavesRandomState` add the state of their seed generators to their own
entry of the weights file (as `seed_generator_<i>` arrays), and restore it
when the file holds the same number of them; files without them, or with a
different count (e.g. saved with dropout, loaded without), leave the
generators as they are.
"""

from __future__ import annotations

PREFIX = "seed_generator_"


def _index(key: str) -> int:
    return int(key[len(PREFIX) :])


class SavesRandomState:
    """Mixin for `keras.Model`s: seed-generator states in saved weights.

    Each model saves the generators of its layers, except those inside a
    nested model that mixes this in too (that model saves its own).
    """

    def _random_state_variables(self) -> list:
        """The seed-generator state variables (`[2]` ints each) this model
        saves, in layer order."""
        nested = [
            layer
            for layer in self._flatten_layers(include_self=False)
            if isinstance(layer, SavesRandomState)
        ]
        skip = {id(v) for layer in nested for v in layer.variables}
        skip.update(id(w) for w in self.weights)
        return [v for v in self.variables if id(v) not in skip]

    def save_own_variables(self, store) -> None:
        super().save_own_variables(store)
        for i, variable in enumerate(self._random_state_variables()):
            store[f"{PREFIX}{i}"] = variable

    def load_own_variables(self, store) -> None:
        keys = list(store.keys())
        seeds = sorted((k for k in keys if k.startswith(PREFIX)), key=_index)
        super().load_own_variables(
            {k: store[k] for k in keys if not k.startswith(PREFIX)}
        )
        states = self._random_state_variables()
        if seeds and len(seeds) == len(states):
            for key, variable in zip(seeds, states):
                variable.assign(store[key])
