"""Nested settings (dicts of dicts, as TOML, JSON and pydantic give them): the one deep merge and the
one flattener to dotted keys."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def deep_update(dst: dict[str, Any], src: dict[str, Any]) -> None:
    """Lay ``src`` over ``dst`` in place: a table present in both is merged key by key, anything
    else in ``src`` replaces what ``dst`` had."""
    for k, v in src.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            deep_update(dst[k], v)
        else:
            dst[k] = v


def flatten(data: Any, prefix: str = "", *, empty_is_leaf: bool = True, max_depth: int | None = None,
            whole: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """Every leaf under its dotted key (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``), in the tables' order;
    lists are leaves. ``empty_is_leaf``: an empty table is a leaf (else it leaves no key);
    ``max_depth``: tables nested deeper than this many levels are leaves; ``whole(key)``: the table
    under that key is a leaf (a setting whose value is a table). Data that is no table is one leaf
    under ``prefix``."""
    out: dict[str, Any] = {}

    def walk(key: str, v: Any, depth: int) -> None:
        table = isinstance(v, Mapping) and (max_depth is None or depth < max_depth) and not (whole and whole(key))
        if table and (v or not empty_is_leaf):
            for k, x in v.items():
                walk(f"{key}.{k}" if key else str(k), x, depth + 1)
        else:
            out[key] = v

    walk(prefix, data, 0)
    return out
