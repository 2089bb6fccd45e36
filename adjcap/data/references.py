"""Reference captions keyed by canonical image id, from any annotation layout but ``folder``
(what ``evaluate --references`` reads), with every id spelling a prediction may use.

Canonical image ids are strings: the image file name where the layout has one
(``COCO_val2014_000000391895.jpg``, ``1007129816.jpg``, ``0.jpg``), otherwise the numeric id as a string
(``391895``). :class:`References` maps the other spellings (numeric COCO id, file name, stem, relative
path, Open Images id) back to the canonical id.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from adjcap.data.annotations import read_annotations
from adjcap.data.ids import basename, coco_id_from_name, stem
from adjcap.data.layouts import Entry
from adjcap.data.records import DataError, Record, offenders, reject_offenders


def clean_references(entries: list[Entry], path: Path) -> list[tuple[str, ...]]:
    """Validated reference lists, blank captions dropped; DataError on wrong types, images without
    references and duplicate ids (naming the offenders and their count)."""
    wrong: list[str] = []
    empty: list[str] = []
    out: list[tuple[str, ...]] = []
    for e in entries:
        refs = e.refs
        if not isinstance(refs, (list, tuple)) or not all(isinstance(c, str) for c in refs):
            wrong.append(e.image_id)
            out.append(())
            continue
        kept = tuple(c for c in refs if c.strip())
        if not kept:
            empty.append(e.image_id)
        out.append(kept)
    reject_offenders(path, wrong, "reference captions must be a list of strings; these images do not have one")
    if empty:
        raise DataError(
            f"{path}: images with no reference captions: {offenders(empty)}. Every image of a "
            "benchmark needs at least one reference; remove these images or use the right annotation file"
        )
    dup = [k for k, v in Counter(e.image_id for e in entries).items() if v > 1]
    reject_offenders(path, dup, "image ids listed more than once")
    return out


@dataclass
class References:
    """Reference captions keyed by canonical image id, plus the id spellings predictions may use."""

    captions: dict[str, list[str]]
    domains: dict[str, str] | None = None
    aliases: dict[str, str] = field(default_factory=dict)
    source: str = ""
    fmt: str = ""
    coco_ids: dict[str, int] = field(default_factory=dict)  # image id -> COCO image id, where known

    def __len__(self) -> int:
        return len(self.captions)

    @property
    def ids(self) -> list[str]:
        return list(self.captions)

    def resolve(self, pred_image_id: Any) -> str | None:
        """The canonical id for a prediction's ``image_id`` (int or str: numeric COCO id, file name,
        relative path, stem), or None when it matches no image."""
        if pred_image_id is None or isinstance(pred_image_id, bool):
            return None
        if isinstance(pred_image_id, float):
            if not pred_image_id.is_integer():
                return None
            pred_image_id = int(pred_image_id)
        if isinstance(pred_image_id, int) or type(pred_image_id).__name__.startswith(("int", "uint")):
            key = str(int(pred_image_id))
        else:
            key = str(pred_image_id).strip()
        base = basename(key)
        tries = [key, base, stem(base)]
        if key.isdigit():
            tries.append(str(int(key)))
        cid = coco_id_from_name(base)
        if cid is not None:
            tries.append(str(cid))
        for k in tries:
            if k in self.captions:
                return k
            hit = self.aliases.get(k)
            if hit is not None:
                return hit
        return None

    def subset(self, ids: Iterable[str]) -> "References":
        keep = [i for i in ids if i in self.captions]
        ks = set(keep)
        return References(
            captions={i: self.captions[i] for i in keep},
            domains={i: self.domains[i] for i in keep} if self.domains is not None else None,
            aliases={a: c for a, c in self.aliases.items() if c in ks},
            coco_ids={i: c for i, c in self.coco_ids.items() if i in ks},
            source=self.source,
            fmt=self.fmt,
        )

    @classmethod
    def from_records(cls, records: list[Record], source: str = "", fmt: str = "") -> "References":
        entries = [
            Entry(
                image_id=r.image_id,
                rel_paths=(),
                refs=list(r.references),
                domain=r.domain,
                coco_id=r.coco_id,
                aliases=(basename(r.image_id), stem(r.image_id)) + ((str(r.coco_id),) if r.coco_id is not None else ()),
            )
            for r in records
        ]
        return build_references(entries, [list(r.references) for r in records], source, fmt)


def build_references(entries: list[Entry], refs: list[Any], source: str, fmt: str) -> References:
    """References from entries and their cleaned captions; an alias two images share is dropped."""
    captions = {e.image_id: list(r) for e, r in zip(entries, refs)}
    has_dom = any(e.domain is not None for e in entries)
    domains = {e.image_id: e.domain for e in entries if e.domain is not None} if has_dom else None
    aliases: dict[str, str] = {}
    ambiguous: set[str] = set()
    for e in entries:
        for a in e.aliases:
            if not a or a in captions or a in ambiguous:
                continue
            prev = aliases.get(a)
            if prev is None:
                aliases[a] = e.image_id
            elif prev != e.image_id:
                ambiguous.add(a)
                del aliases[a]
    coco_ids = {e.image_id: int(e.coco_id) for e in entries if e.coco_id is not None}
    return References(captions=captions, domains=domains, aliases=aliases, source=source, fmt=fmt, coco_ids=coco_ids)


def read_references(path: str | Path, fmt: str = "auto", split: str | None = None) -> References:
    """Reference captions of an annotation file (any layout but ``folder``).

    ``split`` selects the split of a Karpathy file (``train`` = train + restval) and the
    ``<split>_captions.json`` of an IFCap annotation directory; other layouts hold one split.
    """
    p = Path(path).expanduser()
    ann = read_annotations(fmt, p, split)
    if ann.layout.reads == "dir":
        raise DataError(f"{p}: a folder of images has no reference captions; pass an annotation file")
    refs = clean_references(ann.entries, ann.source)
    return build_references(ann.entries, refs, str(ann.source), ann.layout.format)
