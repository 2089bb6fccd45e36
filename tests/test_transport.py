"""Images travel between pools as encoded bytes (not decoded pixels up to 4096 px), in declared Arrow
columns (no pickled state), without changing a feature value; the scorer loads the retrieval image
tower only when it needs it."""

import math
import pickle

import numpy as np
import pytest
from PIL import Image

import pyarrow as pa

from adjcap.engine import transport
from adjcap.engine.transport import pack, unpack
from adjcap.engine.cluster_plan import PoolPlan
from adjcap.engine import image_state, stages
from adjcap.engine import stage_registry as registry
from adjcap.data.images import decode_image
from adjcap.engine.features import rows_to_table
from adjcap.models.roles import ScorerEncoder
from adjcap.engine.pipeline import load_models
from adjcap.engine.run_plan import read_records


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


@pytest.fixture(scope="module")
def reference(world):
    """The features of the world's images as before: every stage sees the pixels decoded from the file."""
    cfg, m, recs = world
    old = [image_state.ImageState(r.image_id, cfg.benchmark, r.split, image=decode_image(r.image_path).image) for r in recs]
    c = m.captioner
    stages.retrieve(old, m.retrieval, m.index, m.index.texts, cfg.retrieval.top_l)
    stages.verify(old, m.verifier, cfg.verifier.keep)
    stages.caption(old, c.captioner, c.clip, cfg.captioner, c.vocabulary)
    stages.score(old, m.retrieval, m.verifier)
    assert all(s.ok for s in old)
    return _stored(old)


def _stored(states):  # the declared columns are the feature table's types (float32 scores): equal as stored
    return rows_to_table([s.to_row() for s in states]).to_pylist()


def _through_every_pool(states, m, cfg):
    """The four stages, the states packed and unpacked (as across processes) before each."""
    c = m.captioner

    def hop(states):
        batch = pack(states)
        assert isinstance(batch, pa.Table) and batch.schema == transport.schema()
        return unpack(pa.ipc.open_stream(_ipc(batch)).read_all())

    new = hop(states)
    stages.retrieve(new, m.retrieval, m.index, m.index.texts, cfg.retrieval.top_l)
    new = hop(new)
    stages.verify(new, m.verifier, cfg.verifier.keep)
    new = hop(new)
    stages.caption(new, c.captioner, c.clip, cfg.captioner, c.vocabulary)
    new = hop(new)
    assert all(s.verifier_memo is not None and s.retrieval_embedding is not None for s in new)
    stages.score(new, m.retrieval, m.verifier)
    return new


def test_features_through_the_transport_equal_features_from_decoded_pixels(world, reference):
    cfg, m, recs = world
    # decoded once, then carried as bytes in the declared columns between every stage, as between Ray pools
    new = [image_state.decode_state(r.image_id, cfg.benchmark, r.split, r.domain, r.image_path) for r in recs]
    new = unpack(pack(new))
    assert all(s.image is None and s.encoded and not s.pixels for s in new)  # decoded pixels never travel
    new = _through_every_pool(new, m, cfg)
    assert all(s.ok for s in new)
    for a, b in zip(reference, _stored(new)):
        assert _same(a, b), a["image_id"]
    final = unpack(pack(new, drop_image=True))
    assert all(s.encoded is None and s.image is None and s.verifier_memo is None and not s.pixels for s in final)


def test_pixels_prepared_by_the_decode_task_give_the_same_features_without_the_bytes(world, reference):
    """The job's decode tasks resize and crop for every model of the pools (known before any loads);
    the pools normalise them on their device, decode no image, and every feature is the same."""
    from adjcap.actors.decode import decode_batch
    from adjcap.engine.executor import decode_pixels
    from adjcap.jobs.extract_features import pools
    from adjcap.models.clip import pixel_prep_for
    from adjcap.models.roles import verifier_pixel_prep

    cfg, m, recs = world
    preps, keep_bytes = decode_pixels(cfg, pools(PoolPlan.of(cfg)))
    assert preps and not keep_bytes
    # what the plan knows without loading is what each loaded model has (geometry and normalisation)
    assert pixel_prep_for(cfg.retrieval.encoder) == m.retrieval.pixel_prep
    assert pixel_prep_for(cfg.captioner.clip) == m.captioner.clip.pixel_prep
    assert verifier_pixel_prep(cfg.verifier) == m.verifier.pixel_prep
    assert {p.key for p in preps} == {m.retrieval.pixel_prep.key, m.verifier.pixel_prep.key,
                                      m.captioner.clip.pixel_prep.key}
    records = transport.records({"image_id": [r.image_id for r in recs], "benchmark": [cfg.benchmark] * len(recs),
                                 "split": [r.split for r in recs], "domain": [r.domain for r in recs],
                                 "error": [None] * len(recs), "image_path": [r.image_path for r in recs]})
    states = unpack(decode_batch(records, None, preps, keep_bytes))
    assert all(s.encoded is None and s.image is None and set(s.pixels) == {p.key for p in preps} for s in states)
    new = _through_every_pool(states, m, cfg)
    assert all(s.ok for s in new), [s.error for s in new]
    for a, b in zip(reference, _stored(new)):
        assert _same(a, b), a["image_id"]
    # a model whose geometry was not prepared, with no bytes to decode: the image fails in one line
    lost = unpack(decode_batch(records.slice(0, 1), None, (), keep_bytes=False))
    stages.retrieve(lost, m.retrieval, m.index, m.index.texts, cfg.retrieval.top_l)
    assert "ray.prepare_pixels=false" in lost[0].error.splitlines()[0]


