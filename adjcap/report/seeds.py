"""The seed study as a table (``rerank.seeds``; :mod:`adjcap.metrics.seeds` computes it): each learned
picker per head seed, mean +- sd across seeds, and Cohen's d (paired over images) against the fixed
fusion and the LM-only pick. The report and ``adjcap compare`` show it."""

from __future__ import annotations

from typing import Any

from adjcap.report.collect import RunData
from adjcap.report.tables import Table, fmt_number

SHOWN = (("B-4", 1), ("METEOR", 1), ("ROUGE-L", 1), ("CIDEr", 1), ("SPICE", 1), ("CLIPScore", 3), ("CHAIR_i", 2))
D_METRIC = "CIDEr"


def _pm(mean: Any, sd: Any, digits: int) -> str:
    if mean is None:
        return "n/a"
    return fmt_number(mean, digits) + (f" \u00b1 {fmt_number(sd, digits)}" if sd is not None else "")


def seeds_table(run: RunData, label: str, protocol: str) -> Table | None:
    """None when the protocol's metrics have no seed study."""
    study = run.metrics.get(protocol, {}).get("seeds")
    if not study or not study.get("pickers"):
        return None
    bases = list(study.get("baselines", []))
    cols = ["picker", "seed", *(n for n, _ in SHOWN), *(f"d {D_METRIC} vs {b}" for b in bases)]
    digits = {2 + k: dg for k, (_, dg) in enumerate(SHOWN)}
    digits.update({2 + len(SHOWN) + k: 2 for k in range(len(bases))})
    tab = Table(title=f"{label}: {protocol}, the learned pickers over {len(study['seeds'])} head seeds "
                      f"({', '.join(map(str, study['seeds']))})", columns=cols, digits=digits)
    for picker, s in study["pickers"].items():
        d = s.get("cohens_d", {})
        for seed, m in s["per_seed"].items():
            tab.rows.append([picker, seed, *(m.get(n) for n, _ in SHOWN),
                             *((d.get(b, {}).get(D_METRIC) or {}).get("per_seed", {}).get(seed) for b in bases)])
        tab.rows.append([picker, "mean \u00b1 sd", *(_pm(s["mean"].get(n), s["sd"].get(n), dg) for n, dg in SHOWN),
                         *(_pm((d.get(b, {}).get(D_METRIC) or {}).get("mean"),
                               (d.get(b, {}).get(D_METRIC) or {}).get("sd"), 2) for b in bases)])
        tab.rules.add(len(tab.rows))
    tab.rules.discard(len(tab.rows))
    tab.caption = ("Each seed fits the heads again on the same features (rerank.seeds); sd: sample standard "
                   "deviation across seeds. d: Cohen's d of the per-image " + D_METRIC + ", paired over images "
                   "(mean difference / sd of the differences), against each baseline's pick (which no seed "
                   "changes); metrics/<protocol>.json 'seeds' has d for every per-image metric.")
    return tab


def reproduced_seeds_table(results: list[Any]) -> Table | None:
    """``adjcap reproduce TABLE --seeds ...``: per row whose pick was fitted per seed (its
    :class:`adjcap.report.reproduced.RowResult` ``extra["seeds"]``: the study's entry for the row's
    picker), the per-seed CIDEr, mean +- sd and Cohen's d against fixed and LM-only; None when no row has one."""
    rows = [r for r in results if r.extra.get("seeds")]
    if not rows:
        return None
    tab = Table(title="The seed study: rows whose heads were fitted once per seed (--seeds)",
                columns=["row", "protocol / picker", "seeds", f"{D_METRIC} per seed", f"{D_METRIC} mean \u00b1 sd",
                         f"d {D_METRIC} vs fixed", f"d {D_METRIC} vs lm"])
    for r in rows:
        s = r.extra["seeds"]
        d = s.get("cohens_d", {})
        per = ", ".join(fmt_number(m.get(D_METRIC)) for m in s["per_seed"].values())
        tab.rows.append([r.row.label, f"{r.protocol} / {r.picker}", ", ".join(s["per_seed"]), per,
                         _pm(s["mean"].get(D_METRIC), s["sd"].get(D_METRIC), 1),
                         *(_pm((d.get(b, {}).get(D_METRIC) or {}).get("mean"),
                               (d.get(b, {}).get(D_METRIC) or {}).get("sd"), 2) for b in ("fixed", "lm"))])
    tab.caption = ("sd: across seeds (ddof 1); d: Cohen's d of the per-image " + D_METRIC + ", paired over images, "
                   "mean \u00b1 sd across seeds.")
    return tab
