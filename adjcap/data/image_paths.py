"""Where each listed image lives under the image root, confined to that root.

An annotation key is a path relative to the image root. Keys that are absolute or climb out with
``..`` are refused, and so is a file that resolves (through symlinks) to a place outside the root:
such a record keeps its id, carries an ``error`` and is never opened, so a hostile annotation file
cannot make a run read ``/etc/passwd``. Files that exist but are not regular images (a FIFO, a
dangling symlink, an unreadable file) are kept: decoding turns them into per-image errors.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from adjcap.data.ids import IMAGE_EXTENSIONS
from adjcap.data.layouts import Entry
from adjcap.data.records import DataError, offenders

ESCAPES_ROOT = "image path escapes the image root"


@dataclass(frozen=True)
class ImagePath:
    path: str | None
    error: str | None = None


def climbs_out(rel: str) -> bool:
    """Is ``rel`` absolute, or does it leave its root through ``..``?"""
    r = rel.replace("\\", "/")
    if r.startswith("/") or os.path.isabs(rel):
        return True
    return os.path.normpath(r).replace("\\", "/").split("/")[0] == ".."


def inside(real_root: str, path: str) -> str | None:
    """None when ``path`` resolves (symlinks followed) to ``real_root`` or below; else where it resolves."""
    real = os.path.realpath(path)
    base = real_root if real_root.endswith(os.sep) else real_root + os.sep
    return None if real == real_root or real.startswith(base) else real


def numeric_index(root: Path) -> dict[int, str]:
    """Map the trailing number of every image file name under root (non-recursive, then one level
    down) to its relative path, for COCO files that list only numeric ids."""
    idx: dict[int, str] = {}
    pat = re.compile(r"(\d+)$")
    for sub in [root] + sorted(p for p in root.iterdir() if p.is_dir()):
        for p in sub.iterdir():
            if p.suffix.lower() in IMAGE_EXTENSIONS:
                m = pat.search(p.stem)
                if m:
                    idx.setdefault(int(m.group(1)), p.relative_to(root).as_posix())
    return idx


def _choose(root: Path, rels: list[str], check: bool) -> str | None:
    """The first candidate that is a file, else the first that exists at all (a FIFO, a dangling
    symlink: decoding reports it); None when none exists. Without ``check``: the first candidate."""
    if not check:
        return str(root / rels[0])
    paths = [str(root / r) for r in rels]
    for p in paths:
        if os.path.isfile(p):
            return p
    for p in paths:
        if os.path.lexists(p):
            return p
    return None


def locate_images(entries: list[Entry], images: Path | None, check: bool, annotations: Path) -> list[ImagePath]:
    """The image path (or the reason there is none) of every entry under the image root ``images``.

    ``check``: every image must exist, else one DataError lists the missing ones. Escaping paths are
    never an exception: they come back as ``ImagePath(None, error)``.
    """
    if images is None:
        return [ImagePath(None)] * len(entries)
    if not images.exists():
        raise DataError(
            f"{images}: image folder not found (images for {annotations}). Point the benchmark's "
            "images path at the folder holding the image files (--set benchmarks.<name>.images=DIR)"
        )
    if not images.is_dir():
        raise DataError(f"{images}: not a directory; the images path must be the folder of image files")
    real_root = os.path.realpath(images)
    num_idx: dict[int, str] | None = None
    out: list[ImagePath] = []
    missing: list[str] = []
    for e in entries:
        rels = list(e.rel_paths)
        if not rels and e.numeric_id is not None:
            if num_idx is None:
                num_idx = numeric_index(images)
            hit = num_idx.get(e.numeric_id)
            rels = [hit] if hit else []
        if not rels:
            if check:
                missing.append(e.image_id)
            out.append(ImagePath(None))
            continue
        bad = next((r for r in rels if climbs_out(r)), None)
        if bad is not None:
            out.append(ImagePath(None, f"{ESCAPES_ROOT}: {bad!r} is not a path inside {images}"))
            continue
        chosen = _choose(images, rels, check)
        if chosen is None:
            missing.append(rels[0])
            out.append(ImagePath(None))
            continue
        real = inside(real_root, chosen)
        if real is not None:
            out.append(
                ImagePath(
                    None,
                    f"{ESCAPES_ROOT}: {chosen} resolves to {real}, outside {real_root}; put the file itself "
                    "under the image root (or point the images path at the folder that holds it)",
                )
            )
            continue
        out.append(ImagePath(chosen))
    if missing:
        raise DataError(
            f"{len(missing)} of {len(entries)} images listed in {annotations} are not in {images}: "
            f"{offenders(missing)}. Point the images path at the folder that holds them "
            "(--set benchmarks.<name>.images=DIR), or remove them from the annotation file."
        )
    return out
