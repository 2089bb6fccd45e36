"""Pickers: LM = the beam's first choice, ties -> lowest beam rank, fixed alpha z-mix, ensemble,
diagnostics; the picker registry and which pickers apply to a table."""

import numpy as np
import pytest
import torch

from adjcap.engine.features import empty_row, rows_to_table
from adjcap.rerank import (
    Heads,
    MemAttend,
    PICKERS,
    TriFuse,
    agreement,
    applicability,
    applicable_pickers,
    differs_from_lm,
    head_scores,
    load_features,
    pick,
    picked_texts,
    picker_names,
    picker_scores,
    register_picker,
    zscore,
)
from adjcap.config import RerankCfg, load_config
from adjcap.demo.synthetic import synthetic_feature_rows


def _row(iid, cands):
    r = empty_row(iid, "coco", "test", None, None)
    r["candidates"] = [
        {
            "text": t,
            "lm_logprob_sum": lm * 4,
            "lm_logprob_mean": lm,
            "n_tokens": 4,
            "beam_rank": rank,
            "retrieval_cosine": cos,
            "verifier": ver,
        }
        for t, lm, cos, ver, rank in cands
    ]
    return r


def test_single_scorer_pickers_and_tie_rule():
    rows = [
        # candidates are listed out of beam order on purpose
        _row("a", [("a0", -1.5, 0.20, 0.1, 2), ("a1", -1.0, 0.10, 0.9, 0), ("a2", -1.2, 0.40, 0.3, 1)]),
        # LM tie between b0 (beam rank 1) and b2 (beam rank 0): the lower beam rank wins
        _row("b", [("b0", -1.0, 0.3, 0.5, 1), ("b1", -2.0, 0.3, 0.5, 2), ("b2", -1.0, 0.3, 0.5, 3)]),
    ]
    rows[1]["candidates"][2]["beam_rank"] = 0
    f = load_features(rows_to_table(rows))
    assert pick(f, "lm").tolist() == [1, 2]
    assert pick(f, "retrieval").tolist() == [2, 2]  # image b: all cosines tie -> beam rank 0
    assert pick(f, "verifier").tolist() == [1, 2]
    assert picked_texts(f, pick(f, "retrieval")) == ["a2", "b2"]


def test_lm_pick_is_the_beams_first_choice_with_mean_feature():
    f = load_features(rows_to_table(synthetic_feature_rows(50, 8, seed=4, short_every=7)), lm_feature="mean")
    idx = pick(f, "lm")
    assert all(int(f.beam_rank[i, j]) == 0 for i, j in enumerate(idx))
    assert differs_from_lm(idx, f) == 0.0


def test_fixed_alpha_mix():
    f = load_features(rows_to_table(synthetic_feature_rows(30, 10, seed=9)))
    for alpha in (0.0, 0.48, 1.0):
        want = alpha * zscore(f.raw_scores[..., 0], f.mask) + (1 - alpha) * zscore(f.raw_scores[..., 1], f.mask)
        assert pick(f, "fixed", alpha=alpha).tolist() == want.argmax(dim=1).tolist()
    assert pick(f, "fixed", alpha=1.0).tolist() == pick(f, "lm").tolist()
    assert pick(f, "fixed", alpha=0.0).tolist() == pick(f, "retrieval").tolist()


def test_ensemble_and_head_pickers():
    f = load_features(rows_to_table(synthetic_feature_rows(25, 10, seed=2, short_every=4)))
    torch.manual_seed(0)
    heads = Heads(trifuse=TriFuse().eval(), memattend=MemAttend().eval())
    t, m = head_scores(f, heads.trifuse), head_scores(f, heads.memattend)
    s = picker_scores(f, "ensemble", heads, beta=0.75)
    want = 0.75 * zscore(t, f.mask) + 0.25 * zscore(m, f.mask)
    torch.testing.assert_close(s[f.mask].float(), want[f.mask])
    assert torch.isinf(s[~f.mask]).all()
    assert pick(f, "ensemble", heads, beta=1.0).tolist() == pick(f, "trifuse", heads).tolist()
    assert pick(f, "ensemble", heads, beta=0.0).tolist() == pick(f, "memattend", heads).tolist()
    assert pick(f, heads).tolist() == pick(f, "ensemble", heads).tolist()  # pick(features, heads)
    idx = pick(f, "ensemble", heads)
    assert all(bool(f.mask[i, j]) for i, j in enumerate(idx))  # never a padded slot
    with pytest.raises(ValueError, match="trifuse"):
        pick(f, "trifuse")
    with pytest.raises(ValueError, match="unknown picker"):
        pick(f, "cider")


def test_verifier_picker_without_verifier_scores_is_an_error():
    rows = [_row("a", [("x", -1.0, 0.2, float("nan"), 0), ("y", -2.0, 0.3, float("nan"), 1)])]
    f = load_features(rows_to_table(rows))
    with pytest.raises(ValueError, match="verifier"):
        pick(f, "verifier")
    assert pick(f, "fixed").tolist() in ([0], [1])


