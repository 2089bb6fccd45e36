"""The paper's open questions as runs, end to end on the demo world in one ``adjcap reproduce`` job (one
embedded Ray for the whole table, asserted; 4 images a split): rows of the real tables, with ``--seeds 42,43,44``:

* ``COCO Karpathy test, Ours`` (xdomain; the same run as corpus-swap's COCO row): the headline, its heads
  fitted on val once per seed;
* ``NoCaps val overall, Ours (COCO-val heads, inductive)`` (xdomain): those heads applied frozen to the
  NoCaps-style row (the demo stand-in), fitting none;
* ``CC3M`` (corpus-swap): the headline searching the demo world's second corpus (another style).

Checked: the seed study against numpy on the stored per-image metrics, the report and ``adjcap compare``
showing it, the inductive row picking with the COCO row's heads, each corpus's size and reference overlap
in the table; and a refit without seeds writing nothing of the study."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from adjcap.cli import app
from adjcap.config import ConfigError, load_config
from adjcap.reproduce import get_table, parse_tables
from adjcap.storage.rundir import RunDir
from adjcap.jobs import reproduce

SEEDS = [42, 43, 44]
COCO, NOCAPS, CC3M = "COCO Karpathy test, Ours", "NoCaps val overall, Ours (COCO-val heads, inductive)", "CC3M"


def _table() -> str:
    """The three rows, from their tables, as one table (TOML); the columns: CIDEr and the corpus's."""
    import tomli_w

    rows = []
    for key, label in (("xdomain", COCO), ("xdomain", NOCAPS), ("corpus-swap", CC3M)):
        r = next(r for r in get_table(key).rows if r.label == label)
        rows.append({k: v for k, v in {"label": r.label, "preset": r.preset, "benchmark": r.benchmark,
                                       "set": list(r.sets), "heads_from": r.heads_from, "match": r.match}.items()
                     if v is not None})
    cols = [c for c in get_table("corpus-swap").columns if c.header in ("CIDEr", "corpus captions")
            or c.measured.startswith("corpus.overlap")]
    return tomli_w.dumps({"tables": {"open-questions": {
        "title": "open questions", "benchmark": "coco", "rows": rows,
        "columns": [{"header": c.header, "measured": c.measured} for c in cols]}}})


@pytest.fixture(scope="module")
def done(demo_cfg, tmp_path_factory):
    """The table's job; its rows ran on the one embedded Ray the table started (counted here)."""
    from adjcap.jobs import ray_session

    root = tmp_path_factory.mktemp("open-questions")
    table = parse_tables(_table())["open-questions"]
    sets = [f"paths.cache_dir={demo_cfg.paths.cache_dir}", f"cache.stages_dir={root / 'stages'}",
            "ray.include_dashboard=false"]
    starts = []
    with pytest.MonkeyPatch.context() as mp:
        real = ray_session._init
        mp.setattr(ray_session, "_init", lambda **kw: starts.append(kw.get("address")) or real(**kw))
        doc = reproduce.main(table, "demo", sets, {"limit": 4, "rerank.seeds": SEEDS}, root / "runs")
    assert starts == ["local"], starts  # one Ray session for the whole table, not one per row
    rows = {r["label"]: r for r in doc["rows"]}
    assert all(r["status"] == "ok" for r in rows.values()), rows
    return doc, {k: RunDir(r["run_dir"]) for k, r in rows.items()}, root


@pytest.mark.slow
def test_seed_study_matches_numpy_on_the_stored_per_image_metrics(done):
    _, runs, _ = done
    study = runs[COCO]
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
        assert np.isclose(st["mean"]["CIDEr"], np.mean(ciders)) and np.isclose(st["sd"]["CIDEr"], np.std(ciders, ddof=1))
        for base in ("fixed", "lm"):
            ds = []
            for seed in SEEDS:
                mine = s["per_image"][picker][str(seed)]
                diff = np.array([mine[i]["CIDEr"] - per_image[base][i]["CIDEr"] for i in sorted(mine)])
                want = diff.mean() / diff.std(ddof=1) if diff.std(ddof=1) > 0 else None
                got = st["cohens_d"][base]["CIDEr"]["per_seed"][str(seed)]
                assert (got is None and want is None) or np.isclose(got, want), (picker, base, seed, got, want)
                ds.append(want)
            if None not in ds:
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


