"""Per-layer variety in one config: each layer's type and its settings.

A `TransformerConfig` describes its layers with `layer_types` (one entry
per layer) and `layer_settings` (per type, the settings that differ from
the config's own); in an encoder a sliding layer's window is symmetric
(each token sees `sliding_window // 2` positions on either side). Without
`layer_types`, every layer has one type: "sliding_attention" when the
config has a `sliding_window` (Mistral: every layer slides), else
"full_attention". A type may carry defaults of its
own: "no_rope_attention" is full attention without rotary positions
(SmolLM3's NoPE layers). A "linear_attention" layer is no attention at
all: its token mixer is a Gated DeltaNet (the config's `linear_attention`
group; Qwen3-Next, Qwen3.5), a recurrence whose decoding cache is a
fixed-size state.

Config fields for layers that differ in what they read (Gemma 4):

- `value_norm`: RMS-normalise each value head, without learned scales.
- `num_kv_shared_layers`: the last this many decoder layers have no key or
  value projections (nor cache): each reuses the keys and values of the
  last earlier layer of its type (`kv_sharing`); 0: none.
- `kv_shared_intermediate_dim`: the feed-forward width of those layers
  (Gemma 4's `use_double_wide_mlp`: twice `intermediate_dim`); None:
  `intermediate_dim`.
- `per_layer_input_dim` (P) and `per_layer_vocabulary_size` (None:
  `vocabulary_size`): per-layer input embeddings (Gemma 4's
  `hidden_size_per_layer_input`, see
  `keras_transformers.layers.per_layer_inputs`); None: none.
- `layer_output_scale`: each block multiplies its output by a constant `[1]`
  weight, loaded with the checkpoint, neither trained nor counted in
  `num_params()` (Gemma 4's `layer_scalar` buffer).

Pure Python: the config validates with it before any framework is
imported.

Examples:
    >>> from keras_transformers import TransformerConfig
    >>> config = TransformerConfig(
    ...     vocabulary_size=100, num_layers=3, hidden_dim=32, num_heads=4,
    ...     intermediate_dim=64, position_embedding="rotary",
    ...     rope_max_wavelength=1e6, sliding_window=8,
    ...     layer_types=["sliding_attention", "sliding_attention", "full_attention"],
    ...     layer_settings={"sliding_attention": {"rope_max_wavelength": 1e4}},
    ... )
    >>> [layer_settings(config, i)["sliding_window"] for i in range(3)]
    [8, 8, None]
    >>> layer_settings(config, 0)["rope_max_wavelength"]
    10000.0
"""

from __future__ import annotations

# The kinds of layer a stack can have.
LAYER_TYPES = (
    "full_attention",
    "sliding_attention",
    "no_rope_attention",
    "linear_attention",
)
# Types whose token mixer is a recurrence (a state, no attention).
RECURRENT_TYPES = ("linear_attention",)
# Settings a type has unless `layer_settings` says otherwise.
TYPE_DEFAULTS = {"no_rope_attention": {"rotary": False}}
# The settings a type may change, and what each is.
SETTINGS = {
    "sliding_window": "attention span of a sliding layer (an integer >= 1)",
    "rope_max_wavelength": "rotary base (a number >= 1)",
    "rope_scaling_factor": "linear rotary interpolation (a number > 0)",
    "rope_scaling": "a Hugging Face rotary scaling dict, or None",
    "rotary": "rotary positions in this type's layers (True or False)",
    "rotary_fraction": "the part of each head that rotates (a number in (0, 1])",
    "head_dim": "the head size H of this type's layers (an integer >= 1)",
    "num_kv_heads": "key/value heads of this type's layers (a divisor of num_heads)",
    "value_from_key": "values are the key projection's output (True or False)",
}


def layer_type(config, index: int) -> str:
    """The type of layer `index` (0-based) of `config`'s stack."""
    if config.layer_types is not None:
        return config.layer_types[index]
    return (
        "sliding_attention" if config.sliding_window is not None else "full_attention"
    )


