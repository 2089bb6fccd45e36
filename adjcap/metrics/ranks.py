"""Rank statistics the paper reports beside the metrics.

* Spearman rho between the retrieval cosine and the verifier score over each image's top-L
  retrieved captions -> mean and std over images (paper: 0.41 +- 0.18 over the top 9);
* how often a picker's choice differs from another's (e.g. from the LM-only pick);
* top-1 agreement of two pickers (e.g. the two heads).

Spearman rho is the Pearson correlation of average ranks (ties share the mean of their ranks),
which is what ``scipy.stats.spearmanr`` computes.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np


def rankdata(x: Any) -> np.ndarray:
    """Ranks 1..n with ties given the average of the ranks they span."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"rankdata expects a 1-D array, got shape {a.shape}")
    order = np.argsort(a, kind="mergesort")
    sorted_a = a[order]
    ranks = np.empty(len(a), dtype=np.float64)
    i = 0
    n = len(a)
    while i < n:
        j = i
        while j + 1 < n and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        ranks[order[i : j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def spearman(x: Any, y: Any) -> float:
    """Spearman rank correlation of two equal-length sequences; NaN when undefined (fewer than
    two pairs, or one side constant). Pairs with a NaN are dropped."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"spearman: need two 1-D sequences of equal length, got {a.shape} and {b.shape}")
    ok = ~(np.isnan(a) | np.isnan(b))
    a, b = a[ok], b[ok]
    if len(a) < 2:
        return float("nan")
    ra, rb = rankdata(a), rankdata(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = math.sqrt(float(np.sum(ra * ra)) * float(np.sum(rb * rb)))
    if den == 0.0:
        return float("nan")
    return float(np.sum(ra * rb) / den)


def _rows(feature_rows: Any) -> Iterable[Mapping[str, Any]]:
    if hasattr(feature_rows, "to_pylist"):
        cols = [
            c
            for c in ("image_id", "error", "retrieved", "verified", "retrieved_verifier")
            if c in feature_rows.column_names
        ]
        return feature_rows.select(cols).to_pylist()
    return feature_rows


def retrieval_verifier_pairs(row: Mapping[str, Any]) -> tuple[list[float], list[float], str]:
    """(retrieval cosines, verifier scores, source) of one feature row.

    With the verifier score of each of the L retrieved captions (the ``verifier`` field of each
    ``retrieved`` entry, or a ``retrieved_verifier`` list aligned with it) all L pairs are used (source ``"retrieved"``); otherwise only the k
    kept captions in ``verified``, which carry their ``retrieval_rank`` (source ``"verified"``).
    """
    retrieved = row.get("retrieved") or []
    rv = row.get("retrieved_verifier")
    if rv is None and retrieved and all(
        r.get("verifier") is not None and not math.isnan(float(r["verifier"])) for r in retrieved
    ):
        rv = [float(r["verifier"]) for r in retrieved]  # the feature table's per-retrieved verifier score
    if rv is not None and len(rv) == len(retrieved) and len(retrieved) > 0:
        return [float(r["cosine"]) for r in retrieved], [float(v) for v in rv], "retrieved"
    cos, ver = [], []
    for v in row.get("verified") or []:
        rank = v.get("retrieval_rank")
        if rank is None or not (0 <= int(rank) < len(retrieved)):
            continue
        cos.append(float(retrieved[int(rank)]["cosine"]))
        ver.append(float(v["verifier"]))
    return cos, ver, "verified"


def retrieval_verifier_spearman(feature_rows: Any) -> dict[str, Any]:
    """Per-image Spearman rho(retrieval cosine, verifier) -> mean, std (population, over images
    where it is defined), counts, and which pairs were used (see :func:`retrieval_verifier_pairs`)."""
    rhos: list[float] = []
    sources: set[str] = set()
    n_pairs: list[int] = []
    undefined = 0
    for row in _rows(feature_rows):
        if row.get("error"):
            continue
        cos, ver, src = retrieval_verifier_pairs(row)
        rho = spearman(cos, ver)
        if math.isnan(rho):
            undefined += 1
            continue
        sources.add(src)
        rhos.append(rho)
        n_pairs.append(len(cos))
    arr = np.asarray(rhos, dtype=np.float64)
    return {
        "mean": float(arr.mean()) if len(arr) else None,
        "std": float(arr.std()) if len(arr) else None,
        "n_images": len(rhos),
        "n_undefined": undefined,
        "pairs_per_image": float(np.mean(n_pairs)) if n_pairs else None,
        "source": "+".join(sorted(sources)) if sources else None,
    }


def top1_agreement(a: Mapping[Hashable, Any], b: Mapping[Hashable, Any]) -> float | None:
    """Fraction (0..1) of images (present in both) where the two picks are equal; None if none."""
    common = [k for k in a if k in b]
    if not common:
        return None
    return sum(1 for k in common if a[k] == b[k]) / len(common)


def pick_disagreement(picks: Mapping[str, Mapping[Hashable, Any]], reference: str = "lm") -> dict[str, float]:
    """For every picker but ``reference``: fraction (0..1) of images where its pick differs from
    the reference picker's (e.g. how often the output scorer overrides the LM-only pick)."""
    if reference not in picks:
        raise KeyError(f"pick_disagreement: no picks for the reference picker '{reference}'; have {sorted(picks)}")
    ref = picks[reference]
    out: dict[str, float] = {}
    for name, p in picks.items():
        if name == reference:
            continue
        agree = top1_agreement(ref, p)
        if agree is not None:
            out[name] = 1.0 - agree
    return out


def pairwise_agreement(picks: Mapping[str, Mapping[Hashable, Any]]) -> dict[str, dict[str, float | None]]:
    """Top-1 agreement of every pair of pickers (symmetric matrix as nested dict)."""
    names = list(picks)
    return {a: {b: top1_agreement(picks[a], picks[b]) for b in names} for a in names}
