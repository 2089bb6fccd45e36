"""A node lost half-way through the job, simulated on this machine: a Ray cluster of a head (no GPU)
and two worker nodes with two logical GPUs each (ray.cluster_utils.Cluster, as tests/test_multinode.py),
`adjcap run-job demo --workers 2` across it, and one worker node removed (its raylet and every actor
and object on it gone) once half of the images are written. The job finishes on the surviving node
(Ray Data restarts the lost actors and retries their batches; lost blocks are rebuilt from lineage),
every image is written exactly once, and the images written before the loss are kept as they were:
the loss costs at most the images not yet written when it happened."""

import threading
import time

import pyarrow.parquet as pq
import pytest

from sim_cluster import simulated_cluster

from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import read_records

pytestmark = [pytest.mark.slow, pytest.mark.alone]

LIMIT = 24  # per split: 48 images, written 2 per part


@pytest.fixture(scope="module")
def cluster():
    with simulated_cluster(2) as (c, nodes):
        yield c, nodes


def written(run_dir) -> dict[str, list[str]]:
    """Image ids in the finished (renamed) feature parts, by part file name."""
    out = {}
    for split in ("test", "val"):
        d = RunDir(run_dir).features_dir("demo", split)
        for p in RunDir(run_dir).parts("demo", split) if d.is_dir() else []:
            try:
                out[f"{split}/{p.name}"] = pq.read_table(p, columns=["image_id"]).column("image_id").to_pylist()
            except (OSError, ValueError):  # renamed between listing and reading: next poll
                continue
    return out


class LoseANode(threading.Thread):
    """Removes ``node`` from the cluster once ``at`` images are written; keeps what was written then."""

    def __init__(self, cluster, node, run_dir, at: int):
        super().__init__(daemon=True)
        self.cluster, self.node, self.run_dir, self.at = cluster, node, run_dir, at
        self.before: dict[str, list[str]] | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            parts = written(self.run_dir)
            if sum(len(v) for v in parts.values()) >= self.at:
                self.cluster.remove_node(self.node, allow_graceful=False)
                self.before = parts
                return
            self.halt.wait(0.1)


def test_a_node_lost_half_way_costs_only_its_unfinished_images(cluster, demo_cfg, tmp_path):
    from typer.testing import CliRunner

    from adjcap.cli import app

    c, nodes = cluster
    run_dir = tmp_path / "demo"
    total = 2 * LIMIT
    loser = LoseANode(c, nodes[1], run_dir, at=total // 2)
    loser.start()
    t0 = time.monotonic()
    res = CliRunner().invoke(app, [
        "run-job", "demo", "--workers", "2", "--address", c.address, "--run-dir", str(run_dir),
        "--limit", str(LIMIT), "--no-evaluate", "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
        "--set", "ray.rows_per_part=2", "--set", "ray.batch_size=2", "--set", "cache.share_stages=false",
        "--set", "ray.mps=true",  # the four split pools across the nodes (auto fuses without MPS)
    ])
    loser.halt.set()
    loser.join()
    assert res.exit_code == 0, res.output
    assert loser.before is not None, "the job finished before half of its images were written"
    after = written(run_dir)
    # what was written before the loss is kept as it was (nothing rewritten, no part lost)
    assert {k: after[k] for k in loser.before} == loser.before
    cfg = demo_cfg.model_copy(update={"limit": LIMIT}).resolved()
    for split, recs in read_records(cfg).items():
        got = RunDir(run_dir).read_features("demo", split).to_pylist()
        ids = [r["image_id"] for r in got]
        assert len(ids) == len(set(ids)) == LIMIT and set(ids) == {r.image_id for r in recs}
        assert all(r["error"] is None for r in got)
    done_before = sum(len(v) for v in loser.before.values())
    print(f"\nnode lost after {done_before}/{total} images written; the other {total - done_before} "
          f"(at most these were redone) finished on the surviving node; {time.monotonic() - t0:.0f} s")
