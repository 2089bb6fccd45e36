"""NoCaps val: the official ``nocaps_val_4500_captions.json`` (COCO-shaped; ``images[]`` carry
``open_images_id`` and ``domain``) or IFCap's ``nocaps_corpus.json`` (a list of ``{"split":
in_domain|near_domain|out_domain, "image_id", "caption": [...]}``). Domains come out as
``in-domain`` / ``near-domain`` / ``out-domain``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adjcap.data.domains import normalize_domain
from adjcap.data.ids import basename, stem
from adjcap.data.layouts.coco import coco_entries, has_nocaps_images, is_coco_shaped
from adjcap.data.layouts.diagnose import head_dicts
from adjcap.data.layouts.registry import Entry, register_layout
from adjcap.data.records import reject_offenders


def looks_like_nocaps_official(obj: Any) -> bool:
    return is_coco_shaped(obj) and has_nocaps_images(obj)


def looks_like_ifcap_nocaps(obj: Any) -> bool:
    if not isinstance(obj, list):
        return False
    head = head_dicts(obj)
    return bool(head) and all(k in head[0] for k in ("image_id", "caption", "split"))


@register_layout(
    "nocaps_official",
    format="nocaps",
    description="the official nocaps captions file",
    sniff=looks_like_nocaps_official,
    accepted_by=("coco",),
)
def parse_nocaps_official(obj: dict[str, Any], path: Path, split: str | None) -> list[Entry]:
    return coco_entries(obj, path, nocaps=True)


@register_layout(
    "ifcap_nocaps",
    format="nocaps",
    description="IFCap's nocaps_corpus.json",
    sniff=looks_like_ifcap_nocaps,
    accepted_by=("ifcap",),
)
def parse_ifcap_nocaps(obj: list[Any], path: Path, split: str | None) -> list[Entry]:
    bad = [str(i) for i, d in enumerate(obj) if not isinstance(d, dict) or "image_id" not in d]
    reject_offenders(path, bad, "entries without an 'image_id' (list indices)")
    out = []
    bad_dom = []
    for d in obj:
        key = str(d["image_id"])
        dom = normalize_domain(d.get("split"))
        if dom is None:
            bad_dom.append(f"{key}: {d.get('split')!r}")
        out.append(Entry(image_id=key, rel_paths=(key,), refs=d.get("caption"), domain=dom, aliases=(basename(key), stem(key))))
    reject_offenders(path, bad_dom, "entries whose 'split' is not in_domain/near_domain/out_domain")
    return out
