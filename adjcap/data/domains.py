"""NoCaps domains: the one place their spellings are normalised."""

from __future__ import annotations

from typing import Any

NOCAPS_DOMAINS = ("in-domain", "near-domain", "out-domain")


def normalize_domain(value: Any) -> str | None:
    """``in_domain`` / ``in-domain`` / ``indomain`` / ``in`` (any case) -> ``in-domain``; likewise near
    and out. Anything else (None, ``overall``, ``far``) -> None."""
    if value is None:
        return None
    s = str(value).strip().lower().replace("_", "-").replace(" ", "-")
    for d in NOCAPS_DOMAINS:
        if s in (d, d.split("-")[0], d.replace("-", "")):
            return d
    return None
