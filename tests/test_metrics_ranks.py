"""Rank statistics: Spearman with ties, the retrieval-verifier correlation, pick agreement."""

import math

import numpy as np
import pytest

from adjcap.engine.features import rows_to_table
from adjcap.metrics.ranks import (
    pairwise_agreement,
    pick_disagreement,
    rankdata,
    retrieval_verifier_spearman,
    spearman,
    top1_agreement,
)


def test_rankdata_averages_ties():
    assert rankdata([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert rankdata([3, 3, 3]).tolist() == [2.0, 2.0, 2.0]


def test_spearman_matches_textbook_values():
    # no ties: rho = 1 - 6 sum d^2 / (n (n^2 - 1)); d = [0, -1, 1, 0, 0] -> 1 - 12/120 = 0.9
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    # ties: Pearson of average ranks; x ranks [1, 2.5, 2.5, 4], y ranks [1, 3, 2, 4]
    # -> 4.5 / sqrt(4.5 * 5) = 0.9486833 (scipy.stats.spearmanr gives the same)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9486832980505138, abs=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))  # constant side: undefined
    assert math.isnan(spearman([1], [2]))
    assert spearman([1, 2, float("nan"), 3], [1, 2, 9, 3]) == pytest.approx(1.0)  # NaN pair dropped


def test_spearman_against_random_reference_formula():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x, y = rng.normal(size=9), rng.normal(size=9)  # continuous: no ties
        rx, ry = np.argsort(np.argsort(x)), np.argsort(np.argsort(y))
        want = 1 - 6 * np.sum((rx - ry) ** 2) / (9 * 80)
        assert spearman(x, y) == pytest.approx(want, abs=1e-12)


def _row(image_id, cosines, verified, error=None, **extra):
    row = {
        "image_id": image_id, "benchmark": "coco", "split": "test", "domain": None, "error": error,
        "retrieved": [{"corpus_id": k, "text": f"c{k}", "cosine": c} for k, c in enumerate(cosines)],
        "verified": [{"corpus_id": r, "text": f"c{r}", "verifier": v, "retrieval_rank": r} for r, v in verified],
        "entities": [], "prompt": "", "candidates": [],
    }
    row.update(extra)
    return row


def test_retrieval_verifier_spearman_over_verified_pairs_from_a_feature_table():
    rows = [
        # verified captions at retrieval ranks 0,1,2 with verifier order equal to cosine order: rho 1
        _row("a", [0.9, 0.8, 0.7, 0.6], [(0, 0.9), (1, 0.5), (2, 0.1)]),
        # reversed: rho -1
        _row("b", [0.9, 0.8, 0.7, 0.6], [(0, 0.1), (1, 0.5), (3, 0.9)]),
        _row("c", [], [], error="decode failed"),
        _row("d", [0.5, 0.4], [(0, 0.3)]),  # one pair: undefined
    ]
    table = rows_to_table(rows)
    s = retrieval_verifier_spearman(table)
    assert s["mean"] == pytest.approx(0.0) and s["std"] == pytest.approx(1.0)
    assert s["n_images"] == 2 and s["n_undefined"] == 1 and s["source"] == "verified"
    assert s["pairs_per_image"] == pytest.approx(3.0)


def test_retrieval_verifier_spearman_uses_all_l_when_available():
    row = _row("a", [0.9, 0.8, 0.7, 0.6], [(0, 0.9)], retrieved_verifier=[0.4, 0.3, 0.2, 0.1])
    s = retrieval_verifier_spearman([row])
    assert s["mean"] == pytest.approx(1.0) and s["source"] == "retrieved" and s["pairs_per_image"] == 4


def test_pick_disagreement_and_agreement():
    picks = {
        "lm": {"a": 0, "b": 0, "c": 0, "d": 0},
        "trifuse": {"a": 0, "b": 3, "c": 5, "d": 0},
        "memattend": {"a": 0, "b": 3, "c": 1, "d": 2},
    }
    assert pick_disagreement(picks) == {"trifuse": 0.5, "memattend": 0.75}
    assert top1_agreement(picks["trifuse"], picks["memattend"]) == 0.5
    assert pairwise_agreement(picks)["lm"]["lm"] == 1.0
    assert top1_agreement({"a": 1}, {"b": 1}) is None
    with pytest.raises(KeyError, match="reference picker"):
        pick_disagreement({"x": {}}, reference="lm")
