"""PNG plots for reports (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg", force=True)
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


def _save(fig: "plt.Figure", path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
    plt.close(fig)
    tmp.replace(path)
    return path


def cider_by_configuration(
    rows: Sequence[tuple],
    path: str | Path,
    *,
    published: Mapping[str, float] | None = None,
    title: str = "CIDEr by configuration",
) -> Path:
    """Horizontal bars: one per configuration (label, CIDEr x100[, (low, high) 95% interval drawn as
    an error bar]); dashed lines for published reference values {label: CIDEr}."""
    rows = [(r[0], r[1], r[2] if len(r) > 2 else None) for r in rows if r[1] is not None]
    n = max(len(rows), 1)
    fig, ax = plt.subplots(figsize=(7.5, 0.45 * n + 1.4))
    labels = [k for k, _, _ in rows]
    vals = [float(v) for _, v, _ in rows]
    y = range(len(rows))
    ci = [c for _, _, c in rows]
    err = None
    if any(c is not None for c in ci):
        err = [[v - c[0] if c else 0.0 for v, c in zip(vals, ci)], [c[1] - v if c else 0.0 for v, c in zip(vals, ci)]]
    bars = ax.barh(list(y), vals, color="#2F7DBC", xerr=err, ecolor="#333333", capsize=3,
                   error_kw={"elinewidth": 1})
    for b, v, c in zip(bars, vals, ci):
        ax.text(max(b.get_width(), c[1] if c else 0.0), b.get_y() + b.get_height() / 2, f" {v:.1f}", va="center",
                fontsize=8)
    if err is not None:
        ax.set_title(title + " (error bars: 95% bootstrap interval over images)", fontsize=10)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("CIDEr (x100)")
    if err is None:
        ax.set_title(title, fontsize=10)
    for k, (name, v) in enumerate((published or {}).items()):
        ax.axvline(v, linestyle="--", color=("#C04A1A", "#777777", "#2A9D8F")[k % 3], linewidth=1,
                   label=f"published: {name} {v:.1f}")
    if published:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    if not rows:
        ax.text(0.5, 0.5, "no CIDEr values", transform=ax.transAxes, ha="center")
    hi = max(vals + [c[1] for c in ci if c] + list((published or {}).values()) + [1.0])
    ax.set_xlim(0, hi * 1.15)
    return _save(fig, Path(path))


def hallucination_per_class(
    series: Mapping[str, Mapping[str, Mapping[str, int]]],
    path: str | Path,
    *,
    top: int = 15,
    title: str = "Hallucinated objects per COCO class (reference proxy)",
) -> Path:
    """Grouped horizontal bars of hallucinated counts per class for each series
    ({series name: CHAIR per_class {class: {"mentioned", "hallucinated"}}}); the ``top`` classes
    by total hallucinations."""
    totals: dict[str, int] = {}
    for per_class in series.values():
        for cls, d in per_class.items():
            totals[cls] = totals.get(cls, 0) + int(d.get("hallucinated", 0))
    classes = [c for c, t in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0])) if t > 0][:top]
    n_series = max(len(series), 1)
    fig, ax = plt.subplots(figsize=(7.5, 0.4 * max(len(classes), 1) * n_series ** 0.5 + 1.6))
    height = 0.8 / n_series
    colors = ["#C04A1A", "#2F7DBC", "#2A9D8F", "#E9C46A", "#6D597A"]
    for s, (name, per_class) in enumerate(series.items()):
        vals = [int(per_class.get(c, {}).get("hallucinated", 0)) for c in classes]
        ys = [i + s * height for i in range(len(classes))]
        ax.barh(ys, vals, height=height, label=name, color=colors[s % len(colors)])
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(classes))], classes, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("hallucinated mentions")
    ax.set_title(title, fontsize=10)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if classes:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    else:
        ax.text(0.5, 0.5, "no hallucinated objects", transform=ax.transAxes, ha="center")
    return _save(fig, Path(path))