def test_the_bytes_travel_where_a_pool_preprocesses_otherwise(world):
    from adjcap.engine.executor import decode_pixels
    from adjcap.jobs.extract_features import pools

    cfg = world[0]
    for change in ({"captioner": cfg.captioner.model_copy(update={"family": "hf"})},
                   {"verifier": cfg.verifier.model_copy(update={"backend": "lavis"})}):
        c = cfg.model_copy(update=change)
        preps, known = registry.pixel_preps(c, registry.names())
        assert preps and not known, change  # the others' pixels, and the bytes for this one
    assert decode_pixels(cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"prepare_pixels": False})}),
                         pools(PoolPlan.of(cfg))) == ((), True)


def _ipc(table):
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue()


def test_a_partly_scored_beam_and_a_bf16_encoding_travel_as_they_are():
    """The lavis backend scores the candidates' verifier half before stage 4 completes: the scores travel
    (stored in the stage cache as NaN, not carried so); a bfloat16 encoding comes back bit for bit."""
    import torch

    s = image_state.ImageState("a", "demo", "test")
    s.retrieved = [{"corpus_id": 3, "text": "a dog", "cosine": 0.5, "verifier": 0.25}]
    s.verified = [{"corpus_id": 3, "text": "a dog", "verifier": 0.25, "retrieval_rank": 0}]
    s.entities, s.prompt = ["dog"], "There is a dog in the image."
    s.candidates = [{"text": "a dog runs", "lm_logprob_sum": -3.0, "lm_logprob_mean": -1.0, "n_tokens": 3,
                     "beam_rank": 0, "retrieval_cosine": math.nan, "verifier": 0.75, "clipscore_cosine": math.nan}]
    s.retrieval_embedding = np.arange(4, dtype=np.float32) / 3
    s.verifier_memo = torch.randn(3, 5).to(torch.bfloat16)
    s.done, s.computed = {"retrieve", "verify", "caption"}, {"caption"}
    bad = image_state.ImageState("b", "demo", "test", error="decode: broken")
    back, broken = unpack(pack([s, bad]))
    assert back.candidates[0]["verifier"] == 0.75 and back.retrieved[0]["verifier"] == 0.25
    assert math.isnan(registry.stage("caption").output.stored(back)["candidates"][0]["verifier"])  # stored: NaN
    assert np.array_equal(back.retrieval_embedding, s.retrieval_embedding)
    assert back.verifier_memo.dtype == torch.bfloat16 and torch.equal(back.verifier_memo, s.verifier_memo)
    assert (back.done, back.computed, back.entities, back.prompt) == (s.done, s.computed, s.entities, s.prompt)
    assert broken.error == "decode: broken" and not broken.done and broken.candidates == []


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
        blob = pack([s])
        assert blob.nbytes <= 1.01 * raw + 4096, name  # never (much) more than the decoded pixels
        (back,) = unpack(blob)
        assert back.image is None
        ref = decode_image(path)
        assert np.array_equal(np.asarray(back.pil()), np.asarray(ref.image)), name
    big = pack([image_state.decode_state("b", "folder", "test", None, files["big.jpg"])])
    assert big.nbytes < 4000 * 3000 * 3 / 10  # a JPEG travels at a fraction of its pixels


@pytest.fixture(scope="module")
def captioned(world) -> tuple[list, list]:
    """(3 states through stages 1-3, the same states scored by stage 4 with every model: the reference);
    tests change copies (pickle) of them."""
    cfg, m, recs = world
    states = [image_state.decode_state(r.image_id, cfg.benchmark, r.split, r.domain, r.image_path) for r in recs[:3]]
    c = m.captioner
    stages.retrieve(states, m.retrieval, m.index, m.index.texts, cfg.retrieval.top_l)
    stages.verify(states, m.verifier, cfg.verifier.keep)
    stages.caption(states, c.captioner, c.clip, cfg.captioner, c.vocabulary)
    ref = pickle.loads(pickle.dumps(states))
    stages.score(ref, m.retrieval, m.verifier)
    return states, ref


