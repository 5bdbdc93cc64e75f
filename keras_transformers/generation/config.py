"""Generation defaults of a checkpoint: Hugging Face `generation_config.json`.

`GenerationConfig` holds the fields our `generate()` and `chat()` use; a
model loaded from a Hugging Face directory that has the file carries it as
`model.generation_config`, and `save_to_preset` writes it back. Arguments
passed to `generate()` override it; `resolve_sampler` turns it plus those
arguments into a `SamplerSpec`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from keras_transformers.config.validation import (
    check_argument_choice,
    check_argument_int,
    check_argument_number,
)
from keras_transformers.generation.sampling import SAMPLERS, SamplerSpec

FILENAME = "generation_config.json"
# Hugging Face's defaults where a sampling checkpoint leaves them out.
HF_TOP_K = 50


def _ids(value):
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


@dataclass(frozen=True)
class GenerationConfig:
    """Default generation settings (a subset of Hugging Face's).

    Every field is None when the checkpoint does not set it; `generate()`
    then uses its own default.

    Attributes:
        eos_token_id: ids that end a row, a tuple (the file may hold an int
            or a list).
        bos_token_id: start token (the seq2seq decoder start when
            `decoder_start_token_id` is absent).
        pad_token_id: padding id.
        decoder_start_token_id: the encoder-decoder decoder's first input.
        max_new_tokens: tokens to generate at most.
        max_length: prompt plus generated tokens at most (used when
            `max_new_tokens` is absent).
        min_new_tokens: the end tokens are masked until this many tokens
            were generated.
        do_sample: sample (True) or decode greedily (False / None).
        temperature, top_k, top_p: the sampler's settings (`top_k` 0 and
            `top_p` 1.0 disable those filters, as in Hugging Face).
        repetition_penalty: > 1 discourages tokens already present.
        forced_bos_token_id: encoder-decoder models: the first generated
            token (BART: `<s>` after the decoder start `</s>`).
        forced_eos_token_id: encoder-decoder models: the token forced at
            the last position `max_new_tokens` allows.
    """

    eos_token_id: tuple[int, ...] | None = None
    bos_token_id: int | None = None
    pad_token_id: int | None = None
    decoder_start_token_id: int | None = None
    max_new_tokens: int | None = None
    max_length: int | None = None
    min_new_tokens: int | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    forced_bos_token_id: int | None = None
    forced_eos_token_id: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "eos_token_id", _ids(self.eos_token_id))
        for name in ("repetition_penalty", "temperature"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"`{name}` must be > 0. Received: {name}={value}")

    @classmethod
    def from_dict(cls, data: dict) -> GenerationConfig:
        """Keeps the known keys of `data`; ignores the others (Hugging Face
        files carry many we do not use)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names and v is not None})

    @classmethod
    def from_json_file(cls, path) -> GenerationConfig:
        """Reads a `generation_config.json`.

        Raises:
            ValueError: the file is not a JSON object.
        """
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{path} is not valid JSON ({error}).") from None
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a JSON object.")
        return cls.from_dict(data)

    @classmethod
    def from_directory(cls, directory) -> GenerationConfig | None:
        """The directory's `generation_config.json`, or None without one."""
        path = Path(directory) / FILENAME
        return cls.from_json_file(path) if path.is_file() else None

    def to_dict(self) -> dict:
        """The fields that are set, as Hugging Face writes them (a single
        end token as an int)."""
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            if field.name == "eos_token_id":
                value = value[0] if len(value) == 1 else list(value)
            out[field.name] = value
        return out

    def to_json_file(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def generation_config(model) -> GenerationConfig:
    """`model.generation_config`, or an empty one."""
    config = getattr(model, "generation_config", None)
    return config if config is not None else GenerationConfig()


def resolve_sampler(defaults, sampler, temperature, top_k, top_p) -> SamplerSpec:
    """The sampler from explicit arguments (None: not given) and defaults.

    `sampler=None`: sample when the defaults say `do_sample` (their
    temperature, top_k and top_p, with Hugging Face's top_k=50 where absent)
    or when `top_k` / `top_p` is given; otherwise greedy. An explicit
    sampler uses the given settings, falling back to the defaults' values;
    "greedy" and "random" take no `top_k` / `top_p` (a ValueError). Both
    top_k and top_p given: the nucleus of the top k ("top_p" with `top_k`),
    Hugging Face's order.
    """
    if sampler is not None:
        check_argument_choice("sampler", sampler, SAMPLERS)
    top_p = check_argument_number("top_p", top_p, 0, 1, low_open=True, optional=True)
    top_k = check_argument_int("top_k", top_k, 1, optional=True)
    temperature = check_argument_number(
        "temperature", temperature, 0, low_open=True, optional=True
    )
    if sampler in ("greedy", "random") and (top_k is not None or top_p is not None):
        what = {"greedy": "always takes the most likely token"}.get(
            sampler, "samples from every token"
        )
        raise ValueError(
            f"`sampler={sampler!r}` {what}, so it has no `top_k` or `top_p`. Received: "
            f"top_k={top_k}, top_p={top_p}. Use sampler='top_k' or 'top_p' (or leave "
            "`sampler` out) to sample from the most likely tokens."
        )
    if sampler == "greedy":
        return SamplerSpec("greedy")
    sampling = sampler is not None or top_k is not None or top_p is not None
    if not sampling and not defaults.do_sample:
        return SamplerSpec("greedy")
    if temperature is None:
        temperature = defaults.temperature if defaults.temperature else 1.0
    temperature = float(temperature)
    if sampler is None and top_k is None and top_p is None:  # do_sample defaults
        top_k = HF_TOP_K if defaults.top_k is None else defaults.top_k or None
        top_p = defaults.top_p if defaults.top_p and defaults.top_p < 1 else None
    elif sampler == "top_k" and top_k is None:
        top_k = defaults.top_k or None
    elif sampler == "top_p" and top_p is None:
        top_p = defaults.top_p
    if sampler == "random":
        return SamplerSpec("random", temperature)
    if sampler == "top_p" or (sampler in (None, "top_k") and top_p is not None):
        return SamplerSpec("top_p", temperature, top_k, top_p)
    if sampler == "top_k" or top_k is not None:
        return SamplerSpec("top_k", temperature, top_k)
    return SamplerSpec("random", temperature)


def attach_generation_config(model, directory) -> None:
    """Sets `model.generation_config` from `directory/generation_config.json`
    when the file exists (a file we cannot read is skipped with a warning)."""
    try:
        config = GenerationConfig.from_directory(directory)
    except (ValueError, TypeError) as error:
        import warnings

        warnings.warn(f"{directory}/{FILENAME} was not used: {error}", stacklevel=3)
        return
    if config is not None:
        model.generation_config = config


def save_generation_config(model, directory) -> None:
    """Writes `model.generation_config` to `directory` (removing a stale
    file when the model has none)."""
    config = getattr(model, "generation_config", None)
    path = Path(directory) / FILENAME
    if config is not None:
        config.to_json_file(path)
    elif path.exists():
        path.unlink()
