"""What a run leaves for people to read: provenance, the per-sample table and the paged gallery
(which stays bounded at 5,000 images), `adjcap --version`, and the --log option's checks."""

import json
import os
import re
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adjcap.storage import provenance
from adjcap.metrics.run_metrics import evaluate_run
from adjcap.report.gallery import CHUNK_ROWS, PAGE_ROWS, write_paged_gallery
from adjcap.report.report import write_report
from adjcap.storage.rundir import RunDir
from adjcap.storage.samples import SAMPLES_SCHEMA, build_samples, write_samples
from adjcap.report.tracking import TrackingError, parse_log_specs, run_metrics

from test_report_render import FIX, _make_run


# ---- provenance ---------------------------------------------------------------------------


def test_cpu_flags_read_from_cpuinfo():
    text = "processor\t: 0\nmodel name\t: AMD EPYC 9454\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512bw\n"
    info = provenance.cpu_info(text)
    assert info["model"] == "AMD EPYC 9454"
    assert info["flags"] == ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw"]
    assert provenance.cpu_info("model name : x\nflags : sse4_2 avx2\n")["flags"] == ["sse4_2", "avx2"]


def test_provenance_of_the_demo_config(demo_cfg):
    from adjcap.engine.run_plan import RunPlan

    cfg = demo_cfg.resolved()
    plan = RunPlan.build(demo_cfg, cfg)
    doc = provenance.start(plan, argv=["adjcap", "demo"])
    assert doc["status"] == "running" and doc["finished_utc"] is None and doc["command"] == ["adjcap", "demo"]
    assert doc["libraries"]["torch"] and doc["libraries"]["pyarrow"] and doc["libraries"]["pycocoevalcap"] == "1.2"
    assert doc["config"]["digest"] == provenance.config_digest(cfg)
    # a model file by content: the same bytes give the same id, whatever the path
    assert doc["models"]["captioner.checkpoint"].startswith("file:")
    assert doc["models"]["retrieval.encoder.model"] == cfg.retrieval.encoder.model
    assert doc["data"]["annotations"]["digest"] and doc["data"]["corpus"]["digest"]
    assert doc["features"]["stages"] == dict(plan.stages) and len(plan.stages) == 4
    assert doc["features"]["corpus_fingerprint"] == plan.corpus.fingerprint
    other = demo_cfg.model_copy(update={"seed": 7}).resolved()
    assert provenance.config_digest(other) != doc["config"]["digest"]
    done = provenance.finish(doc)
    assert done["status"] == "finished" and done["finished_utc"] >= done["started_utc"] and done["seconds"] >= 0
    lines = dict(provenance.short_lines(done))
    assert lines["command"] == "adjcap demo" and "torch" in lines["version"]


def test_provenance_file_is_written_atomically_and_read_back(tmp_path):
    run = RunDir(tmp_path / "r")
    run.write_provenance({"status": "running"})
    assert run.provenance() == {"status": "running"}
    assert not [p for p in run.path.iterdir() if p.name.endswith(".tmp")]


def test_version_option():
    from typer.testing import CliRunner

    from adjcap.cli import app

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0
    assert res.stdout.startswith("adjcap ")
    assert re.search(r"^torch \d", res.stdout, re.M) and re.search(r"^ray \d", res.stdout, re.M)


def test_bad_log_spec_is_refused():
    assert parse_log_specs(["mlflow", "wandb=proj"])[1].target == "proj"
    with pytest.raises(TrackingError, match="unknown tracker 'tensorboard'"):
        parse_log_specs(["tensorboard"])


# ---- samples table ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scored_run(tmp_path_factory):
    run = _make_run(tmp_path_factory.mktemp("s"))
    evaluate_run(run)
    return RunDir(run)


def test_samples_hold_every_pick_with_its_metrics(scored_run):
    import pandas as pd

    write_samples(scored_run)
    df = pd.read_parquet(scored_run.samples_path)
    refs = json.loads((scored_run.path / "references" / "coco-test.json").read_text())
    assert len(df) == len(refs) and set(df.image_id) == set(refs)
    assert df.error.isna().all()  # no feature table: nothing failed, there is simply nothing extracted
    m = json.loads(scored_run.metrics_path("inductive").read_text())
    for iid, picks, r in zip(df.image_id, df.picks, df.references):
        assert list(r) == refs[iid]
        by = {(p["protocol"], p["picker"]): p for p in picks}
        assert set(by) == {("inductive", n) for n in ("lm", "ensemble", "trifuse", "memattend")} | {
            ("training-free", "lm"), ("training-free", "fixed")}
        for n in ("lm", "ensemble"):
            p, want = by[("inductive", n)], m["per_image"][n][iid]
            assert p["cider"] == pytest.approx(want["CIDEr"]) and p["bleu_4"] == pytest.approx(want["B-4"])
            assert p["meteor"] == pytest.approx(want["METEOR"]) and p["rouge_l"] == pytest.approx(want["ROUGE-L"])
            assert len(p["chair_mentioned"]) == want["CHAIR_mentioned"]
            assert len(p["chair_hallucinated"]) == want["CHAIR_hallucinated"]
            assert set(p["chair_hallucinated"]) <= set(p["chair_mentioned"])
    card = scored_run.samples_card_path.read_text()
    assert all(f"`{name}`" in card for name in SAMPLES_SCHEMA.names)


