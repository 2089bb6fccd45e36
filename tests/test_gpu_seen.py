"""A pool actor that Ray gave a GPU torch cannot see (a CUDA torch on an AMD node, a driver too old for
the torch build, a container without the GPU) ends the job in one line naming the node and what torch
sees (adjcap.engine.gpu_errors.check_gpu_seen), instead of running every "GPU" pool on the CPU; Ray's logical
GPUs on a machine without any (the simulated clusters of the tests) still run on the CPU."""

import pickle
import socket

import pytest
import torch

from adjcap.engine import gpu_errors
from adjcap.engine.gpu_errors import GpuFailure, check_gpu_seen

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="torch sees a GPU on this machine")


@needs_no_gpu
def test_a_demanded_gpu_torch_cannot_see_is_the_jobs_end_in_one_line(tmp_path):
    with pytest.raises(GpuFailure) as got:
        check_gpu_seen([0], "cuda", "captioner", "10.1.2.3", dev=tmp_path)
    line = str(got.value)
    assert "\n" not in line and got.value.pool == "captioner"
    assert line.startswith(f"pool captioner on node {socket.gethostname()} (10.1.2.3): Ray gave it GPU 0 but ")
    assert f"torch {torch.__version__}" in line and "counts 0 GPUs" in line
    build = torch.version.cuda or getattr(torch.version, "hip", None)
    assert (build or "CPU-only") in line
    if build:  # torch's own reason for seeing none (no driver here, a driver too old, ...)
        assert "torch says " in line
    # it crosses Ray's process boundary with its line (GpuFailure.__reduce__), and the CLI finds it
    wrapped = RuntimeError("the actor died")
    wrapped.__cause__ = pickle.loads(pickle.dumps(got.value))
    assert str(gpu_errors.find(wrapped)) == line


@needs_no_gpu
@pytest.mark.parametrize("files", [["kfd"], ["nvidia0", "nvidiactl"]], ids=["amd", "nvidia"])
def test_a_gpu_on_the_node_that_torch_cannot_see_fails_with_device_auto(tmp_path, files):
    for f in files:
        (tmp_path / f).touch()
    with pytest.raises(GpuFailure, match=r"^pool verifier on node .*; the node has "
                                         + str(tmp_path / files[0]).replace("/", r"\/")):
        check_gpu_seen([0, 1], "auto", "verifier", dev=tmp_path)


def test_logical_gpus_without_a_gpu_and_pools_without_gpus_run_on(tmp_path):
    check_gpu_seen([0], "auto", "retriever", dev=tmp_path)  # a simulated cluster: no GPU device file here
    check_gpu_seen([], "cuda", "retriever", dev=tmp_path)  # Ray gave no GPU: nothing to check
    (tmp_path / "kfd").touch()
    check_gpu_seen([0], "cpu", "retriever", dev=tmp_path)  # the config asked for the CPU


@needs_no_gpu
@pytest.mark.slow
def test_a_pool_actor_given_a_gpu_it_cannot_see_fails_before_loading_models(demo_cfg):
    """The check runs in the pool actor's constructor on a Ray node with a (logical) GPU: the actor's
    creation fails and the GpuFailure's line is what the driver finds (adjcap.engine.gpu_errors.find)."""
    import ray
    from sim_cluster import simulated_cluster

    from adjcap.actors.pool import actor_class

    cfg = demo_cfg.model_copy(update={"device": "cuda"}).resolved()
    with simulated_cluster(1, gpus=1) as (c, _):
        ray.init(address=c.address)
        try:
            actor = ray.remote(num_gpus=0.25)(actor_class("CaptionerActor")).remote(cfg, ("caption",))
            with pytest.raises(Exception) as got:
                ray.get(actor.__ray_ready__.remote(), timeout=300)
        finally:
            ray.shutdown()
    found = gpu_errors.find(got.value)
    assert found is not None, repr(got.value)
    assert str(found).startswith("pool captioner on node ") and "Ray gave it GPU 0 but torch" in str(found)


def test_a_failure_ray_kept_only_as_a_traceback_is_found():
    """An actor whose constructor raised a GpuFailure dies with an ActorDiedError that holds the creation
    task's traceback as text, not the exception: the command line still prints the failure's line."""
    from ray.exceptions import ActorDiedError, RayTaskError

    line = "pool captioner on node gpu-7 (10.0.0.7): Ray gave it GPU 0 but torch 2.14.1 counts 0 GPUs"
    try:
        raise GpuFailure(line, pool="captioner")
    except GpuFailure as e:
        import traceback

        tb = "".join(traceback.format_exception(e))
    died = ActorDiedError(RayTaskError("CaptionerActor.__init__", tb, RuntimeError("x"), "ray::CaptionerActor",
                                       123, "10.0.0.7"))
    assert getattr(died, "cause", None) is None and str(gpu_errors.find(died)) == line
    outer = RuntimeError("ray data: an actor pool failed")
    outer.__cause__ = died
    assert str(gpu_errors.find(outer)) == line
    assert gpu_errors.find(RuntimeError("CUDA error: unspecified launch failure")) is None
