"""The download sources (``sources.toml``): loaded once, optionally overlaid by a user file and
redirected to a mirror."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from adjcap.nested import deep_update
from adjcap.prepare.errors import PrepareError


def load_sources(path: str | Path | None = None) -> dict[str, Any]:
    """The packaged ``sources.toml``, with the tables of ``path`` (a TOML file) laid over it."""
    data = tomllib.loads((resources.files("adjcap.prepare") / "sources.toml").read_text())
    if path is not None:
        p = Path(path).expanduser()
        try:
            deep_update(data, tomllib.loads(p.read_text()))
        except FileNotFoundError:
            raise PrepareError(f"{p}: sources file not found (--sources FILE)") from None
        except tomllib.TOMLDecodeError as e:
            raise PrepareError(f"{p}: not valid TOML ({e}); fix the sources file") from None
    return data


def mirrored(url: str, mirror: str | None) -> str:
    """``https://host/a/b`` -> ``MIRROR/host/a/b`` (an HTTP mirror laid out by host); no mirror: as is."""
    if not mirror:
        return url
    parts = urlsplit(url)
    tail = parts.path + (f"?{parts.query}" if parts.query else "")
    return f"{mirror.rstrip('/')}/{parts.netloc}{tail}"


def host_of(url: str) -> str:
    return urlsplit(url).netloc
