"""Image id spellings: file names, stems and the numeric COCO id hidden in ``COCO_val2014_<id>.jpg``."""

from __future__ import annotations

import re

IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})

_COCO_NAME = re.compile(r"^COCO_[A-Za-z]+\d*_(\d+)$")


def basename(s: str) -> str:
    """The last component of a ``/`` or ``\\`` separated path."""
    return s.replace("\\", "/").rsplit("/", 1)[-1]


def stem(s: str) -> str:
    """The basename without its last extension (``a/b.c.jpg`` -> ``b.c``; ``.hidden`` stays)."""
    b = basename(s)
    i = b.rfind(".")
    return b[:i] if i > 0 else b


def coco_id_from_name(name: str) -> int | None:
    """``COCO_val2014_000000391895.jpg`` (or a path ending in it) -> 391895; else None."""
    m = _COCO_NAME.match(stem(name))
    return int(m.group(1)) if m else None
