"""Training of the tiny world: deterministic, and the trained models do their jobs on held-out scenes."""

from __future__ import annotations

from pathlib import Path

import json
import random
import re

import numpy as np
import pytest
import torch

from adjcap.demo.train_settings import TinyTrainSettings
from adjcap.demo.train_base import HELDOUT_POOL, deterministic, render_pool
from adjcap.demo.train_blip import swap_negative
from adjcap.demo.train_ifcap import caption_entities, training_entities
from adjcap.demo.tiny import build_tiny_world
from adjcap.demo.world import COLOURS, OBJECTS, build_demo_world, demo_corpus_texts, demo_lexicon, iter_training_pairs
from adjcap.models.entities import lexicon_tagger

SMALL = TinyTrainSettings().scaled(0.02, pool_images=48)


def _state(path):
    from safetensors.torch import load_file

    if path.suffix == ".safetensors":
        return load_file(str(path))
    return torch.load(path, weights_only=True, map_location="cpu")


def _files(root):
    skip = {"TRAINING.json", "READY.json"}  # timings; absolute paths
    return {p.relative_to(root).as_posix(): p for p in sorted(root.rglob("*")) if p.is_file() and p.name not in skip}


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo-small") / "demo"
    build_demo_world(root, n_test=2, n_val=2, n_corpus_images=20)
    return demo_corpus_texts(root)


@pytest.fixture(scope="module")
def seven(tmp_path_factory, small_corpus):
    """(cache dir, files) of one small build, seed 7, in this process; read by the tests below."""
    root = tmp_path_factory.mktemp("tiny-seven")
    return root, build_tiny_world(root, small_corpus, seed=7, settings=SMALL, workers=1)


@pytest.mark.training  # two more builds, one across two processes: make test runs it, make test-fast does not
def test_two_builds_with_one_seed_are_identical(tmp_path, small_corpus, seven):
    """The same files whether the BLIP judge trains in this process or in a second one (``workers``)."""
    root_a, a = seven
    b = build_tiny_world(tmp_path / "b", small_corpus, seed=7, settings=SMALL, workers=2)
    fa, fb = _files(root_a / "tiny"), _files(tmp_path / "b" / "tiny")
    assert fa.keys() == fb.keys()
    for rel in fa:
        if rel.endswith((".safetensors", ".pt")):
            sa, sb = _state(fa[rel]), _state(fb[rel])
            assert sa.keys() == sb.keys(), rel
            for k in sa:
                assert torch.equal(sa[k], sb[k]), f"{rel}: {k}"
        else:
            assert fa[rel].read_bytes() == fb[rel].read_bytes(), rel
    log = json.loads((root_a / "tiny" / "TRAINING.json").read_text())
    assert log["captioner_clip"]["steps"] == SMALL.clip_steps and log["ifcap"]["steps"] == SMALL.ifcap_steps
    assert log["blip"]["steps"] == SMALL.blip_steps and log["retrieval_clip"]["steps"] == SMALL.retrieval_clip_steps
    assert log["workers"] == 1 and json.loads((tmp_path / "b" / "tiny" / "TRAINING.json").read_text())["workers"] == 2
    # trained, not the builders' random weights: another seed gives other weights
    c = build_tiny_world(tmp_path / "c", small_corpus, seed=8, settings=SMALL)
    assert not torch.equal(_state(a["ifcap"])["gpt.transformer.wte.weight"], _state(c["ifcap"])["gpt.transformer.wte.weight"])
    # the real loaders read the trained files
    from adjcap.models.blip import load_verifier
    from adjcap.models.clip import load_dual_encoder
    from adjcap.models.ifcap import load_ifcap

    load_dual_encoder("adjcap-tiny-clip-large", str(a["retrieval_clip"]), device="cpu")
    load_verifier(str(a["blip"]), device="cpu")
    cap = load_ifcap(a["ifcap"], lm_config=a["ifcap"].parent, tokenizer=a["tokenizer"], device="cpu", mapping_heads=2)
    assert cap.dims.clip_dim == 32


def test_settings_are_part_of_the_cache_key(world, demo_cfg):
    """On the session's demo world (the demo's settings and seed): ready for those only."""
    from adjcap.demo.tiny import tiny_world_ready

    root, corpus, seed = world["root"], world["corpus"], demo_cfg.seed
    assert tiny_world_ready(root, corpus, seed) and tiny_world_ready(root, corpus, seed, TinyTrainSettings())
    assert not tiny_world_ready(root, corpus, seed, TinyTrainSettings().scaled(2.0))
    assert not tiny_world_ready(root, corpus, seed, SMALL)
    assert not tiny_world_ready(root, corpus, seed + 1)
    assert not tiny_world_ready(root, corpus[:-1], seed)  # another corpus


