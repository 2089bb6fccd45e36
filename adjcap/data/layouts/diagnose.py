"""Why a JSON annotation file matched no layout: one message naming the file and what was seen."""

from __future__ import annotations

from itertools import islice
from pathlib import Path
from typing import Any

from adjcap.data.records import DataError


def head_dicts(items: list[Any], n: int = 5) -> list[dict[str, Any]]:
    """The dicts among the first ``n`` items (what sniffers look at)."""
    return [x for x in items[:n] if isinstance(x, dict)]


def unrecognised(obj: Any, path: Path) -> DataError:
    """The DataError for content that no registered layout sniffed as its own."""
    if isinstance(obj, dict):
        imgs = obj.get("images")
        if isinstance(imgs, list):
            if not imgs:
                return DataError(f"{path}: 'images' is an empty list; the file has no images")
            return DataError(
                f"{path}: has an 'images' list but neither 'annotations' (COCO format) nor "
                f"per-image 'sentences' (Karpathy format); first entry: {str(imgs[0])[:200]}"
            )
        if not obj:
            return DataError(f"{path}: the JSON object is empty; the file has no images")
        keys = ", ".join(repr(k) for k in islice(obj, 8))
        return DataError(
            f"{path}: unrecognised annotation layout (a JSON object with keys {keys}). Expected a "
            "Karpathy dataset_*.json, a COCO captions file, the nocaps val captions file, or an "
            "IFCap {file name: [captions]} file"
        )
    if isinstance(obj, list):
        if not obj:
            return DataError(f"{path}: the JSON list is empty; the file has no images")
        head = head_dicts(obj)
        if head:
            d = head[0]
            if "image_name" in d and "prediction" in d:
                return DataError(
                    f"{path}: looks like generated captions (an IFCap/ViECap output with "
                    "'prediction'), not a reference annotation file"
                )
            if "image" in d:
                return DataError(
                    f"{path}: a BLIP/LAVIS image list without 'caption' fields; it holds no reference "
                    "captions (for nocaps use IFCap's nocaps_corpus.json or nocaps_val_4500_captions.json)"
                )
            if "image_id" in d and "caption" in d:
                return DataError(
                    f"{path}: looks like a COCO results (predictions) list [{{image_id, caption}}], "
                    "not a reference annotation file"
                )
        return DataError(
            f"{path}: unrecognised annotation layout (a JSON list whose first entry is "
            f"{str(obj[0])[:200]}). Expected IFCap's nocaps_corpus.json or a BLIP/LAVIS list"
        )
    return DataError(f"{path}: unrecognised annotation layout (top-level JSON {type(obj).__name__})")
