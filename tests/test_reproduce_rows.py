"""Table rows that depend on other rows, end to end on the demo world in one embedded Ray: the
cross-benchmark inductive row of ``reproduce xdomain`` (COCO-val heads applied frozen to the NoCaps-style
row: the demo stand-in), beside the transductive row whose features it shares."""

import json

import pytest

from adjcap.reproduce import get_table, parse_tables
from adjcap.rundir import RunDir
from adjcap.jobs import reproduce

pytestmark = pytest.mark.slow


def _rows(table: str, labels: list[str]) -> str:
    """The named rows of a tables.toml table as a table of their own (same rows, same columns), as TOML."""
    import tomli_w

    t = get_table(table)
    picked = [r for r in t.rows if r.label in labels]
    assert len(picked) == len(labels)
    rows = [{k: v for k, v in {"label": r.label, "preset": r.preset, "benchmark": r.benchmark, "set": list(r.sets),
                               "heads_from": r.heads_from, "vars": r.vars, "match": r.match}.items() if v is not None}
            for r in picked]
    cols = [{"header": c.header, "measured": c.measured} for c in t.columns]
    return tomli_w.dumps({"tables": {table: {"title": t.title, "benchmark": t.benchmark, "columns": cols,
                                             "rows": rows}}})


def test_xdomain_inductive_row_applies_the_coco_rows_heads_frozen(demo_cfg, one_local_ray, tmp_path):
    """(The plan test in test_reproduce.py checks that this row shares its features with the transductive
    row of its preset; here it runs after the COCO row and picks with that row's heads, fitting none.)"""
    from adjcap.rerank import load_features, load_heads, pick

    labels = ["COCO Karpathy test, Ours", "NoCaps val overall, Ours (COCO-val heads, inductive)"]
    table = parse_tables(_rows("xdomain", labels))["xdomain"]
    sets = [f"paths.cache_dir={demo_cfg.paths.cache_dir}", f"cache.stages_dir={tmp_path / 'stages'}"]
    doc = reproduce.main(table, "demo", sets, {"limit": 2}, tmp_path / "runs")
    rows = {r["label"]: r for r in doc["rows"]}
    assert all(r["status"] == "ok" and r["measured"]["CIDEr"] is not None for r in rows.values()), rows
    coco, ind = (RunDir(rows[x]["run_dir"]) for x in labels)
    assert rows[labels[1]]["protocol"] == "inductive"
    # the inductive row fitted nothing: it applied the COCO row's heads (fitted on its val split)
    assert json.loads(ind.heads_json_path.read_text())["meta"]["applied_from"] == str(coco.heads_dir)
    fit = json.loads(ind.fit_summary_path("inductive").read_text())
    assert fit["fit_split"] is None and fit["n_fit_images"] == 0
    assert json.loads(coco.heads_json_path.read_text())["meta"]["fit_split"] == "val"
    cfg = ind.config()
    feats = load_features(ind.read_features("demo", "test"), lm_feature=cfg.scorer.lm_feature,
                          memory_tokens=cfg.rerank.memattend.memory_tokens)
    heads = load_heads(coco.heads_dir)
    for picker in ("trifuse", "memattend"):
        want = dict(zip(feats.image_ids, (int(i) for i in pick(feats, picker, heads))))
        got = {e["image_id"]: e["candidate_index"] for e in ind.predictions("inductive", picker)}
        assert got == want, picker
    md = (tmp_path / "runs" / "reproduce" / "xdomain-demo.md").read_text()
    assert labels[1] in md
