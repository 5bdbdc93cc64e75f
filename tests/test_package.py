"""Package-wide rules: backend-neutral imports, public names, docs."""

import re
from pathlib import Path

import keras_transformers as kt

PACKAGE = Path(kt.__file__).parent
BACKEND_PACKAGE = PACKAGE / "backend"


def test_only_the_backend_package_imports_a_backend():
    pattern = re.compile(
        r"^\s*(import|from)\s+(jax|torch|tensorflow)\b|keras\.src", re.M
    )
    offenders = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if BACKEND_PACKAGE not in path.parents and pattern.search(path.read_text())
    ]
    assert offenders == []


def test_public_names_from_design():
    for name in ["GPTBackbone", "GPTCausalLM"]:
        assert hasattr(kt.models, name)
    for name in [
        "MultiHeadAttention",
        "RotaryEmbedding",
        "SinusoidalPositionEncoding",
        "PositionEmbedding",
        "TokenEmbedding",
        "FeedForward",
        "TransformerBlock",
    ]:
        assert hasattr(kt.layers, name)
    assert (
        callable(kt.from_preset)
        and callable(kt.list_presets)
        and callable(kt.load_config)
    )


def test_no_file_too_long():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 450
    }
    assert long == {}, long


def test_every_subpackage_ships_in_the_wheel():
    """Each folder of the package is listed in pyproject.toml's packages."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    listed = set(
        tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
            "packages"
        ]
    )
    package = root / "keras_transformers"
    found = {
        ".".join(p.parent.relative_to(root).parts) for p in package.rglob("__init__.py")
    }
    assert found - listed == set(), "add these to [tool.setuptools] packages"
