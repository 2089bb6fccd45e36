"""A cluster that goes away mid-job, as a cluster user meets it: `run-job demo --address HEAD` on a Ray
head that this test starts on 127.0.0.1 (ray.cluster_utils), whose processes the test kills by their
own process ids after the job's first feature part. The driver ends within a bounded time (before
Ray's own 60 s give-up) with adjcap's one line naming the cluster, that completed parts are kept and
to rerun, and adjcap's own exit code (jobs/ray_guards.py); the parts it wrote are complete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from adjcap.jobs.ray_guards import EXIT_LOST_CLUSTER, LOST_AFTER_S
from adjcap.storage.rundir import RunDir

from .own_world import own_world_settings

pytestmark = [pytest.mark.alone, pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def head():
    """A one-node Ray cluster (the head, 4 CPUs) on 127.0.0.1, started by this test."""
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    old = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # the head's node IP: 127.0.0.1
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    c = Cluster(initialize_head=True, head_node_args={"node_ip_address": "127.0.0.1", "num_cpus": 4, "num_gpus": 0,
                                                      "include_dashboard": False, "object_store_memory": 150 << 20})
    try:
        yield c
    finally:
        try:
            c.shutdown()
        except Exception:  # noqa: BLE001 - its processes were killed on purpose
            pass
        ray_constants.ENABLE_RAY_CLUSTER = old
        os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)


def test_a_lost_head_ends_the_job_in_one_line_and_keeps_parts(head, demo_cfg, tmp_path):
    sets = own_world_settings(demo_cfg, tmp_path / "world")
    run = RunDir(tmp_path / "run")
    args = ["run-job", "demo", "--address", head.address, "--workers", "1", "--limit", "6", "--no-evaluate",
            "--run-dir", str(run.path)]
    for s in sets:
        args += ["--set", s]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("RAY_ADDRESS", None)
    err = tmp_path / "driver.err"
    with open(err, "wb") as e:
        driver = subprocess.Popen([sys.executable, "cli.py", *args], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                  stderr=e, start_new_session=True)
    try:
        deadline = time.time() + 400
        while not any(run.parts("demo", s) for s in ("val", "test")):
            assert driver.poll() is None, err.read_text()[-3000:]
            assert time.time() < deadline, "no feature part in time:\n" + err.read_text()[-3000:]
            time.sleep(0.5)
        # the cluster goes away: every process of the head node, by its pid
        procs = [p.process for ps in head.head_node.all_processes.values() for p in ps]
        for p in procs:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        lost = time.time()
        rc = driver.wait(timeout=120)
        took = time.time() - lost
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(30)
    text = err.read_text(errors="replace")
    assert rc == EXIT_LOST_CLUSTER, (rc, text[-3000:])
    assert LOST_AFTER_S <= took < 55, took  # bounded, and before Ray's own give-up after 60 s
    last = [ln for ln in text.splitlines() if ln.strip()][-1]
    assert last.startswith(f"error: lost the Ray cluster at {head.address}"), text[-3000:]
    assert "completed feature parts are kept" in last and "rerun the same command to resume" in last
    assert sum(1 for ln in text.splitlines() if ln.startswith("error:")) == 1
    for split in ("val", "test"):  # what was written is complete and readable
        for p in run.parts("demo", split):
            assert pq.read_table(p).num_rows >= 1
