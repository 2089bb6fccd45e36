"""One engine, two backends (docs/architecture.md, "Data flow of one image"): the demo's features run
through the Ray backend (Ray Data pools, jobs/ray_backend.py) and the local backend (in process,
adjcap/engine/local.py), each through the same decode function, pool batch class, Arrow transport and
batch sink, come out the same, in the run directory and in the stage cache: bit for bit where this
process computes with the kernels the workers are pinned to (adjcap.machine.numerics.PIN), else within
tests/rows_agree.py's tolerance (this CPU's own kernels sum in another order)."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rows_agree import assert_rows_agree

from adjcap.machine import numerics
from adjcap.config import load_config
from adjcap.jobs.extract_features import extract_features
from adjcap.engine.run_plan import RunPlan

pytestmark = pytest.mark.slow


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by("image_id")


def test_both_backends_write_the_same_features_and_stage_outputs(demo_cfg, one_local_ray, tmp_path):
    """The job's own choice of backend (``executor``): Ray Data pools, or this process (the models loaded
    by the job, its progress counted on an in-process board)."""
    plans = {}
    for backend in ("ray", "local"):
        cfg = load_config("demo", [f"paths.cache_dir={demo_cfg.paths.cache_dir}", f"paths.runs_dir={tmp_path / 'runs'}",
                                   f"cache.stages_dir={tmp_path / backend / 'stages'}", "limit=6", f"executor={backend}",
                                   "ray.include_dashboard=false", "ray.batch_size=4", "ray.rows_per_part=4"])
        plans[backend] = RunPlan.build(cfg, cfg.resolved(), tmp_path / backend / "run")
    summaries = {b: extract_features(plans[b]) for b in ("local", "ray")}  # local first: it builds the index here
    assert summaries["ray"] == summaries["local"]
    assert all(s["done"] == 6 and s["failed"] == 0 for s in summaries["ray"].values()), summaries
    cfg = plans["ray"].cfg
    for split in plans["ray"].records:
        ray_rows, local_rows = (_sorted(plans[b].run.read_features(cfg.benchmark, split)) for b in ("ray", "local"))
        assert ray_rows.num_rows == 6 and ray_rows.column("image_id").equals(local_rows.column("image_id"))
        _agree(ray_rows, local_rows)
    # the sink wrote the same stage outputs in both stage caches (batches of 4: the same part names too)
    caches = {b: plans[b].stage_cache() for b in plans}
    for stage in plans["ray"].stages:
        names = {b: sorted(p.name for p in caches[b].parts(stage)) for b in caches}
        assert names["ray"] == names["local"] and names["ray"], stage
        read = {b: _sorted(pa.concat_tables(pq.read_table(p) for p in caches[b].parts(stage))) for b in caches}
        _agree(read["ray"], read["local"], rows=False)


def _agree(ray_rows: pa.Table, local_rows: pa.Table, rows: bool = True) -> None:
    if numerics.pinned():  # this process runs the workers' kernels: the same bits, every column
        # (compared as Python values, whose repr is exact for every float, so a NaN, the stage cache's
        # blank for a field a later stage fills, equals itself)
        assert repr(ray_rows.to_pylist()) == repr(local_rows.to_pylist())
    elif rows:
        for g, e in zip(ray_rows.to_pylist(), local_rows.to_pylist()):
            assert_rows_agree(g, e)
    else:  # a stage's stored columns: the same images (the part names above: the same batches)
        assert ray_rows.column("image_id").equals(local_rows.column("image_id"))



def test_the_scheduler_looks_less_often_only_where_blocks_come_back_slowly(monkeypatch):
    """The Ray backend's poll pace (jobs/ray_backend.PollPace): the configured poll until two blocks came
    back, then a quarter of the gap between blocks, never under the configured poll nor over LONGEST."""
    from jobs import ray_backend

    set_to: list[float] = []
    monkeypatch.setattr(ray_backend, "data_poll", set_to.append)
    clock = iter([100.0, 108.0, 116.0, *(116.0 + 0.2 * i for i in range(1, 7))])
    monkeypatch.setattr(ray_backend.time, "monotonic", lambda: next(clock))
    pace = ray_backend.PollPace(0.5)
    pace.output()  # the first block, after the models loaded: no gap yet
    assert set_to == [] and pace.seconds() == 0.5
    pace.output()
    pace.output()  # blocks 8 s apart (a CPU-bound job): a quarter of that, capped
    assert set_to == [pace.LONGEST, pace.LONGEST]
    for _ in range(6):  # then 0.2 s apart (a GPU job): back down to the configured poll, not below
        pace.output()
    assert set_to[-1] == 0.5 and all(0.5 <= s <= pace.LONGEST for s in set_to)


def test_a_job_run_with_executor_local_starts_no_ray(demo_cfg, tmp_path, monkeypatch, capsys):
    """``adjcap run-job demo --set executor=local``: the whole job (features, fit, evaluation, report) in the
    command's own process, no Ray session and no Ray call; its progress on the driver's own board; a rerun
    resumes (nothing computed again)."""
    import ray
    from typer.testing import CliRunner

    from adjcap.cli import app
    from adjcap.jobs import ray_session
    from adjcap.storage.rundir import RunDir

    def no_ray(*a, **k):
        raise AssertionError("Ray was used by a job with executor=local")

    for name in ("init", "get", "put", "remote", "kill"):
        monkeypatch.setattr(ray, name, no_ray)
    monkeypatch.setattr(ray_session, "ray_session", no_ray)
    args = ["run-job", "demo", "--limit", "3", "--run-dir", str(tmp_path / "run"),
            "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}", "--set", f"cache.stages_dir={tmp_path / 'stages'}",
            "--set", "executor=local"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "features: decode 6/6, retrieve 6/6, verify 6/6, caption 6/6, score 6/6" in res.output, res.output
    run = RunDir(tmp_path / "run")
    proto = load_config(config_file=run.path / "config.toml").rerank.protocol
    assert run.predictions(proto, "ensemble") and (run.path / "report.md").is_file()
    assert load_config(config_file=run.path / "config.toml").executor == "local"
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert "3 already written" in again.output and "features: decode" not in again.output, again.output


def test_executor_local_refuses_a_family_that_runs_only_on_ray(demo_cfg, tmp_path):
    """The ``lavis`` verifier backend loads in an environment of its own (a Ray runtime environment):
    ``executor=local`` with it is one line naming the setting to change, before anything is read or written."""
    from typer.testing import CliRunner

    from adjcap.cli import app

    res = CliRunner().invoke(app, ["run-job", "demo", "--limit", "2", "--run-dir", str(tmp_path / "run"),
                                   "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
                                   "--set", "executor=local", "--set", "verifier.backend=lavis"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "verifier.backend=lavis" in lines[0] and "set executor=ray" in lines[0], lines[0]
    assert not (tmp_path / "run").exists()
