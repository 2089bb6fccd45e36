"""Checks of finished files: sha256, zip CRCs, decodable images, JSON annotation counts."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, Iterable

from adjcap.prepare.errors import PrepareError


def zip_problem(path: str | Path) -> str | None:
    """None when ``path`` is a readable zip whose every member passes its CRC; else what is wrong."""
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        return f"not a readable zip ({e})"
    return f"member {bad} fails its CRC check" if bad else None


def image_problem(path: str | Path) -> str | None:
    """None when ``path`` decodes as an image (JPEGs decoded at a reduced size: fast, still a full
    pass over the entropy-coded data); else the decoder's complaint."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.draft("RGB", (64, 64))
            im.load()
    except Exception as e:  # noqa: BLE001 - PIL raises many types for broken files
        return f"{type(e).__name__}: {e}"
    return None


def load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise PrepareError(f"{path}: not found") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise PrepareError(f"{path}: not valid JSON ({e}); the file is damaged - run the step again") from None


def annotation_images(path: Path) -> list[str]:
    """The image keys of an annotation file: IFCap ``{name: [captions]}`` keys, IFCap nocaps
    ``[{image_id}]`` or a COCO-style ``{"images": [{file_name|id}]}``."""
    obj = load_json(path)
    if isinstance(obj, dict) and isinstance(obj.get("images"), list):
        return [str(im.get("file_name") or im.get("id")) for im in obj["images"] if isinstance(im, dict)]
    if isinstance(obj, dict):
        return [str(k) for k in obj]
    if isinstance(obj, list):
        return [str(d.get("image_id")) for d in obj if isinstance(d, dict) and "image_id" in d]
    raise PrepareError(f"{path}: unexpected annotation layout (neither an object nor a list)")


def count_problem(path: Path, expected: int) -> str | None:
    n = len(annotation_images(path))
    if expected and n != expected:
        return f"{path}: {n} images, expected {expected}"
    return None


def missing(expected: Iterable[str], present: Iterable[str]) -> list[str]:
    have = set(present)
    return sorted(x for x in set(expected) if x not in have)


def offenders(names: list[str], k: int = 3) -> str:
    head = ", ".join(names[:k])
    return head + (f" and {len(names) - k} more" if len(names) > k else "")
