"""Device/dtype choice and where models come from (adjcap.models.sources): tags, hub ids, snapshot
directories loaded by open_clip's local-dir loading, and the rules that pin preprocessing and activation
for bare checkpoint files."""

from __future__ import annotations

import pytest
import torch

from adjcap.models.precision import dtype_name, pick_device, pick_dtype
from adjcap.models.sources import ModelUnavailableError, clip_source, hf_offline, pinned_from_tags, tag_files


def test_pick_device_and_dtype():
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert pick_dtype("auto", "cpu") == torch.float32
    assert pick_dtype("bf16", "cpu") == torch.bfloat16 and pick_dtype("fp16", "cpu") == torch.float16
    assert dtype_name(torch.bfloat16) == "bf16"
    with pytest.raises(ValueError, match="precision"):
        pick_dtype("int8", "cpu")
    with pytest.raises(ValueError, match="device"):
        pick_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no GPU"):
            pick_device("cuda:1")
    else:
        assert pick_dtype("auto", "cuda") in (torch.bfloat16, torch.float16)


def test_offline_flag(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "")
    assert not hf_offline()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hf_offline()


def test_bare_files_take_what_all_tags_agree_on():
    # RN50x64 has one tag (openai): QuickGELU and OpenAI normalisation are pinned for a bare file
    pp, qg = pinned_from_tags("RN50x64")
    assert qg is True and pp["interpolation"] == "bicubic" and pp["mean"][0] == pytest.approx(0.48145466)
    # bigG's tags differ in activation (laion2b GELU, metaclip QuickGELU): nothing is assumed
    _, qg = pinned_from_tags("ViT-bigG-14")
    assert qg is None
    repo, files, _ = tag_files({"hf_hub": "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k/"})
    assert repo == "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k" and "open_clip_model.safetensors" in files


def test_resolving_tags_and_bare_files(monkeypatch, tmp_path):
    import json
    import warnings

    import open_clip

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "0")
    # the OpenAI ViT-B/32 weights need QuickGELU, which the plain ViT-B-32 config lacks
    src = clip_source("ViT-B-32", "openai")
    assert src.force_quick_gelu and src.model_id == "ViT-B-32/openai" and src.pretrained == "openai"
    assert src.model == "ViT-B-32" and src.checkpoint is None
    assert not clip_source("ViT-B-32-quickgelu", "openai").force_quick_gelu
    assert not clip_source("ViT-bigG-14", "laion2b_s39b_b160k").force_quick_gelu
    assert clip_source("ViT-B-32", None, seed=3).model_id == "ViT-B-32/random-seed3"
    # a bare RN50x64 file: activation and preprocessing pinned from its only tag
    bare = tmp_path / "RN50x64.pt"
    bare.write_bytes(b"not loaded here")
    src = clip_source("RN50x64", str(bare))
    assert src.force_quick_gelu and src.force_preprocess["mean"][0] == pytest.approx(0.48145466)
    assert src.model == "RN50x64" and src.pretrained == str(bare) and src.checkpoint == bare
    assert src.model_id.startswith("RN50x64/sha256:")
    # a bare bigG file: the tags disagree on the activation -> a warning that says what to do
    with pytest.warns(UserWarning, match="quickgelu"):
        src = clip_source("ViT-bigG-14", str(bare))
    assert not src.force_quick_gelu
    # ... unless it sits in a hub snapshot with open_clip_config.json: open_clip's local-dir loading
    snap = tmp_path / "snapshot"
    snap.mkdir()
    (snap / "open_clip_model.safetensors").write_bytes(b"x")
    (snap / "open_clip_pytorch_model.bin").write_bytes(b"y")
    model_cfg = open_clip.get_model_config("ViT-bigG-14")
    (snap / "open_clip_config.json").write_text(json.dumps({
        "model_cfg": model_cfg,
        "preprocess_cfg": {"mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "interpolation": "bilinear"},
    }))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for spec in (snap, snap / "open_clip_model.safetensors"):
            src = clip_source("ViT-bigG-14", str(spec))
            assert src.model == f"local-dir:{snap}" and src.pretrained is None
            assert src.checkpoint == snap / "open_clip_model.safetensors" and src.model_cfg == model_cfg
    # a file open_clip would not pick from that directory, or a partial config: told, not guessed
    with pytest.raises(ValueError, match="open_clip_model.safetensors"):
        clip_source("ViT-bigG-14", str(snap / "open_clip_pytorch_model.bin"))
    (snap / "open_clip_config.json").write_text(json.dumps({"model_cfg": {"embed_dim": 1280}}))
    with pytest.raises(ValueError, match="vision_cfg"):
        clip_source("ViT-bigG-14", str(snap))


def test_hub_snapshots_offline_and_unknown_names(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelUnavailableError, match="hf-hub:org/none.*huggingface-cli download org/none"):
        clip_source("ViT-B-32", "hf-hub:org/none", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match="unknown open_clip model 'ViT-B-33x'"):
        clip_source("ViT-B-33x", None)
