"""LAVIS's own BLIP ITM (salesforce-lavis 1.0.2 in its isolated environment) against adjcap's
transformers verifier on the converted checkpoint: equal ITM probabilities on real images and captions,
in process and through the actual Ray actors.

The LAVIS environment is built with pip on first use (about 2-3 minutes from the package registry) under
``$ADJCAP_CACHE`` (default ``~/.cache/adjcap``) and reused afterwards. A small LAVIS ``BlipITM`` is
built with LAVIS's own classes and random weights inside it; its tokenizer is a local BERT vocabulary
written here (LAVIS would otherwise download bert-base-uncased)."""

from __future__ import annotations

import json
import os
import re
import shutil
import string
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from adjcap.models import lavis_env
from adjcap.demo.tiny_lavis import write_bert_tokenizer
from adjcap.models.blip import load_verifier
from adjcap.models.blip_lavis import LavisCheckpointError

pytestmark = [pytest.mark.slow, pytest.mark.lavis]

ROOT = Path(__file__).resolve().parents[1]
IMAGES = sorted((ROOT / "tests" / "fixtures" / "data" / "images").glob("*.jpg"))
# real COCO-style captions, with the punctuation and case LAVIS's caption processor cleans
CAPTIONS = [
    ["A man riding a wave on top of a surfboard.", "two dogs playing in the snow!", "A (red) bus: parked on the street",
     "a Kitchen with wooden cabinets and a stove", "A giraffe standing next to a tall tree; blue sky",
     "people walking down a busy city street at night"],
    ["A plate of food with broccoli and rice.", "someone is holding a toothbrush ~ near a sink",
     "a cat sleeping on a laptop keyboard", "Zebras grazing in a field #savanna", "an elephant", "A WOMAN ON A BENCH"],
]


def _cache() -> Path:
    return Path(os.environ.get("ADJCAP_CACHE", "~/.cache/adjcap")).expanduser()


@pytest.fixture(scope="module")
def lavis_python():
    d = lavis_env.build(_cache())  # reused when present
    return d / "bin" / "python"


def _lavis(py: Path, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run([str(py), "-W", "ignore", str(ROOT / "tests" / "lavis_tiny.py"), *args],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def tiny(lavis_python, tmp_path_factory):
    """(checkpoint .pth, tokenizer dir, LAVIS's scores) of a small LAVIS BlipITM built in the LAVIS env."""
    d = tmp_path_factory.mktemp("lavis")
    words = sorted({w for cs in CAPTIONS for c in cs for w in re.findall(r"[a-z]+", c.lower())} - set(string.ascii_lowercase))
    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    vocab = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars), *words]
    tok = write_bert_tokenizer(d / "bert-tokenizer", vocab)
    pth = d / "model_tiny_retrieval.pth"
    _lavis(lavis_python, "build", str(pth), str(tok), "7")
    spec = d / "spec.json"
    spec.write_text(json.dumps({"images": [str(p) for p in IMAGES], "captions": CAPTIONS}))
    out = d / "lavis_scores.json"
    _lavis(lavis_python, "score", str(pth), str(tok), str(spec), str(out))
    return pth, tok, json.loads(out.read_text())


