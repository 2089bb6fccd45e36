"""The report's first table: LM-only against each adjudicated picker, difference and paired bootstrap CI."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from adjcap.metrics.bootstrap import paired_bootstrap, ratio_percent
from adjcap.report.collect import RunData
from adjcap.report.headline import headline_table, picker_differences


def test_paired_bootstrap_brackets_a_real_shift_and_not_noise():
    rng = np.random.default_rng(0)
    a = rng.normal(50, 20, size=200)
    shifted = paired_bootstrap(a, a + 5 + rng.normal(0, 5, size=200))
    assert shifted.excludes_zero and shifted.low < shifted.delta < shifted.high and 3 < shifted.delta < 7
    noise = paired_bootstrap(a, a + rng.normal(0, 5, size=200))
    assert not noise.excludes_zero
    assert paired_bootstrap(a, a + 1.0) == paired_bootstrap(a, a + 1.0)  # deterministic
    with pytest.raises(ValueError, match="same images"):
        paired_bootstrap(a, a[:10])


def test_ratio_statistic_is_chair_i():
    x = np.array([[2, 1], [3, 0], [0, 0], [5, 2]], dtype=float)  # (mentioned, hallucinated) per image
    assert ratio_percent(x) == pytest.approx(100 * 3 / 10)
    d = paired_bootstrap(x, np.array([[2, 0], [3, 0], [0, 0], [5, 1]], dtype=float), ratio_percent, samples=200)
    assert d.a == pytest.approx(30.0) and d.b == pytest.approx(10.0) and d.delta == pytest.approx(-20.0)


def _run(n: int = 120) -> RunData:
    rng = np.random.default_rng(1)
    lm = rng.uniform(0, 100, n)
    per = {"lm": {}, "ensemble": {}, "retrieval": {}}
    for k in range(n):
        iid = f"img{k}"
        per["lm"][iid] = {"CIDEr": lm[k], "CHAIR_mentioned": 2, "CHAIR_hallucinated": int(k % 2)}
        per["ensemble"][iid] = {"CIDEr": lm[k] + 10 + rng.normal(0, 5), "CHAIR_mentioned": 2,
                                "CHAIR_hallucinated": int(k % 5 == 0)}
        per["retrieval"][iid] = {"CIDEr": lm[k] + rng.normal(0, 5), "CHAIR_mentioned": 2,
                                 "CHAIR_hallucinated": int(k % 2)}

    def agg(p):
        v = per[p].values()
        return {"metrics": {"CIDEr": float(np.mean([x["CIDEr"] for x in v]))}, "n_images": n,
                "chair": {"CHAIR_i": 100 * sum(x["CHAIR_hallucinated"] for x in v) / sum(x["CHAIR_mentioned"] for x in v)}}

    doc = {"protocol": "inductive", "pickers": {p: agg(p) for p in per}, "per_image": per}
    return RunData(path=Path("."), name="r", metrics={"inductive": doc})


def test_headline_rows_and_intervals():
    run = _run()
    tab = headline_table(run, "r")
    assert [row[1] for row in tab.rows] == ["LM-only (IFCap)", "ensemble", "retrieval"]
    lm_row, ens, ret = tab.rows
    assert lm_row[3] is None and ens[2] == pytest.approx(run.picker_metrics("inductive", "ensemble")["metrics"]["CIDEr"])
    assert ens[3] == pytest.approx(ens[2] - lm_row[2])
    d = picker_differences(run, "inductive", "ensemble")
    assert d["CIDEr"].excludes_zero and ens[4].endswith("*")
    assert d["CHAIR_i"].high < 0 and ens[6] == pytest.approx(ens[5] - lm_row[5])
    assert not picker_differences(run, "inductive", "retrieval")["CHAIR_i"].excludes_zero
    md = tab.to_markdown()
    assert "LM-only (IFCap)" in md and "bootstrap" in md and "95% CI" in md


def test_no_table_without_lm_only():
    run = _run()
    del run.metrics["inductive"]["pickers"]["lm"]
    assert headline_table(run, "r") is None


def test_a_lone_judge_that_beats_the_adjudicated_pickers_is_named_and_explained():
    from adjcap.report.headline import strongest_judge_note

    run = _run()  # the ensemble is the best picker: nothing to explain
    assert strongest_judge_note(run, "inductive") is None
    assert "alone scores highest" not in headline_table(run, "r").caption
    doc = run.metrics["inductive"]
    ens = doc["pickers"]["ensemble"]["metrics"]["CIDEr"]
    doc["pickers"]["retrieval"]["metrics"]["CIDEr"] = ens + 8.4  # the demo world's case
    note = strongest_judge_note(run, "inductive")
    assert note and "retrieval judge alone" in note and f"{ens + 8.4:.1f}" in note and "ensemble" in note
    assert note in headline_table(run, "r").caption
