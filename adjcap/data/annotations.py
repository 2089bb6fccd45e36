"""Reading an annotation file (or directory) as a format: pick the layout (named or sniffed) from the
registry, check it is one the format reads, parse it into entries."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from adjcap.data.jsonfile import load_json
from adjcap.data.layouts import AUTO, LAYOUTS, Entry, Layout, check_format, dir_layout, get_layout, sniff_json
from adjcap.data.layouts.diagnose import unrecognised
from adjcap.data.layouts.ifcap import annotation_file_in_dir
from adjcap.data.records import DataError


@dataclass
class Annotations:
    layout: Layout
    source: Path  # the file (or folder) actually read
    entries: list[Entry]


def layout_of(obj: Any, path: Path) -> Layout:
    """The registered layout of parsed JSON content, or DataError saying what was seen."""
    lay = sniff_json(obj)
    if lay is None:
        raise unrecognised(obj, path)
    return lay


def _reads_annotation_dirs(fmt: str) -> bool:
    return get_layout("ifcap").read_as(fmt) or get_layout("ifcap_nocaps").read_as(fmt)


def _dir_layout_for(fmt: str, path: Path) -> Layout | None:
    if fmt == AUTO:
        return dir_layout(path) if path.is_dir() else None
    return next((lay for lay in LAYOUTS.values() if lay.reads == "dir" and lay.read_as(fmt)), None)


def read_annotations(fmt: str, path: Path, split: str | None) -> Annotations:
    """Parse ``path`` as format ``fmt`` (a registered format name or ``auto``)."""
    check_format(fmt)
    lay = _dir_layout_for(fmt, path)
    if lay is not None:
        return Annotations(lay, path, lay.parse(path, path, split))
    if path.is_dir():
        if not _reads_annotation_dirs(fmt):
            raise DataError(f"{path}: is a directory; format '{fmt}' needs an annotation file")
        path = annotation_file_in_dir(path, split, prefer_nocaps=fmt == get_layout("ifcap_nocaps").format)
    obj = load_json(path)
    lay = layout_of(obj, path)
    if not lay.read_as(fmt):
        raise DataError(
            f"{path}: this is {lay.description} (format '{lay.format}'), not format '{fmt}'. "
            f"Pass --format {lay.format} (or auto)"
        )
    return Annotations(lay, path, lay.parse(obj, path, split))


def detect_format(path: str | Path) -> str:
    """The format name of an annotation file or directory (e.g. karpathy, ifcap, nocaps, coco, lavis,
    folder). DataError when the file is missing or its layout is not recognised."""
    p = Path(path)
    if p.is_dir():
        lay = dir_layout(p)
        return lay.format if lay is not None else get_layout("ifcap").format
    return layout_of(load_json(p), p).format
