"""CLIPScore from embeddings and from the feature table's stored cosines."""

import math

import numpy as np
import pytest
import torch

from adjcap.engine.features import rows_to_table
from adjcap.metrics.clipscore import clipscore, clipscore_from_cosine, clipscore_from_features


def test_clipscore_from_embeddings():
    a = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [3.0, 4.0]])
    b = np.array([[2.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [4.0, 3.0]])
    got = clipscore(a, b)
    # identical direction -> 2.5; orthogonal -> 0; opposite -> clipped to 0; cos = 24/25
    assert got == pytest.approx([2.5, 0.0, 0.0, 2.5 * 24 / 25])
    assert float(clipscore(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 0.0]))) == pytest.approx(2.5 / math.sqrt(2))
    assert clipscore_from_cosine([0.3, -0.2], w=2.0) == pytest.approx([0.6, 0.0])
    with pytest.raises(ValueError, match="must match"):
        clipscore(np.ones((2, 3)), np.ones((2, 4)))
    with pytest.raises(ValueError, match="all zeros"):
        clipscore(np.zeros(3), np.ones(3))


def _cand(text, cos, rank):
    return {"text": text, "lm_logprob_sum": -3.0, "lm_logprob_mean": -0.5, "n_tokens": 6, "beam_rank": rank,
            "retrieval_cosine": cos, "verifier": 0.5}


def _row(image_id, cands, error=None):
    return {"image_id": image_id, "benchmark": "coco", "split": "test", "domain": None, "error": error,
            "retrieved": [], "verified": [], "entities": [], "prompt": "", "candidates": cands}


def test_clipscore_from_feature_rows_by_index_and_text():
    table = rows_to_table([
        _row("a", [_cand("a dog", 0.30, 0), _cand("a cat", 0.40, 1)]),
        _row("b", [_cand("a car", -0.10, 0), _cand("a bus", 0.20, 1)]),
        _row("c", [], error="image unreadable"),
        _row("d", [_cand("a kite", float("nan"), 0)]),
    ])
    r = clipscore_from_features(table, {"a": 1, "b": "a car", "c": 0, "d": 0, "e": 0})
    assert r.per_image == pytest.approx({"a": 2.5 * 0.40, "b": 0.0})
    assert r.mean == pytest.approx((1.0 + 0.0) / 2)
    assert r.n_images == 2 and r.n_missing == 3  # error row, NaN cosine, unknown image: never 0
    assert r.to_dict()["CLIPScore"] == pytest.approx(0.5)
    none = clipscore_from_features(table, {"c": 0})
    assert none.mean is None and none.n_missing == 1
    assert r.source == "retrieval_cosine"  # a table without CLIPScore-encoder cosines: the output scorer's


def test_clipscore_uses_the_fixed_clipscore_encoders_cosine():
    rows = [_row("a", [_cand("a dog", 0.30, 0), _cand("a cat", 0.40, 1)]),
            _row("b", [_cand("a car", 0.10, 0)])]
    for row, own in zip(rows, ([0.20, 0.50], [-0.3])):
        for c, v in zip(row["candidates"], own):
            c["clipscore_cosine"] = v
    r = clipscore_from_features(rows_to_table(rows), {"a": 1, "b": 0})
    assert r.source == "clipscore_cosine" and r.to_dict()["source"] == "clipscore_cosine"
    assert r.per_image == pytest.approx({"a": 2.5 * 0.50, "b": 0.0})
