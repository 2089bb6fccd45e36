"""BLIP ITM verifier on a tiny BlipForImageTextRetrieval saved and loaded through the real loader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from adjcap.demo.tiny_blip import build_tiny_blip
from adjcap.demo.world import random_images
from adjcap.models.blip import ImageMemo, lavis_pre_caption, load_verifier
from adjcap.models.sources import ModelUnavailableError

FIXTURES = Path(__file__).parent / "fixtures" / "data"


def _captions() -> list[str]:
    data = json.loads((FIXTURES / "coco_test_captions.json").read_text())
    return [c for caps in data.values() for c in caps]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_blip(tmp_path_factory.mktemp("tiny") / "blip-itm", _captions())


@pytest.fixture(scope="module")
def verifier(tiny_dir):
    # small batches so that images and caption buckets span several calls
    return load_verifier(str(tiny_dir), device="cpu", image_batch_size=2, pair_batch_size=5)


@pytest.fixture(scope="module")
def images():
    real = [Image.open(p).convert("RGB") for p in sorted((FIXTURES / "images").glob("*.jpg"))]
    return real + random_images(3, size=48, seed=5)


def test_memo_reuse_equals_per_pair_forward(verifier, images):
    caps = _captions()
    long_caption = " ".join(caps[:8])  # far over 35 tokens
    texts_per_image = [
        caps[0:9],  # the 9 retrieved
        [long_caption, caps[12]],
        [],  # an image with nothing to score
        caps[20:40],  # 20 beam candidates
        [caps[3], long_caption, "A DOG!!  on   a (red) sofa."],
    ]
    memo = verifier.encode_images(images)
    assert len(memo) == 5 and len(memo.cross_kv) == verifier.model.config.text_config.num_hidden_layers
    fast = verifier.score(memo, texts_per_image)
    assert [len(a) for a in fast] == [len(t) for t in texts_per_image]
    pair_images = [images[i] for i, texts in enumerate(texts_per_image) for _ in texts]
    pair_texts = [t for texts in texts_per_image for t in texts]
    ref = verifier.score_pairs(pair_images, pair_texts, batch_size=6)
    got = np.concatenate(fast)
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    assert np.all((got > 0) & (got < 1))
    # the test can fail: the same caption scores differently on different images
    same = verifier.score(memo, [[caps[3]]] * 5)
    assert np.ptp(np.concatenate(same)) > 1e-2
    # a memo rebuilt from stored ViT outputs (another pool) scores the same
    again = verifier.memo_from_image_embeds(memo.image_embeds.cpu())
    np.testing.assert_allclose(np.concatenate(verifier.score(again, texts_per_image)), got, atol=1e-6)
    # a memo of a subset still lines up with its images
    sub = verifier.score(memo.select([4, 0]), [texts_per_image[4], texts_per_image[0]])
    np.testing.assert_allclose(sub[0], fast[4], atol=1e-6)
    np.testing.assert_allclose(sub[1], fast[0], atol=1e-6)


def test_text_is_cut_at_35_tokens_with_enc_first(verifier):
    caps = _captions()
    long_caption = " ".join(caps[:8])
    ids = verifier.tokenize([long_caption, caps[0]])
    assert len(ids[0]) == 35 and len(ids[1]) < 35
    enc = verifier.tokenizer.convert_tokens_to_ids("[ENC]")
    assert ids[0][0] == enc == verifier.first_token_id
    assert ids[0][-1] == verifier.tokenizer.sep_token_id
    # text past the 35th token does not change the score
    memo = verifier.encode_images(random_images(1, seed=9))
    extra = long_caption + " and " + " ".join(caps[30:35])
    a, b = verifier.score(memo, [[long_caption, extra]])[0]
    assert a == pytest.approx(b, abs=1e-6)


def test_first_token_choice_matters(tiny_dir, verifier, images):
    cls = load_verifier(str(tiny_dir), device="cpu", first_token="cls")
    assert cls.first_token_id == cls.tokenizer.cls_token_id != verifier.first_token_id
    texts = [_captions()[:4]]
    s_enc = verifier.score(verifier.encode_images(images[:1]), texts)[0]
    s_cls = cls.score(cls.encode_images(images[:1]), texts)[0]
    assert np.abs(s_enc - s_cls).max() > 1e-4
    np.testing.assert_allclose(s_cls, cls.score_pairs(images[:1] * 4, texts[0]), atol=1e-5)


def test_lavis_caption_cleaning():
    assert lavis_pre_caption("A Dog!!  on   a (red) sofa.\n") == "a dog on a red sofa"
    assert lavis_pre_caption(" ".join(["w"] * 60)).count("w") == 50


def test_tiny_builder_is_deterministic_and_loads_like_a_hub_id(tmp_path, tiny_dir, verifier):
    again = build_tiny_blip(tmp_path / "again", _captions())
    v2 = load_verifier(str(again), device="cpu")
    assert v2.model_id.split("/")[1] == verifier.model_id.split("/")[1]
    assert v2.tokenizer.get_vocab() == verifier.tokenizer.get_vocab()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"):
        assert (tiny_dir / name).is_file()
    cfg = verifier.model.config
    assert cfg.text_config.vocab_size == len(verifier.tokenizer)
    assert cfg.text_config.bos_token_id == verifier.tokenizer.convert_tokens_to_ids("[DEC]")
    assert verifier.preprocess(random_images(1, size=100)).shape == (1, 3, 32, 32)
    assert verifier.dtype == torch.float32


def test_load_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError) as info:
        load_verifier("Salesforce/blip-itm-large-coco", device="cpu", cache_dir=str(tmp_path))
    assert "Salesforce/blip-itm-large-coco" in str(info.value) and "verifier.model" in str(info.value)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_verifier(str(tmp_path / "no" / "such" / "dir"), device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_verifier(str(tmp_path / "empty"), device="cpu")


def test_score_checks_counts(verifier):
    memo = verifier.encode_images(random_images(2, seed=1))
    with pytest.raises(ValueError, match="2 encoded images"):
        verifier.score(memo, [["a"]])
    assert isinstance(ImageMemo.concat([memo, memo]), ImageMemo)


def test_sdpa_vision_attention_equals_eager_and_the_token_budget_keeps_scores(tiny_dir, verifier, images):
    """verifier.attention=sdpa (adjcap.models.blip_sdpa): the vision tower's outputs within 1e-5 of
    transformers' eager attention; verifier.text_token_budget: more, shorter ITM chunks, the same
    scores (1e-5) in the same order, and fewer padded tokens."""
    from adjcap.models.blip_sdpa import SdpaBlipAttention

    sdpa = load_verifier(str(tiny_dir), device="cpu", image_batch_size=2, attention="sdpa", text_token_budget=400)
    layers = sdpa.model.vision_model.encoder.layers
    assert all(isinstance(layer.self_attn, SdpaBlipAttention) for layer in layers)
    assert sdpa.model.state_dict().keys() == verifier.model.state_dict().keys()  # same parameters, same names
    eager, fused = verifier.encode_images(images), sdpa.encode_images(images)
    diff = (eager.image_embeds - fused.image_embeds).abs().max().item()
    assert 0 <= diff <= 1e-5 and eager.image_embeds.abs().max().item() > 0.1
    caps = _captions()
    texts = [caps[0:9], caps[9:11], caps[11:31], caps[31:32], caps[32:40]]
    verifier.text_token_counts[:] = [0, 0]
    verifier.pair_batch_size = 256  # one chunk of 5 x 20 rows, as loaded by default
    try:
        plain = verifier.score(eager, texts)
    finally:
        verifier.pair_batch_size = 5
    budget = sdpa.score(fused, texts)
    for a, b in zip(plain, budget):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
    pad = lambda c: 1 - c[0] / c[1]  # noqa: E731
    assert sdpa.text_token_counts[0] == verifier.text_token_counts[0]  # the same real tokens
    assert pad(sdpa.text_token_counts) < pad(verifier.text_token_counts)
