"""Saving / loading heads: round trip, atomic files, refusal of mismatched shapes and configs."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from adjcap.config import load_config
from adjcap.rerank import Heads, HeadsMismatchError, MemAttend, TriFuse, load_heads, save_heads


def _heads():
    torch.manual_seed(0)
    return Heads(
        trifuse=TriFuse(),
        memattend=MemAttend(),
        losses={"trifuse": [2.0, 1.5], "memattend": [2.1, 1.4, 1.3]},
        meta={"seed": 42, "n_images": 10},
    )


def test_round_trip(tmp_path):
    h = _heads()
    save_heads(tmp_path, h, {"fit_split": "val"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heads.json", "memattend.safetensors", "trifuse.safetensors"]
    info = json.loads((tmp_path / "heads.json").read_text())
    assert info["meta"]["fit_split"] == "val" and info["meta"]["seed"] == 42
    assert info["heads"]["trifuse"]["n_params"] == 113 and info["heads"]["memattend"]["n_params"] == 17377
    assert info["heads"]["memattend"]["losses"] == [2.1, 1.4, 1.3]
    g = load_heads(tmp_path, load_config("headline"))
    for name in ("trifuse", "memattend"):
        a, b = getattr(h, name).state_dict(), getattr(g, name).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert g.losses == h.losses and not g.trifuse.training


def test_refuses_mismatched_tensor_shape(tmp_path):
    save_heads(tmp_path, _heads())
    state = load_file(tmp_path / "trifuse.safetensors")
    state["net.2.weight"] = torch.zeros(8, 9)
    save_file(state, tmp_path / "trifuse.safetensors")
    with pytest.raises(HeadsMismatchError, match=r"net\.2\.weight.*\(8, 9\).*\(8, 8\)"):
        load_heads(tmp_path)


def test_refuses_missing_tensor_and_config_mismatch(tmp_path):
    save_heads(tmp_path, _heads())
    state = load_file(tmp_path / "memattend.safetensors")
    del state["head.bias"]
    save_file(state, tmp_path / "memattend.safetensors")
    with pytest.raises(HeadsMismatchError, match="head.bias"):
        load_heads(tmp_path)
    save_heads(tmp_path, _heads())
    cfg = load_config("headline", ["rerank.trifuse.hidden=16"])
    with pytest.raises(HeadsMismatchError, match="trifuse.hidden"):
        load_heads(tmp_path, cfg)
    with pytest.raises(FileNotFoundError, match="heads.json"):
        load_heads(tmp_path / "nowhere")


def test_only_one_head(tmp_path):
    save_heads(tmp_path, Heads(trifuse=TriFuse()))
    g = load_heads(tmp_path)
    assert g.memattend is None and g.trifuse is not None
    with pytest.raises(ValueError, match="no head"):
        save_heads(tmp_path / "x", Heads())
