"""open_clip dual encoder: the real loader on the tiny adjcap-tiny-clip, trimmed text, towers, errors."""

from __future__ import annotations

import json

import open_clip
import pytest
import torch

from adjcap.demo.tiny_clip import TINY_CLIP, build_tiny_clip
from adjcap.demo.world import random_images
from adjcap.models.clip import load_dual_encoder, padded_token_fraction, text_batches
from adjcap.models.sources import ModelUnavailableError

TEXTS = [
    "a dog runs on the beach",
    "two cats!",  # '!' is token id 0, the same id as padding
    "",
    "a man riding a horse down a long dusty road on a hot summer day " * 6,  # > 77 tokens: truncated
    "A red bus.",
    "people",
    "a plate of food with broccoli , carrots and rice on a wooden table",
]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_clip(tmp_path_factory.mktemp("clip") / "retrieval-clip" / "open_clip_model.safetensors")


@pytest.fixture(scope="module")
def enc(tiny_path):
    return load_dual_encoder(TINY_CLIP, str(tiny_path), device="cpu", text_batch_size=3)


def test_trimmed_text_equals_padded(enc):
    assert enc.text_trim_exact
    tok = enc.tokenize(TEXTS)
    assert tok.lengths.tolist()[3] == 77 and tok.lengths.tolist()[2] == 2  # truncated; SOT+EOT only
    assert int(tok.lengths.max()) == 77 and int(tok.lengths[1]) < 10
    for normalize in (True, False):
        trimmed = enc.encode_texts(TEXTS, normalize=normalize)
        padded = enc.encode_texts(TEXTS, normalize=normalize, trim=False)
        assert trimmed.dtype == torch.float32 and trimmed.shape == (len(TEXTS), enc.embed_dim)
        torch.testing.assert_close(trimmed, padded, atol=1e-5, rtol=0)


def test_bucketing_keeps_input_order(enc):
    together = enc.encode_texts(TEXTS)
    one_by_one = torch.cat([enc.encode_texts([t]) for t in TEXTS])
    torch.testing.assert_close(together, one_by_one, atol=1e-5, rtol=0)
    assert enc.encode_texts([]).shape == (0, enc.embed_dim)


def test_token_budget_batches_keep_input_order_and_cut_padding(enc):
    lengths = enc.tokenize(TEXTS).lengths
    plain = text_batches(lengths, 3)
    budget = text_batches(lengths, 3, token_budget=24)
    for batches in (plain, budget):
        assert sorted(int(i) for b in batches for i in b) == list(range(len(TEXTS)))  # each text once
        flat = [int(lengths[i]) for b in batches for i in b]
        assert flat == sorted(flat)  # sorted by length
    assert all(len(b) * int(lengths[b].max()) <= 24 or len(b) == 1 for b in budget)
    assert all(len(b) <= 3 for b in budget)

    def fraction(batches):
        return padded_token_fraction([int(lengths.sum()), sum(len(b) * int(lengths[b].max()) for b in batches)])

    assert fraction(budget) < fraction(plain)
    want = enc.encode_texts(TEXTS)
    enc.text_token_budget, enc.text_token_counts[:] = 24, [0, 0]
    try:
        got = enc.encode_texts(TEXTS)
    finally:
        enc.text_token_budget = None
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)  # in the input order
    assert padded_token_fraction(enc.text_token_counts) == pytest.approx(fraction(budget))


