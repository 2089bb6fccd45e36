"""A COCO captions annotation file: ``{"images": [{"id", "file_name"?}], "annotations": [{"image_id",
"caption"}]}`` (``captions_val2014.json``, BLIP's ``coco_karpathy_test_gt.json``). The nocaps official
file shares the shape (see nocaps.py) and is read by :func:`coco_entries` too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from adjcap.data.domains import normalize_domain
from adjcap.data.ids import basename, coco_id_from_name, stem
from adjcap.data.layouts.diagnose import head_dicts
from adjcap.data.layouts.registry import Entry, register_layout
from adjcap.data.records import DataError, reject_offenders


def is_coco_shaped(obj: Any) -> bool:
    return isinstance(obj, dict) and isinstance(obj.get("images"), list) and "annotations" in obj


def has_nocaps_images(obj: dict[str, Any]) -> bool:
    return any("open_images_id" in d or "domain" in d for d in head_dicts(obj["images"]))


def looks_like_coco(obj: Any) -> bool:
    return is_coco_shaped(obj) and not has_nocaps_images(obj)


def captions_by_image(obj: dict[str, Any], path: Path) -> dict[Any, list[Any]]:
    anns = obj.get("annotations")
    if not isinstance(anns, list):
        raise DataError(f"{path}: 'annotations' must be a list of {{image_id, caption}}")
    by_img: dict[Any, list[Any]] = {}
    bad = []
    for i, a in enumerate(anns):
        if not isinstance(a, dict) or "image_id" not in a or "caption" not in a:
            bad.append(str(i))
            continue
        by_img.setdefault(a["image_id"], []).append(a["caption"])
    reject_offenders(path, bad, "annotations without 'image_id' and 'caption' (list indices)")
    return by_img


def coco_entries(obj: dict[str, Any], path: Path, nocaps: bool) -> list[Entry]:
    """Entries of a COCO-shaped file; ``nocaps``: images carry ``domain`` and ``open_images_id``."""
    by_img = captions_by_image(obj, path)
    out = []
    bad: list[str] = []
    bad_dom: list[str] = []
    seen = set()
    for i, im in enumerate(obj["images"]):
        if not isinstance(im, dict) or "id" not in im:
            bad.append(str(i))
            continue
        num = im["id"]
        seen.add(num)
        fname = im.get("file_name")
        num_int = num if isinstance(num, int) else (int(num) if str(num).isdigit() else None)
        aliases: list[str] = [str(num)]
        if nocaps:
            dom = normalize_domain(im.get("domain"))
            if dom is None:
                bad_dom.append(f"{num}: {im.get('domain')!r}")
            oid = im.get("open_images_id")
            if oid:
                aliases.append(str(oid))
            if not fname and oid:
                fname = f"{oid}.jpg"
            coco_id = None
        else:
            dom = None
            coco_id = coco_id_from_name(fname) if fname else num_int
            if coco_id is None:
                coco_id = num_int
        if fname:
            image_id = basename(str(fname))
            aliases += [str(fname), stem(str(fname))]
            rel: tuple[str, ...] = (str(fname),) if str(fname) == image_id else (str(fname), image_id)
        else:
            image_id = str(num)
            rel = ()
        out.append(
            Entry(
                image_id=image_id,
                rel_paths=rel,
                refs=by_img.get(num, []),
                domain=dom,
                coco_id=coco_id,
                aliases=tuple(aliases),
                numeric_id=num_int if not fname else None,
            )
        )
    reject_offenders(path, bad, "'images' entries without an 'id' (list indices)")
    reject_offenders(path, bad_dom, "images whose 'domain' is not in-domain/near-domain/out-domain")
    orphans = [str(k) for k in by_img if k not in seen]
    reject_offenders(path, orphans, "annotations refer to image ids missing from 'images'")
    return out


@register_layout("coco", format="coco", description="a COCO captions annotation file", sniff=looks_like_coco)
def parse_coco(obj: dict[str, Any], path: Path, split: str | None) -> list[Entry]:
    return coco_entries(obj, path, nocaps=False)
