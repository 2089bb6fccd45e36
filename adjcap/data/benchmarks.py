"""Reading one split of a benchmark as :class:`Record` s: the public entry point of ``adjcap.data``.

Formats (``fmt``; ``auto`` sniffs the content) are the names of the annotation layouts registered in
``adjcap/data/layouts/`` (one module per layout, each a sniff and a parse function):

- **karpathy**: Karpathy's ``dataset_coco.json`` / ``dataset_flickr30k.json`` (``train`` = train + restval).
- **ifcap**: IFCap/ViECap ``{file name: [captions]}`` files, or their ``annotations/<ds>/`` directory.
- **nocaps**: the official ``nocaps_val_4500_captions.json`` or IFCap's ``nocaps_corpus.json``.
- **coco**: a COCO captions file (also reads the nocaps official file and the LAVIS list).
- **lavis**: the BLIP/LAVIS list ``[{"image", "caption"}]``.
- **folder**: a directory of images without references, for captioning one's own images.

References alone (for ``evaluate --references``): :mod:`adjcap.data.references`. Image paths and their
confinement to the image root: :mod:`adjcap.data.image_paths`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from adjcap.data.annotations import read_annotations
from adjcap.data.image_paths import locate_images
from adjcap.data.layouts.folder import scan_folder
from adjcap.data.records import DataError, Record
from adjcap.data.references import clean_references

class SplitFiles(Protocol):
    """What :func:`split_annotations` reads of a benchmark's settings (``adjcap.config.BenchmarkCfg``,
    which sits a layer above the data readers)."""

    annotations: str
    annotations_by_split: Mapping[str, str]


def split_annotations(bench: SplitFiles, split: str, name: str = "<benchmark>") -> str:
    """The annotation path of ``split``: ``annotations_by_split[split]`` when the benchmark lists its
    splits' files, else ``annotations`` (a file that holds the split itself, e.g. Karpathy's, or a
    single-split file). A split the benchmark does not list is an error naming the known ones; it is
    never read from another split's file."""
    by_split = bench.annotations_by_split
    if not by_split:
        return bench.annotations
    if split not in by_split:
        raise DataError(
            f"benchmark '{name}' has no split '{split}'; its splits: {', '.join(sorted(by_split))} "
            f"(set splits=[...] to those, or add the file with --set "
            f"benchmarks.{name}.annotations_by_split.{split}=FILE)"
        )
    return by_split[split]


def read_benchmark(
    fmt: str,
    annotations: str | Path,
    images: str | Path | None,
    split: str,
    *,
    limit: int | None = None,
    check_images: bool = True,
) -> list[Record]:
    """Read one split of a benchmark as :class:`Record` s, in file order.

    ``fmt``: a registered format name (karpathy | ifcap | nocaps | coco | lavis | folder) or ``auto``.
    ``images``: the image root (None: records carry no image path; for ``folder`` it defaults to
    ``annotations``). ``limit``: keep the first N images (N > 0). ``check_images``: every image must
    exist under ``images`` (otherwise a DataError lists the missing ones). A record whose image path
    escapes the image root carries ``error`` and no path.
    """
    ann_path = Path(annotations).expanduser()
    img_root = Path(images).expanduser() if images is not None else None
    if limit is not None and limit < 1:
        raise DataError(f"limit must be a positive number of images, got {limit}; leave it unset to read them all")
    ann = read_annotations(fmt, ann_path, split)
    entries = ann.entries
    folder = ann.layout.reads == "dir"
    if folder:
        if img_root is None:
            img_root = ann.source
        elif img_root != ann.source:
            entries = scan_folder(img_root)
    if limit is not None:
        entries = entries[:limit]
    refs = [() for _ in entries] if folder else clean_references(entries, ann.source)
    located = locate_images(entries, img_root, check_images and not folder, ann.source)
    return [
        Record(
            image_id=e.image_id,
            image_path=loc.path,
            references=r,
            split=split,
            domain=e.domain,
            coco_id=e.coco_id,
            error=loc.error,
        )
        for e, r, loc in zip(entries, refs, located)
    ]
