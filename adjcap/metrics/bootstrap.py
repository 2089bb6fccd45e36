"""Paired bootstrap over images: how sure a difference between two pickers on the same images is."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
    indices: np.ndarray | None = None,
) -> PairedDifference:
    """``a``, ``b``: per-image values of two systems on the same images, row k = image k (a row may
    hold several columns, e.g. CHAIR's mentioned and hallucinated counts). ``statistic`` maps such an
    [n, c] array to the corpus figure (default: the mean of the first column, which is how CIDEr,
    ROUGE-L, ... average per-image scores). Deterministic for a given ``seed``; ``indices`` (from
    :func:`resample_indices`) gives the draws instead, so that several metrics share one resampling
    (the default draws are the same as ``resample_indices(n, samples, seed)``)."""
    xa = np.asarray(a, dtype=np.float64).reshape(len(a), -1)
    xb = np.asarray(b, dtype=np.float64).reshape(len(b), -1)
    if xa.shape != xb.shape or len(xa) == 0:
        raise ValueError(f"paired_bootstrap: need per-image values of both systems on the same images, "
                         f"got shapes {xa.shape} and {xb.shape}")
    stat = statistic or (lambda x: float(x[:, 0].mean()))
    n = len(xa)
    draws = resample_indices(n, samples, seed) if indices is None else _checked(indices, n)
    deltas = np.array([stat(xb[idx]) - stat(xa[idx]) for idx in draws])
    tail = (1.0 - level) / 2.0
    va, vb = stat(xa), stat(xb)
    return PairedDifference(a=va, b=vb, delta=vb - va, low=float(np.quantile(deltas, tail)),
                            high=float(np.quantile(deltas, 1.0 - tail)), n_images=n, level=level)


def ratio_percent(x: np.ndarray) -> float:
    """100 * sum(column 1) / sum(column 0): e.g. CHAIR_i from per-image (mentioned, hallucinated)."""
    den = float(x[:, 0].sum())
    return 100.0 * float(x[:, 1].sum()) / den if den else 0.0


def resample_indices(n: int, samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """[samples, n] image indices drawn with replacement: one bootstrap resampling that every metric
    of a comparison (and every picker of a table) reuses."""
    return np.random.default_rng(seed).integers(0, n, (samples, n))


def _checked(indices: np.ndarray, n: int) -> np.ndarray:
    idx = np.asarray(indices)
    if idx.ndim != 2 or idx.shape[1] != n:
        raise ValueError(f"bootstrap indices of shape {idx.shape} do not resample {n} images")
    return idx


@dataclass(frozen=True)
class Interval:
    """A corpus figure on all images and its percentile bootstrap interval."""

    value: float
    low: float
    high: float
    n_images: int
    level: float


def bootstrap_interval(
    x: Sequence[Sequence[float]] | np.ndarray,
    statistic: Callable[[np.ndarray], float] | None = None,
    *,
    samples: int = BOOTSTRAP_SAMPLES,
    level: float = 0.95,
    seed: int = BOOTSTRAP_SEED,
    indices: np.ndarray | None = None,
) -> Interval:
    """The interval of one system's figure (rows = images, as :func:`paired_bootstrap`)."""
    xs = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    if len(xs) == 0:
        raise ValueError("bootstrap_interval: no per-image values")
    stat = statistic or (lambda v: float(v[:, 0].mean()))
    draws = resample_indices(len(xs), samples, seed) if indices is None else _checked(indices, len(xs))
    vals = np.array([stat(xs[idx]) for idx in draws])
    tail = (1.0 - level) / 2.0
    return Interval(value=stat(xs), low=float(np.quantile(vals, tail)), high=float(np.quantile(vals, 1.0 - tail)),
                    n_images=len(xs), level=level)


def any_hallucinated_percent(x: np.ndarray) -> float:
    """100 * share of rows whose column 1 is > 0: CHAIR_s from per-image (mentioned, hallucinated)."""
    return 100.0 * float((x[:, 1] > 0).mean()) if len(x) else 0.0


def corpus_bleu4(x: np.ndarray) -> float:
    """Corpus BLEU-4 x100 (pycocoevalcap's formula) from per-image rows of
    ``adjcap.metrics.coco.BLEU_STAT_KEYS`` (lengths, guesses and matches summed over the rows)."""
    t = x.sum(axis=0)
    testlen, reflen, guess, correct = t[0], t[1], t[2:6], t[6:10]
    tiny, small = 1e-15, 1e-9
    bleu = float(np.prod((correct + tiny) / (guess + small))) ** 0.25
    ratio = (testlen + tiny) / (reflen + small)
    if ratio < 1:
        bleu *= float(np.exp(1 - 1 / ratio))
    return 100.0 * bleu


@dataclass(frozen=True)
class PerImageStatistic:
    """How a reported metric is made from per-image values (``metrics/<protocol>.json`` per_image
    keys ``columns``). ``exact``: the statistic is the figure the report prints (CIDEr, ROUGE-L, SPICE
    and CLIPScore are means of per-image scores, CHAIR from per-image counts); False for corpus BLEU
    and METEOR, which are not means of per-image scores: their interval is that of the mean per-image
    score."""

    columns: tuple[str, ...]
    statistic: Callable[[np.ndarray], float] | None = None  # None: mean of the first column
    lower_is_better: bool = False
    exact: bool = True
    digits: int = 1
    fallback: "PerImageStatistic | None" = None  # when the per-image columns are absent (older runs)


# the report's metrics that can be resampled over images, in the report's column order
PER_IMAGE_STATISTICS: Mapping[str, PerImageStatistic] = {
    "B-4": PerImageStatistic(("bleu_testlen", "bleu_reflen", *(f"bleu_guess{n}" for n in range(1, 5)),
                              *(f"bleu_correct{n}" for n in range(1, 5))), corpus_bleu4,
                             fallback=PerImageStatistic(("B-4",), exact=False)),
    "METEOR": PerImageStatistic(("METEOR",), exact=False),
    "ROUGE-L": PerImageStatistic(("ROUGE-L",)),
    "CIDEr": PerImageStatistic(("CIDEr",)),
    "SPICE": PerImageStatistic(("SPICE",)),
    "CLIPScore": PerImageStatistic(("CLIPScore",), digits=3),
    "CHAIR_s": PerImageStatistic(("CHAIR_mentioned", "CHAIR_hallucinated"), any_hallucinated_percent,
                                 lower_is_better=True, digits=2),
    "CHAIR_i": PerImageStatistic(("CHAIR_mentioned", "CHAIR_hallucinated"), ratio_percent,
                                 lower_is_better=True, digits=2),
}


def per_image_matrix(per_image: Mapping[str, Mapping[str, float | None]], ids: Sequence[str],
                     columns: Sequence[str]) -> np.ndarray | None:
    """[len(ids), len(columns)] of per-image values; None when any image lacks any column."""
    rows = []
    for i in ids:
        d = per_image.get(i) or {}
        vals = [d.get(c) for c in columns]
        if any(v is None for v in vals):
            return None
        rows.append(vals)
    return np.asarray(rows, dtype=np.float64).reshape(len(ids), len(columns))


def statistic_matrices(name: str, per_a: Mapping[str, Mapping[str, float | None]],
                       per_b: Mapping[str, Mapping[str, float | None]] | None, ids: Sequence[str]
                       ) -> tuple[PerImageStatistic, np.ndarray | None, np.ndarray | None]:
    """The statistic of metric ``name`` that both per-image tables can feed (its fallback when one
    lacks the columns), with the two matrices (``per_b`` None: one table)."""
    st: PerImageStatistic | None = PER_IMAGE_STATISTICS[name]
    first = st
    while st is not None:
        xa = per_image_matrix(per_a, ids, st.columns)
        xb = per_image_matrix(per_b, ids, st.columns) if per_b is not None else None
        if xa is not None and (per_b is None or xb is not None):
            return st, xa, xb
        st = st.fallback
    return first, per_image_matrix(per_a, ids, first.columns), (
        per_image_matrix(per_b, ids, first.columns) if per_b is not None else None)
