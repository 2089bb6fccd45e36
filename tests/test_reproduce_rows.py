"""Tables of the paper's open questions, end to end on the demo world in one embedded Ray, sharing one
runs folder and one stage cache (the headline-on-demo run serves both): the cross-benchmark inductive row
of ``reproduce xdomain`` (COCO-val heads applied frozen to the NoCaps-style row: the demo stand-in) and
``reproduce corpus-swap`` (the demo world's own corpus against its second one, in another style)."""

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


@pytest.fixture(scope="module")
def shared(demo_cfg, tmp_path_factory):
    root = tmp_path_factory.mktemp("rows")
    return [f"paths.cache_dir={demo_cfg.paths.cache_dir}", f"cache.stages_dir={root / 'stages'}"], root / "runs"


def test_xdomain_inductive_row_applies_the_coco_rows_heads_frozen(one_local_ray, shared):
    """(The plan test in test_reproduce.py checks that this row shares its features with the transductive
    row of its preset; here it runs after the COCO row and picks with that row's heads, fitting none.)"""
    from adjcap.rerank import load_features, load_heads, pick

    labels = ["COCO Karpathy test, Ours", "NoCaps val overall, Ours (COCO-val heads, inductive)"]
    table = parse_tables(_rows("xdomain", labels))["xdomain"]
    sets, runs = shared
    doc = reproduce.main(table, "demo", sets, {"limit": 2}, runs)
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
    md = (runs / "reproduce" / "xdomain-demo.md").read_text()
    assert labels[1] in md


def test_corpus_swap_on_the_demo_world(demo_cfg, one_local_ray, shared):
    """`reproduce corpus-swap --benchmark demo`: the headline searching the demo's own corpus and its second
    one (standing in for CC3M and LAION-COCO: one run of features, the second row's reused from the stage
    cache), each row's corpus size and verbatim reference overlap in the table."""
    from adjcap.data.corpora import get_corpus, match_key
    from adjcap.data.corpus import load_corpus

    sets, runs = shared
    doc = reproduce.main("corpus-swap", "demo", sets, {"limit": 2}, runs)
    rows = {r["label"]: r for r in doc["rows"]}
    own, cc3m, laion = (rows[x] for x in ("COCO training captions (headline)", "CC3M", "LAION-COCO"))
    assert all(r["status"] == "ok" for r in (own, cc3m, laion)), rows
    assert own["measured"]["corpus captions"] == 3000 and cc3m["measured"]["corpus captions"] == 2000
    assert laion["measured"] == cc3m["measured"]  # both stand-ins are the demo's second corpus
    assert own["measured"]["test references in corpus (%)"] is not None
    assert cc3m["measured"]["test references in corpus (%)"] == 0.0
    # what the swapped run retrieved is the second corpus's text, and it picks other captions
    cfg = demo_cfg.resolved()
    alt = {match_key(t) for t in load_corpus(get_corpus("demo-alt").path(cfg.paths.data_dir, cfg.paths.cache_dir),
                                             "lines").texts}
    swapped = RunDir(cc3m["run_dir"]).read_features("demo", "test").column("retrieved").to_pylist()
    assert all(match_key(c["text"]) in alt for row in swapped for c in row)
    assert RunDir(laion["run_dir"]).summary()["stages"]["computed"]["retrieve"] == 0
    mine = RunDir(own["run_dir"])
    assert RunDir(cc3m["run_dir"]).predictions("inductive", "lm") != mine.predictions("inductive", "lm")
    md = (runs / "reproduce" / "corpus-swap-demo.md").read_text()
    assert "corpus demo-alt" in md and "| not published |" not in md  # the demo world: nothing published