def test_golden_against_open_clip_directly(enc, tiny_path):
    from safetensors.torch import load_file

    ref, _, preprocess = open_clip.create_model_and_transforms(TINY_CLIP, pretrained=None)
    ref.load_state_dict(load_file(str(tiny_path)))
    ref.eval()
    images = random_images(5, size=80, seed=1)
    pixels = torch.stack([preprocess(im) for im in images])
    torch.testing.assert_close(enc.preprocess(images), pixels)
    tokens = open_clip.get_tokenizer(TINY_CLIP)(TEXTS)
    with torch.no_grad():
        ref_img = ref.encode_image(pixels, normalize=True)
        ref_txt = ref.encode_text(tokens, normalize=True)
        ref_raw = ref.encode_text(tokens)
    torch.testing.assert_close(enc.encode_images(images), ref_img, atol=1e-5, rtol=0)
    torch.testing.assert_close(enc.encode_images(pixels), ref_img, atol=1e-5, rtol=0)
    torch.testing.assert_close(enc.encode_texts(TEXTS), ref_txt, atol=1e-5, rtol=0)
    # IFCap uses raw (unnormalised) text features
    raw = enc.encode_texts(TEXTS, normalize=False)
    torch.testing.assert_close(raw, ref_raw, atol=1e-5, rtol=0)
    assert not torch.allclose(raw.norm(dim=-1), torch.ones(len(TEXTS)))


def test_tiny_builder_is_deterministic_and_ids_track_weights(tmp_path, tiny_path, enc):
    again = build_tiny_clip(tmp_path / "a" / "open_clip_model.safetensors", seed=42)
    other = build_tiny_clip(tmp_path / "b" / "open_clip_model.safetensors", seed=7)
    assert again.read_bytes() == tiny_path.read_bytes()
    assert load_dual_encoder(TINY_CLIP, str(again), device="cpu").model_id == enc.model_id
    assert load_dual_encoder(TINY_CLIP, str(other), device="cpu").model_id != enc.model_id
    assert enc.model_id.startswith(f"{TINY_CLIP}/sha256:")
    assert "/" not in enc.slug
    side = json.loads((tiny_path.parent / "open_clip_config.json").read_text())
    assert side["preprocess_cfg"]["mean"][0] == pytest.approx(0.48145466)


def test_other_embed_dim_round_trips(tmp_path):
    path = build_tiny_clip(tmp_path / "e" / "open_clip_model.safetensors", embed_dim=48)
    e = load_dual_encoder(TINY_CLIP, str(path.parent), device="cpu")  # a directory works too
    assert e.embed_dim == 48
    assert e.encode_texts(["a cat"]).shape == (1, 48)
    assert e.encode_images(random_images(1)).shape == (1, 48)


def test_single_tower_loading_frees_the_other(tiny_path, enc):
    text_only = load_dual_encoder(TINY_CLIP, str(tiny_path), device="cpu", towers=("text",))
    image_only = load_dual_encoder(TINY_CLIP, str(tiny_path), device="cpu", towers=("image",))
    n_all = sum(p.numel() for p in enc.model.parameters())
    n_text = sum(p.numel() for p in text_only.model.parameters())
    n_img = sum(p.numel() for p in image_only.model.parameters())
    assert text_only.model.visual is None and n_text < n_all
    assert image_only.model.transformer is None and n_img < n_all - 49408 * 32
    torch.testing.assert_close(text_only.encode_texts(TEXTS), enc.encode_texts(TEXTS))
    ims = random_images(2, seed=3)
    torch.testing.assert_close(image_only.encode_images(ims), enc.encode_images(ims))
    with pytest.raises(RuntimeError, match="image tower was not loaded"):
        text_only.encode_images(ims)
    with pytest.raises(RuntimeError, match="text tower was not loaded"):
        image_only.encode_texts(["x"])


def test_bf16_on_cpu_when_asked(tiny_path, enc):
    e = load_dual_encoder(TINY_CLIP, str(tiny_path), device="cpu", precision="bf16")
    assert e.dtype == torch.bfloat16 and e.precision == "bf16"
    out = e.encode_texts(TEXTS[:3])
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, enc.encode_texts(TEXTS[:3]), atol=0.1, rtol=0)
    assert enc.dtype == torch.float32  # auto on CPU


