"""The Python API as a user calls it: ``import adjcap`` (cheap), then adjcap.evaluate on real caption
data, and adjcap.caption / adjcap.run / adjcap.load_run on the demo world (a local Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import adjcap

ROOT = Path(__file__).resolve().parents[1]
METRICS = Path(__file__).parent / "fixtures" / "metrics"
PREDS = METRICS / "viecap_coco_results_100.json"
REFS = METRICS / "coco_karpathy_test_gt_100.json"


def test_import_adjcap_loads_no_torch_ray_or_jobs():
    code = ("import sys, adjcap; heavy = ('torch', 'ray', 'jobs', 'actors', 'cli', 'pyarrow', 'pydantic'); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy))); "
            "adjcap.caption; print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'jobs'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True).stdout
    assert out.splitlines() == ["[]", "[]"], out  # even the API module itself loads neither torch nor Ray
    assert {"caption", "run", "evaluate", "load_run", "Metrics"} <= set(dir(adjcap))
    from importlib import metadata

    assert adjcap.__version__ == metadata.version("adjcap")
    with pytest.raises(AttributeError):
        adjcap.no_such_thing  # noqa: B018


def test_evaluate_files_gives_the_command_lines_numbers(tmp_path):
    m = adjcap.evaluate(PREDS, REFS)
    assert isinstance(m, adjcap.Metrics) and m.n_images == 100
    out = tmp_path / "m.json"
    from adjcap.cli import app

    res = CliRunner().invoke(app, ["evaluate", "--predictions", str(PREDS), "--references", str(REFS),
                                   "--no-spice", "--out", str(out)])
    assert res.exit_code == 0, res.output
    cli = json.loads(out.read_text())
    for k in ("B-4", "METEOR", "ROUGE-L", "CIDEr"):
        assert m[k] == pytest.approx(cli["metrics"][k]) and m[k] > 0
    assert m["CHAIR_i"] == pytest.approx(cli["chair"]["CHAIR_i"])
    table = m.per_image_table()
    assert table.num_rows == 100 and "CIDEr" in table.column_names
    assert sum(table.column("CIDEr").to_pylist()) / 100 == pytest.approx(m["CIDEr"], rel=1e-6)
    with pytest.raises(KeyError, match="did you mean 'CIDEr'"):
        m["cider"]


def test_evaluate_in_memory_predictions_and_references():
    gt = json.loads(REFS.read_text())
    refs: dict[str, list[str]] = {}
    for a in gt["annotations"]:
        refs.setdefault(str(a["image_id"]), []).append(a["caption"])
    ids = sorted(refs)[:20]
    refs = {i: refs[i] for i in ids}
    own = {i: refs[i][0] for i in ids}  # each image's first reference as its prediction
    swapped = {i: refs[ids[(k + 1) % len(ids)]][0] for k, i in enumerate(ids)}  # another image's
    good, bad = adjcap.evaluate(own, refs), adjcap.evaluate(swapped, refs)
    assert good.n_images == bad.n_images == 20
    assert good["CIDEr"] > 3 * bad["CIDEr"] and good["B-4"] > bad["B-4"]
    listed = adjcap.evaluate([{"image_id": i, "caption": c} for i, c in own.items()], refs)
    assert listed.scores == good.scores
    with pytest.raises(Exception, match="no reference"):
        adjcap.evaluate({"nope": "a cat"}, refs)


@pytest.fixture(scope="module")
def sets(demo_cfg, tmp_path_factory):
    return [f"paths.cache_dir={demo_cfg.paths.cache_dir}", f"paths.runs_dir={tmp_path_factory.mktemp('runs')}",
            "ray.include_dashboard=false", "executor=local"]  # in process, as in a notebook: the API is the subject


@pytest.mark.slow
def test_caption_a_list_of_demo_images(demo_cfg, sets, tmp_path):
    images = sorted((Path(demo_cfg.resolved().paths.cache_dir) / "demo" / "images").glob("demo-test-000*.png"))[:3]
    assert len(images) == 3
    result = adjcap.caption(images, preset="demo", overrides=sets, run_dir=tmp_path / "run")
    assert isinstance(result, adjcap.Captions) and len(result) == 3
    assert [c.image for c in result] == [p.resolve() for p in images]  # the user's own paths, in order
    for c in result:
        assert c.error is None and c.caption and c.picker == result.picker
        assert len(c.candidates) == demo_cfg.captioner.beam_width
        assert [x.text for x in c.candidates if x.chosen] == [c.caption]
        assert c.lm_caption == next(x.text for x in c.candidates if x.beam_rank == 0)
    assert result.jsonl.exists() and result.gallery.exists() and result.run_dir == tmp_path / "run"
    df = result.to_pandas()
    assert list(df["caption"]) == [c.caption for c in result]


@pytest.mark.slow
def test_run_then_load_run(demo_cfg, sets, tmp_path):
    run = adjcap.run("demo", preset="demo", overrides=[*sets, "rerank.beta=0.6"], limit=8,
                     run_dir=tmp_path / "demo")
    assert isinstance(run, adjcap.Run) and run.config.rerank.beta == 0.6 and run.config.limit == 8
    proto = run.config.rerank.protocol
    m = run.metrics[proto, "ensemble"]
    assert m.n_images == 8 and m["CIDEr"] >= 0 and "CLIPScore" in m.scores
    samples = run.samples
    assert samples.num_rows >= 8 and "image_id" in samples.column_names
    preds = run.predictions(proto, "ensemble")
    assert len(preds) == 8 and all(p["caption"] for p in preds)
    with pytest.raises(KeyError, match="did you mean 'ensemble'"):
        run.predictions(proto, "ensembel")
    again = adjcap.load_run(tmp_path / "demo")
    assert again.metrics == run.metrics and again.config == run.config
    assert again.samples_df().shape[0] == samples.num_rows
    with pytest.raises(FileNotFoundError, match="a run directory"):
        adjcap.load_run(tmp_path)
