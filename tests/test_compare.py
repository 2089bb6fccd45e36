"""adjcap compare: B - A with paired bootstrap intervals, checked against an independent computation
on the runs' samples tables; refusals of runs that cannot be compared image by image."""

import json
import shutil

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from adjcap.config import load_config
from adjcap.metrics.run_metrics import evaluate_run
from adjcap.report.collect import load_run
from adjcap.report.compare import NotComparable, compare, compare_runs, to_text
from adjcap.storage.rundir import RunDir
from adjcap.storage.samples import write_samples
from test_report_render import _make_run


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A: the fixture run; B: the same images and references, the ensemble picking the other system's
    caption and the config changed."""
    a = _make_run(tmp_path_factory.mktemp("a"))
    b = tmp_path_factory.mktemp("b") / "run"
    shutil.copytree(a, b)
    for name, src in (("ensemble", "lm"),):  # B's ensemble picks what the LM picked
        (b / "predictions" / "inductive" / f"{name}.json").write_text(
            (b / "predictions" / "inductive" / f"{src}.json").read_text())
    (b / "config.toml").write_text(load_config("headline", ["verifier.enabled=false"]).to_toml())
    for r in (a, b):
        evaluate_run(r)
        write_samples(RunDir(r))
    return a, b


def _picks(run) -> pd.DataFrame:
    df = pd.read_parquet(RunDir(run).samples_path)
    rows = [dict(image_id=i, **p) for i, ps in zip(df.image_id, df.picks) for p in ps]
    return pd.DataFrame(rows)


def _independent(a, b, protocol, picker, n_boot=2000):
    """Per-image values from samples.parquet and numpy's own resampling: {metric: (delta, low, high)}."""
    pa, pb = _picks(a), _picks(b)
    sel = lambda p: p[(p.protocol == protocol) & (p.picker == picker)].set_index("image_id").sort_index()
    xa, xb = sel(pa), sel(pb)
    assert list(xa.index) == list(xb.index)
    n = len(xa)
    idx = np.random.default_rng(0).integers(0, n, (n_boot, n))
    stats = {
        "CIDEr": lambda x: x["cider"].to_numpy()[idx].mean(axis=1),
        "ROUGE-L": lambda x: x["rouge_l"].to_numpy()[idx].mean(axis=1),
        "METEOR": lambda x: x["meteor"].to_numpy()[idx].mean(axis=1),
        "CHAIR_i": lambda x: 100.0 * np.array([len(h) for h in x["chair_hallucinated"]])[idx].sum(axis=1)
        / np.maximum(np.array([len(m) for m in x["chair_mentioned"]])[idx].sum(axis=1), 1),
        "CHAIR_s": lambda x: 100.0 * (np.array([len(h) for h in x["chair_hallucinated"]]) > 0)[idx].mean(axis=1),
    }
    out = {}
    for name, f in stats.items():
        d = f(xb) - f(xa)
        out[name] = (np.quantile(d, 0.025), np.quantile(d, 0.975))
    return out, xa, xb


def test_intervals_match_an_independent_bootstrap_on_the_samples_table(two_runs):
    a, b = two_runs
    c = compare_runs(load_run(a), load_run(b))
    by = {(pc.protocol, pc.picker): pc for pc in c.pickers}
    assert set(by) == {("inductive", p) for p in ("lm", "ensemble", "trifuse", "memattend")} | {
        ("training-free", "lm"), ("training-free", "fixed")}
    want, xa, xb = _independent(a, b, "inductive", "ensemble")
    got = {m.metric: m.diff for m in by[("inductive", "ensemble")].metrics}
    assert by[("inductive", "ensemble")].n_images == len(xa) == 6
    for name, (low, high) in want.items():
        assert got[name] is not None, name
        assert got[name].low == pytest.approx(low) and got[name].high == pytest.approx(high), name
    assert got["CIDEr"].delta == pytest.approx(xb.cider.mean() - xa.cider.mean())
    assert got["CIDEr"].delta != 0 and got["CIDEr"].low <= got["CIDEr"].delta <= got["CIDEr"].high
    # the same picks in both runs: zero difference, a zero-width interval
    same = {m.metric: m.diff for m in by[("inductive", "lm")].metrics}
    assert same["CIDEr"].delta == 0 and same["CIDEr"].low == same["CIDEr"].high == 0
    assert "SPICE" not in got  # neither run computed it: not listed
    # BLEU-4 is corpus BLEU recomputed from per-image statistics: on all images, the report's figure
    for run, v in ((a, got["B-4"].a), (b, got["B-4"].b)):
        doc = json.loads((run / "metrics" / "inductive.json").read_text())
        assert v == pytest.approx(doc["pickers"]["ensemble"]["metrics"]["B-4"])
    assert by[("inductive", "ensemble")].metrics[0].exact


def test_config_and_provenance_differences_are_listed(two_runs, tmp_path):
    a, b = two_runs
    c = compare_runs(load_run(a), load_run(b))
    keys = {k: (x, y) for k, x, y in c.config_diff}
    assert keys["verifier.enabled"] == (True, False)
    text = to_text(c)
    assert "verifier.enabled: A True  B False" in text and "B - A" in text and "95% CI" in text
    comps, written = compare([a, b], tmp_path)
    md = written["markdown"].read_text()
    assert "| metric | A | B | B - A | 95% CI | verdict |" in md and "verifier.enabled" in md
    assert "<table class='metrics'>" in written["html"].read_text()


def _variant(src, dst, edit):
    shutil.copytree(src, dst)
    refs_path = dst / "references" / "coco-test.json"
    refs = json.loads(refs_path.read_text())
    edit(refs)
    refs_path.write_text(json.dumps(refs))
    return dst


def test_different_image_sets_are_refused_unless_intersection(two_runs, tmp_path):
    a, b = two_runs
    drop = sorted(json.loads((a / "references" / "coco-test.json").read_text()))[0]
    c = _variant(b, tmp_path / "c", lambda r: r.pop(drop))
    with pytest.raises(NotComparable, match=r"different image sets: .* 6 images, .* 5, 5 shared .*--intersection"):
        compare_runs(load_run(a), load_run(c))
    res = compare_runs(load_run(a), load_run(c), intersection=True)
    assert all(pc.n_images == 5 for pc in res.pickers) and "5 shared images" in res.intersection_note
    d = _variant(b, tmp_path / "d", lambda r: r[drop].__setitem__(0, "another reference"))
    with pytest.raises(NotComparable, match=r"different references: 1 of the 6 shared images"):
        compare_runs(load_run(a), load_run(d), intersection=True)


def test_cli_prints_differences_and_refuses_with_one_line(two_runs, tmp_path):
    from adjcap.cli import app

    a, b = two_runs
    res = CliRunner().invoke(app, ["compare", str(a), str(b), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "inductive / ensemble" in res.output and "CIDEr" in res.output and (tmp_path / "compare.html").exists()
    res = CliRunner().invoke(app, ["compare", str(a), str(tmp_path)])
    assert res.exit_code == 2 and "no metrics" in res.output and "Traceback" not in res.output
