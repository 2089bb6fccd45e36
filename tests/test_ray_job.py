"""The Ray job end to end on the demo world: a local Ray with 2 CPUs, four actor pools."""

import json

import pyarrow.parquet as pq
import pytest

from rows_agree import assert_rows_agree

from adjcap.pipeline import run_pipeline
from adjcap.rundir import RunDir
from jobs import run
from jobs.run_benchmark import read_records

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job(demo_cfg, tmp_path_factory):
    """`adjcap run-job demo --workers 2 --run-dir DIR` through the CLI, on 10 images per split."""
    from typer.testing import CliRunner

    from adjcap.config import load_config
    from cli import app

    run_dir = tmp_path_factory.mktemp("run") / "demo"
    res = CliRunner().invoke(app, [
        "run-job", "demo", "--workers", "2", "--run-dir", str(run_dir), "--limit", "10",
        "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}", "--set", "ray.include_dashboard=false",
        "--set", "ray.rows_per_part=4",
        # every stage computed by the pools here, none taken from the stage cache other modules filled
        "--set", "cache.share_stages=false",
    ])
    assert res.exit_code == 0, res.output
    cfg = load_config(config_file=run_dir / "config.toml")  # the saved config re-runs as is
    return cfg, run_dir, res.stdout  # the job's own lines (Ray forwards worker logs to stderr)


def _ids(run_dir, cfg, split):
    t = RunDir(run_dir).read_features(cfg.benchmark, split)
    return t.column("image_id").to_pylist()


def test_cli_job_leaves_the_documented_run_directory(job):
    cfg, run_dir, output = job
    assert [ln for ln in output.strip().splitlines() if not ln.startswith(("\x1b", "("))][-1] == str(run_dir)  # printed last
    assert cfg.ray.workers == 2 and cfg.limit == 10 and cfg.name == "demo"
    preds = sorted((run_dir / "predictions" / cfg.rerank.protocol).glob("*.json"))
    assert {p.stem for p in preds} >= {"lm", "ensemble", "trifuse", "memattend", "fixed"}
    for p in preds:
        entries = json.loads(p.read_text())  # COCO results format
        assert len(entries) == 10 and all(set(e) >= {"image_id", "caption"} for e in entries)
    metrics = json.loads((run_dir / "metrics" / f"{cfg.rerank.protocol}.json").read_text())
    assert metrics["pickers"]["ensemble"]["metrics"]["CIDEr"] is not None
    assert (run_dir / "heads" / "trifuse.safetensors").exists() and (run_dir / "report.md").exists()


def test_one_row_per_image_no_duplicates(job):
    cfg, run_dir, _ = job
    records = read_records(cfg)
    assert (run_dir / "config.toml").exists()
    for split, recs in records.items():
        ids = _ids(run_dir, cfg, split)
        assert len(ids) == len(set(ids)) == len(recs) == 10
        assert set(ids) == {r.image_id for r in recs}


def test_rerun_does_no_work_and_deleting_a_part_restores_exactly_it(job):
    cfg, run_dir, _ = job
    rd = RunDir(run_dir)
    run.main(cfg, run_dir=run_dir, evaluate_after=False)
    summary = rd.summary()["splits"]
    assert all(s["done"] == 0 and s["failed"] == 0 and s["skipped"] == s["images"] for s in summary.values())

    victim = rd.parts(cfg.benchmark, "test")[0]
    lost = set(pq.read_table(victim).column("image_id").to_pylist())
    before = rd.done_ids(cfg.benchmark, "test")
    victim.unlink()
    run.main(cfg, run_dir=run_dir, evaluate_after=False)
    summary = rd.summary()["splits"]
    assert summary["test"]["done"] + summary["test"]["failed"] == len(lost)
    assert summary["val"]["done"] == 0
    after = _ids(run_dir, cfg, "test")
    assert len(after) == len(set(after)) and set(after) == before


def test_ray_output_equals_single_process_pipeline(job):
    cfg, run_dir, _ = job
    recs = read_records(cfg)["test"]
    expected = {r["image_id"]: r for r in run_pipeline(recs, cfg)}
    got = {r["image_id"]: r for r in RunDir(run_dir).read_features(cfg.benchmark, "test").to_pylist()}
    assert set(got) == set(expected)
    for image_id, e in expected.items():
        assert_rows_agree(got[image_id], e)