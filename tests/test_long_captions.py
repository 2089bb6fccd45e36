"""The judges on long captions (``verifier.long_captions``, adjcap.models.judge_window): the sentence
rule, a sentence-level score through stage 4 equal to its named aggregate of each sentence scored
alone by the same judge called directly (BLIP ITM, BLIP-2 ITM, an open_clip SigLIP), ``whole`` the judge's
own call bit for bit, the cut count per sentence, and the setting's identity."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from adjcap.engine import stages
from adjcap.config import VerifierCfg, load_config
from adjcap.demo.tiny_blip import build_tiny_blip
from adjcap.demo.tiny_blip2 import build_tiny_blip2
from adjcap.demo.tiny_clip import TINY_CLIP_LARGE, build_tiny_clip
from adjcap.demo.tiny_siglip import TINY_SIGMOID, build_tiny_siglip
from adjcap.demo.world import random_images
from adjcap.engine.image_state import ImageState
from adjcap.models.judge_window import AGGREGATES, cut_count, judge, sentences
from adjcap.models.roles import load_verifier

LONG = ("The image shows a red ball on a green field. A dog sits next to it!\n\n"
        "Is there a kite? Two blue cubes lie on a wooden table.")
CANDIDATES = [LONG, "a dog on a bench next to a red car.", "three small white boxes. one red ball", ""]


def test_the_sentence_rule():
    assert sentences(LONG) == ["The image shows a red ball on a green field.", "A dog sits next to it!",
                               "Is there a kite?", "Two blue cubes lie on a wooden table."]
    one = "  a dog on a bench.  "
    assert sentences(one) == [one]  # one sentence: the text itself, unchanged
    assert sentences("") == [""] and sentences("3.5 dogs, e.g., two") == ["3.5 dogs, e.g., two"]
    assert sentences("- a dog\n- a cat") == ["- a dog", "- a cat"]  # a line break ends a sentence
    assert sentences("a dog. ") == ["a dog. "] and sentences("Mr. Smith") == ["Mr.", "Smith"]  # a rule


class _Recorder:
    """A judge that records the texts it is asked and scores a text by its length."""

    def __init__(self):
        self.asked = []

    def score(self, memo, texts):
        self.asked.append(texts)
        return [np.array([len(t) / 100 for t in ts], dtype=np.float32) for ts in texts]


def test_whole_is_the_judges_own_call_and_a_sentence_mode_aggregates_one_call():
    rec = _Recorder()
    texts = [CANDIDATES, CANDIDATES[1:2]]
    got = judge(rec, None, texts)
    assert rec.asked == [texts] and got is not None and got[0].dtype == np.float32
    for mode in ("sentence_min", "sentence_mean"):
        rec.asked.clear()
        got = judge(rec, None, texts, mode)
        assert len(rec.asked) == 1 and rec.asked[0] == [[s for t in ts for s in sentences(t)] for ts in texts]
        for ts, g in zip(texts, got):
            want = [AGGREGATES[mode](np.array([np.float32(len(s) / 100) for s in sentences(t)], np.float64))
                    for t in ts]
            assert g.tolist() == want
        assert got[1][0] == np.float32(len(CANDIDATES[1]) / 100)  # one sentence: scored as whole


@pytest.fixture(scope="module")
def judges(tmp_path_factory):
    root = tmp_path_factory.mktemp("long-judges")
    corpus = [s for t in CANDIDATES for s in sentences(t)] + ["a photo of a cat", "people on a street"]
    blip = build_tiny_blip(root / "blip-itm", corpus, image_size=32)
    clip = build_tiny_clip(root / "clip" / "open_clip_model.safetensors", seed=5, model=TINY_CLIP_LARGE)
    siglip = build_tiny_siglip(root / "siglip" / "open_clip_model.safetensors", clip, TINY_CLIP_LARGE, seed=9)
    return {"blip_itm": VerifierCfg(family="blip_itm", model=str(blip)),
            "blip2_itm": VerifierCfg(family="blip2_itm", model=str(build_tiny_blip2(root / "blip2-itm", blip, seed=7))),
            "clip": VerifierCfg(family="clip", model=TINY_SIGMOID, pretrained=str(siglip))}


@pytest.mark.parametrize("family", ["blip_itm", "blip2_itm", "clip"])
def test_a_sentence_score_is_its_aggregate_of_each_sentence_judged_alone(judges, family):
    ver = load_verifier(judges[family], "cpu")
    images: list[Image.Image] = random_images(2, size=48, seed=3)

    def states():
        out = [ImageState(image_id=str(i), benchmark="demo", split="test", image=im) for i, im in enumerate(images)]
        for s in out:
            s.candidates = [{"text": t} for t in CANDIDATES]
        return out

    memo = ver.encode_images(images)
    whole = ver.score(memo, [CANDIDATES] * 2)
    got = states()
    stages.score_verifier(got, ver)  # whole: the judge's own call, bit for bit
    assert [[c["verifier"] for c in s.candidates] for s in got] == [[float(v) for v in w] for w in whole]
    # the reference: the judge called on each sentence alone, on its image alone
    alone = {}
    for i, im in enumerate(images):
        one = ver.encode_images([im])
        for x in {x for t in CANDIDATES for x in sentences(t)}:
            alone[i, x] = float(ver.score(one, [[x]])[0][0])
    for mode, agg in (("sentence_min", min), ("sentence_mean", lambda v: sum(v) / len(v))):
        got = states()
        stages.score_verifier(got, ver, mode)
        for i, s in enumerate(got):
            for c in s.candidates:
                want = agg([alone[i, x] for x in sentences(c["text"])])
                assert c["verifier"] == pytest.approx(want, abs=2e-5), (mode, c["text"])
            assert s.candidates[1]["verifier"] == pytest.approx(float(whole[i][1]), abs=2e-5)  # one sentence
        assert got[0].candidates[0]["verifier"] != pytest.approx(float(whole[0][0]), abs=1e-4)  # not the whole's


def test_the_cut_count_per_sentence_and_the_settings_identity(judges):
    long_sentences = ". ".join(["a red car next to a dog on a bench"] * 4) + "."
    blip = judges["blip_itm"]
    assert cut_count([long_sentences], blip)["cut"] == 1
    split = cut_count([long_sentences, "a dog."], blip.model_copy(update={"long_captions": "sentence_min"}))
    assert split["cut"] == 0 and split["long_captions"] == "sentence_min"
    one_long = " ".join(["a red car next to a dog on a bench"] * 4) + ". A dog."
    assert cut_count([one_long], blip.model_copy(update={"long_captions": "sentence_mean"}))["cut"] == 1

    from adjcap.engine.identity import stage_identities

    base = ["paths.cache_dir=/nonexistent/cache", "paths.data_dir=/nonexistent/data"]
    head = stage_identities(load_config("headline", base).resolved(), "corpus-fp")
    # whole: the identities from before the setting; a sentence mode is stage 4's alone (the captions stay)
    assert head["verify"] == "f3e08aefa817554bc164c842" and head["score"] == "b25a4f521c1caa3ff986cf86"
    for mode in ("sentence_min", "sentence_mean"):
        ids = stage_identities(load_config("headline", [*base, f"verifier.long_captions={mode}"]).resolved(), "corpus-fp")
        assert [ids[s] == head[s] for s in ("retrieve", "verify", "caption", "score")] == [True, True, True, False]
