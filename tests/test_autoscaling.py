"""The autoscaling rehearsal: the AWS recipe's node types (deploy/ray-cluster-aws-l4.yaml: a head without
GPUs, an L4 group from 0 workers) on Ray's own autoscaler and fake multi-node provider
(tests/autoscaling_sim.py: logical GPUs on real raylets of this machine). `adjcap run-job demo --workers 2`
starts with no GPU worker up, plans for the GPU nodes the launcher config says the autoscaler can add, asks
for them, waits on one progress line while the autoscaler adds them, and its features equal the in-process
pipeline's; a node type that never comes (no capacity: max_workers 0 in the config the autoscaler reads,
while the job reads 2) ends the job at ray.scale_wait_s in one line."""

import json

import pytest
import yaml
from autoscaling_sim import autoscaling_cluster, gpu_nodes_up
from rows_agree import assert_rows_agree

from adjcap.engine.cluster_plan import NODE_SHAPES
from adjcap.engine.pipeline import load_models, run_pipeline
from adjcap.storage.rundir import RunDir
from adjcap.engine.run_plan import read_records

pytestmark = [pytest.mark.slow, pytest.mark.alone]

LIMIT = 3


def aws_worker_types(max_workers: int | None = None) -> dict:
    """The AWS recipe's GPU worker type(s): its name, min/max workers, and its instance's CPUs and GPUs as
    logical resources (no memory resource: the fake nodes have this machine's)."""
    from pathlib import Path

    conf = yaml.safe_load((Path(__file__).resolve().parents[1] / "deploy/ray-cluster-aws-l4.yaml").read_text())
    out = {}
    for name, t in conf["available_node_types"].items():
        if name == conf["head_node_type"]:
            continue
        cpus, gpus, _, _ = NODE_SHAPES[t["node_config"]["InstanceType"]]
        out[name] = {"resources": {"CPU": cpus, "GPU": gpus}, "node_config": {},
                     "min_workers": t.get("min_workers", 0),
                     "max_workers": t["max_workers"] if max_workers is None else max_workers}
    assert out and all(t["min_workers"] == 0 for t in out.values()), "the recipe's GPU group starts from 0"
    return out


def _run_job(address, demo_cfg, run_dir, conf, wait_s):
    from typer.testing import CliRunner

    from adjcap.cli import app

    return CliRunner().invoke(app, [
        "run-job", "demo", "--workers", "2", "--address", address, "--run-dir", str(run_dir),
        "--limit", str(LIMIT), "--no-evaluate", "--set", f"paths.cache_dir={demo_cfg.paths.cache_dir}",
        "--set", f"ray.autoscaler_config={conf}", "--set", f"ray.scale_wait_s={wait_s}",
        "--set", "ray.mps=false",  # fused: one actor per logical GPU (docs/architecture.md, "Pools")
        "--set", "cache.share_stages=false",  # every stage computed here
    ])


def test_the_job_asks_for_its_gpu_workers_and_runs_on_them(demo_cfg, tmp_path):
    with autoscaling_cluster(aws_worker_types(), tmp_path) as (c, conf):
        import ray

        ray.init(address=c.address)
        try:
            assert gpu_nodes_up() == 0  # the head only
        finally:
            ray.shutdown()
        res = _run_job(c.address, demo_cfg, tmp_path / "run", conf, 600)
        assert res.exit_code == 0, res.output + (tmp_path / "monitor.log").read_text()[-3000:]
        assert "waiting for 2 GPU workers: 0 up, 2 pending" in res.output
    cfg = demo_cfg.model_copy(update={"limit": LIMIT}).resolved()
    models = load_models(cfg)
    for split, recs in read_records(cfg).items():
        got = RunDir(tmp_path / "run").read_features("demo", split).to_pylist()
        ref = {r["image_id"]: r for r in run_pipeline(recs, cfg, models)}
        assert sorted(r["image_id"] for r in got) == sorted(ref)
        for g in got:
            assert_rows_agree(g, ref[g["image_id"]])


def test_a_node_type_that_never_comes_ends_at_the_deadline(demo_cfg, tmp_path):
    with autoscaling_cluster(aws_worker_types(max_workers=0), tmp_path) as (c, conf):
        told = tmp_path / "job-view.yaml"  # what the job reads: the group can reach 2 workers
        data = json.loads(conf.read_text())
        for name, t in aws_worker_types(max_workers=2).items():
            data["available_node_types"][name] = t
        told.write_text(json.dumps(data))
        res = _run_job(c.address, demo_cfg, tmp_path / "run", told, 5)
    assert res.exit_code != 0
    last = [ln for ln in res.output.splitlines() if ln.strip()][-1]
    group = next(iter(aws_worker_types()))  # the recipe's L4 group: ray.worker.l4
    assert "waited 5 s (ray.scale_wait_s)" in last and f"never came: 2 x {group}" in last, res.output
