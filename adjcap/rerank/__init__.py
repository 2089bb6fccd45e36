"""The method's only learned part: Borda-consensus pseudo-labels, the TriFuse and MemAttend heads
(a registry of head specs), the pickers (a registry), the three evaluation protocols, persistence
and diagnostics.

Works on the Arrow feature tables only (``image_id``, ``error``, ``candidates``, ``verified``):
reference captions are never read here.

Typical use::

    from adjcap.rerank import load_features, borda_targets, fit, pick, run_protocol
    feats = load_features("runs/x/features/coco-val", lm_feature="mean")
    q, target = borda_targets(feats.raw_scores, feats.mask)
    heads = fit(feats, cfg.rerank, device=fit_device(cfg.rerank.device, torch.cuda.is_available()))
    idx = pick(test_feats, "ensemble", heads, beta=0.75)
    applicability(test_feats, heads)      # picker -> None (can run) or why it cannot
    result = run_protocol(cfg, {"val": val_table, "test": test_table})
"""

from adjcap.rerank.borda import average_ranks, borda_targets, listwise_loss
from adjcap.rerank.diagnostics import agreement, differs_from_lm, loss_curves
from adjcap.rerank.features import BeamFeatures, load_features, read_feature_table, zscore
from adjcap.rerank.fitting import Fitted, fit, fit_device, fit_head, fit_heads, fit_memattend, fit_trifuse
from adjcap.rerank.heads import HEADS, Heads, HeadSpec, MemAttend, TriFuse, count_params, head_spec
from adjcap.rerank.pickers import (
    PICKERS,
    PickerSpec,
    applicability,
    applicable_pickers,
    get_picker,
    head_scores,
    pick,
    picked_texts,
    picker_names,
    picker_scores,
    register_picker,
)
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
    "HEADS",
    "HeadSpec",
    "Heads",
    "HeadsMismatchError",
    "MemAttend",
    "PICKERS",
    "Pick",
    "PickerSpec",
    "ProtocolResult",
    "TriFuse",
    "agreement",
    "applicability",
    "applicable_pickers",
    "average_ranks",
    "borda_targets",
    "count_params",
    "differs_from_lm",
    "fit",
    "fit_device",
    "fit_head",
    "fit_heads",
    "fit_memattend",
    "fit_trifuse",
    "get_picker",
    "head_scores",
    "head_spec",
    "holdout_split",
    "listwise_loss",
    "load_features",
    "load_heads",
    "loss_curves",
    "pick",
    "picked_texts",
    "picker_names",
    "picker_scores",
    "register_picker",
    "read_feature_table",
    "run_protocol",
    "save_heads",
    "select_alpha",
    "select_beta",
    "zscore",
]
