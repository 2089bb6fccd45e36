"""The Ray job end to end on the demo world: a local Ray with 2 CPUs and no GPU, where the default
ray.pools=auto runs every stage in one fused pool (tests/test_multinode.py and tests/faults/test_job_faults.py
run the four split pools)."""

import json
import sys

import pyarrow.parquet as pq
import pytest

from rows_agree import assert_rows_agree

from adjcap.engine.pipeline import run_pipeline
from adjcap.storage.rundir import RunDir
from adjcap.jobs import run
from adjcap.engine.run_plan import read_records

pytestmark = pytest.mark.slow
CORPUS_READS: list[str] = []  # what the job fixture's run parsed through the index lifecycle's corpus reader


def _counting_corpus_reads(reads: list[str]):
    """A patch of the one reader of the corpus retrieval searches (adjcap.index.lifecycle) that lists
    what it parses."""
    from unittest import mock

    import adjcap.index.lifecycle as lifecycle

    real = lifecycle.load_corpus

    def spy(path, *args, **kwargs):
        reads.append(str(path))
        return real(path, *args, **kwargs)

    return mock.patch.object(lifecycle, "load_corpus", spy)


@pytest.fixture(scope="module")
def job(demo_cfg, tmp_path_factory):
    """`adjcap run-job demo --workers 2 --run-dir DIR --log mlflow=file://... --log wandb=PROJECT`
    through the CLI, on 10 images per split (W&B offline, MLflow in a local file store)."""
    import os

    from typer.testing import CliRunner

    from adjcap.config import load_config
    from adjcap.cli import app

    run_dir = tmp_path_factory.mktemp("run") / "demo"
    mlruns = run_dir.parent / "mlruns"
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with _counting_corpus_reads(CORPUS_READS):
            res = CliRunner().invoke(app, [
                "run-job", "demo", "--workers", "2", "--run-dir", str(run_dir), "--limit", "10",
                "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}", "--set", "ray.include_dashboard=false",
                "--set", "ray.rows_per_part=4",
                # a stage cache of its own: the pools compute every stage here (none is taken from what
                # other modules stored), and a rerun finds them there, as a user's rerun does (the default)
                "--set", f"cache.stages_dir={run_dir.parent / 'stages'}",
                "--log", f"mlflow={mlruns.as_uri()}", "--log", "wandb=adjcap-test",
            ])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    assert res.exit_code == 0, res.output
    stages = RunDir(run_dir).summary()["stages"]
    assert all(n == 20 for n in stages["computed"].values()) and not any(stages["reused"].values()), stages
    # batches of 8 (the demo's ray.batch_size): the pools' pace is timed from the first batch back to the last
    streaming = stages["streaming"]
    assert 0 < streaming["images"] <= 20 - 1 and streaming["seconds"] > 0, streaming
    assert f"streaming: {streaming['images'] / streaming['seconds']:.2f} images/s" in res.stdout, res.stdout
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


def test_a_gpu_less_job_runs_one_fused_pool(job):
    _, _, output = job
    assert "pools: fused x2 (retrieve + verify + caption + score)" in output, output


def test_the_job_reads_its_corpus_once(job):
    """Run plan, identity, provenance (start and end), stage cache and the index the retrievers share
    all use the corpus the run plan read (docs/architecture.md, "Run plan")."""
    cfg, _, _ = job
    assert CORPUS_READS == [cfg.resolved().benchmark_cfg().corpus]


def test_one_row_per_image_no_duplicates(job):
    cfg, run_dir, _ = job
    records = read_records(cfg.resolved())
    assert (run_dir / "config.toml").exists()
    for split, recs in records.items():
        ids = _ids(run_dir, cfg, split)
        assert len(ids) == len(set(ids)) == len(recs) == 10
        assert set(ids) == {r.image_id for r in recs}


def test_rerun_does_no_work_and_deleting_a_part_restores_exactly_it(job):
    from adjcap.jobs.ray_session import ray_session

    cfg, run_dir, _ = job
    rd = RunDir(run_dir)
    reads: list[str] = []
    with ray_session(cfg.resolved()), _counting_corpus_reads(reads):  # both reruns on one local Ray
        run.main(cfg, run_dir=run_dir, evaluate_after=False)
        assert len(reads) == 1  # once per job
        summary = rd.summary()["splits"]
        assert all(s["done"] == 0 and s["failed"] == 0 and s["skipped"] == s["images"] for s in summary.values())

        victim = rd.parts(cfg.benchmark, "test")[0]
        lost = set(pq.read_table(victim).column("image_id").to_pylist())
        before = rd.done_ids(cfg.benchmark, "test")
        victim.unlink()
        run.main(cfg, run_dir=run_dir, evaluate_after=False)
        assert len(reads) == 2
    summary = rd.summary()["splits"]
    assert summary["test"]["done"] + summary["test"]["failed"] == len(lost)
    assert summary["val"]["done"] == 0
    # the lost images come back from the run's stage cache: no pool computes anything again
    stages = rd.summary()["stages"]
    assert not any(stages["computed"].values()) and set(stages["reused"].values()) == {len(lost)}, stages
    after = _ids(run_dir, cfg, "test")
    assert len(after) == len(set(after)) and set(after) == before


def test_ray_output_equals_single_process_pipeline(job):
    cfg, run_dir, _ = job
    recs = read_records(cfg.resolved())["test"]
    expected = {r["image_id"]: r for r in run_pipeline(recs, cfg)}
    got = {r["image_id"]: r for r in RunDir(run_dir).read_features(cfg.benchmark, "test").to_pylist()}
    assert set(got) == set(expected)
    for image_id, e in expected.items():
        assert_rows_agree(got[image_id], e)