def typed(config, causal: bool) -> bool:
    """Whether a stack of `config` has per-layer types: a causal one, or an
    encoder's (`stacks="encoder"`, whose sliding layers are symmetric
    windows); a seq2seq encoder stack has full-attention layers only."""
    return causal or config.stacks == "encoder"


def layer_settings(config, index: int, causal: bool = True) -> dict:
    """The resolved attention settings of layer `index`: `sliding_window`
    (None for a full-attention layer), `rope_max_wavelength` (None without
    rotary positions), `rope_scaling_factor`, `rope_scaling`,
    `rotary_fraction`, `head_dim`, `num_kv_heads` and `value_from_key`. The
    layers of a stack that is not `causal` are typed only in an encoder (see
    `typed`)."""
    kind = layer_type(config, index) if typed(config, causal) else "full_attention"
    own = {
        **TYPE_DEFAULTS.get(kind, {}),
        **(config.layer_settings or {}).get(kind, {}),
    }
    window = None
    if kind == "sliding_attention":
        window = own.get("sliding_window", config.sliding_window)
    rotary = config.rotary and own.get("rotary", True)
    return dict(
        sliding_window=window,
        rope_max_wavelength=(
            float(own.get("rope_max_wavelength", config.rope_max_wavelength))
            if rotary
            else None
        ),
        rope_scaling_factor=float(
            own.get("rope_scaling_factor", config.rope_scaling_factor)
        ),
        rope_scaling=own.get("rope_scaling", config.rope_scaling),
        rotary_fraction=float(own.get("rotary_fraction", config.rotary_fraction)),
        head_dim=own.get("head_dim", config.resolved_head_dim),
        num_kv_heads=own.get("num_kv_heads", config.resolved_num_kv_heads),
        value_from_key=own.get("value_from_key", False),
    )


def recurrent(config) -> bool:
    """Whether a layer of `config`'s stack carries a recurrent state (a
    "linear_attention" layer): decoding then must feed it real tokens
    only, in order (no position can be written twice)."""
    types = config.layer_types or ()
    return any(kind in RECURRENT_TYPES for kind in types)


def sliding_windows(config) -> list:
    """Each layer's sliding window (None: full attention) in a decoder."""
    return [
        layer_settings(config, i)["sliding_window"] for i in range(config.num_layers)
    ]