def test_deterministic_context_restores_the_global_state():
    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    before = torch.random.get_rng_state()
    with deterministic(3, threads=1):
        assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
        x = torch.rand(3)
    with deterministic(3, threads=1):
        assert torch.equal(x, torch.rand(3))
    assert torch.get_num_threads() == threads and torch.are_deterministic_algorithms_enabled() == det
    assert torch.equal(torch.random.get_rng_state(), before)


def test_training_pool_is_deterministic_and_separate():
    a = list(iter_training_pairs(5, 3))
    b = list(iter_training_pairs(5, 3))
    other = list(iter_training_pairs(5, 3, pool=HELDOUT_POOL))
    assert [p.captions for p in a] == [p.captions for p in b]
    assert all(np.array_equal(np.asarray(p.image), np.asarray(q.image)) for p, q in zip(a, b))
    assert [p.captions for p in a] != [p.captions for p in other]
    assert all(len(p.captions) == 5 and p.scene["objects"] for p in a)
    with pytest.raises(ValueError, match="benchmark split"):
        next(iter_training_pairs(5, 1, pool="test"))


def test_training_entities_follow_ifcap():
    tag, lem = lexicon_tagger(demo_lexicon())
    cap = "A picture of two red balls and a stop sign on the grass next to a ball."
    assert caption_entities(cap, tag, lem) == ["ball", "stop", "sign", "grass"]  # no 'picture'
    assert training_entities(cap, tag, lem, random.Random(0), drop=1.0) == []
    kept = training_entities(cap, tag, lem, random.Random(0), drop=0.0)
    assert sorted(kept) == sorted(["ball", "stop", "sign", "grass"])
    rng = random.Random(1)
    counts = sum(len(training_entities(cap, tag, lem, rng)) for _ in range(2000)) / 2000
    assert 2.0 < counts < 2.8  # 4 entities kept with p = 0.6 each


def test_swapped_negative_contradicts_the_scene():
    rng = random.Random(0)
    scene = {"background": "grass", "objects": [{"type": "ball", "colour": "red"}, {"type": "kite", "colour": "blue"}]}
    for _ in range(50):
        neg = swap_negative("A red ball and a blue kite on the grass.", scene, rng)
        words = re.findall(r"[a-z]+", neg.lower())
        changed = [w for w in words if w not in {"a", "red", "ball", "and", "blue", "kite", "on", "the", "grass"}]
        assert len(changed) == 1 and (changed[0] in COLOURS or changed[0] in OBJECTS), neg
    assert swap_negative("Two colorful things in a field.", scene, rng) is None


def test_count_and_insert_negatives_contradict_the_scene():
    from adjcap.demo.negatives import count_negative, insert_negative
    from adjcap.demo.quality import caption_errors

    rng = random.Random(0)
    scene = {"background": "grass", "objects": [{"type": "ball", "colour": "red"}, {"type": "ball", "colour": "red"},
                                                {"type": "kite", "colour": "blue"}]}
    caps = ["Two red balls and a blue kite on the grass.", "Three different objects on the grass."]
    assert all(not caption_errors(c, scene) for c in caps)  # the true captions
    for _ in range(30):
        neg = count_negative(caps, scene, rng)
        assert [e.split(":")[0] for e in caption_errors(neg, scene)] == ["count"], neg
        ins = insert_negative(caps[0], scene, rng)
        assert ins.startswith(caps[0][:-1] + " next to ") and ins.endswith(".")
        assert any(e.startswith("object:") for e in caption_errors(ins, scene)), ins
    assert count_negative(["A red ball on the grass."], scene, rng) is None


def test_caption_errors_read_colours_objects_and_counts():
    from adjcap.demo.quality import caption_errors

    scene = {"objects": [{"type": "stop sign", "colour": "red"}, {"type": "box", "colour": "blue"}]}
    assert caption_errors("A red stop sign next to a blue box on a green lawn.", scene) == []
    assert caption_errors("A yellow stop sign.", scene) == ["colour:yellow"]
    assert caption_errors("A blue box next to a white clock.", scene) == ["colour:white", "object:clock"]
    assert caption_errors("Two blue boxes.", scene) == ["count:two boxes"]
    assert caption_errors("Three things against a white wall.", scene) == ["count:three things"]