def test_scorer_loads_the_image_tower_only_when_an_embedding_is_missing(world, captioned):
    cfg, m, _ = world
    states, ref = captioned  # ref: scored with both towers

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


def test_the_scorers_verifier_encodes_only_the_images_without_stage_2s_encoding(world, captioned, monkeypatch):
    """A batch where one image lost stage 2's encoding (as one resumed from the stage cache): only that image
    is encoded again, so the others need no pixels (a pool's output drops them), and the scores are the
    ones every image's carried encoding gives."""
    _, m, _ = world
    states, ref = captioned
    mixed = pickle.loads(pickle.dumps(states))
    mixed[1].verifier_memo = None
    for s in (mixed[0], mixed[2]):
        s.pixels = {k: v for k, v in s.pixels.items() if k != m.verifier.pixel_prep.key}
        s.image = s.encoded = None
    encoded = []
    real = m.verifier.encode_images
    monkeypatch.setattr(m.verifier, "encode_images", lambda images: encoded.append(len(images)) or real(images))
    stages.score(mixed, m.retrieval, m.verifier)
    assert encoded == [1] and all(s.ok for s in mixed), [s.error for s in mixed]
    for x, y in zip(ref, mixed):
        assert [cx["verifier"] for cx in x.candidates] == pytest.approx([cy["verifier"] for cy in y.candidates], abs=1e-5)


def test_decode_tasks_and_the_stage_cache_load_no_torch():
    """The CPU tasks that decode images import no model library (a decoding process starts on under
    half the CPU it took with PyTorch), nor does the stage cache they fill states from."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, actors.decode, adjcap.engine.transport, adjcap.engine.decode_task, adjcap.engine.stage_cache; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'torchvision', 'open_clip', 'transformers'}))")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, check=True).stdout
    assert out.strip() == "[]", out


def test_split_pools_carry_only_what_later_pools_read_and_the_features_are_unchanged(world, reference):
    """Each split pool's output (jobs.extract_features.pools: ``keep``) carries the pixels of the geometries
    the pools after it read and the verifier's encoding only to a pool that reads it; the features are the
    same as before and the hops carry fewer bytes than with everything kept."""
    from adjcap.actors.decode import decode_batch
    from adjcap.engine.executor import decode_pixels
    from adjcap.jobs.extract_features import pools

    cfg, m, recs = world
    recs = recs[:3]
    split = cfg.model_copy(update={"ray": cfg.ray.model_copy(update={"pools": "split"})})
    runs = pools(PoolPlan.of(split))
    assert [r.meters for r in runs] == [("retrieve",), ("verify",), ("caption",), ("score",)]
    preps, keep_bytes = decode_pixels(split, runs)
    records = transport.records({"image_id": [r.image_id for r in recs], "benchmark": [cfg.benchmark] * len(recs),
                                 "split": [r.split for r in recs], "domain": [r.domain for r in recs],
                                 "error": [None] * len(recs), "image_path": [r.image_path for r in recs]})
    states = unpack(decode_batch(records, None, preps, keep_bytes))
    models = vars(m)
    dropped = set()
    for i, run in enumerate(runs):
        for name in run.meters:
            registry.stage(name).run(states, models, split)
        keep, last = run.kwargs["keep"], run.kwargs["last"]
        later = {k for r in runs[i + 1:] for k in
                 (p.key for p in registry.pixel_preps(split, r.meters)[0])}
        assert keep.pixels == later and not keep.encoded
        assert keep.memo == any(n == "score" for r in runs[i + 1:] for n in r.meters)
        full = pack(states)
        states = unpack(pa.ipc.open_stream(_ipc(pack(states, drop_image=last, keep=keep))).read_all())
        # an image drops the pixels later pools read only for an image lacking what it carries (the
        # scorer's verifier re-encodes only an image without stage 2's encoding)
        spare = dict(keep.spare)
        for s in states:
            wanted = set() if last else {k for k in later if not (k in spare and all(
                getattr(s, attr) is not None for attr in spare[k]))}
            assert set(s.pixels) == wanted, (run.meters, sorted(s.pixels), sorted(wanted))
            dropped |= (set() if last else later) - wanted
        if not last:
            assert pack(states, keep=keep).nbytes <= full.nbytes
    assert all(s.ok for s in states), [s.error for s in states]
    assert registry.pixel_preps(split, ["verify"])[0][0].key in dropped  # after the verifier's pool
    for a, b in zip(reference, _stored(states)):
        assert _same(a, b), a["image_id"]
