"""`ray job submit --working-dir` with the links (docs/architecture.md, "One layout"): a clone's tracked
files, links kept, uploaded as the job's working directory to a local Ray with a job server; `python
cli.py run-job demo` runs there through adjcap/jobs, adjcap/actors and adjcap/cli.py, with the code
imported from the uploaded copy, and writes its features where --run-dir says."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from wheel_venv import tracked_copy

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_job_submitted_with_its_working_dir_runs_through_the_links(demo_cfg, tmp_path, monkeypatch):
    from ray.cluster_utils import Cluster

    src = tracked_copy(tmp_path / "clone")
    assert (src / "adjcap" / "jobs").is_symlink() and (src / "adjcap" / "cli.py").is_symlink()
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the job finds its code in the uploaded copy only
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    port = _free_port()
    cluster = Cluster(initialize_head=True, head_node_args={
        "node_ip_address": "127.0.0.1", "num_cpus": 2, "num_gpus": 0, "object_store_memory": 150 << 20,
        "include_dashboard": True, "dashboard_host": "127.0.0.1", "dashboard_port": port,
        # not Ray's fixed default (52365): a Ray another test module runs meanwhile may hold that one, and
        # a head whose job agent cannot bind its port never takes a submission
        "dashboard_agent_listen_port": _free_port()})
    run_dir = tmp_path / "runs" / "submitted"
    probe = ("import adjcap.jobs.run, adjcap.actors.pool, adjcap.jobs.ray_session as s; "
             "print('CODE', adjcap.jobs.run.__file__, adjcap.actors.pool.__file__, s.ROOT)")
    entry = (f"{sys.executable} cli.py run-job demo --limit 2 --workers 1 --no-evaluate --run-dir {run_dir} "
             f"--set paths.cache_dir={demo_cfg.paths.cache_dir} && {sys.executable} -c \"{probe}\"")
    cmd = [str(Path(sys.executable).parent / "ray"), "job", "submit", "--address", f"http://127.0.0.1:{port}",
           "--working-dir", str(src), "--", "bash", "-c", entry]
    try:
        # the head's job agent registers a while after the dashboard answers (longer on a loaded machine):
        # until it has, the submission is refused before any job exists, and is sent again
        deadline = time.time() + 180
        while True:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if "No available agent to submit job" not in res.stderr + res.stdout or time.time() > deadline:
                break
            time.sleep(3)
    finally:
        cluster.shutdown()
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    code = next(line.split()[1:] for line in out.splitlines() if line.startswith("CODE "))
    run_py, pool_py, root = (Path(p) for p in code)
    # imported through the links of the uploaded copy (Ray unpacks it under its session directory)
    assert run_py.parent.name == "jobs" and run_py.parent.parent.name == "adjcap" and "runtime_resources" in str(run_py)
    assert pool_py.parent.parent == run_py.parent.parent and root == run_py.parents[2]
    from adjcap.storage.rundir import RunDir

    rd = RunDir(run_dir)
    for split in ("val", "test"):  # every image of the limited splits, once, with its candidates
        ids = sorted(rd.current_ids("demo", split))
        table = rd.read_features("demo", split, image_ids=set(ids))
        assert len(ids) == 2 and sorted(table.column("image_id").to_pylist()) == ids