# ---- the demo world's trained models (built once per session by the demo_cfg fixture) ----------------


@pytest.fixture(scope="module")
def world(demo_cfg):
    root = Path(demo_cfg.resolved().paths.cache_dir) / "tiny"
    return {
        "root": root,
        "log": json.loads((root / "TRAINING.json").read_text()),
        "held": render_pool(demo_cfg.seed, 200, HELDOUT_POOL),
        "corpus": demo_corpus_texts(Path(demo_cfg.resolved().paths.cache_dir) / "demo"),
    }


def test_every_training_lowered_its_loss(world):
    for name in ("captioner_clip", "retrieval_clip", "blip", "ifcap"):
        entry = world["log"][name]
        assert entry["steps"] > 0 and entry["loss_last"] < 0.9 * entry["loss_first"], (name, entry)


def test_trained_clip_retrieves_held_out_pairs(world):
    from adjcap.models.clip import load_dual_encoder

    held = world["held"]
    enc = load_dual_encoder("adjcap-tiny-clip-large", str(world["root"] / "retrieval-clip"), device="cpu")
    sim = enc.encode_images(held.images) @ enc.encode_texts([c[0] for c in held.captions]).T
    n = len(held)
    recall5 = (sim.topk(5, dim=1).indices == torch.arange(n)[:, None]).any(1).float().mean().item()
    assert recall5 > 0.15, recall5  # chance: 5 / 200
    assert sim.diag().mean() > sim.mean() + 0.2


def test_trained_verifier_prefers_the_matching_caption(world):
    from adjcap.models.blip import load_verifier

    held = world["held"]
    ver = load_verifier(str(world["root"] / "blip-itm"), device="cpu")
    n = len(held)
    pairs = [[held.captions[i][0], held.captions[(i + 7) % n][0]] for i in range(n)]
    probs = np.stack(ver.score(ver.encode_images(held.images), pairs))
    assert (probs[:, 0] > probs[:, 1]).mean() > 0.7
    assert ((probs > 0) & (probs < 1)).all()


BACKGROUND_WORDS = {"grass": {"grass", "grassy", "lawn", "park", "field"}, "beach": {"beach", "sand", "sandy", "sea"},
                    "street": {"street", "road", "city"}, "snow": {"snow", "snowy"}, "table": {"table", "wooden"},
                    "wall": {"wall", "background", "plain"}}


def test_trained_ifcap_captions_held_out_images(world):
    """Retrieve 5 corpus captions with the retrieval CLIP, caption with IFCap (no entities): well-formed
    sentences of the corpus vocabulary, ending with the stop token, that name the scene's setting."""
    from adjcap.models.clip import load_dual_encoder
    from adjcap.models.ifcap import load_ifcap

    root, held = world["root"], world["held"]
    corpus = world["corpus"][:1500]
    ret = load_dual_encoder("adjcap-tiny-clip-large", str(root / "retrieval-clip"), device="cpu")
    clip = load_dual_encoder("adjcap-tiny-clip", str(root / "captioner-clip"), device="cpu")
    cap = load_ifcap(root / "ifcap" / "tiny-ifcap.pt", lm_config=root / "ifcap", tokenizer=root / "gpt2-tokenizer",
                     device="cpu", mapping_heads=2)
    images, scenes = held.images[:96], held.scenes[:96]
    top = (ret.encode_images(images) @ ret.encode_texts(corpus).T).topk(5, dim=1).indices
    r = clip.encode_texts(corpus, normalize=False)[top]
    beams = cap.generate(clip.encode_images(images), r, [[] for _ in images], beam_width=3, max_len=30)
    vocab = {w for t in world["corpus"] for w in re.findall(r"[a-z]+", t.lower())}
    setting = 0
    for beam, scene in zip(beams, scenes):
        text = beam[0].text.strip()
        words = re.findall(r"[a-z]+", text.lower())
        assert text.endswith(".") and len(words) >= 3 and set(words) <= vocab, text
        setting += bool(set(words) & BACKGROUND_WORDS[scene["background"]])
    # chance: about 1 in 6. Seed 42: 0.61 on these 96 images (0.62 on all 200); on the first 24 alone it
    # swung between 0.58 and 0.67 with the recipe, too few images for a floor of 0.6
    assert setting / len(images) > 0.45, setting / len(images)
