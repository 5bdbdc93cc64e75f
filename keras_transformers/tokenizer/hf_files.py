"""Files of a Hugging Face tokenizer directory, for `HFTokenizer`:
`tokenizer.json` (read by the `tokenizers` library), `tokenizer_config.json`,
`special_tokens_map.json`, and chat templates (`chat_template.jinja`,
`additional_chat_templates/*.jinja`, or `chat_template` in the config)."""

from __future__ import annotations

import json
import os
from typing import Any

from keras_transformers.tokenizer._common import CONFIG_FILENAME, HF_TOKENIZER_FILENAME

CLASS_NAME = "HFTokenizer"
FORMAT_VERSION = 1
SPECIAL_TOKENS_MAP_FILENAME = "special_tokens_map.json"
CHAT_TEMPLATE_FILENAME = "chat_template.jinja"
CHAT_TEMPLATE_DIR = "additional_chat_templates"
DEFAULT_TEMPLATE = "default"
# The named special tokens of `transformers`, in the order `special_tokens` lists them.
NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "cls_token",
    "sep_token",
    "mask_token",
)
# `transformers` writes `model_max_length` = 1e30 when a model has no limit.
_MAX_SENSIBLE_LENGTH = 10**9
# Classes of ours that write a `tokenizer_config.json` with `class_name`.
_OTHER_CLASSES = ("BPETokenizer", "WordPieceTokenizer", "BertPreprocessor")


def read_backend(path: str) -> tuple[Any, dict[str, str]]:
    """The `tokenizers.Tokenizer` of a `tokenizer.json`, without the padding
    and truncation the file may set (Hugging Face `transformers` ignores them
    unless asked to pad or truncate), and the sides those name
    (`{"padding_side": "left", ...}`), defaults for the config's."""
    from tokenizers import Tokenizer

    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Tokenizer file '{path}' does not exist. A Hugging Face tokenizer "
            f"directory needs {HF_TOKENIZER_FILENAME}; copy it from the model's "
            "repository, or save one with `HFTokenizer.save_assets(directory)`."
        )
    try:
        backend = Tokenizer.from_file(path)
    except Exception as error:  # tokenizers raises a bare Exception
        raise ValueError(
            f"'{path}' is not a valid Hugging Face tokenizer file ({error}). It is "
            "corrupt or truncated: download it again from the model's repository "
            "(or save it again with `save_assets`). If it was written by a newer "
            "`tokenizers` library, upgrade it: `pip install -U tokenizers`."
        ) from None
    sides = {}
    for key, settings in (
        ("padding_side", backend.padding),
        ("truncation_side", backend.truncation),
    ):
        if settings and str(settings.get("direction", "")).lower() in ("left", "right"):
            sides[key] = str(settings["direction"]).lower()
    backend.no_padding()
    backend.no_truncation()
    return backend, sides


def read_json_object(path: str) -> dict[str, Any]:
    """The JSON object in `path`, or {} when the file does not exist."""
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as file:
            data = json.load(file)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"'{path}' is not valid UTF-8 JSON ({error}). It is corrupt or "
            "truncated: download it again, or delete it to load the tokenizer "
            "without its special-token settings."
        ) from None
    if not isinstance(data, dict):
        raise ValueError(f"'{path}' must hold a JSON object; delete or rewrite it.")
    return data


def token_content(value: Any) -> str | None:
    """A token string from a string or an `AddedToken` dict."""
    if isinstance(value, dict):  # {"content": ..., "__type": "AddedToken"}
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def added_token_fields(value: Any) -> dict[str, Any]:
    """`tokenizers.AddedToken` keyword arguments of a config value."""
    fields = {"content": token_content(value), "special": True, "normalized": False}
    if isinstance(value, dict):
        for key in ("single_word", "lstrip", "rstrip", "normalized"):
            if isinstance(value.get(key), bool):
                fields[key] = value[key]
    return fields


def _token_list(value: Any) -> list[Any]:
    if isinstance(value, dict):  # named extra tokens, e.g. {"image_token": "<image>"}
        value = list(value.values())
    return [v for v in value if token_content(v)] if isinstance(value, list) else []


