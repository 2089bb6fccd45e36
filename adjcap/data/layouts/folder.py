"""A directory of images (searched recursively, hidden entries skipped) without references, for
captioning one's own images. Every file with an image extension becomes a record, whatever it turns
out to be (a dangling symlink, a FIFO, an unreadable file): decoding gives such a file its error row,
so one odd file never stops the run. Symlinked directories are not followed."""

from __future__ import annotations

import os
from pathlib import Path

from adjcap.data.ids import IMAGE_EXTENSIONS, basename, coco_id_from_name, stem
from adjcap.data.layouts.ifcap import is_annotation_dir
from adjcap.data.layouts.registry import Entry, register_layout
from adjcap.data.records import DataError


def looks_like_folder(path: Path) -> bool:
    return path.is_dir() and not is_annotation_dir(path)


@register_layout("folder", format="folder", description="a folder of images", sniff=looks_like_folder, reads="dir")
def scan_folder(root: Path, path: Path | None = None, split: str | None = None) -> list[Entry]:
    if not root.exists():
        raise DataError(f"{root}: image folder not found; check the path given as images/annotations")
    if not root.is_dir():
        raise DataError(f"{root}: not a directory; the 'folder' format takes a directory of images")
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in filenames:
            if not fn.startswith(".") and os.path.splitext(fn)[1].lower() in IMAGE_EXTENSIONS:
                files.append(Path(dirpath, fn).relative_to(root).as_posix())
    files.sort()
    if not files:
        raise DataError(
            f"{root}: no image files found (looked for {', '.join(sorted(IMAGE_EXTENSIONS))}, recursively)"
        )
    out = []
    for rel in files:
        base = basename(rel)
        cid = coco_id_from_name(base)
        al = (base, stem(rel)) + ((str(cid),) if cid is not None else ())
        out.append(Entry(image_id=rel, rel_paths=(rel,), refs=(), coco_id=cid, aliases=al))
    return out