def test_untrimmable_towers_fall_back_to_padding(tmp_path):
    base = open_clip.get_model_config(TINY_CLIP)
    bidir = json.loads(json.dumps(base))
    bidir["text_cfg"]["no_causal_mask"] = True  # bidirectional text: padding matters
    custom = json.loads(json.dumps(base))
    custom["custom_text"] = True  # text tower in model.text (TextTransformer)
    (tmp_path / "adjcap-test-bidir.json").write_text(json.dumps(bidir))
    (tmp_path / "adjcap-test-custom.json").write_text(json.dumps(custom))
    open_clip.add_model_config(tmp_path)
    b = load_dual_encoder("adjcap-test-bidir", None, device="cpu")
    assert not b.text_trim_exact and b.tokenize(["a cat"]).lengths.tolist() == [77]
    tokens = b.tokenizer(TEXTS)
    with torch.no_grad():
        ref = b.model.encode_text(tokens, normalize=True)
    torch.testing.assert_close(b.encode_texts(TEXTS), ref, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="not exact"):
        b.encode_texts(TEXTS, trim=True)
    c = load_dual_encoder("adjcap-test-custom", None, device="cpu", seed=1)
    assert c.text_trim_exact and c.model.text is not None
    torch.testing.assert_close(c.encode_texts(TEXTS), c.encode_texts(TEXTS, trim=False), atol=1e-5, rtol=0)
    assert c.model_id == "adjcap-test-custom/random-seed1"


def test_offline_uncached_tag_fails_clearly(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelUnavailableError) as info:
        load_dual_encoder("ViT-bigG-14", "laion2b_s39b_b160k", device="cpu", cache_dir=str(tmp_path))
    msg = str(info.value)
    assert "ViT-bigG-14" in msg and "laion2b_s39b_b160k" in msg
    assert "laion/CLIP-ViT-bigG-14-laion2B-39B-b160k" in msg and "pretrained" in msg


def test_bad_names_and_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_dual_encoder("ViT-B-32", str(tmp_path / "missing.safetensors"), device="cpu")
    with pytest.raises(ValueError, match="pretrained tag"):
        load_dual_encoder("ViT-B-32", "no-such-tag", device="cpu")
    with pytest.raises(ValueError, match="unknown open_clip model"):
        load_dual_encoder("ViT-B-33x", None, device="cpu")
    with pytest.raises(ValueError, match="towers"):
        load_dual_encoder(TINY_CLIP, None, device="cpu", towers=("audio",))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_dual_encoder(TINY_CLIP, str(empty), device="cpu")
    wrong = build_tiny_clip(tmp_path / "w" / "open_clip_model.safetensors", embed_dim=40)
    (wrong.parent / "open_clip_config.json").unlink()  # bare file of another shape
    with pytest.raises(RuntimeError, match="could not load checkpoint"):
        load_dual_encoder(TINY_CLIP, str(wrong), device="cpu")


def test_snapshot_config_decides_preprocessing_and_architecture(tmp_path, tiny_path, enc):
    import shutil

    snap = tmp_path / "snap"
    snap.mkdir()
    shutil.copy(tiny_path, snap / "open_clip_model.safetensors")
    side = json.loads((tiny_path.parent / "open_clip_config.json").read_text())
    side["preprocess_cfg"].update(mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25], interpolation="bilinear")
    (snap / "open_clip_config.json").write_text(json.dumps(side))
    e = load_dual_encoder("any-name", str(snap), device="cpu")  # the architecture comes from the config
    assert e.model_id.split("/")[1] == enc.model_id.split("/")[1]
    assert list(e.preprocess_cfg["mean"]) == [0.5] * 3 and e.preprocess_cfg["interpolation"] == "bilinear"
    torch.testing.assert_close(e.encode_texts(TEXTS), enc.encode_texts(TEXTS))
    im = random_images(1, seed=4)
    assert not torch.allclose(e.preprocess(im), enc.preprocess(im))
    torch.testing.assert_close(e.encode_images(e.preprocess(im)), enc.encode_images(e.preprocess(im)))
