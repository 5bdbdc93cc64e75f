"""The shared `to_dict` / `from_dict` / `replace` of the frozen config
dataclasses (`TransformerConfig` and its option groups): JSON-ready dicts
both ways, unknown and missing keys named."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any


class _Group:
    """Shared `to_dict` / `from_dict` for the frozen config dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.to_dict() if isinstance(value, _Group) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise ValueError(
                f"{cls.__name__}.from_dict expects a dict. Received: {type(data).__name__}"
            )
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(
                f"Unknown {cls.__name__} key(s) {unknown}. Known keys: {sorted(known)}."
            )
        required = [
            f.name
            for f in known.values()
            if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and f.name not in data
        ]
        if required:
            raise ValueError(
                f"{cls.__name__} needs the key(s) {required}, which are missing. "
                f"Received keys: {sorted(data)}."
            )
        kwargs = dict(data)
        for name, group in getattr(cls, "_groups", lambda: {})().items():
            if kwargs.get(name) is not None:
                kwargs[name] = group.from_dict(kwargs[name])
        return cls(**kwargs)

    def replace(self, **changes):
        """Returns a copy with `changes` applied (validated again). A dict
        for a group (e.g. `moe={"capacity_factor": 1.25}`) changes only the
        keys it names; the group's other values are kept. A key of a group
        that is set may also be given on its own (`image_size=384` for
        `vision={"image_size": 384}`) when no top-level field has that name."""
        known = {f.name for f in fields(self)}
        for name in getattr(self, "_groups", lambda: {})():
            group = getattr(self, name)
            if group is None:
                continue
            for key in [k for k in changes if k not in known]:
                if key in {f.name for f in fields(group)}:
                    merged = changes.get(name)
                    merged = dict(merged) if isinstance(merged, dict) else {}
                    merged[key] = changes.pop(key)
                    changes[name] = merged
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(
                f"Unknown {type(self).__name__} key(s) {unknown}. Known keys: {sorted(known)}."
            )
        for name, group in getattr(self, "_groups", lambda: {})().items():
            if isinstance(changes.get(name), dict):
                current = getattr(self, name)
                base = current.to_dict() if current is not None else {}
                changes[name] = group.from_dict({**base, **changes[name]})
        return dataclasses.replace(self, **changes)
