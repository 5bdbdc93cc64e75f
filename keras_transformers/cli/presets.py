"""`keras-transformers presets [--family FAMILY]`: the built-in presets with
their family, parameter count and description."""

from __future__ import annotations

import argparse


def add_parser(commands) -> None:
    """Adds the `presets` sub-command to the `keras-transformers` parser."""
    from keras_transformers.presets import FAMILIES

    presets = commands.add_parser("presets", help="list the built-in presets")
    presets.add_argument("--family", choices=FAMILIES, help="show only this family")


def _format_table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def _count(n: int) -> str:
    """A parameter count with one decimal: 124439808 -> '124.4M' (also for
    counts of 100 units and more, so close presets stay distinguishable)."""
    for unit, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def run(args: argparse.Namespace) -> int:
    """Prints the built-in presets: name, family, parameters, description."""
    from keras_transformers.presets import list_presets, load_config

    rows = [["name", "family", "params", "description"]]
    for name, info in list_presets(args.family).items():
        config = load_config(name)
        params = _count(config.num_params())
        if config.moe is not None:
            params += f" ({_count(config.num_active_params())} active)"
        rows.append([name, info["family"], params, info.get("description", "")])
    if len(rows) == 1:
        print(f"No built-in presets of family {args.family!r}.")
        return 0
    print(_format_table(rows))
    return 0
