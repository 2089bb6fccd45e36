"""`adjcap reproduce`: the paper's tables as data, their rendering beside the published values, and
one table end to end on the demo world (one Ray session, rows sharing their stage work)."""

import json
import math

import pytest
from typer.testing import CliRunner

from adjcap.config import list_presets, load_config
from adjcap.index import benchmark_corpus
from adjcap.report.reproduced import RowResult, build_table
from adjcap.reproduce import distinct_runs, get_table, load_tables, parse_tables, plan_table
from adjcap.engine.identity import feature_identity
from adjcap.engine.stage_cache import stage_identities
from adjcap.engine.stage_registry import names as stage_names
from adjcap.cli import app

STAGES = stage_names()

PAPER_TABLES = ("reproduction", "scoreboard", "protocols", "ablation", "verifier-substrate", "xdomain", "chair",
                "clipscore")


def test_every_paper_table_is_registered_and_listed():
    tables = load_tables()
    assert set(PAPER_TABLES) <= set(tables)
    res = CliRunner().invoke(app, ["reproduce", "--list"])
    assert res.exit_code == 0, res.output
    for key in PAPER_TABLES:
        assert f"\n{key}  " in "\n" + res.output
        for row in tables[key].rows:
            assert row.label in res.output and row.preset in res.output
    # every row of the published tables finds its published entry (labels and matches are right)
    from adjcap.report.reproduced import published_row

    for key in ("scoreboard", "protocols", "ablation", "verifier-substrate", "xdomain", "chair", "reproduction"):
        t = tables[key]
        for row in t.rows:
            if row.match == {}:
                continue
            assert published_row(t, row) is not None, (key, row.label)


def test_a_missing_preset_is_said_not_a_crash(tmp_path):
    text = """
[tables.t]
title = "T"
benchmark = "coco"
columns = [{ header = "CIDEr", measured = "metrics.CIDEr" }]
rows = [{ label = "a", preset = "headline" }, { label = "b", preset = "no-such-preset-yet" }]
"""
    t = parse_tables(text)["t"]
    assert t.missing_presets() == ["no-such-preset-yet"]
    plans = plan_table(t, "demo", runs_dir=tmp_path)
    assert plans[0].cfg is not None and plans[0].problem is None
    assert plans[1].cfg is None and "no-such-preset-yet" in plans[1].problem
    table = build_table(t, [RowResult(p.row, p.benchmark, status=p.problem or "ok") for p in plans])
    assert "missing" in table.to_markdown()


def _fake_metrics(cider, spice=20.0):
    return {"metrics": {"B-4": 30.0, "METEOR": 26.0, "ROUGE-L": 54.0, "CIDEr": cider, "SPICE": spice},
            "clipscore": {"CLIPScore": 0.75}, "chair": {"CHAIR_s": 10.0}}


def test_rendering_puts_published_values_and_differences_beside_measured():
    t = get_table("ablation")
    results = [RowResult(r, "coco", "training-free", "lm", metrics=_fake_metrics(100.0 + i))
               for i, r in enumerate(t.rows)]
    table = build_table(t, results, "coco")
    h = table.columns
    cider, paper, delta = h.index("CIDEr"), h.index("CIDEr") + 1, h.index("CIDEr") + 2
    assert h[paper] == "paper" and h[delta] == "\u0394"
    first = table.rows[0]
    assert first[0] == t.rows[0].label and first[cider] == 100.0 and first[paper] == 108.0
    assert math.isclose(first[delta], 100.0 - 108.0)
    row8 = table.rows[7]
    assert row8[paper] == 117.6 and math.isclose(row8[delta], 107.0 - 117.6)
    md, tex, html = table.to_markdown(), table.to_latex(), table.to_html()
    assert "| 100.0 | 108.0 | -8.0 |" in md
    assert "\\begin{tabular}" in tex and "108.0" in tex and "<table" in html and "117.6" in html
    # the same numbers measured on the demo world: nothing published to compare with
    demo = build_table(t, [RowResult(r.row, "demo", r.protocol, r.picker, metrics=r.metrics) for r in results], "demo")
    assert all(row[paper] is None and row[delta] is None and row[cider] is not None for row in demo.rows)
    assert "| 100.0 | n/a | n/a |" in demo.to_markdown()


def test_difference_rows_and_paper_text_values():
    t = get_table("clipscore")
    labels = [r.label for r in t.rows]
    metrics = {labels[0]: {"metrics": {"CIDEr": 100.0}, "clipscore": {"CLIPScore": 0.70}},
               labels[1]: {"metrics": {"CIDEr": 110.0}, "clipscore": {"CLIPScore": 0.80}}}
    results = [RowResult(r, "coco", "inductive", "ensemble", metrics=metrics.get(r.label)) for r in t.rows]
    table = build_table(t, results, "coco")
    diff = table.rows[-1]
    assert diff[0] == "Ours - IFCap"
    cs = table.columns.index("CLIPScore")
    assert math.isclose(diff[cs], 0.10) and diff[cs + 1] == 0.083 and math.isclose(diff[cs + 2], 0.10 - 0.083)
    ci = table.columns.index("CIDEr")
    assert table.rows[1][ci + 1] == 117.6 and math.isclose(diff[ci], 10.0)
    assert "0.083" in table.to_markdown()  # CLIPScore keeps three decimals