def test_agreement():
    assert agreement([1, 2, 3, 4], [1, 0, 3, 0]) == 0.5
    assert agreement({"a": 1, "b": 2}, {"b": 2, "a": 0, "c": 5}) == 0.5
    with pytest.raises(ValueError):
        agreement([1, 2], [1])
    assert np.isnan(agreement([], []))


def test_short_beam_picks_the_same_alone_or_padded_in_a_batch():
    rows = synthetic_feature_rows(8, 12, seed=21, short_every=2)
    both = load_features(rows_to_table(rows))
    torch.manual_seed(3)
    heads = Heads(trifuse=TriFuse().eval(), memattend=MemAttend().eval())
    for r in rows:
        if len(r["candidates"]) == 12:
            continue
        alone = load_features(rows_to_table([r]))
        i = both.image_ids.index(r["image_id"])
        k = len(r["candidates"])
        for name in ("trifuse", "memattend"):
            torch.testing.assert_close(
                head_scores(both, getattr(heads, name))[i, :k], head_scores(alone, getattr(heads, name))[0],
                atol=1e-5, rtol=1e-5,
            )
        for picker in ("lm", "fixed", "trifuse", "memattend", "ensemble"):
            assert int(pick(both, picker, heads)[i]) == int(pick(alone, picker, heads)[0]), picker


def test_picker_registry_declares_needs_and_names_unknown_ones():
    assert picker_names() == ["lm", "retrieval", "verifier", "fixed", "trifuse", "memattend", "ensemble"]
    assert picker_names(learned=True) == ["trifuse", "memattend", "ensemble"]
    assert picker_names(learned=False) == ["lm", "retrieval", "verifier", "fixed"]
    assert PICKERS.get("ensemble").heads == ("trifuse", "memattend")
    assert PICKERS.get("verifier").scorers == ("verifier",)
    with pytest.raises(ValueError, match=r"unknown picker 'ensembel'; did you mean 'ensemble'\? \(known: lm, retrieval,"):
        pick(load_features(rows_to_table(synthetic_feature_rows(2, 3, seed=0))), "ensembel")
    with pytest.raises(ValueError, match="already registered"):
        register_picker("lm")(lambda ctx: None)
    with pytest.raises(ValueError, match="unknown scorer 'clip'"):
        register_picker("new", scorers=("clip",))
    assert "new" not in PICKERS


def test_every_declared_picker_has_its_scoring_function_and_the_config_checks_without_torch():
    """adjcap/picker_needs.py declares the pickers (what the config checks); adjcap.rerank.pickers
    gives each its function: the two lists are one."""
    import subprocess
    import sys

    from adjcap.picker_needs import PICKER_NEEDS

    assert PICKER_NEEDS.names() == PICKERS.names()
    assert all(PICKERS.get(n).scorers == PICKER_NEEDS.get(n).scorers for n in PICKERS)
    code = ("import sys; from adjcap.config import load_config; load_config('ifcap', ['rerank.picker=lm']); "
            "assert 'torch' not in sys.modules, 'checking a config imported torch'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_config_picker_is_checked_against_the_registry():
    for name in picker_names():
        assert RerankCfg(picker=name).picker == name
    with pytest.raises(ValueError, match=r"did you mean 'verifier'\? \(known: lm, retrieval, verifier"):
        RerankCfg(picker="verifer")
    assert load_config("ifcap").rerank.picker in PICKERS


def test_applicable_pickers_skip_absent_verifier_and_missing_heads():
    # a table from a run without a verifier: every verifier score is NaN
    rows = [
        _row("a", [("x", -1.0, 0.2, float("nan"), 0), ("y", -2.0, 0.3, float("nan"), 1)]),
        _row("b", [("x", -1.5, 0.1, float("nan"), 0), ("z", -1.0, 0.4, float("nan"), 1)]),
    ]
    f = load_features(rows_to_table(rows))
    why = applicability(f)
    assert why["verifier"] == "the feature table has no finite verifier scores"
    assert why["trifuse"] == "needs a fitted trifuse head" and why["ensemble"] == "needs fitted trifuse and memattend heads"
    assert applicable_pickers(f) == ["lm", "retrieval", "fixed"]
    for name in applicable_pickers(f):  # each applicable picker really runs
        assert pick(f, name).shape == (2,)
    torch.manual_seed(0)
    only_tri = Heads(trifuse=TriFuse().eval())
    assert applicable_pickers(f, only_tri) == ["lm", "retrieval", "fixed", "trifuse"]
    assert applicability(f, only_tri)["ensemble"] == "needs a fitted memattend head"
    both = Heads(trifuse=TriFuse().eval(), memattend=MemAttend().eval())
    assert applicable_pickers(f, both) == ["lm", "retrieval", "fixed", "trifuse", "memattend", "ensemble"]
    # with verifier scores present, the verifier picker applies
    g = load_features(rows_to_table(synthetic_feature_rows(3, 4, seed=1)))
    assert applicable_pickers(g, both) == picker_names()