@pytest.mark.slow
def test_report_compare_and_reproduce_show_the_seed_study(done, tmp_path):
    doc, runs, root = done
    res = CliRunner().invoke(app, ["report", "--run", str(runs[COCO].path), "--out", str(tmp_path / "report")])
    assert res.exit_code == 0, res.output
    md = (tmp_path / "report" / "report.md").read_text()
    assert "over 3 head seeds (42, 43, 44)" in md and "mean \u00b1 sd" in md and "d CIDEr vs fixed" in md
    res = CliRunner().invoke(app, ["compare", str(runs[COCO].path), str(runs[CC3M].path), "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert res.output.count("over 3 head seeds") == 2 and "d CIDEr vs lm" in res.output
    assert "over 3 head seeds" in (tmp_path / "compare.md").read_text()
    rows = {r["label"]: r for r in doc["rows"]}
    assert set(rows[COCO]["seeds"]["per_seed"]) == {"42", "43", "44"} and "seeds" not in rows[NOCAPS]
    table_md = (root / "runs" / "reproduce" / "open-questions-demo.md").read_text()
    assert "The seed study" in table_md and COCO in table_md.split("The seed study")[1]


@pytest.mark.slow
def test_the_inductive_row_picks_with_the_coco_rows_heads(done):
    from adjcap.rerank import load_features, load_heads, pick

    doc, runs, _ = done
    coco, ind = runs[COCO], runs[NOCAPS]
    assert {r["label"]: r for r in doc["rows"]}[NOCAPS]["protocol"] == "inductive"
    assert json.loads(ind.heads_json_path.read_text())["meta"]["applied_from"] == str(coco.heads_dir)
    fit = json.loads(ind.fit_summary_path("inductive").read_text())
    assert fit["fit_split"] is None and fit["n_fit_images"] == 0 and not ind.seed_predictions_dir("inductive").exists()
    assert json.loads(coco.heads_json_path.read_text())["meta"]["fit_split"] == "val"
    cfg = ind.config()
    feats = load_features(ind.read_features("demo", "test"), lm_feature=cfg.scorer.lm_feature,
                          memory_tokens=cfg.rerank.memattend.memory_tokens)
    heads = load_heads(coco.heads_dir)
    for picker in ("trifuse", "memattend"):
        want = dict(zip(feats.image_ids, (int(i) for i in pick(feats, picker, heads))))
        got = {e["image_id"]: e["candidate_index"] for e in ind.predictions("inductive", picker)}
        assert got == want, picker


@pytest.mark.slow
def test_each_corpus_its_size_and_overlap_and_what_was_retrieved(demo_cfg, done):
    from adjcap.data.corpora import get_corpus, match_key
    from adjcap.data.corpus import load_corpus

    doc, runs, _ = done
    rows = {r["label"]: r for r in doc["rows"]}
    own, alt = rows[COCO]["measured"], rows[CC3M]["measured"]
    assert own["corpus captions"] == 3000 and alt["corpus captions"] == 2000
    assert own["test references in corpus (%)"] is not None and alt["test references in corpus (%)"] == 0.0
    cfg = demo_cfg.resolved()
    texts = {match_key(t) for t in load_corpus(get_corpus("demo-alt").path(cfg.paths.data_dir, cfg.paths.cache_dir),
                                               "lines").texts}
    swapped = runs[CC3M].read_features("demo", "test").column("retrieved").to_pylist()
    assert all(match_key(c["text"]) in texts for row in swapped for c in row)
    assert runs[CC3M].predictions("inductive", "lm") != runs[COCO].predictions("inductive", "lm")


@pytest.mark.slow
def test_a_refit_without_seeds_writes_nothing_of_the_study(done):
    """Unset rerank.seeds ([seed]): no seed folders, no 'seeds' in the heads' record or config.toml, and the
    picks and weights are the seed study's seed 42, byte for byte."""
    from adjcap.jobs import fit

    _, runs, _ = done
    run = runs[COCO]
    before = {p: run.predictions("inductive", p) for p in ("ensemble", "trifuse", "memattend", "fixed", "lm")}
    w42 = _weights(run.seed_heads_dir(42) / "memattend.safetensors")
    cfg = run.config()
    plain = cfg.model_copy(update={"rerank": cfg.rerank.model_copy(update={"seeds": None})})
    fit.refit(plain.resolved(), run, saved=plain)
    assert not run.seed_predictions_dir("inductive").exists() and not (run.heads_dir / "seeds").exists()
    assert "seeds" not in json.loads(run.heads_json_path.read_text())["meta"]["rerank"]
    assert "seeds" not in run.config_path.read_text()
    assert {p: run.predictions("inductive", p) for p in before} == before
    assert _same(_weights(run.heads_dir / "memattend.safetensors"), w42)


def test_seeds_must_be_distinct():
    with pytest.raises(ConfigError, match="distinct seeds"):
        load_config("demo", ["rerank.seeds=[42, 42]"])


def test_reproduce_takes_seeds():
    from adjcap.reproduce import plan_table

    plans = plan_table(get_table("protocols"), "demo", updates={"rerank.seeds": SEEDS})
    assert all(p.cfg.rerank.seeds == SEEDS for p in plans)
    res = CliRunner().invoke(app, ["reproduce", "protocols", "--seeds", "42,x"])
    assert res.exit_code == 2 and "--seeds" in res.output