@pytest.mark.slow
def test_ablation_on_the_demo_world_end_to_end(demo_cfg, tmp_path):
    """`adjcap reproduce ablation --benchmark demo --limit 2`: every row runs, the table is written, and each
    stage computes only what no earlier row already stored. The rows run in this process (``executor=local``:
    the table's logic is the subject here; a table's rows in one Ray session: tests/test_open_questions.py)."""
    runs, stages = tmp_path / "runs", tmp_path / "stages"
    sets = [f"paths.cache_dir={demo_cfg.paths.cache_dir}", "ray.include_dashboard=false",
            f"cache.stages_dir={stages}", "executor=local"]
    args = ["reproduce", "ablation", "--benchmark", "demo", "--limit", "2", "--runs-dir", str(runs), "--workers", "1"]
    for s in sets:
        args += ["--set", s]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "Ray dashboard" not in res.output  # no Ray session at all
    doc = json.loads((runs / "reproduce" / "ablation-demo.json").read_text())
    t = get_table("ablation")
    known = set(list_presets())
    for row, r in zip(t.rows, doc["rows"]):
        if row.preset not in known:
            assert "missing" in r["status"]
            continue
        assert r["status"] == "ok", r
        assert r["measured"]["CIDEr"] is not None and r["measured"]["B-4"] is not None
    md = (runs / "reproduce" / "ablation-demo.md").read_text()
    assert all(row.label in md for row in t.rows)
    assert "| n/a | n/a |" in md  # nothing published for the demo world
    assert (runs / "reproduce" / "ablation-demo.tex").exists() and (runs / "reproduce" / "ablation-demo.html").exists()

    # stage work: one computation per distinct (stage identity, image), the rest reused
    plans = [p for p in plan_table(t, "demo", sets, {"limit": 2}, runs) if p.cfg is not None]
    images, expected = {}, {s: set() for s in STAGES}
    for p in {p.run_dir: p for p in plans}.values():
        cfg = p.cfg.resolved()
        ids = stage_identities(cfg, benchmark_corpus(cfg.benchmark_cfg(), cfg.benchmark).fingerprint)
        for split in cfg.splits:
            for s in STAGES:
                expected[s].add((ids[s], split))
            images[p.run_dir] = images.get(p.run_dir, 0) + 2
    work = doc["stage_work"]
    total = sum(images.values())
    for s in STAGES:
        assert work["computed"][s] == 2 * len(expected[s]), (s, work)
        assert work["computed"][s] + work["reused"][s] == total
    assert work["computed"]["retrieve"] < total  # rows 1-8 share at least their retrieval
    assert load_config(config_file=next(runs.glob("ablation-8-demo*")) / "config.toml").benchmark == "demo"


def test_demo_table_says_what_was_run_and_which_encoder():
    t = get_table("scoreboard")
    res = [RowResult(r, "demo", "inductive", "ensemble", metrics=_fake_metrics(90.0),
                     extra={"encoder": "adjcap-tiny-clip-large"}) for r in t.rows]
    demo = build_table(t, res, "demo")
    assert demo.title.startswith("demo: ") and not demo.title.startswith(t.title)
    assert all(row[0] == f"{r.label} [run with adjcap-tiny-clip-large]" for row, r in zip(demo.rows, t.rows))
    coco = build_table(t, [RowResult(r.row, "coco", r.protocol, r.picker, metrics=r.metrics, extra=r.extra)
                           for r in res], "coco")
    assert coco.title.startswith(t.title) and [row[0] for row in coco.rows] == [r.label for r in t.rows]


def test_a_row_takes_its_heads_from_another_rows_run(tmp_path):
    """xdomain's cross-benchmark inductive rows: COCO-val heads applied frozen to NoCaps and Flickr30k. Each
    runs after the COCO row, in a run of its own that shares every stage with the transductive row of its
    preset (the stage cache computes its features once), and its paper cells say "not published"."""
    t = get_table("xdomain")
    plans = plan_table(t, "demo", runs_dir=tmp_path)
    by = {p.row.label: p for p in plans}
    coco = by["COCO Karpathy test, Ours"]
    inductive = [p for p in plans if p.row.heads_from]
    assert {p.benchmark for p in inductive} == {"demo"} and len(inductive) == 5
    assert {p.row.preset for p in inductive} == {"xdomain-nocaps", "xdomain-flickr30k"}
    for p in inductive:
        assert p.heads_from == coco.run_dir and p.cfg.rerank.protocol == "inductive"
        twin = by[p.row.label.replace(" (COCO-val heads, inductive)", "")]
        assert twin.cfg.rerank.protocol == "transductive" and twin.run_dir != p.run_dir
        assert feature_identity(p.cfg) == feature_identity(twin.cfg)  # every stage the same: computed once
    order = [p.run_dir for p in distinct_runs(plans)]
    assert order.index(coco.run_dir) < min(order.index(p.run_dir) for p in inductive)
    assert len({p.run_dir for p in inductive}) == 2  # NoCaps' four domain rows are one run
    # the paper publishes no cross-benchmark inductive number: said in the cell, on the paper's benchmark
    res = [RowResult(r, r.benchmark or t.benchmark, "inductive", "ensemble",
                     metrics={"metrics": {"CIDEr": 70.0, "SPICE": 10.0}, "domains": {}}) for r in t.rows]
    rows = build_table(t, res).rows
    for row, r in zip(rows, t.rows):
        assert (row[4] == "not published") == bool(r.heads_from), row
    assert "| not published |" in build_table(t, res).to_markdown()
    # a row naming no row, or a row that takes its own heads from another, is refused when the table loads
    bad = """
[tables.t]
title = "T"
benchmark = "coco"
columns = [{ header = "CIDEr", measured = "metrics.CIDEr" }]
rows = [{ label = "a", preset = "headline" }, { label = "b", preset = "headline", heads_from = "%s" },
        { label = "c", preset = "headline", heads_from = "b" }]
"""
    from adjcap.config import ConfigError

    with pytest.raises(ConfigError, match="'zz', which is no row"):
        parse_tables(bad % "zz")
    with pytest.raises(ConfigError, match="takes its own from 'a'"):
        parse_tables(bad % "a")
