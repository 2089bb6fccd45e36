"""The seed study (``rerank.seeds``): a demo run's heads fitted once per seed on the same features, each
learned picker scored per seed, mean and sd across seeds and Cohen's d (paired over images) against the
fixed fusion and the LM-only pick, checked against numpy on the stored per-image metrics; the report and
``adjcap compare`` show it; without seeds nothing of it is written."""

import json
import shutil

import numpy as np
import pytest
from typer.testing import CliRunner

from adjcap.cli import app
from adjcap.config import load_config
from adjcap.features import rows_to_table
from adjcap.pipeline import run_pipeline
from adjcap.rundir import RunDir
from adjcap.jobs import extract_features

SEEDS = [42, 43, 44]


@pytest.fixture(scope="module")
def demo_features(demo_cfg, tmp_path_factory):
    """A demo run directory with features of 8 val and 8 test images (in-process pipeline), not yet fitted."""
    cfg = load_config("demo", [f"paths.cache_dir={demo_cfg.paths.cache_dir}", "limit=8", "captioner.beam_width=4"])
    rcfg = cfg.resolved()
    run = RunDir(tmp_path_factory.mktemp("seeds") / "run")
    records = extract_features.read_records(rcfg)
    with run.lock():
        run.write_config(cfg.to_toml())
        extract_features.write_references(run, rcfg.benchmark, records)
        for split, recs in records.items():
            run.write_part(rcfg.benchmark, split, rows_to_table(run_pipeline(recs, rcfg)))
    return run


def _fit_and_evaluate(run: RunDir, *sets: str) -> None:
    args = ["fit", "--run", str(run.path)]
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["evaluate", "--run", str(run.path)])
    assert res.exit_code == 0, res.output


@pytest.fixture(scope="module")
def runs(demo_features, tmp_path_factory):
    """(one seed, three seeds): the same features fitted as the demo preset says, and with rerank.seeds."""
    single = RunDir(tmp_path_factory.mktemp("single") / "run")
    shutil.copytree(demo_features.path, single.path)
    _fit_and_evaluate(single)
    study = RunDir(tmp_path_factory.mktemp("study") / "run")
    shutil.copytree(demo_features.path, study.path)
    _fit_and_evaluate(study, f"rerank.seeds={SEEDS}")
    return single, study


def test_per_seed_metrics_mean_sd_and_cohens_d_match_numpy(runs):
    single, study = runs
    doc = json.loads(study.metrics_path("inductive").read_text())
    s = doc["seeds"]
    assert s["seeds"] == SEEDS and s["baselines"] == ["fixed", "lm"]
    assert set(s["pickers"]) == {"ensemble", "trifuse", "memattend"}
    per_image = doc["per_image"]
    for picker, st in s["pickers"].items():
        # the run's own seed (42) is the run's own heads: its picks are the picker's main predictions
        assert json.loads((study.seed_predictions_dir("inductive") / f"{picker}.seed-42.json").read_text()) == \
            study.predictions("inductive", picker)
        assert s["per_image"][picker]["42"] == per_image[picker]
        ciders = [st["per_seed"][str(seed)]["CIDEr"] for seed in SEEDS]
        assert ciders[0] == doc["pickers"][picker]["metrics"]["CIDEr"]
        assert np.isclose(st["mean"]["CIDEr"], np.mean(ciders))
        assert np.isclose(st["sd"]["CIDEr"], np.std(ciders, ddof=1))
        for base in ("fixed", "lm"):
            ds = []
            for seed in SEEDS:
                mine = s["per_image"][picker][str(seed)]
                ids = sorted(mine)
                diff = np.array([mine[i]["CIDEr"] - per_image[base][i]["CIDEr"] for i in ids])
                want = diff.mean() / diff.std(ddof=1)
                got = st["cohens_d"][base]["CIDEr"]["per_seed"][str(seed)]
                assert np.isclose(got, want), (picker, base, seed, got, want)
                ds.append(want)
            assert np.isclose(st["cohens_d"][base]["CIDEr"]["mean"], np.mean(ds))
            assert np.isclose(st["cohens_d"][base]["CIDEr"]["sd"], np.std(ds, ddof=1))
    # other seeds are other heads: fitted, saved, and their weights differ from seed 42's
    w = {x: _weights(study.seed_heads_dir(x) / "trifuse.safetensors") for x in SEEDS}
    assert _same(w[42], _weights(study.heads_dir / "trifuse.safetensors"))
    assert not _same(w[43], w[42]) and not _same(w[44], w[42])


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path))


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(bool((a[k] == b[k]).all()) for k in a)


