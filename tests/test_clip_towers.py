"""Loading only the towers a pool needs, tensor by tensor (adjcap.models.clip's lean path): the same
weights and embeddings as open_clip's own loading of the whole model, the other tower never allocated,
and open_clip's loading kept for files the lean path cannot read as they are."""

import pytest
import torch
from safetensors.torch import save_file

from adjcap.demo.tiny_clip import build_tiny_clip
from adjcap.models import clip as clip_mod
from adjcap.models.clip import load_dual_encoder
from adjcap.models.sources import clip_source


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_clip(tmp_path_factory.mktemp("clip") / "m" / "open_clip_model.safetensors")


def test_bare_file_loads_lean_and_equals_whole_model_loading(tiny, tmp_path, monkeypatch):
    from PIL import Image

    bare = tmp_path / "bare.safetensors"  # no open_clip_config.json beside it: the lean path applies
    bare.write_bytes(tiny.read_bytes())
    model = "adjcap-tiny-clip"
    src = clip_source(model, str(bare))
    assert clip_mod._build_towers(src, {"image"}, torch.float32, torch.device("cpu")) is not None
    lean = load_dual_encoder(model, str(bare), device="cpu")
    monkeypatch.setattr(clip_mod, "_build_towers", lambda *a, **k: None)
    whole = load_dual_encoder(model, str(bare), device="cpu")
    a, b = lean.model.state_dict(), whole.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(lean.model.attn_mask, whole.model.attn_mask)
    assert lean.preprocess_cfg == whole.preprocess_cfg
    texts = ["a dog on a beach", "two people riding bikes down a busy street at night"]
    torch.testing.assert_close(lean.encode_texts(texts), whole.encode_texts(texts))
    img = [Image.new("RGB", (40, 30), (200, 30, 90))]
    torch.testing.assert_close(lean.encode_images(img), whole.encode_images(img))


def test_one_tower_only_is_allocated_in_the_asked_dtype(tiny, tmp_path):
    bare = tmp_path / "bare.safetensors"
    bare.write_bytes(tiny.read_bytes())
    enc = load_dual_encoder("adjcap-tiny-clip", str(bare), device="cpu", precision="bf16", towers=("text",))
    assert enc.model.visual is None
    assert {p.dtype for p in enc.model.parameters()} == {torch.bfloat16}
    assert not any(p.is_meta for p in enc.model.parameters())


def test_files_it_cannot_read_as_they_are_go_through_open_clip(tiny, tmp_path):
    from safetensors.torch import load_file

    sd = load_file(tiny)
    wrapped = tmp_path / "wrapped.safetensors"
    save_file({"module." + k: v for k, v in sd.items()}, wrapped)  # a DDP prefix: open_clip strips it
    src = clip_source("adjcap-tiny-clip", str(wrapped))
    assert clip_mod._build_towers(src, {"image", "text"}, torch.float32, torch.device("cpu")) is None
    enc = load_dual_encoder("adjcap-tiny-clip", str(wrapped), device="cpu")
    assert torch.equal(enc.model.state_dict()["logit_scale"], sd["logit_scale"])
    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in sd.items() if not k.startswith("visual.")}, missing)
    assert clip_mod._build_towers(clip_source("adjcap-tiny-clip", str(missing)), {"image"}, torch.float32,
                                  torch.device("cpu")) is None


def test_a_cached_pretrained_tag_loads_lean_with_the_tags_preprocessing(tiny, tmp_path, monkeypatch):
    """A tag whose file is in the local Hugging Face cache is read like a bare file (the kept towers
    only), with the tag's preprocessing and QuickGELU, and equals open_clip's own loading of the tag."""
    import open_clip
    import open_clip.pretrained as ocp
    from PIL import Image

    repo, commit = "adjcap-test/tiny-clip-tag", "0" * 40
    snap = tmp_path / "hub" / f"models--{repo.replace('/', '--')}"
    (snap / "snapshots" / commit).mkdir(parents=True)
    (snap / "refs").mkdir()
    (snap / "refs" / "main").write_text(commit)
    (snap / "snapshots" / commit / "open_clip_model.safetensors").write_bytes(tiny.read_bytes())
    tag = ocp._pcfg(hf_hub=f"{repo}/", quick_gelu=True, mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25),
                    interpolation="bilinear", resize_mode="squash")
    monkeypatch.setitem(ocp._PRETRAINED, "adjcap-tiny-clip", {"tagged": tag})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model, cache = "adjcap-tiny-clip", str(tmp_path / "hub")

    src = clip_source(model, "tagged", cache_dir=cache)
    assert src.model_id == "adjcap-tiny-clip/tagged" and src.pretrained == "tagged"  # identity: the tag
    assert src.checkpoint is not None and src.checkpoint.name == "open_clip_model.safetensors"
    assert src.force_quick_gelu
    assert clip_mod._build_towers(src, {"image"}, torch.float32, torch.device("cpu")) is not None
    lean = load_dual_encoder(model, "tagged", device="cpu", cache_dir=cache)
    monkeypatch.setattr(clip_mod, "_build_towers", lambda *a, **k: None)
    whole = load_dual_encoder(model, "tagged", device="cpu", cache_dir=cache)  # open_clip reads the tag
    assert lean.preprocess_cfg == whole.preprocess_cfg
    quick = [any(isinstance(m, open_clip.transformer.QuickGELU) for m in e.model.modules()) for e in (lean, whole)]
    assert quick == [True, True]  # the tag's activation (the tiny config's own is GELU)
    assert lean.preprocess_cfg["interpolation"] == "bilinear" and tuple(lean.preprocess_cfg["mean"]) == (0.5, 0.5, 0.5)
    a, b = lean.model.state_dict(), whole.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    texts = ["a dog on a beach", "two people riding bikes down a busy street at night"]
    torch.testing.assert_close(lean.encode_texts(texts), whole.encode_texts(texts))
    img = [Image.new("RGB", (40, 30), (200, 30, 90))]
    torch.testing.assert_close(lean.encode_images(img), whole.encode_images(img))
