"""The verifier families (``verifier.family``): BLIP-2 ITM and an open_clip judge (SigLIP's class, and a
CLIP without a logit bias) saved as tiny models of the real classes, loaded through the project's
loaders (adjcap.models.roles.load_verifier), each scoring equal to transformers / open_clip called
directly; their config refusals, identities, sizes, needs and the demo mapping of the verifier sweep."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from adjcap.engine import stages
from adjcap.config import ConfigError, VerifierCfg, load_config
from adjcap.demo.tiny_blip import build_tiny_blip
from adjcap.demo.tiny_blip2 import build_tiny_blip2
from adjcap.demo.tiny_clip import TINY_CLIP, TINY_CLIP_LARGE, build_tiny_clip
from adjcap.demo.tiny_judges import JUDGE_DIRS, judge_config
from adjcap.demo.tiny_siglip import TINY_SIGMOID, build_tiny_siglip
from adjcap.demo.world import random_images
from adjcap.engine.identity import stage_identities
from adjcap.engine.image_state import ImageState
from adjcap.models import budget
from adjcap.models.roles import load_verifier, verifier_pixel_prep
from adjcap.models.sources import weights_of

FIXTURES = Path(__file__).parent / "fixtures" / "data"
CAPTIONS = ["a red ball on a green field", "two blue cubes next to a yellow kite", "a dog",
            "three small white boxes and one red ball on a wooden table in a room", "a stop sign"]


def _corpus() -> list[str]:
    data = json.loads((FIXTURES / "coco_test_captions.json").read_text())
    return [c for caps in data.values() for c in caps] + CAPTIONS


@pytest.fixture(scope="module")
def images():
    real = [Image.open(p).convert("RGB") for p in sorted((FIXTURES / "images").glob("*.jpg"))][:2]
    return real + random_images(2, size=48, seed=3)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("judges")
    blip = build_tiny_blip(root / "blip-itm", _corpus(), image_size=32)
    clip = build_tiny_clip(root / "clip" / "open_clip_model.safetensors", seed=5, model=TINY_CLIP_LARGE)
    return {"blip2": build_tiny_blip2(root / "blip2-itm", blip, seed=7),
            "siglip": build_tiny_siglip(root / "siglip" / "open_clip_model.safetensors", clip, TINY_CLIP_LARGE, seed=9),
            "clip": clip}


def _per_image(n: int) -> list[list[str]]:
    return [CAPTIONS[: 1 + i % len(CAPTIONS)] for i in range(n)]  # 1..5 captions an image


def test_blip2_itm_is_the_models_own_itm_forward(tiny, images):
    from transformers import AutoTokenizer, Blip2ForImageTextRetrieval

    ver = load_verifier(VerifierCfg(family="blip2_itm", model=str(tiny["blip2"]), caption_preprocess="none",
                                    batch_size=3), "cpu")
    ver.pair_batch_size = 4  # caption buckets span several calls
    texts = _per_image(len(images))
    got = ver.score(ver.encode_images(images), texts)
    assert [len(g) for g in got] == [len(t) for t in texts]
    flat = np.concatenate(got)
    assert ((flat > 0) & (flat < 1)).all() and flat.std() > 1e-3  # a probability, and not a constant
    # transformers called directly: the saved model, its own tokenizer, its ITM forward, softmax class 1
    net = Blip2ForImageTextRetrieval.from_pretrained(str(tiny["blip2"])).eval()
    tok = AutoTokenizer.from_pretrained(str(tiny["blip2"]))
    pix = ver.preprocess(images)
    for i, caps in enumerate(texts):
        enc = tok(caps, padding=True, return_tensors="pt")
        with torch.no_grad():
            out = net(pixel_values=pix[[i] * len(caps)], input_ids=enc["input_ids"],
                      attention_mask=enc["attention_mask"], use_image_text_matching_head=True)
        np.testing.assert_allclose(got[i], out.logits_per_image.softmax(-1)[:, 1].numpy(), atol=1e-5)
    # stage 4's path: the memo rebuilt from the vision output carried in the state scores the same
    memo = ver.encode_images(images)
    again = ver.score(ver.memo_from_image_embeds(memo.image_embeds.clone()), texts)
    np.testing.assert_allclose(np.concatenate(again), flat, atol=1e-6)
    pairs = [(im, t) for im, ts in zip(images, texts) for t in ts]
    np.testing.assert_allclose(ver.score_pairs([p[0] for p in pairs], [p[1] for p in pairs]), flat, atol=1e-5)


@pytest.mark.parametrize("kind", ["siglip", "clip"])
def test_clip_family_is_open_clips_own_forward(tiny, images, kind):
    model = TINY_SIGMOID if kind == "siglip" else TINY_CLIP_LARGE
    ver = load_verifier(VerifierCfg(family="clip", model=model, pretrained=str(tiny[kind])), "cpu")
    assert ver.kind == ("sigmoid" if kind == "siglip" else "cosine")
    texts = _per_image(len(images))
    got = ver.score(ver.encode_images(images), texts)
    # open_clip called directly: the saved folder, its tokenizer and transform, model(image, text)
    net, _, transform = open_clip.create_model_and_transforms(f"local-dir:{Path(tiny[kind]).parent}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{Path(tiny[kind]).parent}")
    net.eval()
    for i, caps in enumerate(texts):
        with torch.no_grad():
            out = net(transform(images[i])[None].expand(len(caps), -1, -1, -1), tokenizer(caps))
        cos = (out[0] * out[1]).sum(-1)
        want = torch.sigmoid(out[2] * cos + out[3]) if kind == "siglip" else (cos + 1) / 2
        assert len(out) == (4 if kind == "siglip" else 3)  # SigLIP's class has a logit bias, CLIP's none
        np.testing.assert_allclose(got[i], want.detach().numpy(), atol=1e-5)
        assert ((got[i] >= 0) & (got[i] <= 1)).all()


def test_the_verify_and_score_stages_run_every_family(tiny, images):
    """Stage 2 keeps the top k by the family's score; stage 4 reuses stage 2's image encoding."""
    for cfg in (VerifierCfg(family="blip2_itm", model=str(tiny["blip2"])),
                VerifierCfg(family="clip", model=TINY_SIGMOID, pretrained=str(tiny["siglip"]))):
        ver = load_verifier(cfg, "cpu")
        # the family's pixels, known before loading, are the loaded judge's (the decode tasks prepare them)
        assert ver.pixel_prep is not None and verifier_pixel_prep(cfg) == ver.pixel_prep
        states = [ImageState(image_id=str(i), benchmark="demo", split="test", image=im) for i, im in enumerate(images[:2])]
        for s in states:
            s.retrieved = [{"corpus_id": j, "text": t, "cosine": 0.0, "verifier": float("nan")}
                           for j, t in enumerate(CAPTIONS)]
        stages.verify(states, ver, keep=2)
        for s in states:
            assert s.ok, s.error
            top = sorted(s.retrieved, key=lambda r: -r["verifier"])[:2]
            assert [v["text"] for v in s.verified] == [r["text"] for r in top]
            s.candidates = [{"text": t} for t in CAPTIONS[:3]]
        direct = ver.score(ver.encode_images(images[:2]), [CAPTIONS[:3]] * 2)
        stages.score_verifier(states, ver)
        for s, d in zip(states, direct):
            np.testing.assert_allclose([c["verifier"] for c in s.candidates], d, atol=1e-6)


def test_families_in_the_config_identity_memory_plan_and_needs():
    base = ["paths.cache_dir=/nonexistent/cache", "paths.data_dir=/nonexistent/data"]
    # the BLIP ITM runs keep the identities they had before verifier.family existed
    head = stage_identities(load_config("headline", base).resolved(), "corpus-fp")
    assert head["verify"] == "f3e08aefa817554bc164c842" and head["score"] == "b25a4f521c1caa3ff986cf86"
    flickr = stage_identities(load_config("verifier-flickr", base).resolved(), "corpus-fp")
    assert flickr["verify"] == "48f2cba635bca89169aacc80"
    for preset, family in (("verifier-blip2", "blip2_itm"), ("verifier-siglip", "clip")):
        cfg = load_config(preset, base).resolved()
        ids = stage_identities(cfg, "corpus-fp")
        assert cfg.verifier.family == family and ids["retrieve"] == head["retrieve"] and ids["verify"] != head["verify"]
    # one line naming the settings for a family without its model
    for sets, said in ((["verifier.family=blip2_itm"], "verifier.model"),
                       (["verifier.family=clip", "verifier.model=ViT-B-32"], "verifier.pretrained"),
                       (["verifier.family=clip", "verifier.model=ViT-B-32", "verifier.pretrained=openai",
                         "verifier.backend=lavis"], "verifier.backend=transformers")):
        with pytest.raises(ConfigError, match=said.replace(".", r"\.")) as e:
            load_config("headline", sets)
        assert "\n" not in str(e.value)
    # the memory plan: the real architectures' parameter counts
    siglip = load_config("verifier-siglip").verifier
    assert budget.verifier_params(siglip) == 877_960_498
    assert budget.verifier_params(load_config("verifier-blip2").verifier) == budget.BLIP2_PARAMS["Salesforce/blip2-itm-vit-g"]
    assert budget.verifier_params(load_config("headline").verifier) == budget.BLIP_ITM_LARGE
    # prepare --for: the open_clip tag and SigLIP's hub tokenizer; BLIP-2 from the hub
    keys = {(w.role, w.kind, w.key) for w in weights_of(load_config("verifier-siglip", base).resolved())}
    assert ("verifier", "open_clip", "ViT-SO400M-14-SigLIP-384/webli") in keys
    assert ("verifier tokenizer", "hf", "timm/ViT-B-16-SigLIP") in keys
    keys = {(w.role, w.kind, w.key) for w in weights_of(load_config("verifier-blip2", base).resolved())}
    assert ("verifier", "hf", "Salesforce/blip2-itm-vit-g") in keys


def test_the_verifier_sweep_maps_each_family_onto_its_tiny_judge():
    from adjcap.reproduce import get_table, plan_table

    plans = plan_table(get_table("verifier-sweep"), "demo")
    got = {p.row.preset: p.cfg.verifier for p in plans}
    assert got["headline"].family == "blip_itm" and got["headline"].pretrained is None
    assert got["headline"].model == got["verifier-flickr"].model == "{cache}/tiny/blip-itm"
    for preset, family in (("verifier-blip2", "blip2_itm"), ("verifier-siglip", "clip")):
        v = got[preset]
        assert {"family": v.family, "model": v.model, **({"pretrained": v.pretrained} if v.pretrained else {})} \
            == judge_config("{cache}", family)
        assert f"/tiny/{JUDGE_DIRS[family]}" in (v.pretrained or v.model)
    assert len({p.run_dir for p in plans}) == 4


def test_a_tiny_judge_is_trained_from_the_tiny_world_and_built_once(demo_cfg, tmp_path):
    """The demo's tiny judges (built on first use, never by make demo): BLIP-2's Q-Former trains against
    the tiny BLIP's frozen vision tower, SigLIP's text tower against the tiny retrieval CLIP's locked
    image tower; a second call reuses them; another training setting of one judge rebuilds that one only."""
    from safetensors.torch import load_file

    from adjcap.demo.tiny_judges import JudgeSettings, build_tiny_judge, judge_ready

    shared = Path(demo_cfg.resolved().paths.cache_dir) / "tiny"
    (tmp_path / "tiny").mkdir()
    for entry in shared.iterdir():  # the session's tiny world, read only: the judges go beside it
        (tmp_path / "tiny" / entry.name).symlink_to(entry)
    small = JudgeSettings(pool_images=48, blip2_steps=3, blip2_batch=16, siglip_steps=3, siglip_batch=16,
                          heldout_images=6)
    blip2 = build_tiny_judge(tmp_path, "blip2_itm", settings=small)
    siglip = build_tiny_judge(tmp_path, "clip", settings=small) / "open_clip_model.safetensors"
    got = load_file(blip2 / "model.safetensors")
    blip = load_file(shared / "blip-itm" / "model.safetensors")
    vision = [k for k in blip if k.startswith("vision_model.")]
    assert vision and all(torch.equal(got[k], blip[k]) for k in vision)  # frozen, the tiny BLIP's
    assert not torch.equal(got["itm_head.weight"], blip["itm_head.weight"])  # trained from BLIP's start
    sig, clip = load_file(siglip), load_file(shared / "retrieval-clip" / "open_clip_model.safetensors")
    assert all(torch.equal(sig[k], clip[k]) for k in clip if k.startswith("visual."))  # locked image tower
    marker = json.loads((tmp_path / "tiny" / "siglip.READY.json").read_text())
    assert marker["training"]["steps"] == 3 and 0 <= marker["quality"]["accuracy"] <= 1
    stamp = siglip.stat().st_mtime_ns, (blip2 / "model.safetensors").stat().st_mtime_ns
    build_tiny_judge(tmp_path, "clip", settings=small)
    build_tiny_judge(tmp_path, "blip2_itm", settings=small)
    assert (siglip.stat().st_mtime_ns, (blip2 / "model.safetensors").stat().st_mtime_ns) == stamp
    longer = JudgeSettings(**{**small.__dict__, "blip2_steps": 4})
    assert judge_ready(tmp_path, "clip", longer) and not judge_ready(tmp_path, "blip2_itm", longer)


def test_each_family_is_one_record_that_everything_reads():
    """adjcap.engine.verifier_families is the one list: the config's names are its names, its model-side parts
    resolve to functions of the models layer, and the refusals, identities' unread keys, sizes, pixels and
    loader all come from the record of the section's family."""
    import inspect
    import pkgutil
    import typing

    from adjcap.engine import verifier_families as vf

    assert typing.get_args(VerifierCfg.model_fields["family"].annotation) == vf.NAMES == ("blip_itm", "blip2_itm", "clip")
    for f in vf.FAMILIES.values():
        for part in ("load", "params", "pixels"):
            fn = pkgutil.resolve_name(getattr(f, part))
            assert inspect.isfunction(fn) and fn.__module__.startswith("adjcap.models."), (f.name, part)
        for backend, own in f.isolated.items():  # a backend in its own environment: its loader and environment
            assert backend in f.backends and inspect.isfunction(pkgutil.resolve_name(own.load)), (f.name, backend)
            assert pkgutil.resolve_name(own.env).__module__ == "adjcap.models.lavis_env", (f.name, backend)
    assert vf.isolated(VerifierCfg(backend="lavis")) is vf.FAMILIES["blip_itm"].isolated["lavis"]
    assert vf.isolated(VerifierCfg()) is None and vf.isolated(VerifierCfg(backend="lavis", enabled=False)) is None
    # a model of another family's hub prefix is refused for every family, BLIP ITM's too
    with pytest.raises(ConfigError, match="verifier.family=blip_itm but verifier.model is the BLIP-2 ITM checkpoint"):
        load_config("headline", ["verifier.model=Salesforce/blip2-itm-vit-g"])
    assert vf.refusal(VerifierCfg(enabled=False, family="clip")) is None  # no stage 2: nothing to refuse
    assert vf.unread(VerifierCfg()) == ("verifier.family", "verifier.pretrained")
    assert verifier_pixel_prep(VerifierCfg(backend="lavis")) is None  # decoded in the lavis environment
