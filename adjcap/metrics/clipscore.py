"""CLIPScore (Hessel et al. 2021, reference-free): ``w * max(cos(image, caption), 0)``, w = 2.5.

The paper computes it with one fixed encoder, ViT-bigG/14 (``eval.clipscore``), for every run. Stage 4
stores, for every beam candidate, that encoder's cosine between the image and the candidate
(``candidates[j].clipscore_cosine``), so the CLIPScore of any picker's choice needs no re-encoding:
:func:`clipscore_from_features`. Feature tables written before that column existed fall back to
``retrieval_cosine`` (the run's own output scorer; the result's ``source`` says which). :func:`clipscore` works
from raw embeddings.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

CLIPSCORE_W = 2.5


def clipscore_from_cosine(cos: Any, w: float = CLIPSCORE_W) -> np.ndarray:
    """Elementwise ``w * max(cos, 0)``."""
    c = np.asarray(cos, dtype=np.float64)
    return w * np.maximum(c, 0.0)


def clipscore(image_emb: Any, text_emb: Any, w: float = CLIPSCORE_W) -> np.ndarray:
    """CLIPScore of paired embeddings: (D,) & (D,) -> scalar array, (N, D) & (N, D) -> (N,).

    Embeddings are L2-normalised here (unnormalised inputs are fine). Accepts numpy arrays or
    torch tensors.
    """
    a = _to_numpy(image_emb)
    b = _to_numpy(text_emb)
    if a.shape != b.shape:
        raise ValueError(f"clipscore: image embeddings {a.shape} and text embeddings {b.shape} must match")
    if a.ndim not in (1, 2):
        raise ValueError(f"clipscore: expected (D,) or (N, D) embeddings, got shape {a.shape}")
    na = np.linalg.norm(a, axis=-1, keepdims=True)
    nb = np.linalg.norm(b, axis=-1, keepdims=True)
    if np.any(na == 0) or np.any(nb == 0):
        raise ValueError("clipscore: an embedding is all zeros")
    cos = np.sum((a / na) * (b / nb), axis=-1)
    return clipscore_from_cosine(cos, w)


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float64)


@dataclass
class ClipScoreResult:
    mean: float | None  # mean over scored images (None when none could be scored)
    per_image: dict[Hashable, float] = field(default_factory=dict)
    n_images: int = 0
    n_missing: int = 0  # picked images without a usable cosine (errors, no match, NaN)
    source: str = "clipscore_cosine"  # the candidate field the cosines came from

    def to_dict(self, per_image: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"CLIPScore": self.mean, "n_images": self.n_images, "n_missing": self.n_missing,
                               "source": self.source}
        if per_image:
            out["per_image"] = {str(k): v for k, v in self.per_image.items()}
        return out


def _rows(feature_rows: Any) -> Iterable[Mapping[str, Any]]:
    if hasattr(feature_rows, "to_pylist"):  # pyarrow Table
        cols = [c for c in ("image_id", "error", "candidates") if c in feature_rows.column_names]
        return feature_rows.select(cols).to_pylist()
    return feature_rows


def clipscore_from_features(
    feature_rows: Any, picks: Mapping[Hashable, int | str], w: float = CLIPSCORE_W
) -> ClipScoreResult:
    """CLIPScore of each image's picked candidate from its stored ``clipscore_cosine`` (the fixed
    CLIPScore encoder's), or ``retrieval_cosine`` in tables that predate that field.

    ``feature_rows``: feature-table rows (dicts, or a pyarrow Table with FEATURE_SCHEMA).
    ``picks``: image_id -> candidate index (int) or the picked caption text (str; matched
    against the candidates' text). Images in ``picks`` without a usable cosine are counted in
    ``n_missing``, never scored as 0.
    """
    by_id: dict[str, Mapping[str, Any]] = {}
    for r in _rows(feature_rows):
        by_id[str(r["image_id"])] = r
    # tables written before the CLIPScore encoder had its own field hold no clipscore_cosine values
    has_own = any(c.get("clipscore_cosine") is not None for r in by_id.values() for c in (r.get("candidates") or []))
    field_name = "clipscore_cosine" if has_own else "retrieval_cosine"
    per: dict[Hashable, float] = {}
    missing = 0
    for img, pick in picks.items():
        row = by_id.get(str(img))
        if row is None or row.get("error") or not row.get("candidates"):
            missing += 1
            continue
        cands = row["candidates"]
        cand = None
        if isinstance(pick, (int, np.integer)) and not isinstance(pick, bool):
            if 0 <= int(pick) < len(cands):
                cand = cands[int(pick)]
        elif isinstance(pick, str):
            target = pick.strip()
            cand = next((c for c in cands if (c.get("text") or "").strip() == target), None)
        cos = None if cand is None else cand.get(field_name)
        if cos is None or (isinstance(cos, float) and math.isnan(cos)):
            missing += 1
            continue
        per[img] = float(clipscore_from_cosine(cos, w))
    mean = float(np.mean(list(per.values()))) if per else None
    return ClipScoreResult(mean=mean, per_image=per, n_images=len(per), n_missing=missing, source=field_name)
