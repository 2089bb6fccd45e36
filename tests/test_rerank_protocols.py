"""The three protocols, hyperparameter selection on a held-out part of the fit table, and the
prediction table."""

import pyarrow as pa
import pytest

from adjcap.config import ConfigError, load_config
from adjcap.engine.features import PREDICTION_SCHEMA, rows_to_table
from adjcap.rerank import (
    ALPHA_GRID,
    BETA_GRID,
    holdout_split,
    load_features,
    pick,
    run_protocol,
    save_heads,
    load_heads,
)
from adjcap.demo.synthetic import synthetic_feature_rows

FAST = ["rerank.trifuse.epochs=8", "rerank.memattend.epochs=3"]


@pytest.fixture(scope="module")
def tables():
    return {
        "val": rows_to_table(synthetic_feature_rows(40, 8, seed=11, split="val", short_every=6)),
        "test": rows_to_table(synthetic_feature_rows(30, 8, seed=12, split="test", error_every=10)),
    }


def test_training_free_fixed(tables):
    cfg = load_config("training-free")
    res = run_protocol(cfg, tables)
    assert res.protocol == "training-free" and res.picker == "fixed" and res.heads is None and res.fit_split is None
    test = load_features(tables["test"])
    want = pick(test, "fixed", alpha=0.48)
    got = [res.picks["test"][iid].index for iid in test.image_ids]
    assert got == want.tolist()
    assert len(res.failed["test"]) == 3 and all(i not in res.picks["test"] for i in res.failed["test"])
    pred = res.predictions("test")
    assert pred.schema == PREDICTION_SCHEMA and pred.num_rows == 27
    assert set(pred.column("picker").to_pylist()) == {"fixed"}
    assert 0.0 <= res.diagnostics["test"]["differs_from_lm"] <= 1.0


def test_learned_picker_refused_without_training(tables):
    with pytest.raises(ConfigError, match="training-free"):  # when the config loads, before any work
        load_config("training-free", ["rerank.picker=ensemble"])
    cfg = load_config("training-free")  # and by the protocol, for a config made without that check
    cfg = cfg.model_copy(update={"rerank": cfg.rerank.model_copy(update={"picker": "ensemble"})})
    with pytest.raises(ValueError, match="training-free"):
        run_protocol(cfg, tables)


def test_inductive_fits_on_val_and_applies_frozen_to_test(tables):
    cfg = load_config("headline", FAST)
    res = run_protocol(cfg, tables)
    assert res.fit_split == "val" and res.apply_split == "test" and res.n_fit_images == 40
    assert len(res.losses["trifuse"]) == 8 and len(res.losses["memattend"]) == 3
    # the same heads applied directly give the same picks: nothing of test entered the fit
    test = load_features(tables["test"])
    assert [res.picks["test"][i].index for i in test.image_ids] == pick(test, "ensemble", res.heads, beta=0.75).tolist()
    # fitting on val alone gives byte-identical picks on test (test features played no role)
    alone = run_protocol(cfg, {"val": tables["val"], "test": tables["test"].slice(0, 5)})
    for iid, p in alone.picks["test"].items():
        assert res.picks["test"][iid] == p
    d = res.diagnostics["test"]
    assert 0.0 <= d["agreement_trifuse_memattend"] <= 1.0 and "memattend_differs_from_lm" in d
    with pytest.raises(KeyError, match="fit_split"):
        run_protocol(cfg, {"test": tables["test"]})


def test_transductive_fits_on_the_apply_split(tables):
    cfg = load_config("transductive", FAST)
    res = run_protocol(cfg, {"test": tables["test"]})
    assert res.fit_split == "test" and res.n_fit_images == 27
    assert res.heads.meta["fit_split"] == "test"


def test_selection_by_borda_loss_on_held_out_fit_images(tables):
    cfg = load_config("headline", FAST + ["rerank.select=true", "rerank.holdout_fraction=0.25"])
    res = run_protocol(cfg, tables)
    sel = res.selection
    assert sel["holdout_images"] == 10 and sel["rest_images"] == 30 and sel["fit_split"] == "val"
    assert len(sel["alpha"]["loss"]) == len(ALPHA_GRID) == 51 and len(sel["beta"]["loss"]) == len(BETA_GRID) == 21
    assert res.alpha == ALPHA_GRID[sel["alpha"]["loss"].index(min(sel["alpha"]["loss"]))]
    assert res.beta == BETA_GRID[sel["beta"]["loss"].index(min(sel["beta"]["loss"]))]
    # the selection only looks at the fit table: changing the test table does not change it
    res2 = run_protocol(cfg, {"val": tables["val"], "test": tables["test"].slice(0, 4)})
    assert (res2.alpha, res2.beta) == (res.alpha, res.beta)
    # training-free fixed fusion selects alpha on the fit split too
    tf = run_protocol(load_config("training-free", ["rerank.select=true", "rerank.holdout_fraction=0.25"]), tables)
    assert tf.alpha == res.alpha and tf.heads is None


def test_holdout_split_is_seeded_by_image_id():
    ids = [f"img{i}" for i in range(50)]
    rest, hold = holdout_split(ids, 0.2, seed=42)
    assert len(hold) == 10 and len(rest) == 40 and set(rest).isdisjoint(hold)
    r2, h2 = holdout_split(list(reversed(ids)), 0.2, seed=42)
    assert sorted(ids[i] for i in hold) == sorted(list(reversed(ids))[i] for i in h2)
    _, h3 = holdout_split(ids, 0.2, seed=7)
    assert set(h3) != set(hold)


def test_apply_saved_heads(tables, tmp_path):
    cfg = load_config("headline", FAST)
    res = run_protocol(cfg, tables)
    save_heads(tmp_path, res.heads)
    again = run_protocol(cfg, {"test": tables["test"]}, heads=load_heads(tmp_path, cfg))
    assert again.picks["test"] == res.picks["test"]
