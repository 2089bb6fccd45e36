"""The report's first table, read like the paper's headline: the LM-only pick (IFCap's own caption)
against each adjudicated picker on the same images, with the difference and a paired bootstrap
confidence interval over images (CIDEr and the reference-proxy CHAIR_i)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from adjcap.metrics.bootstrap import PairedDifference, paired_bootstrap, ratio_percent
from adjcap.report.collect import LM_PICKER, RunData
from adjcap.report.tables import Table

CHAIR_COUNTS = ("CHAIR_mentioned", "CHAIR_hallucinated")


def _common(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]], keys: tuple[str, ...]) -> list[str]:
    return sorted(i for i in a if i in b and all(a[i].get(k) is not None and b[i].get(k) is not None for k in keys))


def picker_differences(run: RunData, protocol: str, picker: str) -> dict[str, PairedDifference | None]:
    """``picker`` minus LM-only on the images both were scored on: CIDEr (mean of per-image CIDEr)
    and CHAIR_i (hallucinated / mentioned objects, %); None where the per-image values are absent."""
    lm, other = run.per_image(protocol, LM_PICKER), run.per_image(protocol, picker)
    out: dict[str, PairedDifference | None] = {"CIDEr": None, "CHAIR_i": None}
    ids = _common(lm, other, ("CIDEr",))
    if ids:
        out["CIDEr"] = paired_bootstrap([[lm[i]["CIDEr"]] for i in ids], [[other[i]["CIDEr"]] for i in ids])
    ids = _common(lm, other, CHAIR_COUNTS)
    if ids:
        a = np.array([[lm[i][k] for k in CHAIR_COUNTS] for i in ids], dtype=float)
        b = np.array([[other[i][k] for k in CHAIR_COUNTS] for i in ids], dtype=float)
        if a[:, 0].sum() > 0 and b[:, 0].sum() > 0:
            out["CHAIR_i"] = paired_bootstrap(a, b, ratio_percent)
    return out


def _ci(d: PairedDifference | None) -> str | None:
    if d is None:
        return None
    mark = " *" if d.excludes_zero else ""
    return f"[{d.low:+.1f}, {d.high:+.1f}]{mark}"


def headline_table(run: RunData, label: str) -> Table | None:
    """Rows: per protocol, LM-only then every adjudicated picker; CIDEr, its difference from LM-only
    with a 95% paired bootstrap CI, CHAIR_i likewise (lower is better). None when the run has no
    LM-only predictions to compare against."""
    tab = Table(
        title=f"{label}: adjudication vs the LM-only pick (IFCap's own caption), same images",
        columns=["protocol", "picker", "CIDEr", "delta CIDEr", "95% CI", "CHAIR_i %", "delta CHAIR_i", "95% CI ",
                 "images"],
        label="tab:" + re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-") + "-headline",
        digits={2: 1, 3: 1, 5: 1, 6: 1},
    )
    level = None
    for proto in run.protocols:
        if LM_PICKER not in run.pickers(proto):
            continue
        tab.rules.add(len(tab.rows))
        lm = run.picker_metrics(proto, LM_PICKER)
        tab.rows.append([proto, "LM-only (IFCap)", lm.get("metrics", {}).get("CIDEr"), None, None,
                         (lm.get("chair") or {}).get("CHAIR_i"), None, None, lm.get("n_images")])
        for picker in run.pickers(proto):
            if picker == LM_PICKER:
                continue
            m = run.picker_metrics(proto, picker)
            d = picker_differences(run, proto, picker)
            level = level or next((x.level for x in d.values() if x is not None), None)
            cider, chair = d["CIDEr"], d["CHAIR_i"]
            tab.rows.append([
                proto, picker, m.get("metrics", {}).get("CIDEr"), cider.delta if cider else None, _ci(cider),
                (m.get("chair") or {}).get("CHAIR_i"), chair.delta if chair else None, _ci(chair),
                m.get("n_images"),
            ])
    if not tab.rows:
        return None
    n = max((r[-1] or 0) for r in tab.rows)
    notes = [x for x in (strongest_judge_note(run, proto) for proto in run.protocols) if x]
    tab.caption = (
        f"delta = picker - LM-only on the same images; CI: {int(100 * (level or 0.95))}% paired percentile "
        f"bootstrap over the {n} images (2,000 resamples); * = the interval excludes zero. CIDEr x100, higher "
        "is better; CHAIR_i (% of mentioned COCO objects that are hallucinated; the CHAIR table names its ground "
        "truth, the references by default), lower is better." + "".join(" " + x for x in notes))
    return tab


def _single_judge(picker: str) -> str | None:
    """The one frozen scorer a picker follows alone (no heads, one scorer), else None."""
    from adjcap.picker_needs import PICKER_NEEDS

    if picker not in PICKER_NEEDS:
        return None
    spec = PICKER_NEEDS.get(picker)
    return spec.scorers[0] if len(spec.scorers) == 1 and not spec.heads else None


def strongest_judge_note(run: RunData, protocol: str) -> str | None:
    """When one frozen judge alone beats every adjudicated picker on CIDEr, say so and why: the heads
    learn the judges' Borda consensus, which weighs each judge equally, so a world where one judge is
    much better than the others favours following it alone (the paper's judges are closer, and its
    ensemble is its best row)."""
    cider = {p: run.picker_metrics(protocol, p).get("metrics", {}).get("CIDEr") for p in run.pickers(protocol)}
    cider = {p: c for p, c in cider.items() if c is not None}
    judges = {p: c for p, c in cider.items() if p != LM_PICKER and _single_judge(p)}
    adjudicated = {p: c for p, c in cider.items() if p != LM_PICKER and p not in judges}
    if not judges or not adjudicated:
        return None
    best_judge = max(judges, key=judges.get)
    best_adj = max(adjudicated, key=adjudicated.get)
    if judges[best_judge] <= adjudicated[best_adj]:
        return None
    return (f"{protocol}: the {best_judge} judge alone scores highest here (CIDEr {judges[best_judge]:.1f} against "
            f"{adjudicated[best_adj]:.1f} for {best_adj}, the best adjudicated picker): the heads learn the judges' "
            "Borda consensus, which weighs every judge equally, so where one judge is much better than the others "
            "following it alone wins; in the paper the judges are closer and the ensemble is its best row.")
