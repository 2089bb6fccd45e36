"""The identity records whether TF32 was in effect (adjcap.models.precision.tf32_in_effect), on CUDA only:
a CPU run's identity is what it was; ROCm, where torch's switch does nothing, is told apart from CUDA."""

from __future__ import annotations

import torch

from adjcap.config import load_config
from adjcap.engine.identity import stage_identities, stage_settings
from adjcap.models.precision import tf32_in_effect

BASE = ["paths.cache_dir=/nonexistent/cache", "paths.data_dir=/nonexistent/data"]


def test_tf32_in_effect_by_device(monkeypatch):
    assert tf32_in_effect(True, "cpu") is None and tf32_in_effect(False, "cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a driver that sees no GPU
    monkeypatch.setattr(torch.version, "hip", None)
    assert tf32_in_effect(True, "cuda") is True and tf32_in_effect(False, "cuda:1") is False
    monkeypatch.setattr(torch.version, "hip", "6.2")
    assert tf32_in_effect(True, "cuda") is False  # ROCm: exact fp32 whatever the switch says


def test_identity_records_tf32_on_cuda_only(monkeypatch):
    cpu = load_config("gpu", [*BASE, "device=cpu"]).resolved()
    before = stage_identities(cpu, "fp")
    assert not any("tf32_in_effect" in d for d in stage_settings(cpu, "fp").values())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cuda = load_config("gpu", [*BASE, "device=cuda"]).resolved()
    monkeypatch.setattr(torch.version, "hip", None)
    nvidia = stage_identities(cuda, "fp")
    assert stage_settings(cuda, "fp")["retrieve"]["tf32_in_effect"] is True
    monkeypatch.setattr(torch.version, "hip", "6.2")
    amd = stage_identities(cuda, "fp")
    assert nvidia["retrieve"] != amd["retrieve"]  # the same config, other beams: other identities
    assert stage_identities(cpu, "fp") == before
