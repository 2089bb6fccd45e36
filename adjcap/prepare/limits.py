"""The limits of `adjcap prepare`: download deadlines and extraction caps (``[limits]`` of sources.toml,
overridable with ``--sources FILE``), read once into typed values."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from adjcap.prepare.errors import PrepareError

GiB = 1 << 30
MiB = 1 << 20


@dataclass(frozen=True)
class Deadlines:
    """A download gives up when no byte arrived for ``stall_seconds`` (across its retries, backoff
    included), or when, once it has run ``rate_window_seconds``, fewer than ``min_bytes_per_second``
    arrived on average over the last window (0 turns the rate check off). The bytes received stay in
    the ``.partial`` for the next run."""

    stall_seconds: float = 60.0
    min_bytes_per_second: float = 1024.0
    rate_window_seconds: float = 60.0


@dataclass(frozen=True)
class ExtractLimits:
    """Caps on what an archive may expand to, from its headers before writing and counted while
    writing: per member, in total, and the ratio of a member's size to its compressed size (only for
    members of at least ``ratio_floor_bytes``; small files may compress well without harm). The defaults
    hold the real archives (COCO val2014.zip: 6.6 GB of JPEGs; the IFCap release; CoreNLP's zip)."""

    max_member_bytes: int = 8 * GiB
    max_total_bytes: int = 64 * GiB
    max_ratio: float = 200.0
    ratio_floor_bytes: int = 1 * MiB


def _read(cls, table: dict[str, Any], where: str):
    known = {f.name: f for f in fields(cls)}
    kw = {}
    for k, v in table.items():
        if k not in known:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise PrepareError(f"{where}.{k}: {v!r} is not a non-negative number; fix it in the sources file")
        kw[k] = type(getattr(cls(), k))(v)
    return cls(**kw)


def limits_of(sources: dict[str, Any]) -> tuple[Deadlines, ExtractLimits]:
    """The ``[limits]`` table of the loaded sources as typed values; an unknown key is refused."""
    table = sources.get("limits", {}) or {}
    if not isinstance(table, dict):
        raise PrepareError("sources [limits]: not a table; fix the sources file")
    names = {f.name for f in fields(Deadlines)} | {f.name for f in fields(ExtractLimits)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise PrepareError(f"sources [limits].{unknown[0]}: unknown limit; known: {', '.join(sorted(names))}")
    return _read(Deadlines, table, "sources [limits]"), _read(ExtractLimits, table, "sources [limits]")
