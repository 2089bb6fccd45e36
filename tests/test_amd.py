"""AMD GPUs: torch's ROCm build presents them as `cuda` and Ray counts them as `GPU`, so adjcap takes its
GPU paths unchanged. Checked by faking what an AMD node shows: the ROCm torch build's attributes,
Ray's cluster resources with an AMD accelerator type, ROCR_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES."""

from types import SimpleNamespace

import pytest
import torch

from adjcap.machine.accelerators import HIP, ROCR, Gpu, rocm_visible_env, visible_gpus
from adjcap.config import load_config
from adjcap.machine.doctor import budget_lines, report
from adjcap.engine.cluster_plan import PoolPlan
from adjcap.engine.pools import pool_budget, pool_names
from adjcap.models.precision import pick_device, pick_dtype

GiB = 2**30


@pytest.fixture
def rocm_torch(monkeypatch):
    """torch as its ROCm build shows itself on a node with two MI355X: hip set, cuda available."""
    monkeypatch.setattr(torch.version, "hip", "6.3.42131", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "AMD Instinct MI355X")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i=0: SimpleNamespace(total_memory=288 * GiB))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


def test_rocr_only_nodes_get_the_same_devices_as_hip_indices():
    assert rocm_visible_env({ROCR: "2,3"}) == {HIP: "0,1"}  # HIP indexes within what ROCR exposes
    assert rocm_visible_env({ROCR: "5"}) == {HIP: "0"}
    assert rocm_visible_env({ROCR: "2,3", HIP: "1"}) == {}  # the user chose already
    assert rocm_visible_env({}) == {}


def test_ray_refuses_rocr_only_and_accepts_the_added_hip_variable(monkeypatch):
    from ray._private.accelerators.amd_gpu import AMDGPUAcceleratorManager as AMD

    monkeypatch.delenv(HIP, raising=False)
    monkeypatch.setenv(ROCR, "2,3")
    with pytest.raises(RuntimeError, match=HIP):
        AMD.get_current_process_visible_accelerator_ids()
    for k, v in rocm_visible_env().items():
        monkeypatch.setenv(k, v)
    assert AMD.get_resource_name() == "GPU"  # AMD GPUs are Ray's plain GPU resource
    assert AMD.get_current_process_visible_accelerator_ids() == ["0", "1"]
    AMD.set_current_process_visible_accelerator_ids(["1"])  # what Ray does for an actor's GPU share
    import os

    assert os.environ[HIP] == "1"


def test_pools_take_gpu_shares_on_an_amd_cluster(monkeypatch):
    import adjcap.jobs.ray_session as rs

    resources = {"CPU": 64.0, "GPU": 8.0, "accelerator_type:AMD-Instinct-MI355X-OAM": 1.0, "memory": 1e12}
    monkeypatch.setattr(rs.ray, "cluster_resources", lambda: dict(resources))
    cfg = load_config("headline")
    for pool in pool_names():
        r = rs.pool_resources(PoolPlan.of(cfg), pool)
        assert r["num_gpus"] == cfg.ray.gpu_share and r["num_cpus"] == 1.0
    resources.pop("GPU")  # the same cluster without GPUs: CPU shares, no GPU request
    assert "num_gpus" not in rs.pool_resources(PoolPlan.of(cfg), "retriever")


def test_models_load_on_the_cuda_device_rocm_presents(rocm_torch):
    assert pick_device("auto") == torch.device("cuda")
    assert pick_device("cuda") == torch.device("cuda")
    assert pick_dtype("auto", "cuda") == torch.bfloat16
    assert visible_gpus() == [Gpu("AMD Instinct MI355X", 288 * GiB)] * 2


def test_doctor_names_rocm_and_the_budget_on_amd_gpus(rocm_torch, monkeypatch, tmp_path):
    monkeypatch.setenv(ROCR, "0,1")
    monkeypatch.delenv(HIP, raising=False)
    cfg = load_config("headline", [f"paths.cache_dir={tmp_path}", f"paths.data_dir={tmp_path}"])
    text = report(cfg.resolved())
    assert "accelerator ROCm 6.3.42131, 2 x AMD Instinct MI355X" in text
    assert f"{ROCR} is set without {HIP}" in text and f"{HIP}=0,1" in text
    assert "per GPU (2 x AMD Instinct MI355X, 288.00 GiB): fits" in text


def test_budget_counts_the_towers_each_pool_holds_and_says_when_a_gpu_is_too_small():
    cfg = load_config("headline", ["precision=auto"]).resolved()
    gpu = pool_budget(cfg, gpu=True)  # auto precision: half on a GPU (IFCap stays fp32, spec 1.5)
    assert gpu["retriever"] == {"params": 1_844_907_264, "bytes": 2 * 1_844_907_264}  # bigG image tower only
    assert gpu["scorer"]["params"] == 694_659_841 + 446_128_642  # bigG text tower + BLIP ITM large
    cpu = pool_budget(cfg, gpu=False)
    assert cpu["retriever"]["bytes"] == 2 * gpu["retriever"]["bytes"]
    total = sum(gpu[p]["bytes"] for p in ("retriever", "verifier", "captioner", "scorer"))
    assert any("fits" in line for line in budget_lines(cfg, [Gpu("NVIDIA L4", 24 * GiB)]))
    small = budget_lines(cfg, [Gpu("small", total - GiB)])
    assert any("does NOT fit (1.00 GiB short)" in line for line in small)
