"""A node lost half-way through the job, simulated on this machine: a Ray cluster of a head (no GPU)
and two worker nodes with two logical GPUs each (ray.cluster_utils.Cluster, as tests/test_multinode.py),
`adjcap run-job demo --workers 2` across it, and a worker node that holds a pool actor removed (its
raylet and every actor and object on it gone) once half of the images are written. The job finishes on
the surviving node (Ray Data restarts the lost actors and retries their batches; lost blocks are rebuilt
from lineage), every image is written exactly once, and the images written before the loss are kept as
they were: the loss costs at most the images not yet written when it happened.

One fused pool (two actors of one GPU each; the survivor's two GPUs hold both): no named pool's actor is
killed here, and one actor process per worker instead of four keeps the test short."""

import threading
import time

import pyarrow.parquet as pq
import pytest

from sim_cluster import node_workers, raylet_pid, simulated_cluster

from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import read_records

pytestmark = [pytest.mark.slow, pytest.mark.alone]

LIMIT = 24  # per split: 48 images, written 2 per part (the images are cheap once the actors are up)


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


def actor_hosts(nodes) -> dict[int, int]:
    """{index in ``nodes``: its pool actor processes} of the nodes that hold a pool actor now."""
    raylets = {raylet_pid(n): i for i, n in enumerate(nodes)}
    out: dict[int, int] = {}
    for _, ppid, title in node_workers(raylets):
        if "MapWorker(MapBatches(" in title:
            out[raylets[ppid]] = out.get(raylets[ppid], 0) + 1
    return out


class LoseANode(threading.Thread):
    """Removes a node of ``nodes`` that holds a pool actor once ``at`` images are written (wherever Ray
    placed the actors, the loss takes one); keeps what was written then and the actors it took."""

    def __init__(self, cluster, nodes, run_dir, at: int):
        super().__init__(daemon=True)
        self.cluster, self.nodes, self.run_dir, self.at = cluster, nodes, run_dir, at
        self.before: dict[str, list[str]] | None = None
        self.actors_lost = 0
        self.gone_at: int | None = None  # images written once the node was gone
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            parts = written(self.run_dir)
            if sum(len(v) for v in parts.values()) >= self.at:
                hosts = actor_hosts(self.nodes)
                lost = max(hosts, key=hosts.get, default=len(self.nodes) - 1)
                self.cluster.remove_node(self.nodes[lost], allow_graceful=False)
                self.before, self.actors_lost = parts, hosts.get(lost, 0)
                self.gone_at = sum(len(v) for v in written(self.run_dir).values())
                return
            self.halt.wait(0.1)


def test_a_node_lost_half_way_costs_only_its_unfinished_images(cluster, demo_cfg, tmp_path):
    from typer.testing import CliRunner

    from adjcap.cli import app

    c, nodes = cluster
    run_dir = tmp_path / "demo"
    total = 2 * LIMIT
    loser = LoseANode(c, nodes, run_dir, at=total // 2)
    loser.start()
    t0 = time.monotonic()
    res = CliRunner().invoke(app, [
        "run-job", "demo", "--workers", "2", "--address", c.address, "--run-dir", str(run_dir),
        "--limit", str(LIMIT), "--no-evaluate", "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
        "--set", "ray.rows_per_part=2", "--set", "ray.batch_size=2", "--set", "cache.share_stages=false",
        "--set", "ray.pools=fused",
    ])
    loser.halt.set()
    loser.join()
    assert res.exit_code == 0, res.output
    assert loser.before is not None, "the job finished before half of its images were written"
    assert loser.actors_lost >= 1, "the lost node held no pool actor"
    assert loser.gone_at < total, "every image was written before the node was gone: the loss was not mid-job"
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
