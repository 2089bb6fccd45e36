"""Karpathy's ``dataset_coco.json`` / ``dataset_flickr30k.json``:
``{"images": [{"filepath"?, "filename", "split", "sentences": [{"raw", "tokens"}], "cocoid"?}]}``.
The split ``train`` means Karpathy's ``train`` + ``restval`` (the 113K-image training set)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from adjcap.data.ids import coco_id_from_name, stem
from adjcap.data.layouts.diagnose import head_dicts
from adjcap.data.layouts.registry import Entry, register_layout
from adjcap.data.records import DataError, reject_offenders


def looks_like_karpathy(obj: Any) -> bool:
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("images"), list)
        and "annotations" not in obj
        and any("sentences" in d for d in head_dicts(obj["images"]))
    )


def split_counts(imgs: list[dict[str, Any]]) -> str:
    counts = Counter(str(im["split"]) for im in imgs)
    return ", ".join(f"{k} ({v})" for k, v in sorted(counts.items()))


def karpathy_images(obj: dict[str, Any], path: Path, split: str | None) -> list[dict[str, Any]]:
    """The raw image dicts of ``split`` (``train`` = train + restval), checked for filename/split."""
    imgs = obj["images"]
    bad = [str(i) for i, im in enumerate(imgs) if not isinstance(im, dict) or "filename" not in im or "split" not in im]
    reject_offenders(path, bad, "'images' entries without 'filename' and 'split' (list indices)")
    if split is None:
        raise DataError(f"{path}: a Karpathy file holds several splits ({split_counts(imgs)}); say which one (--split)")
    wanted = {"train", "restval"} if split == "train" else {split}
    sel = [im for im in imgs if im["split"] in wanted]
    if not sel:
        raise DataError(f"{path}: no images in split '{split}'; the file has: {split_counts(imgs)}")
    return sel


def sentence_texts(sents: list[Any]) -> list[Any]:
    """``raw`` of each sentence (else its joined ``tokens``); anything else is kept as found so that
    validation names the image."""
    out: list[Any] = []
    for s in sents:
        if isinstance(s, dict) and isinstance(s.get("raw"), str):
            out.append(s["raw"])
        elif isinstance(s, dict) and isinstance(s.get("tokens"), list):
            out.append(" ".join(map(str, s["tokens"])))
        else:
            out.append(s)
    return out


@register_layout("karpathy", format="karpathy", description="a Karpathy dataset_*.json", sniff=looks_like_karpathy)
def parse_karpathy(obj: dict[str, Any], path: Path, split: str | None) -> list[Entry]:
    out = []
    for im in karpathy_images(obj, path, split):
        fname = str(im["filename"])
        fpath = im.get("filepath")
        cid = im.get("cocoid")
        cid = int(cid) if isinstance(cid, int) or (isinstance(cid, str) and cid.isdigit()) else None
        if cid is None:
            cid = coco_id_from_name(fname)
        sents = im.get("sentences")
        refs = sentence_texts(sents) if isinstance(sents, list) else sents
        aliases = [fname, stem(fname)]
        if cid is not None:
            aliases.append(str(cid))
        if fpath:
            aliases.append(f"{fpath}/{fname}")
        out.append(
            Entry(
                image_id=fname,
                rel_paths=(f"{fpath}/{fname}", fname) if fpath else (fname,),
                refs=refs,
                coco_id=cid,
                split=str(im["split"]),
                aliases=tuple(aliases),
            )
        )
    return out