def test_report_and_compare_show_the_seed_study(runs, tmp_path):
    single, study = runs
    res = CliRunner().invoke(app, ["report", "--run", str(study.path)])
    assert res.exit_code == 0, res.output
    md = study.report_md.read_text()
    assert "over 3 head seeds (42, 43, 44)" in md and "mean \u00b1 sd" in md and "d CIDEr vs fixed" in md
    res = CliRunner().invoke(app, ["compare", str(single.path), str(study.path), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "over 3 head seeds" in res.output and "d CIDEr vs lm" in res.output
    assert "over 3 head seeds" in (tmp_path / "compare.md").read_text()


def test_without_seeds_nothing_of_the_study_is_written(runs):
    """Default rerank.seeds (unset = [seed]): no seed folders, no 'seeds' key in the metrics, the heads'
    record or config.toml; and the study's seed-42 figures are the single run's, byte for byte."""
    single, study = runs
    assert not single.seed_predictions_dir("inductive").exists() and not (single.heads_dir / "seeds").exists()
    doc = json.loads(single.metrics_path("inductive").read_text())
    assert "seeds" not in doc
    assert "seeds" not in json.loads(single.heads_json_path.read_text())["meta"]["rerank"]
    assert "seeds" not in single.config_path.read_text()
    for picker in ("ensemble", "trifuse", "memattend", "fixed", "lm"):
        assert single.predictions("inductive", picker) == study.predictions("inductive", picker)
    assert _same(_weights(single.heads_dir / "memattend.safetensors"), _weights(study.heads_dir / "memattend.safetensors"))


def test_seeds_must_be_distinct():
    from adjcap.config import ConfigError

    with pytest.raises(ConfigError, match="distinct seeds"):
        load_config("demo", ["rerank.seeds=[42, 42]"])


def test_reproduce_takes_seeds_and_tabulates_the_study(runs):
    """`adjcap reproduce protocols --seeds 42,43,44`: every row's config carries the seeds (the learned rows
    fit per seed), and a row whose run has the study gets the seed table beside the paper's."""
    from adjcap.report.collect import load_run
    from adjcap.report.reproduced import RowResult
    from adjcap.report.seeds import reproduced_seeds_table
    from adjcap.reproduce import get_table, plan_table

    t = get_table("protocols")
    plans = plan_table(t, "demo", updates={"rerank.seeds": SEEDS})
    assert all(p.cfg.rerank.seeds == SEEDS for p in plans)
    res = CliRunner().invoke(app, ["reproduce", "protocols", "--seeds", "42,x"])
    assert res.exit_code == 2 and "--seeds" in res.output
    _, study = runs
    doc = load_run(study.path).metrics["inductive"]["seeds"]
    results = [RowResult(t.rows[0], "demo", "training-free", "fixed", metrics={}),
               RowResult(t.rows[1], "demo", "inductive", "ensemble", metrics={},
                         extra={"seeds": doc["pickers"]["ensemble"]})]
    tab = reproduced_seeds_table(results)
    assert [r[0] for r in tab.rows] == [t.rows[1].label]  # the training-free row fits nothing
    want = doc["pickers"]["ensemble"]
    assert tab.rows[0][2] == "42, 43, 44"
    assert tab.rows[0][4] == f"{want['mean']['CIDEr']:.1f} \u00b1 {want['sd']['CIDEr']:.1f}"
    assert reproduced_seeds_table(results[:1]) is None
