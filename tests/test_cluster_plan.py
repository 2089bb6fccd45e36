"""The job's plan for the cluster it will become (adjcap.engine.cluster_plan), without Ray: node types as data,
the per-node memory check, the nodes a plan waits for, ``ray.pools=auto``'s MPS rule, and every recipe in
deploy/ holding its documented job (`run-job coco --workers 8`) with the node shapes it names."""

import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

from adjcap.engine import pools
from adjcap.machine.accelerators import mps_status
from adjcap.engine.cluster_plan import (GiB, L4_GPU_BYTES, NodeType, PoolPlan, ResourceError, actor_memory, launcher_node_types,
                                 merge_up,
                                 plan_cluster, ray_memory, shape_type)
from adjcap.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
# one GPU's memory by the accelerator a KubeRay worker group asks for (what torch reports)
GPU_BYTES = {"nvidia.com/gpu": L4_GPU_BYTES, "amd.com/gpu": 288e9}


def _headline(*sets):
    return load_config("headline", ["paths.data_dir=/nonexistent", *sets]).resolved()


def test_a_head_without_gpus_plans_the_gpu_workers_it_can_add():
    """Right after `ray up` only the head is up: the plan is still on GPUs (the L4 group can be added),
    8 workers, one set of actors on each, and the progress line counts them."""
    types = [NodeType("head", 8, 0, ray_memory(32 * GiB), 1, up=1), shape_type("l4", "g6.2xlarge", max_count=8)]
    for mps in (True, False):
        plan = plan_cluster(_headline("ray.workers=8", f"ray.mps={str(mps).lower()}"), types)
        assert plan.gpu and plan.nodes == {"l4": 8} and plan.waiting
        assert plan.pools == (pools.pool_names() if mps else ("fused",))
        assert plan.progress() == "waiting for 8 GPU workers: 0 up, 8 pending"
        assert sum(b.get("GPU", 0) for b in plan.bundles()) == pytest.approx(8.0)
    two_up = [types[0], shape_type("l4", "g6.2xlarge", max_count=8, up=2)]
    assert plan_cluster(_headline("ray.workers=8"), two_up).progress() == "waiting for 8 GPU workers: 2 up, 6 pending"
    all_up = [types[0], shape_type("l4", "g6.2xlarge", max_count=8, up=8)]
    assert not plan_cluster(_headline("ray.workers=8"), all_up).waiting


def test_memory_is_checked_per_node_not_summed():
    """A head with a terabyte cannot hold a GPU actor: the L4 nodes' own memory must hold each actor."""
    head = NodeType("head", 64, 0, 1000 * GiB, 1, up=1)
    small = shape_type("l4", "g6.xlarge", max_count=8)  # 16 GiB: 11.2 GiB for actors
    with pytest.raises(ResourceError) as e:
        plan_cluster(_headline("ray.workers=8", "ray.mps=false"), [head, small])
    msg = str(e.value)
    assert "\n" not in msg and "one fused actor needs" in msg and "no node type holds it" in msg
    assert "head (64 CPU, no GPU" in msg and "l4 (4 CPU, 1 GPU, 11.2 GiB" in msg
    # split under MPS: each actor fits a g6.xlarge alone, but one set does not fit one node, so 8 sets need
    # more nodes than the group's 8
    with pytest.raises(ResourceError, match=r"do not fit on the nodes the cluster can have .*use --workers \d"):
        plan_cluster(_headline("ray.workers=8", "ray.mps=true"), [head, small])
    # the same request, summed over the cluster (the old check), would have passed: 8 x 16.2 GiB < 1,089 GiB
    assert 8 * actor_memory(pools.pool_budget(_headline(), gpu=True)["fused"]["bytes"], "fused") < 1000 * GiB


def test_a_static_cluster_cannot_wait_and_more_gpus_than_it_can_have_are_refused():
    one = [NodeType("gpu-node", 16, 1, 100 * GiB, 1, up=1, gpu_memory=L4_GPU_BYTES)]
    with pytest.raises(ResourceError, match="need 1 GPU x 2 = 2 GPUs, the cluster has 1"):
        plan_cluster(_headline("ray.workers=2", "ray.mps=false"), one)
    assert not plan_cluster(_headline("ray.workers=1"), one).waiting


