"""`adjcap reproduce captioner-sweep`: its rows as data (IFCap and the hf family, each LM-only /
training-free / inductive ensemble, same judges), on the demo world the hf rows on the tiny BLIP
captioner of the demo cache; and the paired bootstrap interval of a difference against the LM-only pick."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from adjcap.cli import app
from adjcap.report.reproduced import RowResult, paired_intervals
from adjcap.reproduce import distinct_runs, get_table, plan_table


def test_the_sweep_runs_two_families_with_the_same_judges(tmp_path):
    table = get_table("captioner-sweep")
    plans = plan_table(table, "demo", runs_dir=tmp_path)
    families = [p.cfg.captioner.family for p in plans]
    assert families == ["ifcap"] * 3 + ["hf"] * 3
    assert len(distinct_runs(plans)) == 4  # LM-only and the ensemble read one run per family
    for p in plans:
        ifcap = plans[0].cfg
        assert p.cfg.verifier == ifcap.verifier and p.cfg.retrieval == ifcap.retrieval  # the same judges
        if p.cfg.captioner.family == "hf":
            assert p.cfg.captioner.hf.model == "{cache}/tiny/blip-caption"
    assert plan_table(table, None)[3].cfg.captioner.hf.model == "Salesforce/blip-image-captioning-large"
    res = CliRunner().invoke(app, ["reproduce", "--list"])
    assert res.exit_code == 0 and "\ncaptioner-sweep  " in res.output and "BLIP large captioning" in res.output


def test_a_difference_against_the_lm_pick_gets_its_paired_interval(tmp_path):
    table = get_table("captioner-sweep")
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lm = {f"i{k}": {"CIDEr": float(x)} for k, x in enumerate(rng.uniform(0, 100, 50))}
    ens = {k: {"CIDEr": v["CIDEr"] + 10.0} for k, v in lm.items()}  # every image 10 better
    (run / "metrics" / "inductive.json").write_text(json.dumps(
        {"protocol": "inductive", "pickers": {"lm": {}, "ensemble": {}}, "per_image": {"lm": lm, "ensemble": ens}}))
    rows = {r.label: r for r in table.rows}
    results = [RowResult(rows["IFCap, LM-only pick"], "demo", "inductive", "lm", run_dir=str(run)),
               RowResult(rows["IFCap, inductive ensemble"], "demo", "inductive", "ensemble", run_dir=str(run)),
               RowResult(rows["BLIP large captioning, LM-only pick"], "demo", "inductive", "lm", run_dir="a"),
               RowResult(rows["BLIP large captioning, inductive ensemble"], "demo", "inductive", "ensemble", run_dir="b")]
    out = paired_intervals(table, results)
    assert [d["label"] for d in out] == ["IFCap: ensemble - LM-only"]  # the BLIP rows' runs are not there
    d = out[0]
    assert abs(d["delta"] - 10.0) < 1e-9 and abs(d["low"] - 10.0) < 1e-9 and d["excludes_zero"] and d["images"] == 50
