"""Reranker diagnostics reported by the evaluation: top-1 agreement between pickers, how often a
picker differs from the LM's own pick, and the heads' training-loss curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from adjcap.rerank.features import BeamFeatures
from adjcap.rerank.pickers import pick
from adjcap.rerank.heads import Heads

Picks = Sequence[int] | np.ndarray | Mapping[str, Any]


def _index(p: Any) -> int:
    if isinstance(p, (int, np.integer)):
        return int(p)
    if isinstance(p, Mapping):
        return int(p["index"])
    return int(getattr(p, "index"))


def agreement(picks_a: Picks, picks_b: Picks) -> float:
    """Top-1 agreement rate in [0, 1]. Index arrays of equal length are compared position by
    position; mappings image_id -> index (or -> Pick) are compared on their common image ids."""
    if isinstance(picks_a, Mapping) and isinstance(picks_b, Mapping):
        common = [k for k in picks_a if k in picks_b]
        if not common:
            return float("nan")
        return float(np.mean([_index(picks_a[k]) == _index(picks_b[k]) for k in common]))
    a = np.asarray(picks_a, dtype=np.int64)
    b = np.asarray(picks_b, dtype=np.int64)
    if a.shape != b.shape:
        raise ValueError(f"agreement: pick arrays differ in shape {a.shape} vs {b.shape}")
    return float(np.mean(a == b)) if a.size else float("nan")


def differs_from_lm(picks: Picks, feats: BeamFeatures) -> float:
    """Fraction of images whose pick differs from the LM-only pick (argmax of the LM feature)."""
    lm = pick(feats, "lm")
    if isinstance(picks, Mapping):
        lm_map = {iid: int(i) for iid, i in zip(feats.image_ids, lm)}
        return 1.0 - agreement(picks, lm_map)
    return 1.0 - agreement(picks, lm)


def loss_curves(heads: Heads | None) -> dict[str, list[float]]:
    """Per-epoch training losses of each fitted head."""
    if heads is None:
        return {}
    return {k: list(v) for k, v in heads.losses.items()}
