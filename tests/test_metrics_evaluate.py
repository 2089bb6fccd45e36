"""The evaluation engine: prediction files against reference files (COCO, NoCaps), run directories."""

import contextlib
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from adjcap.config import load_config
from adjcap.engine.features import rows_to_table
from adjcap.metrics.coco import coco_metrics
from adjcap.metrics.evaluate import evaluate_predictions, format_table, load_predictions
from adjcap.metrics.run_metrics import evaluate_run
from adjcap.java.runtime import MetricError

FIX = Path(__file__).parent / "fixtures" / "metrics"


@pytest.fixture(scope="module")
def coco_eval(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "metrics.json"
    rep = evaluate_predictions(FIX / "viecap_coco_results_100.json", FIX / "coco_karpathy_test_gt_100.json",
                               fmt="coco", out=out)
    return rep, out


def test_coco_results_with_numeric_ids_against_coco_gt(coco_eval):
    rep, out = coco_eval
    rows = json.loads((FIX / "viecap_coco_test_100.json").read_text())
    same = coco_metrics({r["image_name"]: r["prediction"] for r in rows}, {r["image_name"]: r["captions"] for r in rows})
    for k, v in same.scores.items():
        assert rep["metrics"][k] == pytest.approx(v, abs=1e-9) if v is not None else rep["metrics"][k] is None
    assert rep["n_images"] == 100 and rep["format"] == "coco"
    assert rep["metrics"]["SPICE"] is None and rep["notes"]["SPICE"] == "not requested"
    assert 0 <= rep["chair"]["CHAIR_s"] <= 100 and rep["chair"]["n_mentioned"] > 100
    assert len(rep["per_image"]) == 100 and "391895" in rep["per_image"]
    written = json.loads(out.read_text())
    assert written["metrics"] == rep["metrics"] and written["chair"]["per_class"]
    table = format_table(rep)
    assert "CIDEr" in table and "n/a" in table and "CHAIR_s" in table


def test_nocaps_domains_are_each_their_own_corpus(tmp_path):
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    rep = evaluate_predictions(FIX / "viecap_nocaps_results_60.json", FIX / "nocaps_corpus_60.json", fmt="nocaps")
    doms = rep["domains"]
    assert list(doms) == ["in-domain", "near-domain", "out-domain", "overall"]
    assert [doms[d]["n_images"] for d in doms] == [20, 20, 20, 60]
    corpus = json.loads((FIX / "nocaps_corpus_60.json").read_text())
    preds = {p["image_id"]: p["caption"] for p in json.loads((FIX / "viecap_nocaps_results_60.json").read_text())}
    tok = PTBTokenizer()
    with contextlib.redirect_stdout(io.StringIO()):
        gts = tok.tokenize({c["image_id"]: [{"caption": x} for x in c["caption"]] for c in corpus})
        res = tok.tokenize({i: [{"caption": preds[i]}] for i in gts})
    for dom in ("in_domain", "near_domain", "out_domain", None):
        ids = [c["image_id"] for c in corpus if dom is None or c["split"] == dom]
        want, _ = Cider().compute_score({i: gts[i] for i in ids}, {i: res[i] for i in ids})
        name = dom.replace("_", "-") if dom else "overall"
        assert doms[name]["CIDEr"] == pytest.approx(100 * want, abs=1e-9), name
    # corpus-level CIDEr: the overall is not the image-weighted mean of the domains
    mean = sum(doms[d]["CIDEr"] for d in ("in-domain", "near-domain", "out-domain")) / 3
    assert abs(doms["overall"]["CIDEr"] - mean) > 1e-6
    assert rep["metrics"] == {k: v for k, v in doms["overall"].items() if k != "n_images"}
    assert "near-domain" in format_table(rep)


def test_bad_prediction_files_fail_with_clear_errors(tmp_path):
    refs = FIX / "coco_karpathy_test_gt_100.json"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"image_id": 391895, "caption": "a"}, {"image_id": 999999999, "caption": "b"}]))
    with pytest.raises(MetricError, match="1 of 2 predicted image ids match no reference image"):
        evaluate_predictions(bad, refs, fmt="coco")
    bad.write_text(json.dumps([{"image_id": 391895, "caption": "a"}, {"image_id": 391895, "caption": "b"}]))
    with pytest.raises(ValueError, match="more than one caption"):
        evaluate_predictions(bad, refs, fmt="coco")
    bad.write_text(json.dumps([{"image": 1}]))
    with pytest.raises(ValueError, match="not .*image_id"):
        load_predictions(bad)
    bad.write_text("{oops")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_predictions(bad)
    assert load_predictions({"a.jpg": "a dog"}) == [{"image_id": "a.jpg", "caption": "a dog"}]


def _cand(text, cos, rank):
    return {"text": text, "lm_logprob_sum": -3.0, "lm_logprob_mean": -0.5, "n_tokens": 6, "beam_rank": rank,
            "retrieval_cosine": cos, "verifier": 0.5}


