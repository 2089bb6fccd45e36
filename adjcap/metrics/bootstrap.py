"""Paired bootstrap over images: how sure a difference between two pickers on the same images is."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0


@dataclass(frozen=True)
class PairedDifference:
    """``b - a`` on all images, and its percentile bootstrap interval (images resampled with
    replacement, the same draw for both systems)."""

    a: float
    b: float
    delta: float
    low: float
    high: float
    n_images: int
    level: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0.0 or self.high < 0.0


def paired_bootstrap(
    a: Sequence[Sequence[float]] | np.ndarray,
    b: Sequence[Sequence[float]] | np.ndarray,
    statistic: Callable[[np.ndarray], float] | None = None,
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    level: float = 0.95,
    seed: int = BOOTSTRAP_SEED,
) -> PairedDifference:
    """``a``, ``b``: per-image values of two systems on the same images, row k = image k (a row may
    hold several columns, e.g. CHAIR's mentioned and hallucinated counts). ``statistic`` maps such an
    [n, c] array to the corpus figure (default: the mean of the first column, which is how CIDEr,
    BLEU, ... average per-image scores). Deterministic for a given ``seed``."""
    xa = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    xb = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    if xa.shape != xb.shape or len(xa) == 0:
        raise ValueError(f"paired_bootstrap: need per-image values of both systems on the same images, "
                         f"got shapes {xa.shape} and {xb.shape}")
    stat = statistic or (lambda x: float(x[:, 0].mean()))
    n = len(xa)
    rng = np.random.default_rng(seed)
    deltas = np.empty(samples)
    for s in range(samples):
        idx = rng.integers(0, n, n)
        deltas[s] = stat(xb[idx]) - stat(xa[idx])
    tail = (1.0 - level) / 2.0
    va, vb = stat(xa), stat(xb)
    return PairedDifference(a=va, b=vb, delta=vb - va, low=float(np.quantile(deltas, tail)),
                            high=float(np.quantile(deltas, 1.0 - tail)), n_images=n, level=level)


def ratio_percent(x: np.ndarray) -> float:
    """100 * sum(column 1) / sum(column 0): e.g. CHAIR_i from per-image (mentioned, hallucinated)."""
    den = float(x[:, 0].sum())
    return 100.0 * float(x[:, 1].sum()) / den if den else 0.0
