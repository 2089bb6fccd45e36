"""A 100,000-character caption must not take the evaluation down (METEOR's Java used to run out of
memory and lose every metric), and a METEOR failure loses METEOR only."""

import json

import pytest

from adjcap.metrics.coco import score_tokenized
from adjcap.metrics.evaluate import evaluate_predictions
from adjcap.metrics.meteor import MAX_METEOR_CHARS, MeteorScorer, meteor_scores

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LONG = " ".join(["a", "dog", "runs", "on", "the", "grass", "near", "some", "trees"] * 3000)[:100_000]


def test_a_100k_character_caption_is_cut_for_meteor_and_everything_is_scored(tmp_path, small_coco):
    pred, refs, caps = small_coco
    rows = json.loads(pred.read_text())
    rows[0]["caption"] = LONG
    pred.write_text(json.dumps(rows))
    rep = evaluate_predictions(pred, refs, fmt="coco")
    assert all(rep["metrics"][m] is not None for m in ("B-4", "METEOR", "ROUGE-L", "CIDEr"))
    assert rep["n_images"] == len(rows)
    assert "1 captions longer than" in rep["notes"]["METEOR"] and "cut" in rep["notes"]["METEOR"]
    assert set(rep["per_image"]) == {str(r["image_id"]) for r in rows}


def test_meteor_failure_reports_meteor_missing_and_keeps_the_rest():
    gts = {"1": ["a dog running on grass", "a brown dog in a field"], "2": ["a cat on a sofa"]}
    res = {"1": ["a dog runs on the grass"], "2": ["a cat sitting on a couch"]}
    # a heap too small to load METEOR's paraphrase table: the JVM dies, as it did on the long caption
    with MeteorScorer(mem="16m") as tiny:
        out = score_tokenized(gts, res, meteor=tiny)
    assert out.scores["METEOR"] is None
    assert out.notes["METEOR"].startswith("n/a: METEOR") and "\n" not in out.notes["METEOR"]
    assert all(out.scores[m] is not None for m in ("B-4", "ROUGE-L", "CIDEr"))


def test_long_references_are_cut_too_and_counted():
    gts = {"1": ["a dog running on grass", LONG]}
    res = {"1": [LONG]}
    with MeteorScorer(mem="16m") as tiny:  # never started for real: the JVM dies, the count is still said
        out = meteor_scores(gts, res, meteor=tiny)
    assert out.score is None and f"2 captions longer than {MAX_METEOR_CHARS}" in out.note
