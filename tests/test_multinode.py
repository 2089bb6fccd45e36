"""Several nodes, simulated on this machine: a Ray cluster of a head (no GPU) and two worker nodes
with one logical GPU each (ray.cluster_utils.Cluster, every server on 127.0.0.1), and
`adjcap run-job demo --workers 2 --address ADDR` across it: the pools' actors sit on the GPU nodes,
two per pool, four per node (two nodes x one GPU / 0.25 GPU per actor: the cluster filled, as
`--workers 8` fills eight GPUs); every image is written exactly once; the rows equal those of the
single-process pipeline (adjcap.engine.pipeline.run_pipeline, which tests/test_ray_job.py also checks a
one-node job against).

The GPUs are logical (Ray resources only): the actors are scheduled as on GPU machines, torch sees
no CUDA device and runs on the CPU."""

import threading
from collections import Counter

import pytest
from rows_agree import assert_rows_agree

from sim_cluster import node_workers, raylet_pid, simulated_cluster

from adjcap.engine.pipeline import load_models, run_pipeline
from adjcap.engine.pools import split_pools
from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import read_records

pytestmark = [pytest.mark.slow, pytest.mark.alone]

LIMIT = 4
POOLS = tuple(p.actor_name for p in split_pools())  # RetrieverActor, VerifierActor, CaptionerActor, ScorerActor
WIDE = 2  # actors per pool: 4 pools x 2 x 0.25 GPU fill the two nodes' GPUs


@pytest.fixture(scope="module")
def cluster():
    """Head (1 CPU, 0 GPU) + two nodes (8 logical CPUs, 1 logical GPU each), all on 127.0.0.1."""
    with simulated_cluster(2, gpus=1) as (c, nodes):
        yield c, {f"gpu-node-{i}": n for i, n in enumerate(nodes)}


def _run_job(cluster, demo_cfg, run_dir, workers: int) -> str:
    from typer.testing import CliRunner

    from adjcap.cli import app

    res = CliRunner().invoke(app, [
        "run-job", "demo", "--workers", str(workers), "--address", cluster.address, "--run-dir", str(run_dir),
        "--limit", str(LIMIT), "--no-evaluate", "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
        "--set", "ray.rows_per_part=3",
        "--set", "ray.mps=true",  # with GPUs, auto splits only under MPS (adjcap.engine.pools.is_fused)
        # every stage computed by the pools here, none taken from the stage cache other modules filled
        "--set", "cache.share_stages=false",
    ])
    assert res.exit_code == 0, res.output
    return res.output


class ActorPlacement(threading.Thread):
    """While a job runs: which node each pool actor lives on, and the most image-decoding tasks seen
    running at once (:func:`sim_cluster.node_workers`)."""

    def __init__(self, nodes: dict[int, str]):
        super().__init__(daemon=True)
        self.nodes, self.seen, self.halt = nodes, {}, threading.Event()  # raylet pid -> node name
        self.decoding = 0

    def run(self) -> None:
        while not self.halt.is_set():
            decoding = 0
            for pid, ppid, title in node_workers(self.nodes):
                decoding += "MapBatches(decode_batch)" in title
                pool = next((p for p in POOLS if f"MapBatches({p})" in title), None)
                if pool and pid not in self.seen:
                    self.seen[pid] = (pool, self.nodes[ppid])
            self.decoding = max(self.decoding, decoding)
            self.halt.wait(0.2)

    def placement(self) -> dict[str, list[str]]:
        self.halt.set()
        self.join()
        out: dict[str, list[str]] = {p: [] for p in POOLS}
        for pool, node in self.seen.values():
            out[pool].append(node)
        return out


@pytest.fixture(scope="module")
def runs(cluster, demo_cfg, tmp_path_factory):
    c, gpu_nodes = cluster
    wide = tmp_path_factory.mktemp("wide") / "demo"
    nodes = {raylet_pid(c.head_node): "head", **{raylet_pid(n): name for name, n in gpu_nodes.items()}}
    watch = ActorPlacement(nodes)
    watch.start()
    _run_job(c, demo_cfg, wide, workers=WIDE)
    wide_actors = watch.placement()
    return wide, wide_actors, set(gpu_nodes), watch.decoding


def test_pools_spread_over_the_gpu_nodes_as_asked(runs):
    _, actors, gpu_nodes, _ = runs
    for pool in POOLS:
        assert len(actors[pool]) == WIDE, (pool, actors)
        assert set(actors[pool]) <= gpu_nodes, f"{pool} actor on the GPU-less head"
    per_node = Counter(n for nodes in actors.values() for n in nodes)
    # 8 actors x 0.25 GPU fill the two nodes' 2 x 1 GPU: four actors on each
    assert sorted(per_node.values()) == [4, 4] and set(per_node) == gpu_nodes


def test_image_decoding_is_bounded_by_the_workers(runs):
    """2 x --workers decoding tasks at once (ray.decode_tasks), not one per free quarter CPU of the
    cluster: unbounded, the two 8-CPU nodes ran 23 decoding processes of ~0.8 GiB each."""
    decoding = runs[-1]
    assert 1 <= decoding <= 2 * WIDE, decoding


def test_every_image_exactly_once_and_rows_equal_to_one_process(runs, demo_cfg):
    wide = runs[0]
    cfg = demo_cfg.model_copy(update={"limit": LIMIT}).resolved()
    models = load_models(cfg)
    for split, recs in read_records(cfg).items():
        got = RunDir(wide).read_features("demo", split).to_pylist()
        ref = {r["image_id"]: r for r in run_pipeline(recs, cfg, models)}
        ids = [r["image_id"] for r in got]
        assert len(ids) == len(set(ids)) == LIMIT and set(ids) == {r.image_id for r in recs} == set(ref)
        for g in got:
            assert_rows_agree(g, ref[g["image_id"]])
            assert g["error"] is None