def test_provenance_written_and_completed(job):
    from adjcap.storage.provenance import config_digest

    cfg, run_dir, _ = job
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["status"] == "finished" and prov["finished_utc"] >= prov["started_utc"]
    assert prov["command"] == sys.argv  # the process's own command line (here: pytest's)
    assert prov["libraries"]["torch"] and prov["libraries"]["ray"] and prov["python"]["version"]
    assert prov["cluster"]["nodes"] == 1 and prov["cluster"]["per_node"][0]["cpus"] > 0
    assert prov["config"]["digest"] == config_digest(cfg.resolved())
    # models by content, data files by digest, the stage identities the stage cache uses
    assert prov["models"]["captioner.checkpoint"].startswith("file:")
    assert prov["data"]["corpus"]["digest"] and prov["features"]["index"]["digest"]
    assert set(prov["features"]["stages"]) == {"retrieve", "verify", "caption", "score"}
    assert "Provenance (provenance.json)" in (run_dir / "report.md").read_text()
    assert "class='provenance'" in (run_dir / "report.html").read_text()


def test_samples_table_one_row_per_image_and_split(job):
    import pandas as pd

    cfg, run_dir, _ = job
    df = pd.read_parquet(run_dir / "samples.parquet")
    assert len(df) == 20 and not df.duplicated(["split", "image_id"]).any()
    assert sorted(df.split.unique()) == ["test", "val"]
    for split in ("test", "val"):
        feats = RunDir(run_dir).read_features(cfg.benchmark, split).to_pylist()
        rows = df[df.split == split].set_index("image_id")
        for f in feats:  # every candidate and every judge's score, as the feature table has them
            cands = list(rows.loc[f["image_id"], "candidates"])
            assert [c["text"] for c in cands] == [c["text"] for c in f["candidates"]]
            assert [c["verifier"] for c in cands] == pytest.approx([c["verifier"] for c in f["candidates"]])
            assert [c["beam_rank"] for c in cands] == [c["beam_rank"] for c in f["candidates"]]
            assert rows.loc[f["image_id"], "image_path"] == f["image_id"]  # the demo's images lie at the root
    metrics = json.loads((run_dir / "metrics" / f"{cfg.rerank.protocol}.json").read_text())
    test = df[df.split == "test"]
    for iid, picks in zip(test.image_id, test.picks):
        by = {p["picker"]: p for p in picks if p["protocol"] == cfg.rerank.protocol}
        assert set(by) >= {"lm", "ensemble", "trifuse", "memattend", "fixed"}
        for name, p in by.items():
            assert p["cider"] == pytest.approx(metrics["per_image"][name][iid]["CIDEr"])
            assert len(p["chair_mentioned"]) == metrics["per_image"][name][iid]["CHAIR_mentioned"]
    assert all(len(p) == 0 for p in df[df.split == "val"].picks)
    assert "| `candidates` |" in (run_dir / "samples.md").read_text()


def test_mlflow_run_reads_back(job):
    import mlflow

    cfg, run_dir, _ = job
    mlflow.set_tracking_uri((run_dir.parent / "mlruns").as_uri())
    runs = mlflow.search_runs(experiment_names=["adjcap"], output_format="list")
    assert len(runs) == 1
    r = runs[0]
    metrics = json.loads((run_dir / "metrics" / f"{cfg.rerank.protocol}.json").read_text())
    for picker, m in metrics["pickers"].items():
        assert r.data.metrics[f"{cfg.rerank.protocol}/{picker}/CIDEr"] == pytest.approx(m["metrics"]["CIDEr"])
        assert r.data.metrics[f"{cfg.rerank.protocol}/{picker}/CHAIR_i"] == pytest.approx(m["chair"]["CHAIR_i"])
    assert r.data.params["rerank.protocol"] == cfg.rerank.protocol and r.data.params["limit"] == "10"
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert r.data.tags["provenance.config.digest"] == prov["config"]["digest"]
    assert r.data.tags["provenance.libraries.torch"] == prov["libraries"]["torch"]
    arts = {a.path for a in mlflow.MlflowClient().list_artifacts(r.info.run_id)}
    assert {"report.md", "report.html", "samples.parquet", "provenance.json"} <= arts


def test_wandb_offline_run_reads_back(job):
    from wandb_records import offline_run

    cfg, run_dir, _ = job
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    w = offline_run(files[0])
    metrics = json.loads((run_dir / "metrics" / f"{cfg.rerank.protocol}.json").read_text())
    for picker, m in metrics["pickers"].items():
        assert w["summary"][f"{cfg.rerank.protocol}/{picker}/CIDEr"] == pytest.approx(m["metrics"]["CIDEr"])
    assert w["config"]["config"]["rerank.protocol"] == cfg.rerank.protocol
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert w["config"]["provenance"]["provenance.config.digest"] == prov["config"]["digest"]
    assert "benchmark-demo" in w["tags"]
    (files_logged,) = w["artifacts"].values()
    assert {"report.md", "report.html", "samples.parquet", "provenance.json"} <= set(files_logged)


def test_fit_command_rewrites_the_samples_table(job):
    """`adjcap fit --run DIR` (last here: it leaves the metrics older than the picks): the samples
    table gets the new picks, without the metrics that were computed for the old ones."""
    import pandas as pd
    from typer.testing import CliRunner

    from adjcap.cli import app

    cfg, run_dir, _ = job
    res = CliRunner().invoke(app, ["fit", "--run", str(run_dir)])
    assert res.exit_code == 0, res.output
    df = pd.read_parquet(run_dir / "samples.parquet")
    picks = [p for ps in df[df.split == "test"].picks for p in ps]
    assert len(picks) >= 10 * 5 and all(p["cider"] is None and p["candidate_index"] is not None for p in picks)
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["later_steps"][-1]["job"] == "fit"
