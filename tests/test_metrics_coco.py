"""COCO metrics equal a direct pycocoevalcap evaluation of the same real caption set."""

import contextlib
import io
import json
from pathlib import Path

import pytest

from adjcap.metrics.coco import METRIC_NAMES, MissingReferences, align, coco_metrics
from adjcap.metrics.spice import SpiceConfig
from adjcap.metrics.tokenizer import ptb_tokenize

FIX = Path(__file__).parent / "fixtures" / "metrics"


def _load():
    rows = json.loads((FIX / "viecap_coco_test_100.json").read_text())
    preds = {r["image_name"]: r["prediction"] for r in rows}
    refs = {r["image_name"]: r["captions"] for r in rows}
    return preds, refs


@pytest.fixture(scope="module")
def data():
    from adjcap.metrics.meteor import shared_meteor

    shared_meteor()  # start adjcap's METEOR JVM now: it loads while pycocoevalcap's own one does
    return _load()


@pytest.fixture(scope="module")
def direct(data):
    """pycocoevalcap 1.2 called the way COCOEvalCap calls it."""
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.meteor.meteor import Meteor
    from pycocoevalcap.rouge.rouge import Rouge
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    preds, refs = data
    tok = PTBTokenizer()
    with contextlib.redirect_stdout(io.StringIO()):
        gts = tok.tokenize({i: [{"caption": c} for c in refs[i]] for i in preds})
        res = tok.tokenize({i: [{"caption": preds[i]}] for i in preds})
        bleu, _ = Bleu(4).compute_score(gts, res)
    meteor = Meteor()
    met, _ = meteor.compute_score(gts, res)
    del meteor
    rouge, _ = Rouge().compute_score(gts, res)
    cider, cider_per = Cider().compute_score(gts, res)
    scores = {"B-1": bleu[0], "B-2": bleu[1], "B-3": bleu[2], "B-4": bleu[3], "METEOR": met, "ROUGE-L": rouge,
              "CIDEr": cider}
    return {k: 100.0 * v for k, v in scores.items()}, dict(zip(gts.keys(), (100.0 * c for c in cider_per)))


@pytest.fixture(scope="module")
def ours(data, tmp_path_factory):
    preds, refs = data
    work = tmp_path_factory.mktemp("run")
    empty = tmp_path_factory.mktemp("no-jars")
    spice = SpiceConfig(work_dir=work, corenlp_dir=empty)
    return coco_metrics(preds, refs, spice=spice, tmp_dir=work / "tmp")


def test_every_metric_equals_direct_pycocoevalcap(ours, direct):
    want, _ = direct
    for name, value in want.items():
        assert ours.scores[name] == pytest.approx(value, abs=1e-9), name
    # sanity: a real ViECap-style system on COCO is in the usual range
    assert 40 < ours.scores["CIDEr"] < 150
    assert ours.n_images == 100


def test_per_image_cider_kept_for_the_gallery(ours, direct):
    _, per = direct
    assert set(ours.per_image) == set(per)
    for i, v in per.items():
        assert ours.per_image[i]["CIDEr"] == pytest.approx(v, abs=1e-9)
    assert all({"B-4", "METEOR", "ROUGE-L"} <= set(d) for d in ours.per_image.values())


def test_spice_missing_is_none_with_reason_never_zero(ours):
    assert ours.scores["SPICE"] is None
    assert "spice_jars" in ours.notes["SPICE"]
    d = ours.to_dict(per_image=False)
    assert d["scores"]["SPICE"] is None
    assert list(d["scores"]) == list(METRIC_NAMES)


def test_prediction_without_references_is_an_error_listing_ids(data):
    preds, refs = data
    preds = dict(preds)
    preds["not-an-image.jpg"] = "a cat"
    preds["another.jpg"] = "a dog"
    with pytest.raises(MissingReferences) as e:
        align(preds, refs)
    msg = str(e.value)
    assert "2 predicted image id(s) have no references" in msg and "not-an-image.jpg" in msg


def test_references_without_predictions_error_and_explicit_intersection(data):
    preds, refs = data
    some = dict(list(preds.items())[:60])
    with pytest.raises(MissingReferences, match="40 of 100 reference images have no prediction"):
        align(some, refs)
    p, r, notes = align(some, refs, on_missing="intersection")
    assert list(p) == list(some) and set(r) == set(some)
    assert "40 reference images" in notes["unpredicted_references"]


def test_tokenizer_keeps_lines_aligned_with_odd_characters(tmp_path):
    caps = {"a": ["A caf\u00e9 with two\rchairs.", "Line\nbreak here!"], "b": ["\u201cQuoted\u201d dog, running..."]}
    out = ptb_tokenize(caps, tmp_dir=tmp_path)
    assert out["a"][0].startswith("a caf\u00e9 with two chairs")
    assert out["a"][1] == "line break here"
    assert "dog" in out["b"][0] and "running" in out["b"][0]
    assert list(tmp_path.iterdir()) == []  # temp input removed
