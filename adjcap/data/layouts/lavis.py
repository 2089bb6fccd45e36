"""The BLIP/LAVIS annotation list ``[{"image": "val2014/....jpg", "caption": str | [str], "image_id"?}]``
(one entry per caption or per image); also read under format ``coco``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adjcap.data.ids import basename, coco_id_from_name, stem
from adjcap.data.layouts.diagnose import head_dicts
from adjcap.data.layouts.registry import Entry, register_layout
from adjcap.data.records import reject_offenders


def looks_like_lavis(obj: Any) -> bool:
    if not isinstance(obj, list):
        return False
    head = head_dicts(obj)
    return bool(head) and "image" in head[0] and "caption" in head[0]


@register_layout(
    "lavis", format="lavis", description="a BLIP/LAVIS annotation list", sniff=looks_like_lavis, accepted_by=("coco",)
)
def parse_lavis(obj: list[Any], path: Path, split: str | None) -> list[Entry]:
    bad = [str(i) for i, d in enumerate(obj) if not isinstance(d, dict) or not isinstance(d.get("image"), str)]
    reject_offenders(path, bad, "entries without an 'image' path string (list indices)")
    by_key: dict[str, Entry] = {}
    for d in obj:
        img = d["image"]
        cap = d.get("caption")
        key = basename(img)
        e = by_key.get(key)
        if e is None:
            cid = coco_id_from_name(key)
            al = [img, stem(key)] + ([str(cid)] if cid is not None else [])
            if "image_id" in d:
                al.append(str(d["image_id"]))
            e = by_key[key] = Entry(
                image_id=key, rel_paths=(img, key) if img != key else (key,), refs=[], coco_id=cid, aliases=tuple(al)
            )
        if isinstance(cap, list):
            e.refs.extend(cap)
        else:
            e.refs.append(cap)
    return list(by_key.values())