def check_layer_types(config, fail) -> None:
    """Validates `layer_types` and `layer_settings` of `config`; `fail(name,
    value, expected)` raises."""
    types, settings = config.layer_types, config.layer_settings
    if types is not None:
        if config.stacks == "encoder_decoder":
            fail("layer_types", types, 'None unless stacks="decoder" or "encoder"')
        ok = isinstance(types, (list, tuple)) and len(types) == config.num_layers
        if not ok or any(kind not in LAYER_TYPES for kind in types):
            fail(
                "layer_types",
                types,
                f"a list of num_layers={config.num_layers} entries, each one of "
                f"{LAYER_TYPES}",
            )
    linear = types is not None and "linear_attention" in types
    if linear and config.linear_attention is None:
        fail(
            "linear_attention",
            None,
            "a LinearAttentionConfig: layer_types has 'linear_attention' layers",
        )
    if not linear and config.linear_attention is not None:
        fail(
            "linear_attention",
            config.linear_attention,
            "None unless layer_types has 'linear_attention' entries",
        )
    if settings is None:
        return
    if not isinstance(settings, dict) or any(k not in LAYER_TYPES for k in settings):
        fail("layer_settings", settings, f"a dict keyed by layer types {LAYER_TYPES}")
    for kind, own in settings.items():
        if not isinstance(own, dict) or any(k not in SETTINGS for k in own):
            known = "; ".join(f"{k}: {v}" for k, v in SETTINGS.items())
            fail(f"layer_settings[{kind!r}]", own, f"a dict of these settings: {known}")
        window = own.get("sliding_window", 1)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            fail(
                f"layer_settings[{kind!r}]['sliding_window']", window, "an integer >= 1"
            )
        for flag in ("rotary", "value_from_key"):
            if not isinstance(own.get(flag, True), bool):
                fail(f"layer_settings[{kind!r}][{flag!r}]", own[flag], "True or False")
        for size in ("head_dim", "num_kv_heads"):
            value = own.get(size, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                fail(f"layer_settings[{kind!r}][{size!r}]", value, "an integer >= 1")
        if config.num_heads % own.get("num_kv_heads", 1):
            fail(
                f"layer_settings[{kind!r}]['num_kv_heads']",
                own["num_kv_heads"],
                f"a divisor of num_heads={config.num_heads}",
            )
        if kind == "no_rope_attention" and own.get("rotary") is True:
            fail(
                "layer_settings['no_rope_attention']['rotary']",
                True,
                "False (layers with rotary positions are 'full_attention')",
            )


def kv_sharing(config, index: int) -> tuple:
    """`(store, reuse)` of layer `index` (each a layer type or None) with
    `num_kv_shared_layers`: the last `num_kv_shared_layers` layers reuse the
    keys and values of the last earlier layer of their type, which stores
    them (see `keras_transformers.layers.kv_sharing`)."""
    first = config.num_layers - config.num_kv_shared_layers
    if not config.num_kv_shared_layers:
        return None, None
    kind = layer_type(config, index)
    if index >= first:
        return None, kind
    later = [layer_type(config, i) for i in range(index + 1, first)]
    return (None if kind in later else kind), None


def check_layer_inputs(config, fail) -> None:
    """Validates the per-layer inputs and the KV sharing of `config`."""
    for name in ("value_norm", "layer_output_scale"):
        if not isinstance(getattr(config, name), bool):
            fail(name, getattr(config, name), "True or False")
    for name in ("per_layer_input_dim", "per_layer_vocabulary_size"):
        value = getattr(config, name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            fail(name, value, "None or an integer >= 1")
    if config.per_layer_input_dim is not None and config.stacks != "decoder":
        fail(
            "per_layer_input_dim",
            config.per_layer_input_dim,
            'None unless stacks="decoder"',
        )
    shared = config.num_kv_shared_layers
    if (
        isinstance(shared, bool)
        or not isinstance(shared, int)
        or not (0 <= shared < config.num_layers)
    ):
        fail(
            "num_kv_shared_layers",
            shared,
            f"an integer in [0, num_layers={config.num_layers})",
        )
    if shared and (config.stacks != "decoder" or config.remat):
        fail(
            "num_kv_shared_layers", shared, '0 unless stacks="decoder" and remat=False'
        )
    first = config.num_layers - shared
    producers = {layer_type(config, i) for i in range(first)}
    for i in range(first, config.num_layers):
        if layer_type(config, i) not in producers:
            fail(
                "num_kv_shared_layers",
                shared,
                f"a count that leaves a '{layer_type(config, i)}' layer before layer "
                f"{i} to share its keys and values (or change layer_types)",
            )
    width = config.kv_shared_intermediate_dim
    if width is not None and (
        isinstance(width, bool) or not isinstance(width, int) or width < 1 or not shared
    ):
        fail(
            "kv_shared_intermediate_dim",
            width,
            "None, or an integer >= 1 with num_kv_shared_layers > 0",
        )


def check_windows(config, fail) -> None:
    """Every sliding layer has a window."""
    for i in range(config.num_layers if config.layer_types is not None else 0):
        kind = layer_type(config, i)
        if (
            kind == "sliding_attention"
            and layer_settings(config, i)["sliding_window"] is None
        ):
            fail(
                "sliding_window",
                None,
                f"an integer >= 1: layer {i} is a 'sliding_attention' layer (or set "
                "layer_settings['sliding_attention']['sliding_window'])",
            )


__all__ = [
    "LAYER_TYPES",
    "SETTINGS",
    "TYPE_DEFAULTS",
    "check_layer_inputs",
    "check_layer_types",
    "check_windows",
    "RECURRENT_TYPES",
    "layer_settings",
    "recurrent",
    "kv_sharing",
    "layer_type",
    "sliding_windows",
    "typed",
]
