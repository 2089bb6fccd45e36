"""IFCap/ViECap ``annotations/<ds>/{train,val,test}_captions.json`` = ``{file name: [captions]}``.
A directory ``annotations/<ds>/`` is accepted too: :func:`annotation_file_in_dir` picks the file."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any

from adjcap.data.ids import basename, coco_id_from_name, stem
from adjcap.data.layouts.registry import Entry, register_layout
from adjcap.data.records import DataError

NOCAPS_CORPUS = "nocaps_corpus.json"
SPLIT_FILE = "{split}_captions.json"


def looks_like_ifcap(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and not isinstance(obj.get("images"), list)
        and any(isinstance(v, list) for v in islice(obj.values(), 5))
    )


@register_layout("ifcap", format="ifcap", description="an IFCap/ViECap {file name: [captions]} file", sniff=looks_like_ifcap)
def parse_ifcap(obj: dict[str, Any], path: Path, split: str | None) -> list[Entry]:
    out = []
    for key, refs in obj.items():
        cid = coco_id_from_name(key)
        out.append(
            Entry(
                image_id=key,
                rel_paths=(key,) if basename(key) == key else (key, basename(key)),
                refs=refs,
                coco_id=cid,
                aliases=(basename(key), stem(key)) + ((str(cid),) if cid is not None else ()),
            )
        )
    return out


def is_annotation_dir(d: Path) -> bool:
    """Does ``d`` hold IFCap annotation files (``<split>_captions.json`` or ``nocaps_corpus.json``)?"""
    return any((d / SPLIT_FILE.format(split=s)).is_file() for s in ("test", "val", "train")) or (
        d / NOCAPS_CORPUS
    ).is_file()


def annotation_file_in_dir(d: Path, split: str | None, prefer_nocaps: bool) -> Path:
    """The annotation file of ``split`` inside an IFCap annotation directory."""
    cands = [d / SPLIT_FILE.format(split=split)] if split else []
    if prefer_nocaps:
        cands.insert(0, d / NOCAPS_CORPUS)
    else:
        cands.append(d / NOCAPS_CORPUS)
    for c in cands:
        if c.is_file():
            return c
    have = sorted(p.name for p in d.glob("*.json"))
    raise DataError(
        f"{d}: no {split}_captions.json in this annotation directory (found: "
        f"{', '.join(have) or 'no JSON files'}); pass the annotation file itself or the right split"
    )