def test_env_is_built_once_and_reported(lavis_python):
    assert lavis_python.is_file()
    assert lavis_env.status(_cache()).startswith("built")
    info = json.loads((lavis_python.parent.parent / lavis_env.MARKER).read_text())
    assert info["lavis"] == "1.0.2" and "transformers==4.26.1" in info["requirements"]
    t0 = os.path.getmtime(lavis_python.parent.parent / lavis_env.MARKER)
    assert lavis_env.build(_cache()) == lavis_python.parent.parent  # reused, not rebuilt
    assert os.path.getmtime(lavis_python.parent.parent / lavis_env.MARKER) == t0
    # torch and Ray are this environment's files, linked, not a second copy; LAVIS's pins are its own
    assert f"torch=={torch.__version__.split('+')[0]}" in [x.split("+")[0] for x in info["linked"]]
    done = subprocess.run([str(lavis_python), "-c", "import torch, ray, transformers; "
                           "print(torch.__file__, ray.__file__, transformers.__version__)"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    t, r, tv = done.stdout.split()
    bridge = lavis_python.parent.parent / lavis_env.BRIDGE_DIR
    assert t == str(bridge / "torch" / "__init__.py") and r == str(bridge / "ray" / "__init__.py") and tv == "4.26.1"


def test_transformers_on_converted_lavis_checkpoint_equals_lavis(tiny):
    pth, tok, lavis = tiny
    ours = load_verifier(str(pth), device="cpu", precision="fp32", tokenizer=str(tok))
    images = [Image.open(p).convert("RGB") for p in IMAGES]
    got = ours.score(ours.encode_images(images), CAPTIONS)
    want = [np.asarray(s, dtype=np.float32) for s in lavis["score"]]
    flat = np.concatenate(want)
    assert flat.max() - flat.min() > 1e-3  # the scores differ between captions: the comparison means something
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=0)
    # LAVIS's own forward per (image, caption) pair agrees with its encode-once path
    np.testing.assert_allclose(np.asarray(lavis["pairs"]), flat, atol=1e-5, rtol=0)
    assert ours.model_id.startswith("model_tiny_retrieval.pth/sha256s:")


def test_checkpoint_keys_are_all_accounted_for(tiny, tmp_path):
    pth, tok, _ = tiny
    sd = torch.load(pth, weights_only=True)["model"]
    assert "temp" in sd and "ptr_queue" in sd and "vision_proj_m.weight" in sd  # dropped by name, not ignored
    broken = dict(sd)
    del broken["text_encoder.encoder.layer.1.crossattention.self.value.bias"]
    p = tmp_path / "missing.pth"
    torch.save({"model": broken}, p)
    with pytest.raises(LavisCheckpointError, match=r"missing.pth: .*missing text_encoder\.encoder\.layer\.1\."
                                                    r"crossattention\.self\.value\.bias"):
        load_verifier(str(p), device="cpu", tokenizer=str(tok))
    extra = dict(sd)
    extra["text_encoder.cls.predictions.bias"] = torch.zeros(3)
    q = tmp_path / "extra.pth"
    torch.save({"model": extra}, q)
    with pytest.raises(LavisCheckpointError, match=r"extra.pth: .*unexpected keys text_encoder\.cls\.predictions\.bias"):
        load_verifier(str(q), device="cpu", tokenizer=str(tok))


def test_ray_actors_of_both_backends_agree(tiny, tmp_path):
    """The real pools, laid out by the pool plan: the one pool actor running stage verify and the verifier's
    part of stage 4 in the LAVIS env (the verifier family's runtime environment), and running stage verify
    on the converted checkpoint in this env, on the same states."""
    import pyarrow as pa
    import ray

    from adjcap.engine.transport import pack, unpack
    from adjcap.actors.pool import actor_class
    from adjcap.engine.cluster_plan import PoolPlan
    from adjcap.config import load_config
    from adjcap.engine.image_state import ImageState

    import importlib.util

    assert importlib.util.find_spec("lavis") is None  # so the LAVIS pools can only have run in the LAVIS env
    pth, tok, _ = tiny
    cfg = load_config("demo", [f"paths.cache_dir={_cache()}", f"verifier.model={pth}", f"verifier.tokenizer={tok}",
                               "verifier.keep=3", "device=cpu", "ray.pools=split"])
    states = []
    for i, p in enumerate(IMAGES):
        s = ImageState(image_id=p.stem, benchmark="fixture", split="test", image=Image.open(p).convert("RGB"),
                       encoded=p.read_bytes())
        s.retrieved = [{"corpus_id": j, "text": t, "cosine": 0.0, "verifier": float("nan")}
                       for j, t in enumerate(CAPTIONS[i])]
        s.candidates = [{"text": t, "verifier": float("nan")} for t in reversed(CAPTIONS[1 - i])]
        s.done = {"retrieve", "caption"}  # the outputs the pools read travel as those stages' columns
        states.append(s)
    batch = pack(states)

    def run(backend):
        c = cfg.model_copy(update={"verifier": cfg.verifier.model_copy(update={"backend": backend})}).resolved()
        # the plan's verifier pool, and (lavis) the verifier's part of stage 4 that runs before the scorer's pool
        layout = [p for p in PoolPlan.of(c).layout(gpu=False) if p.name == "verifier" or p.part]
        assert [p.meters for p in layout] == ([("verify",), ("score-verifier",)] if backend == "lavis" else [("verify",)])
        assert all((p.env is not None) == (backend == "lavis") for p in layout)
        ds = ray.data.from_arrow(batch)
        for p in layout:
            ds = ds.map_batches(actor_class(p.actor_name), batch_size=8, batch_format="pyarrow",
                                fn_constructor_kwargs={"cfg": c, "stages": p.stages, "part": p.part, "last": False,
                                                       "pool": p.name},
                                compute=ray.data.ActorPoolStrategy(size=1), num_cpus=0.5,
                                **({"runtime_env": dict(p.env)} if p.env else {}))
        out = unpack(pa.concat_tables(ray.get(ds.to_arrow_refs())))
        return {s.image_id: s for s in out}

    ray.init(num_cpus=2, include_dashboard=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    try:
        lav = run("lavis")
        hf = run("transformers")
    finally:
        ray.shutdown()
    ours = load_verifier(str(pth), device="cpu", precision="fp32", tokenizer=str(tok))
    for s0 in states:
        a, b = lav[s0.image_id], hf[s0.image_id]
        assert a.error is None and b.error is None, (a.error, b.error)
        assert a.verifier_backend == "lavis" and b.verifier_backend == "transformers"
        np.testing.assert_allclose([r["verifier"] for r in a.retrieved], [r["verifier"] for r in b.retrieved], atol=1e-5)
        assert [v["corpus_id"] for v in a.verified] == [v["corpus_id"] for v in b.verified]
        assert len(a.verified) == 3
        # the LAVIS scorer pool scored the candidates; the transformers one on the same image agrees
        want = ours.score(ours.encode_images([s0.image]), [[c["text"] for c in s0.candidates]])[0]
        np.testing.assert_allclose([c["verifier"] for c in a.candidates], want, atol=1e-5)
        assert a.to_row()["verifier_backend"] == "lavis"
