"""SIGTERM to a real `cli.py run-job` driver after Ray has started (a scheduler's stop: SLURM,
Kubernetes, `kill`): the same one-line stop as Ctrl-C with exit code 143, no Ray stack dump; a
temp part left as a killed writer leaves it is removed by the next run, which resumes exactly."""

from __future__ import annotations

import signal

import pytest

from adjcap.config import load_config
from adjcap.engine.pipeline import load_models
from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import read_records

from .own_world import own_world_settings
from .test_job_faults import BENCH, Driver, _n_parts, _one_line_error, _part_ids, _wait_for

pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.timeout(900)]
LIMIT = 6


def test_sigterm_after_ray_started_is_a_clean_stop_and_resume_is_exact(demo_cfg, tmp_path):
    world = tmp_path / "world"
    sets = own_world_settings(demo_cfg, world)
    cfg = load_config("demo", sets + [f"limit={LIMIT}"]).resolved()
    records = read_records(cfg)
    load_models(cfg)  # the corpus index, built once here
    run = RunDir(tmp_path / "run")
    args = ["run-job", BENCH, "--workers", "1", "--limit", str(LIMIT), "--run-dir", str(run.path), "--no-evaluate"]
    for s in sets:
        args += ["--set", s]

    a = Driver(args, tmp_path, "A")
    try:
        # a feature part: Ray is up and every pool has processed a batch
        _wait_for(lambda: _n_parts(run) >= 1, 600, "A's first feature part", a)
        a.track()
        a.proc.send_signal(signal.SIGTERM)
        rc = a.wait(180)
    finally:
        a.reap()
    err = a.stderr()
    assert rc == 143, err[-3000:]
    line = _one_line_error(err)
    assert line.startswith("interrupted:") and "resume" in line
    assert "Aborted" not in err and "SIGTERM" not in err and "Fatal Python error" not in err, err[-3000:]
    after_a = _part_ids(run)
    ids = after_a["val"] + after_a["test"]
    assert ids and len(ids) == len(set(ids)) and len(ids) < 2 * LIMIT

    leftover = run.features_dir(BENCH, "test") / ".part-00000000000000000001-h-1-deadbeef.parquet.x1y2z3.tmp"
    leftover.parent.mkdir(parents=True, exist_ok=True)
    leftover.write_bytes(b"PAR1 half")  # what a killed writer leaves
    b = Driver(args, tmp_path, "B")
    try:
        assert b.wait(600) == 0, b.stderr()[-3000:]
    finally:
        b.reap()
    assert not leftover.exists()
    final = _part_ids(run)
    for split, recs in records.items():
        assert sorted(final[split]) == sorted(r.image_id for r in recs), split  # each image exactly once
        assert set(after_a[split]) <= set(final[split])
    assert "already written" in b.stdout()