def test_auto_pools_follow_mps_on_gpus(tmp_path):
    cfg = _headline()
    off = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"mps": False})})
    on = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"mps": True})})
    assert [p.name for p in pools.layout(off, gpu=True)] == ["fused"]
    assert [p.name for p in pools.layout(on, gpu=True)] == list(pools.pool_names())
    assert [p.name for p in pools.layout(on, gpu=False)] == ["fused"]  # no GPU: fused whatever MPS says
    pipe = tmp_path / "mps"
    pipe.mkdir()
    assert mps_status({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, which=lambda _: "/usr/bin/x")[0] is False
    (pipe / "control").touch()  # a plain file (anyone can plant one in /tmp) is not the daemon's pipe
    assert mps_status({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, which=lambda _: None)[0] is False
    (pipe / "control").unlink()
    os.mkfifo(pipe / "control")
    on_now, line = mps_status({"CUDA_MPS_PIPE_DIRECTORY": str(pipe)}, which=lambda _: None)
    assert on_now and str(pipe / "control") in line
    link = tmp_path / "planted"  # a link in /tmp to a folder holding a pipe is not the daemon's folder
    link.symlink_to(pipe, target_is_directory=True)
    assert mps_status({"CUDA_MPS_PIPE_DIRECTORY": str(link)}, which=lambda _: None)[0] is False
    off_now, line = mps_status({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "none")}, which=lambda _: None)
    assert not off_now and "no NVIDIA driver tools" in line


# --- every recipe holds its documented job -------------------------------------------------------------

def _command(text: str) -> tuple[str, dict, list[str]]:
    """(benchmark, {--workers, --preset}, --set values) of the `run-job` command in a recipe's text."""
    line = next(ln for ln in text.splitlines() if "run-job" in ln)
    words = shlex.split(line[line.index("run-job"):].split("'")[0].split("#")[0])
    bench, opts, sets, i = words[1], {}, [], 2
    while i < len(words):
        if words[i] in ("--workers", "--preset", "-p"):
            opts[words[i].lstrip("-")] = words[i + 1]
            i += 2
        elif words[i] == "--set":
            sets.append(words[i + 1])
            i += 2
        else:
            i += 1
    return bench, opts, sets


def _bytes(q: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    m = re.fullmatch(r"([\d.]+)([KMGT]i?)?", str(q))
    return float(m.group(1)) * (units[m.group(2)] if m.group(2) else 1)


def _pod_type(name: str, spec: dict, start: dict, count: int | None, up: int) -> NodeType:
    res = spec["template"]["spec"]["containers"][0]["resources"]
    lim = {**res.get("requests", {}), **res.get("limits", {})}
    acc = next((k for k in GPU_BYTES if k in lim), None)
    gpus = float(start.get("num-gpus", lim.get(acc, 0) if acc else 0))
    cpus = float(start.get("num-cpus", lim["cpu"]))
    return NodeType(name, cpus, gpus, ray_memory(_bytes(lim["memory"])), count, up, GPU_BYTES[acc] if acc and gpus else 0.0)


def kuberay_node_types(cluster: dict) -> list[NodeType]:
    """A RayCluster's head and worker groups as node types (a pod's memory limit, Ray's share of it)."""
    spec = cluster["spec"]
    head = spec["headGroupSpec"]
    out = [_pod_type("head", head, head.get("rayStartParams", {}), 1, 1)]
    for g in spec.get("workerGroupSpecs", []):
        out.append(_pod_type(g["groupName"], g, g.get("rayStartParams", {}), int(g["maxReplicas"]),
                             int(g.get("replicas", g.get("minReplicas", 0)))))
    return out


def _recipes():
    out = []
    aws = DEPLOY / "ray-cluster-aws-l4.yaml"
    conf = yaml.safe_load(aws.read_text())
    types = launcher_node_types(conf)
    types = [t.__class__(**{**t.__dict__, "up": 1}) if t.name == conf["head_node_type"] else t for t in types]
    out.append(pytest.param(aws.name, _command(aws.read_text()), types, id=aws.stem))
    clusters = {}
    for f in sorted((DEPLOY / "kuberay").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc.get("kind") == "RayCluster":
                clusters[doc["metadata"]["name"]] = doc
    for f in sorted((DEPLOY / "kuberay").glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc and doc.get("kind") == "RayJob":
                spec = doc["spec"]
                cluster = ({"spec": spec["rayClusterSpec"]} if "rayClusterSpec" in spec
                           else clusters[spec["clusterSelector"]["ray.io/cluster"]])
                cmd = _command("run-job" + spec["entrypoint"].split("run-job", 1)[1])
                out.append(pytest.param(f.name, cmd, kuberay_node_types(cluster), id=f.stem))
    return out


def _job_cfg(cmd, *more):
    bench, opts, sets = cmd
    preset = opts.get("preset", "demo" if bench == "demo" else "headline")  # run-job's default (cli.py)
    return load_config(preset, [f"benchmark={bench}", f"ray.workers={opts.get('workers', 1)}",
                                "paths.data_dir=/nonexistent", *sets, *more]).resolved()


@pytest.mark.parametrize(("recipe", "cmd", "types"), _recipes())
def test_every_recipe_holds_its_documented_job(recipe, cmd, types):
    """The documented command's plan on the recipe's node types (its GPU group from what it starts with
    up to its maximum) fits, split under MPS and fused without; each GPU node holds at most one GPU's
    worth of actors."""
    assert cmd[1].get("workers") == "8", f"{recipe}: the documented command is `run-job coco --workers 8`"
    assert any(t.gpus for t in types), f"{recipe}: no GPU node type"
    for mps in ("true", "false"):
        try:
            plan = plan_cluster(_job_cfg(cmd, f"ray.mps={mps}"), types)
        except ResourceError as e:
            pytest.fail(f"{recipe} cannot hold its documented job (ray.mps={mps}): {e}")
        assert plan.gpu
        gpu_types = {t.name: t for t in types if t.gpus}
        assert sum(gpu_types[n].gpus * k for n, k in plan.nodes.items() if n in gpu_types) >= 8


def test_a_recipe_on_the_16_gib_l4_could_not_hold_it():
    """The test above fails for a recipe whose L4 nodes are too small (the AWS recipe on g6.xlarge)."""
    conf = yaml.safe_load((DEPLOY / "ray-cluster-aws-l4.yaml").read_text())
    for t in conf["available_node_types"].values():
        if t["node_config"]["InstanceType"].startswith("g6."):
            t["node_config"]["InstanceType"] = "g6.xlarge"
    with pytest.raises(ResourceError):
        plan_cluster(_job_cfg(("coco", {"workers": "8"}, []), "ray.mps=false"), launcher_node_types(conf))


def test_the_node_shapes_table_says_what_the_plan_says():
    """docs/guide/presets.md "Node shapes": per preset, which L4 shape holds one set of actors (split and
    fused), as adjcap.engine.cluster_plan computes it."""
    text = (ROOT / "docs/guide/presets.md").read_text()
    rows = [r for r in text.split("## Node shapes", 1)[1].splitlines() if r.startswith("| `")]
    assert rows
    shapes = ("g6.xlarge", "g6.2xlarge", "g6.4xlarge")
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        cfg = load_config(cells[0].strip("`"), ["paths.data_dir=/nonexistent"]).resolved()
        b = pools.pool_budget(cfg, gpu=True)
        split = sum(actor_memory(b[p]["bytes"], p) for p in pools.pool_names())
        fused = actor_memory(b["fused"]["bytes"], "fused")
        assert cells[1] == f"{split / GiB:.1f} / {fused / GiB:.1f}", row
        gpu = sum(b[p]["bytes"] for p in pools.pool_names()), b["fused"]["bytes"]
        assert cells[2] == f"{gpu[0] / GiB:.1f} / {gpu[1] / GiB:.1f}", row
        assert max(gpu) <= L4_GPU_BYTES, row  # every preset listed fits one L4's memory
        for shape, cell in zip(shapes, cells[3:6]):
            mem = shape_type("x", shape).memory
            want = "both" if split <= mem else "fused" if fused <= mem else "no"
            assert cell.split()[0] == want, (row, shape)


def test_doctor_says_whether_mps_is_on(monkeypatch, tmp_path):
    import adjcap.machine.doctor as doctor

    cfg = load_config("demo", [f"paths.cache_dir={tmp_path}"]).resolved()
    monkeypatch.setattr(doctor, "mps_status", lambda: (False, "off: no NVIDIA driver tools on this machine (x)"))
    assert "\nmps         off: no NVIDIA driver tools on this machine (x)\n" in doctor.report(cfg)
    monkeypatch.setattr(doctor, "mps_status", lambda: (True, "on (control pipe /tmp/nvidia-mps/control)"))
    assert "\nmps         on (control pipe /tmp/nvidia-mps/control)\n" in doctor.report(cfg)


# --- the cluster's facts merged (adjcap.engine.cluster_plan) and the job's side, with Ray's answers given (jobs/ray_session.py) ------------------------------------

def test_nodes_up_are_counted_into_their_types():
    conf = yaml.safe_load((DEPLOY / "ray-cluster-aws-l4.yaml").read_text())
    types = launcher_node_types(conf)
    up = [("ray.head.default", {"CPU": 8.0}), ("", {"CPU": 8.0, "GPU": 1.0}), ("ray.worker.l4", {"CPU": 8.0, "GPU": 1.0})]
    merged = {t.name: t for t in merge_up(types, up, autoscaling=True)}
    assert merged["ray.worker.l4"].up == 2 and merged["ray.head.default"].up == 1  # by name, else by shape
    # no autoscaler, no types known: the nodes up are all there is
    static = merge_up([], [("", {"CPU": 16.0, "GPU": 2.0, "memory": 50 * GiB})] * 2, autoscaling=False)
    assert [(t.gpus, t.up, t.max_count) for t in static] == [(2.0, 2, 2)]
    assert merge_up([], [("", {"CPU": 16.0, "GPU": 2.0})], autoscaling=True)[0].max_count is None


def test_the_job_waits_on_one_line_and_ends_naming_what_never_came(monkeypatch, capsys):
    import ray.autoscaler.sdk

    from adjcap.jobs import ray_session

    asked = []
    monkeypatch.setattr(ray.autoscaler.sdk, "request_resources", lambda bundles=None, **kw: asked.append(bundles))
    monkeypatch.setattr(ray_session, "POLL_S", 0.0)
    head = NodeType("head", 8, 0, ray_memory(32 * GiB), 1, up=1)
    arriving = iter([0, 1, 2, 2])
    monkeypatch.setattr(ray_session, "cluster_facts",
                        lambda cfg: ((head, shape_type("l4", "g6.2xlarge", 8, up=next(arriving))), True))
    cfg = _headline("ray.workers=2", "ray.mps=false")
    plan = ray_session.check_pools(PoolPlan.of(cfg))
    assert set(plan) == {"fused"} and plan["fused"]["num_gpus"] == 1.0
    assert asked == [[{"CPU": 1.0, "GPU": 1.0}] * 2]
    out = capsys.readouterr().out
    assert out.splitlines() == ["waiting for 2 GPU workers: 0 up, 2 pending"]  # one line (not a terminal)
    ray_session.release_request()
    assert asked[-1] == []  # withdrawn: the autoscaler may remove the nodes
    never = iter([0] * 1000)
    monkeypatch.setattr(ray_session, "cluster_facts",
                        lambda cfg: ((head, shape_type("l4", "g6.2xlarge", 8, up=next(never))), True))
    with pytest.raises(ResourceError) as e:
        ray_session.check_pools(PoolPlan.of(_headline("ray.workers=2", "ray.mps=false", "ray.scale_wait_s=0")))
    assert str(e.value).startswith("waited 0 s (ray.scale_wait_s) for the nodes the plan asked for: 2 GPU workers: "
                                   "0 up, 2 pending; never came: 2 x l4")
    assert "\n" not in str(e.value)
    ray_session.release_request()