def _length(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return int(value) if 0 < value < _MAX_SENSIBLE_LENGTH else None


def _side(value: Any, fallback: str, key: str, path: str) -> str:
    if value is None:
        return fallback
    side = str(value).lower()
    if side not in ("left", "right"):
        raise ValueError(
            f"'{path}' has {key}={value!r}; it must be 'left' or 'right'. Fix the "
            "file or delete the key."
        )
    return side


def read_chat_templates(directory: str, config: dict) -> dict[str, str]:
    """Chat templates by name (the unnamed one is `"default"`).

    `chat_template.jinja` and `additional_chat_templates/*.jinja` (what
    `transformers` 5 writes) take priority over the config's `chat_template`
    (a string, or a list of `{"name", "template"}`), as in `transformers`.
    """
    templates: dict[str, str] = {}
    path = os.path.join(directory, CHAT_TEMPLATE_FILENAME)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as file:
            templates[DEFAULT_TEMPLATE] = file.read()
    extra_dir = os.path.join(directory, CHAT_TEMPLATE_DIR)
    if os.path.isdir(extra_dir):
        for name in sorted(os.listdir(extra_dir)):
            if name.endswith(".jinja"):
                with open(os.path.join(extra_dir, name), encoding="utf-8") as file:
                    templates[name[: -len(".jinja")]] = file.read()
    if templates:
        return templates
    value = config.get("chat_template")
    if isinstance(value, str):
        return {DEFAULT_TEMPLATE: value}
    if isinstance(value, list):
        return {
            str(item["name"]): str(item["template"])
            for item in value
            if isinstance(item, dict) and "name" in item and "template" in item
        }
    return {}


def read_options(directory: str, sides: dict[str, str]) -> dict[str, Any]:
    """`HFTokenizer` keyword arguments (all but the backend) of a directory;
    `sides` are the padding / truncation sides of its `tokenizer.json`."""
    config_path = os.path.join(directory, CONFIG_FILENAME)
    config = read_json_object(config_path)
    special_map = read_json_object(os.path.join(directory, SPECIAL_TOKENS_MAP_FILENAME))
    named = {key: config.get(key) for key in NAMED_TOKENS}
    if "added_tokens_decoder" not in config:
        # As `transformers`: the legacy map overrides the config's named tokens.
        named.update({k: v for k, v in special_map.items() if k in NAMED_TOKENS and v})
    extra = _token_list(config.get("additional_special_tokens"))
    extra += _token_list(config.get("extra_special_tokens"))
    for key in ("additional_special_tokens", "extra_special_tokens"):
        extra += [t for t in _token_list(special_map.get(key)) if t not in extra]
    added = []
    for entry in (config.get("added_tokens_decoder") or {}).values():
        if isinstance(entry, dict) and token_content(entry):
            added.append(entry)
    return {
        **{key: value for key, value in named.items() if token_content(value)},
        "additional_special_tokens": extra,
        "added_tokens": added,
        **{
            key: _side(config.get(key), sides.get(key, "right"), key, config_path)
            for key in ("padding_side", "truncation_side")
        },
        "model_max_length": _length(config.get("model_max_length")),
        "clean_up_tokenization_spaces": bool(
            config.get("clean_up_tokenization_spaces", False)
        ),
        "split_special_tokens": bool(config.get("split_special_tokens", False)),
        "chat_template": read_chat_templates(directory, config) or None,
        "sequence_length": _length(config.get("sequence_length"))
        if config.get("class_name") == CLASS_NAME
        else None,
    }


def saved_class(directory: str) -> str | None:
    """The `class_name` our `tokenizer_config.json` records, if any."""
    try:
        config = read_json_object(os.path.join(directory, CONFIG_FILENAME))
    except ValueError:
        return None
    name = config.get("class_name")
    return name if isinstance(name, str) else None


def has_hf_tokenizer(directory: str) -> bool:
    """Whether `directory` holds a `tokenizer.json` that `HFTokenizer` should
    load: saved by `HFTokenizer`, or any Hugging Face one not saved by our
    other tokenizer classes."""
    if not os.path.isfile(os.path.join(directory, HF_TOKENIZER_FILENAME)):
        return False
    return saved_class(directory) not in _OTHER_CLASSES


def write_chat_templates(directory: str, templates: dict[str, str]) -> None:
    """Writes the templates as `transformers` 5 does, and removes stale ones."""
    path = os.path.join(directory, CHAT_TEMPLATE_FILENAME)
    extra_dir = os.path.join(directory, CHAT_TEMPLATE_DIR)
    if os.path.isfile(path):
        os.remove(path)
    if os.path.isdir(extra_dir):
        for name in os.listdir(extra_dir):
            if name.endswith(".jinja"):
                os.remove(os.path.join(extra_dir, name))
    for name, template in templates.items():
        if name == DEFAULT_TEMPLATE:
            target = path
        else:
            if os.path.basename(name) != name or name in ("", ".", ".."):
                raise ValueError(f"Invalid chat template name {name!r}.")
            os.makedirs(extra_dir, exist_ok=True)
            target = os.path.join(extra_dir, f"{name}.jinja")
        with open(target, "w", encoding="utf-8") as file:
            file.write(template)
    if os.path.isdir(extra_dir) and not os.listdir(extra_dir):
        os.rmdir(extra_dir)


def add_missing_tokens(backend, values: list[Any]) -> None:
    """Adds to `backend` the tokens (strings or `AddedToken` dicts) it does not
    have as added tokens, special unless a dict says otherwise, as
    `transformers` does with the special tokens of a config."""
    from tokenizers import AddedToken

    have = {t.content for t in backend.get_added_tokens_decoder().values()}
    for value in values:
        token = token_content(value)
        if token is None or token in have:
            continue
        fields = added_token_fields(value)
        special = fields.pop("special")
        if isinstance(value, dict) and isinstance(value.get("special"), bool):
            special = value["special"]
        added = AddedToken(**fields, special=special)
        if special:
            backend.add_special_tokens([added])
        else:
            backend.add_tokens([added])
        have.add(token)


def chat_templates_of(value: Any) -> dict[str, str]:
    """`{name: template}` from a string, a dict or a list of `{name, template}`."""
    if value is None:
        return {}
    if isinstance(value, str):
        return {DEFAULT_TEMPLATE: value}
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return read_chat_templates("", {"chat_template": list(value)})
    raise ValueError(
        "`chat_template` must be a string, a {name: template} dict or a list of "
        f'{{"name", "template"}} dicts. Received: {type(value).__name__}.'
    )


def clean_up_tokenization(text: str) -> str:
    """`transformers`' `clean_up_tokenization`: no space before punctuation."""
    for before, after in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(before, after)
    return text