def test_evaluate_run_writes_metrics_per_protocol(tmp_path, monkeypatch):
    rows = json.loads((FIX / "viecap_coco_test_100.json").read_text())[:30]
    run = tmp_path / "run"
    (run / "references").mkdir(parents=True)
    (run / "config.toml").write_text(load_config("demo").to_toml())  # benchmark demo, apply split test
    (run / "references" / "demo-test.json").write_text(json.dumps({r["image_name"]: r["captions"] for r in rows}))
    (run / "references" / "demo-val.json").write_text("{}")
    # two beam candidates per image: the system's caption and (as a stand-in) the first reference
    feats = [{"image_id": r["image_name"], "benchmark": "demo", "split": "test", "domain": None, "error": None,
              "retrieved": [{"corpus_id": k, "text": t, "cosine": 0.5 - 0.1 * k} for k, t in enumerate(r["captions"][:3])],
              "verified": [{"corpus_id": k, "text": r["captions"][k], "verifier": v, "retrieval_rank": k}
                           for k, v in enumerate([0.9, 0.2, 0.5])],
              "entities": [], "prompt": "",
              "candidates": [_cand(r["prediction"], 0.30, 0), _cand(r["captions"][0], 0.32, 1)]} for r in rows]
    (run / "features" / "demo-test").mkdir(parents=True)
    pq.write_table(rows_to_table(feats), run / "features" / "demo-test" / "part-00000.parquet")
    pred = run / "predictions" / "inductive"
    pred.mkdir(parents=True)
    lm = [{"image_id": r["image_name"], "caption": r["prediction"], "candidate_index": 0} for r in rows]
    tri = [{"image_id": r["image_name"], "caption": r["captions"][0], "candidate_index": 1} for r in rows]
    mem = [dict(e) for e in lm[:15]] + [dict(e) for e in tri[15:]]
    for name, data in (("lm", lm), ("trifuse", tri), ("memattend", mem)):
        (pred / f"{name}.json").write_text(json.dumps(data))

    from adjcap.metrics import evaluate as evaluate_mod

    javas = []  # the PTB tokeniser's Java processes: one for the run's references and every file's captions
    real = evaluate_mod.ptb_tokenize
    monkeypatch.setattr(evaluate_mod, "ptb_tokenize", lambda caps, **kw: javas.append(len(caps)) or real(caps, **kw))
    out = evaluate_run(run)
    assert len(javas) == 1, javas
    doc = json.loads((run / "metrics" / "inductive.json").read_text())
    assert set(out) == {"inductive"} and set(doc["pickers"]) == {"lm", "trifuse", "memattend"}
    refs = {r["image_name"]: r["captions"] for r in rows}
    for name, data in (("lm", lm), ("trifuse", tri), ("memattend", mem)):  # as each file scored on its own
        alone = coco_metrics({e["image_id"]: e["caption"] for e in data}, refs)
        for k, v in alone.scores.items():
            got = doc["pickers"][name]["metrics"][k]
            assert got == pytest.approx(v, abs=1e-9) if v is not None else got is None, (name, k)
    lm_m, tri_m = doc["pickers"]["lm"], doc["pickers"]["trifuse"]
    assert tri_m["metrics"]["CIDEr"] > lm_m["metrics"]["CIDEr"]  # a reference caption scores higher
    assert lm_m["clipscore"]["CLIPScore"] == pytest.approx(2.5 * 0.30)
    assert tri_m["clipscore"]["CLIPScore"] == pytest.approx(2.5 * 0.32)
    stats = doc["rank_stats"]
    assert stats["pick_disagreement_vs_lm"] == {"memattend": 0.5, "trifuse": 1.0}
    assert stats["top1_agreement_heads"] == 0.5
    # verifier order [0.9, 0.2, 0.5] against cosine order [0.5, 0.4, 0.3]: rho = 0.5 for every image
    assert stats["retrieval_verifier_spearman"]["mean"] == pytest.approx(0.5)
    assert set(doc["per_image"]["lm"]) == {r["image_name"] for r in rows}
    assert "CIDEr" in doc["per_image"]["lm"][rows[0]["image_name"]]
    assert not list((run / "metrics").glob("*.tmp"))


def test_spice_is_run_once_per_image_caption_and_not_retried(monkeypatch, tmp_path):
    import adjcap.metrics.evaluate as ev
    from adjcap.metrics.spice import SpiceConfig

    calls = []

    def fake_spice(preds, refs, spice):
        calls.append(dict(preds))
        return {i: float(len(c)) for i, c in preds.items()}, None

    monkeypatch.setattr(ev, "spice_per_image", fake_spice)
    e = ev.Evaluator({"a": ["x"], "b": ["y"]}, spice=SpiceConfig(work_dir=tmp_path))
    assert e._spice({"a": "cat", "b": "dog"}, e.references) == ({"a": 3.0, "b": 3.0}, None)
    assert e._spice({"a": "cat", "b": "dogs"}, e.references) == ({"a": 3.0, "b": 4.0}, None)
    assert calls == [{"a": "cat", "b": "dog"}, {"b": "dogs"}]  # the unchanged pick is not re-scored

    monkeypatch.setattr(ev, "spice_per_image", lambda *a: calls.append("again") or (None, "n/a: no jars"))
    e2 = ev.Evaluator({"a": ["x"]}, spice=SpiceConfig(work_dir=tmp_path))
    assert e2._spice({"a": "cat"}, e2.references) == (None, "n/a: no jars")
    assert e2._spice({"a": "dog"}, e2.references) == (None, "n/a: no jars")
    assert calls.count("again") == 1
