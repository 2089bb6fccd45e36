"""The registry of annotation layouts.

A *layout* is one way a benchmark's annotations are written down (a Karpathy ``dataset_*.json``, an
IFCap ``{file name: [captions]}`` file, ...). Each is registered with one ``sniff`` function (does this
parsed content look like me?) and one ``parse`` function (content -> :class:`Entry` list)::

    @register_layout("karpathy", format="karpathy", description="a Karpathy dataset_*.json",
                     sniff=looks_like_karpathy)
    def parse_karpathy(obj, path, split): ...

A *format* is the name a user passes (``--format`` / ``benchmarks.<name>.format``): every layout
answers to its own format, and some are also read under another one (``accepted_by``: the nocaps
official file is COCO-style, so format ``coco`` reads it too). ``auto`` sniffs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

from adjcap.data.records import DataError
from adjcap.registry import check, lookup

AUTO = "auto"


@dataclass
class Entry:
    """One image as a layout found it, before validation."""

    image_id: str
    rel_paths: tuple[str, ...]  # candidate paths relative to the image root, best first
    refs: Any  # as found in the file; validated by the reader
    domain: str | None = None
    coco_id: int | None = None
    split: str | None = None  # the file's own split tag (Karpathy)
    aliases: tuple[str, ...] = ()
    numeric_id: int | None = None  # a COCO-style numeric id without a file name


Sniff = Callable[[Any], bool]
Parse = Callable[[Any, Path, "str | None"], list[Entry]]


@dataclass(frozen=True)
class Layout:
    name: str
    format: str
    description: str
    sniff: Sniff
    parse: Parse
    accepted_by: tuple[str, ...] = ()
    reads: Literal["json", "dir"] = "json"  # what sniff/parse get: parsed JSON, or the directory path

    def read_as(self, fmt: str) -> bool:
        return fmt in (AUTO, self.format) or fmt in self.accepted_by


LAYOUTS: dict[str, Layout] = {}


def register_layout(
    name: str,
    *,
    format: str,
    description: str,
    sniff: Sniff,
    accepted_by: tuple[str, ...] = (),
    reads: Literal["json", "dir"] = "json",
) -> Callable[[Parse], Parse]:
    """Decorator registering ``parse`` (``(content, path, split) -> list[Entry]``) as layout ``name``."""

    def deco(parse: Parse) -> Parse:
        if name in LAYOUTS:
            raise ValueError(f"annotation layout '{name}' is already registered")
        if name == AUTO or format == AUTO:
            raise ValueError(f"'{AUTO}' is reserved for detecting the layout")
        LAYOUTS[name] = Layout(name, format, description, sniff, parse, tuple(accepted_by), reads)
        return parse

    return deco


def format_names() -> tuple[str, ...]:
    """Every format a user can name, ``auto`` last."""
    return tuple(sorted({lay.format for lay in LAYOUTS.values()})) + (AUTO,)


def check_format(fmt: str) -> str:
    """``fmt`` when it is a known format name, else DataError listing the known ones."""
    return check(fmt, format_names(), "benchmark format", DataError)


def get_layout(name: str) -> Layout:
    """The layout registered as ``name``, else DataError listing the known ones."""
    return lookup(dict(sorted(LAYOUTS.items())), name, "annotation layout", DataError)


def sniff_json(obj: Any) -> Layout | None:
    """The first JSON layout whose sniff accepts ``obj`` (registration order), or None."""
    for lay in LAYOUTS.values():
        if lay.reads == "json" and lay.sniff(obj):
            return lay
    return None


def dir_layout(path: Path) -> Layout | None:
    """The directory layout that takes ``path`` (e.g. a folder of images), or None."""
    for lay in LAYOUTS.values():
        if lay.reads == "dir" and lay.sniff(path):
            return lay
    return None

