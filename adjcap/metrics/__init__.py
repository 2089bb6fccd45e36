"""Caption metrics: COCO metrics through pycocoevalcap (BLEU, METEOR, ROUGE-L, CIDEr), SPICE,
CLIPScore, the reference-proxy CHAIR, rank statistics, NoCaps domains, and the evaluation engine.

Submodules are imported on use; the names below are the public API.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "MetricResult": "adjcap.metrics.coco",
    "coco_metrics": "adjcap.metrics.coco",
    "coco_metrics_by_domain": "adjcap.metrics.coco",
    "METRIC_NAMES": "adjcap.metrics.coco",
    "MissingReferences": "adjcap.metrics.coco",
    "MetricError": "adjcap.java.runtime",
    "JavaUnavailable": "adjcap.java.runtime",
    "SpiceConfig": "adjcap.java.corenlp",
    "SpiceUnavailable": "adjcap.java.corenlp",
    "compute_spice": "adjcap.metrics.spice",
    "spice_status": "adjcap.java.corenlp",
    "clipscore": "adjcap.metrics.clipscore",
    "clipscore_from_features": "adjcap.metrics.clipscore",
    "ChairMatcher": "adjcap.metrics.chair",
    "chair_proxy": "adjcap.metrics.chair",
    "spearman": "adjcap.metrics.ranks",
    "retrieval_verifier_spearman": "adjcap.metrics.ranks",
    "pick_disagreement": "adjcap.metrics.ranks",
    "top1_agreement": "adjcap.metrics.ranks",
    "Evaluator": "adjcap.metrics.evaluate",
    "evaluate_predictions": "adjcap.metrics.evaluate",
    "evaluate_run": "adjcap.metrics.run_metrics",
    "format_table": "adjcap.metrics.evaluate",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'adjcap.metrics' has no attribute '{name}'")
    import importlib

    return getattr(importlib.import_module(mod), name)
