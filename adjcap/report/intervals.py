"""Bootstrap intervals of every metric of a run's main table: per protocol and picker, each metric's
percentile interval over the images the picker was scored on, from one resampling of those images
shared by every metric (the statistics of :data:`adjcap.metrics.bootstrap.PER_IMAGE_STATISTICS`,
the ones ``adjcap compare`` uses for differences)."""

from __future__ import annotations

from adjcap.metrics.bootstrap import (
    BOOTSTRAP_SAMPLES,
    PER_IMAGE_STATISTICS,
    Interval,
    bootstrap_interval,
    resample_indices,
    statistic_matrices,
)
from adjcap.report.collect import RunData


def picker_intervals(run: RunData, protocol: str, picker: str, *, samples: int = BOOTSTRAP_SAMPLES,
                     level: float = 0.95) -> dict[str, tuple[Interval, bool]]:
    """{metric: (interval, exact)} for the metrics with per-image values on every scored image;
    ``exact`` False: the interval is of the mean per-image score, not of the corpus figure (METEOR)."""
    per = run.per_image(protocol, picker)
    ids = sorted(per)
    if not ids:
        return {}
    draws = resample_indices(len(ids), samples)
    out: dict[str, tuple[Interval, bool]] = {}
    for name in PER_IMAGE_STATISTICS:
        st, x, _ = statistic_matrices(name, per, None, ids)
        if x is None:
            continue
        if st.columns[:1] == ("CHAIR_mentioned",) and st.statistic is not None and x[:, 0].sum() == 0 \
                and name == "CHAIR_i":
            continue
        out[name] = (bootstrap_interval(x, st.statistic, samples=samples, level=level, indices=draws), st.exact)
    return out


def interval_text(iv: Interval, digits: int, exact: bool = True) -> str:
    return f" [{iv.low:.{digits}f}, {iv.high:.{digits}f}]" + ("" if exact else "†")
