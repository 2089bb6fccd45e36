"""Images travel between pools as encoded bytes (not decoded pixels up to 4096 px), without
changing a feature value; the scorer loads the retrieval image tower only when it needs it."""

import math
import pickle

import numpy as np
import pytest
from PIL import Image

from adjcap.actors.transport import pack, unpack
from adjcap import image_state, stages
from adjcap.data.images import decode_image
from adjcap.models.roles import ScorerEncoder
from adjcap.pipeline import load_models
from adjcap.run_plan import read_records


def _same(a, b):
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.fixture(scope="module")
def world(demo_cfg):
    cfg = demo_cfg.resolved()
    return cfg, load_models(cfg), read_records(cfg)["test"][:6]


def test_features_through_the_transport_equal_features_from_decoded_pixels(world):
    cfg, m, recs = world
    # as before: every stage sees the pixels decoded straight from the file
    old = [image_state.ImageState(r.image_id, cfg.benchmark, r.split, image=decode_image(r.image_path).image) for r in recs]
    c = m.captioner
    stages.retrieve(old, m.retrieval, m.index, m.index.texts, cfg.retrieval.top_l)
    stages.verify(old, m.verifier, cfg.verifier.keep)
    stages.caption(old, c.captioner, c.clip, cfg.captioner, c.vocabulary)
    stages.score(old, m.retrieval, m.verifier)
    # now: decoded once, then carried as bytes and pickled between every stage, as between Ray pools
    new = [image_state.decode_state(r.image_id, cfg.benchmark, r.split, r.domain, r.image_path) for r in recs]

    def hop(states):
        batch = pack(states)
        out = unpack(batch)
        assert all(s.image is None and s.encoded for s in out)  # pixels never travel
        return out

    new = hop(new)
    stages.retrieve(new, m.retrieval, m.index, m.index.texts, cfg.retrieval.top_l)
    new = hop(new)
    stages.verify(new, m.verifier, cfg.verifier.keep)
    new = hop(new)
    stages.caption(new, c.captioner, c.clip, cfg.captioner, c.vocabulary)
    new = hop(new)
    stages.score(new, m.retrieval, m.verifier)
    assert all(s.ok for s in old) and all(s.ok for s in new)
    for a, b in zip(old, new):
        assert _same(a.to_row(), b.to_row()), a.image_id
    final = unpack(pack(new, drop_image=True))
    assert all(s.encoded is None and s.image is None and s.verifier_memo is None for s in final)


def _save(im, path, **kw):
    im.save(path, **kw)
    return str(path)


def test_large_images_travel_compact_and_decode_to_the_same_pixels(tmp_path):
    rng = np.random.default_rng(0)
    smooth = Image.fromarray(np.kron(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8),
                                     np.ones((50, 50, 1), dtype=np.uint8)))  # 4000x3000
    noisy = Image.fromarray(rng.integers(0, 255, (1500, 2000, 3), dtype=np.uint8))
    rotated = Image.fromarray(rng.integers(0, 255, (300, 500, 3), dtype=np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    files = {
        "big.jpg": _save(smooth, tmp_path / "big.jpg", quality=90),
        "huge.jpg": _save(smooth.resize((6000, 4500)), tmp_path / "huge.jpg", quality=90),  # > max_side
        "noisy.png": _save(noisy, tmp_path / "noisy.png"),
        "plain.bmp": _save(noisy, tmp_path / "plain.bmp"),  # uncompressed: bigger than its pixels
        "rotated.jpg": _save(rotated, tmp_path / "rotated.jpg", exif=exif),
    }
    for name, path in files.items():
        s = image_state.decode_state(name, "folder", "test", None, path)
        assert s.ok, s.error
        raw = s.image.width * s.image.height * 3
        blob = pickle.dumps(s)
        assert len(blob) <= 1.01 * raw + 4096, name  # never (much) more than the decoded pixels
        back = pickle.loads(blob)
        assert back.image is None
        ref = decode_image(path)
        assert np.array_equal(np.asarray(back.pil()), np.asarray(ref.image)), name
    big = pickle.dumps(image_state.decode_state("b", "folder", "test", None, files["big.jpg"]))
    assert len(big) < 4000 * 3000 * 3 / 10  # a JPEG travels at a fraction of its pixels


def test_scorer_loads_the_image_tower_only_when_an_embedding_is_missing(world):
    cfg, m, recs = world
    states = [image_state.decode_state(r.image_id, cfg.benchmark, r.split, r.domain, r.image_path) for r in recs[:3]]
    c = m.captioner
    stages.retrieve(states, m.retrieval, m.index, m.index.texts, cfg.retrieval.top_l)
    stages.verify(states, m.verifier, cfg.verifier.keep)
    stages.caption(states, c.captioner, c.clip, cfg.captioner, c.vocabulary)
    ref = pickle.loads(pickle.dumps(states))  # scored with both towers, for reference
    stages.score(ref, m.retrieval, m.verifier)

    enc = ScorerEncoder(cfg.retrieval.encoder, "cpu")
    a = pickle.loads(pickle.dumps(states))
    stages.score(a, enc, m.verifier)
    assert enc.image is None  # every state carried stage 1's embedding
    b = pickle.loads(pickle.dumps(states))
    b[1].retrieval_embedding = None
    stages.score(b, enc, m.verifier)
    assert enc.image is not None
    for x, y, z in zip(ref, a, b):
        for cx, cy, cz in zip(x.candidates, y.candidates, z.candidates):
            assert cx["retrieval_cosine"] == pytest.approx(cy["retrieval_cosine"], abs=1e-5)
            assert cx["retrieval_cosine"] == pytest.approx(cz["retrieval_cosine"], abs=1e-5)


def test_decode_tasks_and_the_stage_cache_load_no_torch():
    """The CPU tasks that decode images import no model library (a decoding process starts on under
    half the CPU it took with PyTorch), nor does the stage cache they fill states from."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, actors.decode, actors.transport, adjcap.stage_cache; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'torchvision', 'open_clip', 'transformers'}))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True).stdout
    assert out.strip() == "[]", out
