"""The pixel geometries of the models, remembered (docs/architecture.md, "Pixels prepared once").

What a model's decode step prepares (:class:`adjcap.engine.pixel_prep.PixelPrep`) is known without its
weights, but finding it out imports the model's library: open_clip builds the model on the meta device,
the BLIP verifier reads its image processor through transformers. On the driver that import (~3 s on a
workstation, ~9 s on a slow 2-core box) was most of its CPU while it streamed images (``benchmarks/scale.py``).

:func:`remembered` keeps each answer in the process and in ``{cache_dir}/pixels/<key>.json``, keyed by
everything that decides it: the config section that names the model (every field: a changed batch size only
misses), the content id of every local file it names (a folder: the content ids of its ``*.json`` files, where
the model's preprocessing is written), and the versions of open_clip, transformers and this module's format.
A warm cache answers with neither library imported; a section it cannot key (an unreadable local path) is
computed each time. Torch-free: the job's driver imports it."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

from adjcap.engine.pixel_prep import PixelPrep
from adjcap.storage.content_ids import file_content_id
from adjcap.storage.io import atomic_write_json

log = logging.getLogger(__name__)

FORMAT = 1
LIBRARIES = ("open_clip_torch", "transformers")
_UNKNOWN = "unknown"  # stored when the geometry is not known before loading (the pools decode the bytes)
_MEMO: dict[str, PixelPrep | None] = {}


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def _local_ids(section: Mapping[str, Any]) -> dict[str, str]:
    """The content id of every string field of ``section`` that names an existing local file or folder."""
    out: dict[str, str] = {}
    for field, value in section.items():
        if not isinstance(value, str) or not value:
            continue
        p = Path(value.removeprefix("local-dir:")).expanduser()
        if p.is_file():
            out[field] = file_content_id(p)
        elif p.is_dir():
            out[field] = ",".join(f"{f.name}={file_content_id(f)}" for f in sorted(p.glob("*.json")))
    return out


def memo_key(what: str, section: Mapping[str, Any]) -> str:
    """The key of ``what`` (a family's kind of model) for the config ``section`` naming it."""
    made_of = {"what": what, "section": dict(section), "local": _local_ids(section), "format": FORMAT,
               "libraries": {d: _version(d) for d in LIBRARIES}}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _read(path: Path) -> tuple[bool, PixelPrep | None]:
    try:
        doc = json.loads(path.read_text())
        return True, None if doc == _UNKNOWN else PixelPrep(**{**doc, "mean": tuple(doc["mean"]),
                                                               "std": tuple(doc["std"])})
    except (OSError, ValueError, TypeError, KeyError):
        return False, None  # absent, or not this format: computed again and written over


def remembered(what: str, section: Mapping[str, Any], cache_dir: str | Path | None,
               compute: Callable[[], PixelPrep | None]) -> PixelPrep | None:
    """``compute()`` (the model's :class:`PixelPrep`, or None when not known before loading), remembered
    under ``cache_dir`` (not on disk when None) by :func:`memo_key`."""
    try:
        key = memo_key(what, section)
    except OSError as e:  # a local path that cannot be read: its loader will say so
        log.info(f"pixels: {what} not remembered ({e})")
        return compute()
    if key in _MEMO:
        return _MEMO[key]
    path = Path(cache_dir).expanduser() / "pixels" / f"{key}.json" if cache_dir else None
    found, prep = _read(path) if path is not None else (False, None)
    if not found:
        prep = compute()
        if path is not None:
            try:
                atomic_write_json(path, _UNKNOWN if prep is None else asdict(prep))
            except OSError as e:  # a read-only cache: computed again next time
                log.info(f"pixels: {path} not written ({e})")
    _MEMO[key] = prep
    return prep


def clip_pixels(enc: Any, cache_dir: str | Path | None) -> PixelPrep | None:
    """:func:`adjcap.models.clip.pixel_prep_for` of the open_clip encoder section ``enc``, remembered."""

    def compute():
        from adjcap.models.clip import pixel_prep_for

        return pixel_prep_for(enc)

    return remembered("open_clip", enc.model_dump(), cache_dir, compute)


def verifier_pixels(v: Any, cache_dir: str | Path | None) -> PixelPrep | None:
    """:func:`adjcap.models.roles.verifier_pixel_prep` of the verifier section ``v``, remembered."""

    def compute():
        from adjcap.models.roles import verifier_pixel_prep

        return verifier_pixel_prep(v)

    return remembered("verifier", v.model_dump(), cache_dir, compute)
