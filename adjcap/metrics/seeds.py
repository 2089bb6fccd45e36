"""The seed study (``rerank.seeds``): each learned picker scored once per head seed, summarised.

* Per seed: the picker's corpus metrics (:data:`SEED_METRICS`, as the main table has them).
* Across seeds: the mean and the sample standard deviation (ddof 1; None with one seed).
* Cohen's d, paired over images (paper, Limitations: "a multi-seed Cohen's d over TriFuse/MemAttend
  training initialisations"): for a per-image metric x, a learned picker's pick L at seed s and a
  baseline B (the fixed fusion, the LM-only pick), d_s = mean(x_L - x_B) / sd(x_L - x_B) over the images
  both scored (sd with ddof 1; None when the differences do not vary). Each seed's d, and their mean and
  sd across seeds. The baselines do not depend on the head seed, so each is scored once.

Pure functions over what :func:`adjcap.metrics.run_metrics.evaluate_run` scores; it writes the result as
``seeds`` in ``metrics/<protocol>.json``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# corpus figures shown per seed: (name, where in a picker's metrics)
SEED_METRICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("B-4", ("metrics", "B-4")), ("METEOR", ("metrics", "METEOR")), ("ROUGE-L", ("metrics", "ROUGE-L")),
    ("CIDEr", ("metrics", "CIDEr")), ("SPICE", ("metrics", "SPICE")), ("CLIPScore", ("clipscore", "CLIPScore")),
    ("CHAIR_s", ("chair", "CHAIR_s")), ("CHAIR_i", ("chair", "CHAIR_i")),
)
# per-image metrics Cohen's d is computed on (those every compared image has)
D_METRICS = ("CIDEr", "SPICE", "METEOR", "ROUGE-L", "CLIPScore")
BASELINES = ("fixed", "lm")


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return None if math.isnan(float(v)) else float(v)


def _get(doc: Mapping[str, Any], path: tuple[str, ...]) -> float | None:
    cur: Any = doc
    for p in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(p)
    return _number(cur)


def mean_sd(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """(mean, sample sd with ddof 1) of the values; None where undefined (no value; sd of one value)."""
    xs = [v for v in values if v is not None]
    if not xs or len(xs) != len(values):
        return None, None
    a = np.asarray(xs, dtype=np.float64)
    return float(a.mean()), (float(a.std(ddof=1)) if len(a) > 1 else None)


def cohens_d_paired(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Cohen's d of paired samples: mean(x - y) / sd(x - y), ddof 1; None when n < 2 or sd = 0."""
    d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
    if d.size < 2:
        return None
    sd = float(d.std(ddof=1))
    return float(d.mean() / sd) if sd > 0 else None


def paired_values(a: Mapping[str, Mapping[str, Any]], b: Mapping[str, Mapping[str, Any]],
                  metric: str) -> tuple[list[float], list[float]] | None:
    """The metric's per-image values of the images both scored (sorted ids); None when any lacks it."""
    ids = sorted(set(a) & set(b))
    xs = [_number((a[i] or {}).get(metric)) for i in ids]
    ys = [_number((b[i] or {}).get(metric)) for i in ids]
    if not ids or any(v is None for v in xs + ys):
        return None
    return xs, ys  # type: ignore[return-value]


def seed_study(scored: Mapping[str, Mapping[int, Mapping[str, Any]]],
               per_image: Mapping[str, Mapping[int, Mapping[str, Mapping[str, Any]]]],
               baselines: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, Any]:
    """``scored``: picker -> seed -> its metrics (one :meth:`Evaluator.score` result without per_image);
    ``per_image``: picker -> seed -> image -> metric; ``baselines``: baseline picker -> image -> metric.
    -> {"seeds", "baselines", "pickers": {picker: {"per_seed", "mean", "sd", "cohens_d"}}} (JSON keys:
    seeds as strings)."""
    seeds = sorted({s for by_seed in scored.values() for s in by_seed})
    out: dict[str, Any] = {"seeds": seeds, "baselines": [b for b in BASELINES if b in baselines],
                           "d_metrics": list(D_METRICS), "pickers": {}}
    for picker, by_seed in scored.items():
        ss = sorted(by_seed)
        per_seed = {str(s): {name: _get(by_seed[s], path) for name, path in SEED_METRICS} for s in ss}
        mean: dict[str, float | None] = {}
        sd: dict[str, float | None] = {}
        for name, _ in SEED_METRICS:
            mean[name], sd[name] = mean_sd([per_seed[str(s)][name] for s in ss])
        d: dict[str, Any] = {}
        for base in out["baselines"]:
            d[base] = {}
            for metric in D_METRICS:
                per = {}
                for s in ss:
                    pair = paired_values(per_image[picker][s], baselines[base], metric)
                    per[str(s)] = cohens_d_paired(*pair) if pair is not None else None
                if all(v is None for v in per.values()):
                    continue
                m, v = mean_sd(list(per.values()))
                d[base][metric] = {"per_seed": per, "mean": m, "sd": v}
        out["pickers"][picker] = {"per_seed": per_seed, "mean": mean, "sd": sd, "cohens_d": d}
    return out
