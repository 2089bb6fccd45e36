"""The synthetic demo world: deterministic, complete, readable by the benchmark readers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from adjcap.data import decode_image, load_corpus, read_benchmark
from adjcap.demo.world import BACKGROUNDS, OBJECTS, build_demo_world, demo_corpus_texts

SMALL = dict(n_test=6, n_val=4, n_corpus_images=50)


def _all_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_demo_world(tmp_path_factory.mktemp("demo") / "demo")


def test_layout_and_counts(world: dict[str, Path]):
    root = world["root"]
    assert world["images"] == root / "images" and world["manifest"].is_file()
    test = json.loads(world["test"].read_text())
    val = json.loads(world["val"].read_text())
    train = json.loads(world["train"].read_text())
    assert (len(test), len(val), len(train)) == (300, 100, 600)  # the demo's defaults
    assert all(len(c) == 5 for d in (test, val, train) for c in d.values())
    assert all(isinstance(s, str) and s for d in (test, val, train) for c in d.values() for s in c)
    pngs = sorted(p.name for p in world["images"].glob("*.png"))
    assert pngs == sorted(list(test) + list(val))  # train is text-only
    assert not set(train) & set(test) and not set(val) & set(test)


def test_readable_by_ifcap_reader_and_images_decode(world: dict[str, Path]):
    for split, n in (("test", 300), ("val", 100)):
        recs = read_benchmark("ifcap", world["annotations"], world["images"], split)
        assert len(recs) == n and all(len(r.references) == 5 for r in recs)
        assert recs[0].split == split and recs[0].image_id == f"demo-{split}-0000.png"
        for r in recs[:4]:
            d = decode_image(r.image_path)
            assert d.ok and d.image.mode == "RGB" and min(d.image.size) >= 100
    recs = read_benchmark("auto", world["test"], world["images"], "test")
    assert len(recs) == 300


def test_corpus_texts(world: dict[str, Path]):
    texts = demo_corpus_texts(world["root"])
    assert len(texts) == 3000
    assert texts == load_corpus(world["train"]).texts
    assert all(t[0].isupper() and t[-1] == "." for t in texts)  # normalised
    vocab = {w for t in texts for w in re.findall(r"[a-z]+", t.lower())}
    # COCO-class nouns for the entity filter and CHAIR, plus colours and shapes
    assert {"kite", "clock", "umbrella", "car", "ball", "stop", "sign", "tree", "house"} <= vocab
    assert {"red", "green", "blue", "circle", "square", "triangle", "grass", "table"} <= vocab
    # every word of the test/val references is in the training corpus
    for split in ("test", "val"):
        caps = json.loads(world[split].read_text())
        words = {w for c in caps.values() for s in c for w in re.findall(r"[a-z]+", s.lower())}
        assert words <= vocab


def test_captions_describe_the_drawn_scene(world: dict[str, Path]):
    man = json.loads(world["manifest"].read_text())
    caps = {**json.loads(world["test"].read_text()), **json.loads(world["val"].read_text())}
    assert set(man["scenes"]) == set(caps)
    nouns = sorted(OBJECTS, key=len, reverse=True)
    for name, scene in man["scenes"].items():
        kinds = {o["type"] for o in scene["objects"]}
        colours = {o["colour"] for o in scene["objects"]}
        assert scene["background"] in BACKGROUNDS and 1 <= len(scene["objects"]) <= 3
        mentioned_any = False
        for cap in caps[name]:
            low = cap.lower()
            for scenery in ("green field", "green lawn"):  # background, not an object colour
                low = low.replace(scenery, "")
            for noun in nouns:
                plural = OBJECTS[noun][0]
                if re.search(rf"\b({re.escape(noun)}|{re.escape(plural)})\b", low):
                    mentioned_any = True
                    assert noun in kinds, (name, cap, kinds)  # references never hallucinate objects
            for col in ("red", "green", "blue", "yellow", "orange", "purple", "pink", "brown"):
                if re.search(rf"\b{col}\b", low):
                    assert col in colours, (name, cap, colours)
        assert mentioned_any, name
    # the pixels follow the scene: an image whose objects are all red has red pixels
    import numpy as np
    from PIL import Image

    for name, scene in man["scenes"].items():
        if scene["split"] == "test" and all(o["colour"] == "red" for o in scene["objects"]):
            a = np.asarray(Image.open(world["images"] / name).convert("RGB")).reshape(-1, 3).astype(int)
            red = (a[:, 0] > 180) & (a[:, 1] < 80) & (a[:, 2] < 80)
            assert red.sum() > 30


def test_deterministic_bytes(tmp_path: Path):
    a = build_demo_world(tmp_path / "a", seed=7, **SMALL)
    b = build_demo_world(tmp_path / "b", seed=7, **SMALL)
    fa, fb = _all_files(a["root"]), _all_files(b["root"])
    # 6 test + 4 val images, 3 caption files, manifest, lexicon, the second corpus
    assert fa.keys() == fb.keys() and len(fa) == 6 + 4 + 3 + 1 + 1 + 1
    assert fa == fb
    c = build_demo_world(tmp_path / "c", seed=8, **SMALL)
    assert c["test"].read_bytes() != a["test"].read_bytes()
    # the splits draw from separate streams: more test images leave val and train unchanged
    d = build_demo_world(tmp_path / "d", seed=7, n_test=9, n_val=4, n_corpus_images=50)
    assert d["val"].read_bytes() == a["val"].read_bytes()
    assert d["train"].read_bytes() == a["train"].read_bytes()
    assert json.loads(d["test"].read_text()).keys() > json.loads(a["test"].read_text()).keys()


def test_idempotent_reuse_and_repair(tmp_path: Path):
    root = tmp_path / "w"
    p = build_demo_world(root, **SMALL)
    stamp = {k: v.stat().st_mtime_ns for k, v in _paths_of(root).items()}
    build_demo_world(root, **SMALL)
    assert {k: v.stat().st_mtime_ns for k, v in _paths_of(root).items()} == stamp  # reused, untouched
    victim = p["images"] / "demo-test-0001.png"
    original = victim.read_bytes()
    victim.unlink()
    build_demo_world(root, **SMALL)  # incomplete -> rebuilt
    assert victim.read_bytes() == original
    p["manifest"].unlink()  # no completion marker -> rebuilt, same content
    build_demo_world(root, **SMALL)
    assert p["manifest"].is_file() and victim.read_bytes() == original
    build_demo_world(root, n_test=2, n_val=4, n_corpus_images=50)  # other parameters -> rewritten
    assert len(json.loads(p["test"].read_text())) == 2


def _paths_of(root: Path) -> dict[str, Path]:
    return {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}


def test_demo_corpus_texts_builds_missing_world(tmp_path: Path):
    texts = demo_corpus_texts(tmp_path / "fresh")
    assert len(texts) == 3000 and (tmp_path / "fresh" / "manifest.json").is_file()
