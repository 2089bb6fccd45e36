"""Paired differences between two picks that need not share a run (the LVLM protocol's rows against
greedy decoding, a run of its own): per-image values of both picks on the images both were scored on,
the same bootstrap draws for every metric (:mod:`adjcap.metrics.bootstrap`).

Metrics (per-image columns of ``metrics/<protocol>.json``, :mod:`adjcap.metrics.evaluate`): CIDEr (mean),
CHAIR_s (% captions with a hallucinated object), CHAIR_i (hallucinated / mentioned, %), object recall
(ground-truth classes mentioned / ground-truth classes, %) and length (mean words); CHAIR here is the
run's first CHAIR (``eval.chair``: proxy, or instances when only instances is asked)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from adjcap.metrics.bootstrap import PairedDifference, paired_bootstrap, ratio_percent
from adjcap.report.collect import RunData


def _share_hallucinated(x: np.ndarray) -> float:
    return 100.0 * float((x[:, 0] > 0).mean()) if len(x) else 0.0


def _mean(x: np.ndarray) -> float:
    return float(x[:, 0].mean()) if len(x) else 0.0


# metric -> (per-image columns, statistic over the [images, columns] array)
PAIRED_METRICS: dict[str, tuple[tuple[str, ...], Callable[[np.ndarray], float]]] = {
    "CHAIR_s": (("CHAIR_hallucinated",), _share_hallucinated),
    "CHAIR_i": (("CHAIR_mentioned", "CHAIR_hallucinated"), ratio_percent),
    "recall": (("CHAIR_objects", "CHAIR_recalled"), ratio_percent),
    "words": (("words",), _mean),
    "CIDEr": (("CIDEr",), _mean),
}


def paired_across(a: RunData, a_protocol: str, a_picker: str, b: RunData, b_protocol: str,
                  b_picker: str) -> dict[str, PairedDifference | None]:
    """(a's pick) - (b's pick) per metric of :data:`PAIRED_METRICS` on the images both have the metric's
    columns for, with its 95% paired bootstrap interval; None where no image has them."""
    pa, pb = a.per_image(a_protocol, a_picker), b.per_image(b_protocol, b_picker)
    out: dict[str, PairedDifference | None] = {}
    for name, (cols, stat) in PAIRED_METRICS.items():
        ids = sorted(i for i in set(pa) & set(pb) if all(k in pa[i] and k in pb[i] for k in cols))
        if not ids:
            out[name] = None
            continue
        xa = np.array([[pa[i][k] for k in cols] for i in ids], dtype=float)
        xb = np.array([[pb[i][k] for k in cols] for i in ids], dtype=float)
        out[name] = paired_bootstrap(xb, xa, stat)  # the same draws for every metric of the same images
    return out


def as_rows(label: str, diffs: dict[str, PairedDifference | None], **extra: Any) -> list[dict[str, Any]]:
    """JSON rows of :func:`paired_across` (one per metric that has values)."""
    return [{"label": label, "metric": m, "delta": d.delta, "low": d.low, "high": d.high,
             "excludes_zero": bool(d.excludes_zero), "images": int(d.n_images), **extra}
            for m, d in diffs.items() if d is not None]
