"""The method's only learned part: Borda-consensus pseudo-labels, the TriFuse and MemAttend heads,
fixed fusion / ensemble pickers, the three evaluation protocols, persistence and diagnostics.

Works on the Arrow feature tables only (``image_id``, ``error``, ``candidates``, ``verified``):
reference captions are never read here.

Typical use::

    from adjcap.rerank import load_features, borda_targets, fit, pick, run_protocol
    feats = load_features("runs/x/features/coco-val", lm_feature="mean")
    q, target = borda_targets(feats.raw_scores, feats.mask)
    heads = fit(feats, cfg)               # TriFuse + MemAttend, seed cfg.seed
    idx = pick(test_feats, "ensemble", heads, beta=0.75)
    result = run_protocol(cfg, {"val": val_table, "test": test_table})
"""

from adjcap.rerank.borda import average_ranks, borda_targets, listwise_loss
from adjcap.rerank.diagnostics import agreement, differs_from_lm, loss_curves
from adjcap.rerank.features import BeamFeatures, load_features, read_feature_table, zscore
from adjcap.rerank.fitting import Fitted, fit, fit_heads, fit_memattend, fit_trifuse
from adjcap.rerank.fusion import (
    LEARNED_PICKERS,
    PICKERS,
    TRAINING_FREE_PICKERS,
    head_scores,
    pick,
    picked_texts,
    picker_scores,
)
from adjcap.rerank.heads import Heads, MemAttend, TriFuse, count_params
from adjcap.rerank.persist import HeadsMismatchError, load_heads, save_heads
from adjcap.rerank.protocols import (
    ALPHA_GRID,
    BETA_GRID,
    Pick,
    ProtocolResult,
    holdout_split,
    run_protocol,
    select_alpha,
    select_beta,
)

__all__ = [
    "ALPHA_GRID",
    "BETA_GRID",
    "BeamFeatures",
    "Fitted",
    "Heads",
    "HeadsMismatchError",
    "LEARNED_PICKERS",
    "MemAttend",
    "PICKERS",
    "Pick",
    "ProtocolResult",
    "TRAINING_FREE_PICKERS",
    "TriFuse",
    "agreement",
    "average_ranks",
    "borda_targets",
    "count_params",
    "differs_from_lm",
    "fit",
    "fit_heads",
    "fit_memattend",
    "fit_trifuse",
    "head_scores",
    "holdout_split",
    "listwise_loss",
    "load_features",
    "load_heads",
    "loss_curves",
    "pick",
    "picked_texts",
    "picker_scores",
    "read_feature_table",
    "run_protocol",
    "save_heads",
    "select_alpha",
    "select_beta",
    "zscore",
]
