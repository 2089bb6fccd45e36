"""Nested settings (dicts of dicts, as TOML and pydantic give them): the one deep merge and the one
flattener to dotted keys."""

from __future__ import annotations

from typing import Any


def deep_update(dst: dict[str, Any], src: dict[str, Any]) -> None:
    """Lay ``src`` over ``dst`` in place: a table present in both is merged key by key, anything
    else in ``src`` replaces what ``dst`` had."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            deep_update(dst[k], v)
        else:
            dst[k] = v


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf under its dotted key (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``); an empty table is a
    leaf."""
    out: dict[str, Any] = {}

    def walk(key: str, v: Any) -> None:
        if isinstance(v, dict) and v:
            for k, x in v.items():
                walk(f"{key}.{k}" if key else k, x)
        else:
            out[key] = v

    walk(prefix, data)
    return out