def test_stale_metrics_are_not_put_beside_new_picks(scored_run, tmp_path):
    import shutil

    run = RunDir(tmp_path / "copy")
    shutil.copytree(scored_run.path, run.path)
    later = time.time() + 5
    for f in run.prediction_files("inductive").values():  # a new fit, not yet evaluated
        os.utime(f, (later, later))
    t = build_samples(run).to_pylist()
    inductive = [p for r in t for p in r["picks"] if p["protocol"] == "inductive"]
    free = [p for r in t for p in r["picks"] if p["protocol"] == "training-free"]
    assert inductive and all(p["cider"] is None and p["chair_mentioned"] is None for p in inductive)
    assert all(p["cider"] is not None for p in free)
    assert not any(k.startswith("inductive/") for k in run_metrics(run))  # nor logged to a tracker
    assert any(k.startswith("training-free/") for k in run_metrics(run))


# ---- the gallery at 5,000 images ---------------------------------------------------------------


def _synthetic_samples(n: int) -> pa.Table:
    """n images with a 20-candidate beam each; ensemble and lm pick different candidates on half."""
    rows = []
    for i in range(n):
        cands = [{"text": f"a photo number {i} of candidate {k} with some objects", "lm_logprob_sum": -5.0 - k,
                  "lm_logprob_mean": -0.5 - k / 10, "n_tokens": 10, "beam_rank": k, "retrieval_cosine": 0.3,
                  "verifier": 0.5, "clipscore_cosine": 0.3} for k in range(20)]
        pick = {"chair_mentioned": [], "chair_hallucinated": [], "bleu_4": 20.0, "meteor": 20.0, "rouge_l": 40.0,
                "spice": None, "clipscore": 0.7}
        adj_idx = i % 2
        rows.append({
            "image_id": f"img-{i:05d}.jpg", "benchmark": "coco", "split": "test", "image_path": f"img-{i:05d}.jpg",
            "domain": None, "error": None, "references": [f"reference {r} of image {i}" for r in range(5)],
            "retrieved": [], "verified": [], "entities": [], "prompt": "There are a in image.", "candidates": cands,
            "picks": [{"protocol": "inductive", "picker": "lm", "candidate_index": 0, "caption": cands[0]["text"],
                       "cider": float(i % 97), **pick},
                      {"protocol": "inductive", "picker": "ensemble", "candidate_index": adj_idx,
                       "caption": cands[adj_idx]["text"], "cider": float(i % 89), **pick}],
        })
    return pa.Table.from_pylist(rows, schema=SAMPLES_SCHEMA)


def test_paged_gallery_stays_bounded_at_5000_images(tmp_path):
    samples = _synthetic_samples(5000)
    out = write_paged_gallery(samples, tmp_path / "gallery.html", tmp_path / "gallery", "inductive", "ensemble",
                              title="5,000 images", split="test")
    page = out["html"].read_text()
    assert out["images"] == 5000
    assert len(out["chunks"]) == 5000 // CHUNK_ROWS - 1  # the first chunk is in the page itself
    # the page: an index of every image (what sorting and filtering need) and one chunk of rows, no more
    assert len(page.encode()) < 600_000
    assert page.count("candidate 19 with some objects") == CHUNK_ROWS  # only the first chunk's beams inline
    assert f'"pageRows":{PAGE_ROWS}' in page
    index = json.loads(re.search(r"var GALLERY_INDEX=(\[.*?\]);</script>", page).group(1))
    assert len(index) == 5000 and len({r[1] for r in index}) == 5000
    # every chunk a small script of its own rows; together they hold every image once
    ids = [r["id"] for r in json.loads(re.search(r"chunk\(0,(.*)\);</script>", page).group(1))]
    for p in out["chunks"]:
        assert p.stat().st_size < 400_000
        ids += [r["id"] for r in json.loads(re.search(r"chunk\(\d+,(.*)\);\n$", p.read_text()).group(1))]
    assert sorted(ids) == sorted(r[1] for r in index)
    # a smaller rerun leaves no stale chunks behind
    out2 = write_paged_gallery(samples.slice(0, 250), tmp_path / "gallery.html", tmp_path / "gallery",
                               "inductive", "ensemble", title="250 images", split="test")
    assert sorted(p.name for p in (tmp_path / "gallery").iterdir()) == sorted(p.name for p in out2["chunks"])


def test_report_of_a_5000_image_run_stays_small(scored_run, tmp_path):
    """report.html keeps its highlights (60 images) and links the paged gallery of all 5,000."""
    import shutil

    run = RunDir(tmp_path / "big")
    shutil.copytree(scored_run.path, run.path)
    pq.write_table(_synthetic_samples(5000), run.samples_path)
    paths = write_report([run.path], image_root=FIX / "images")
    html = paths["html"].read_text()
    assert len(html.encode()) < 1_000_000
    assert html.count("<tr data-lm=") == 60  # the highlights only
    assert "href='gallery.html'" in html and "Every image (5000)" in html
    assert len(run.gallery_html().read_bytes()) < 600_000
