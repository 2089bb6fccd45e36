"""The three evaluation protocols of the learned reranker (paper, "Evaluation protocols") and the
hyperparameter selection by Borda pseudo-label loss ("Hyperparameter selection criterion").

* ``training-free``: no fit. Pickers ``lm``, ``retrieval``, ``verifier`` or ``fixed`` only.
* ``inductive``: fit the heads on ``tables[rerank.fit_split]`` (e.g. val), apply them frozen to
  ``tables[rerank.apply_split]`` (e.g. test).
* ``transductive``: fit and apply on ``tables[rerank.apply_split]`` (upper bound).

Picks are produced for every table passed in (the picker is a pure function once fitted); the split
the protocol is evaluated on is ``apply_split``.

With ``rerank.select``: the fit table's images are split by image id (seeded with ``Config.seed``)
into a held-out part (``rerank.holdout_fraction``) and the rest. alpha (grid 0..1, step 0.02) is the
value whose z-mix alpha z(LM) + (1-alpha) z(cos) has the lowest listwise loss against the Borda
target on the held-out part; for learned pickers the heads are fit on the rest and beta (grid 0..1,
step 0.05) is chosen the same way from beta z(TriFuse) + (1-beta) z(MemAttend); the final heads are
then refit on the whole fit table. Ties go to the smaller grid value.

With ``rerank.seeds``: the heads are fitted once per listed seed on the same fit features (the run's
own ``seed`` reuses the heads above), with the same alpha and beta (``ProtocolResult.seed_heads``). References are never read:
only ``image_id``, ``error``, ``candidates`` and ``verified`` columns are.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from adjcap.config import Config
from adjcap.engine.features import PREDICTION_SCHEMA
from adjcap.registry import check
from adjcap.rerank.borda import borda_targets, listwise_loss
from adjcap.rerank.diagnostics import agreement, differs_from_lm
from adjcap.rerank.features import BeamFeatures, load_features, zscore
from adjcap.rerank.fitting import fit_heads
from adjcap.rerank.pickers import get_picker, head_scores, pick, picker_names
from adjcap.rerank.heads import Heads

PROTOCOLS = ("training-free", "inductive", "transductive")
ALPHA_GRID = np.round(np.arange(51) * 0.02, 10)
BETA_GRID = np.round(np.arange(21) * 0.05, 10)


@dataclass(frozen=True)
class Pick:
    index: int  # index into the feature row's ``candidates`` list
    caption: str


@dataclass
class ProtocolResult:
    protocol: str
    picker: str
    fit_split: str | None  # None: nothing was fit
    apply_split: str
    alpha: float
    beta: float
    picks: dict[str, dict[str, Pick]]  # split -> image_id -> Pick
    failed: dict[str, list[str]]  # split -> image ids that have no pick (error rows)
    heads: Heads | None = None
    losses: dict[str, list[float]] = field(default_factory=dict)  # head -> per-epoch training loss
    selection: dict[str, Any] = field(default_factory=dict)
    diagnostics: dict[str, dict[str, float]] = field(default_factory=dict)  # split -> name -> value
    n_fit_images: int = 0
    # the seed study (rerank.seeds): seed -> heads fitted with that seed on the same fit features
    seed_heads: dict[int, Heads] = field(default_factory=dict)

    def predictions(self, split: str | None = None) -> pa.Table:
        """The picks of ``split`` (default: the apply split) as a PREDICTION_SCHEMA table."""
        split = split or self.apply_split
        if split not in self.picks:
            raise KeyError(f"no picks for split {split!r}; have {sorted(self.picks)}")
        items = self.picks[split]
        return pa.table(
            {
                "image_id": pa.array(list(items), pa.string()),
                "caption": pa.array([p.caption for p in items.values()], pa.string()),
                "picker": pa.array([self.picker] * len(items), pa.string()),
                "candidate_index": pa.array([p.index for p in items.values()], pa.int32()),
            },
            schema=PREDICTION_SCHEMA,
        )

    def summary(self) -> dict[str, Any]:
        """JSON-friendly summary (no per-image picks)."""
        return {
            "protocol": self.protocol,
            "picker": self.picker,
            "fit_split": self.fit_split,
            "apply_split": self.apply_split,
            "alpha": self.alpha,
            "beta": self.beta,
            "n_fit_images": self.n_fit_images,
            "n_picks": {s: len(p) for s, p in self.picks.items()},
            "n_failed": {s: len(f) for s, f in self.failed.items()},
            "losses": self.losses,
            "selection": self.selection,
            "diagnostics": self.diagnostics,
            **({"seeds": sorted(self.seed_heads)} if self.seed_heads else {}),
        }


# --------------------------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------------------------


def holdout_split(image_ids: list[str], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(rest, held-out) row indices. Each image goes to the held-out part by a seeded hash of its
    id, ranked so that exactly round(fraction * n) images are held out (at least 1, and at least 1
    left when n >= 2); independent of row order."""
    n = len(image_ids)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    keys = [hashlib.sha256(f"{seed}:{iid}".encode()).hexdigest() for iid in image_ids]
    order = sorted(range(n), key=lambda i: keys[i])
    k = int(round(fraction * n))
    k = max(1, min(k, n - 1)) if n >= 2 else 1
    hold = np.sort(np.asarray(order[:k], dtype=np.int64))
    rest = np.sort(np.asarray(order[k:], dtype=np.int64))
    return rest, hold


def _grid_losses(mix: Callable[[float], torch.Tensor], grid: np.ndarray, feats: BeamFeatures) -> list[float]:
    _, target = borda_targets(feats.raw_scores, feats.mask)
    out = []
    for g in grid:
        s = mix(float(g)).to(torch.float32)
        out.append(float(listwise_loss(s, target, feats.mask)))
    return out


def select_alpha(feats: BeamFeatures, grid: np.ndarray = ALPHA_GRID) -> tuple[float, list[float]]:
    """alpha minimising the Borda pseudo-label loss of alpha z(LM) + (1-alpha) z(cos) on ``feats``."""
    zl, zc = feats.scores[..., 0].double(), feats.scores[..., 1].double()
    losses = _grid_losses(lambda a: a * zl + (1.0 - a) * zc, grid, feats)
    return float(grid[int(np.argmin(losses))]), losses


def select_beta(feats: BeamFeatures, heads: Heads, grid: np.ndarray = BETA_GRID) -> tuple[float, list[float]]:
    """beta minimising the Borda pseudo-label loss of beta z(TriFuse) + (1-beta) z(MemAttend)."""
    if heads.trifuse is None or heads.memattend is None:
        raise ValueError("select_beta needs both a TriFuse and a MemAttend head")
    zt = zscore(head_scores(feats, heads.trifuse), feats.mask).double()
    zm = zscore(head_scores(feats, heads.memattend), feats.mask).double()
    losses = _grid_losses(lambda b: b * zt + (1.0 - b) * zm, grid, feats)
    return float(grid[int(np.argmin(losses))]), losses


# --------------------------------------------------------------------------------------------
# Protocols
# --------------------------------------------------------------------------------------------


def _table_for(tables: dict[str, Any], split: str, role: str) -> Any:
    if split not in tables:
        raise KeyError(
            f"rerank.{role} = {split!r} but no feature table for split {split!r} was given "
            f"(have: {', '.join(sorted(tables)) or 'none'}); run the benchmark on that split or change rerank.{role}"
        )
    return tables[split]


def _learned(protocol: str, picker: str) -> bool:
    """Whether the picker needs fitted heads; a learned picker under training-free is an error."""
    check(protocol, PROTOCOLS, "rerank.protocol")
    learned = get_picker(picker).learned
    if protocol == "training-free" and learned:
        raise ValueError(
            f"rerank.picker = {picker!r} needs fitted heads but rerank.protocol = 'training-free' fits nothing; "
            f"use a training-free picker ({', '.join(picker_names(learned=False))}) or protocol inductive/transductive"
        )
    return learned


def _fit_split(r: Any) -> str | None:
    """The split heads (and alpha, beta) are fitted on: fit_split (inductive), apply_split (transductive)."""
    if r.protocol == "inductive":
        return r.fit_split
    if r.protocol == "transductive":
        return r.apply_split
    return r.fit_split if r.select else None  # training-free: alpha is still chosen on a held-out beam dump


def _fit_features(tables: dict[str, Any], feats: dict[str, BeamFeatures], fit_split: str | None, r: Any,
                  needs_fit: bool) -> BeamFeatures | None:
    """The fit split's features when something is fitted or selected on them (None otherwise)."""
    if fit_split is None or not (needs_fit or r.select):
        return None
    _table_for(tables, fit_split, "fit_split" if r.protocol != "transductive" else "apply_split")
    fit_feats = feats[fit_split]
    if fit_feats.n_images == 0:
        raise ValueError(f"split {fit_split!r}: no usable feature rows to fit on (all {len(fit_feats.failed_ids)} failed)")
    return fit_feats


def _select_weights(cfg: Config, fit_feats: BeamFeatures | None, fit_split: str | None, needs_fit: bool,
                    device: str) -> tuple[float, float, dict[str, Any]]:
    """(alpha, beta, the selection's record): the configured values, or with rerank.select those with
    the lowest Borda loss on a held-out part of the fit table (beta only for the ensemble being fitted)."""
    r = cfg.rerank
    alpha, beta = float(r.alpha), float(r.beta)
    if not r.select or fit_feats is None:
        return alpha, beta, {}
    rest, hold = holdout_split(fit_feats.image_ids, r.holdout_fraction, cfg.seed)
    hold_feats = fit_feats.subset(hold)
    alpha, a_losses = select_alpha(hold_feats)
    selection: dict[str, Any] = {
        "criterion": "Borda pseudo-label listwise loss on a held-out part of the fit table",
        "fit_split": fit_split,
        "holdout_images": int(len(hold)),
        "rest_images": int(len(rest)),
        "alpha": {"grid": ALPHA_GRID.tolist(), "loss": a_losses, "chosen": alpha},
    }
    if needs_fit and r.picker == "ensemble" and len(rest) > 0:
        probe = fit_heads(fit_feats.subset(rest), r, seed=cfg.seed, device=device)
        beta, b_losses = select_beta(hold_feats, probe)
        selection["beta"] = {"grid": BETA_GRID.tolist(), "loss": b_losses, "chosen": beta}
    return alpha, beta, selection


def _fitted_heads(cfg: Config, fit_feats: BeamFeatures | None, fit_split: str | None, heads: Heads | None,
                  learned: bool, weights: dict[str, Any], device: str) -> tuple[Heads | None, dict[int, Heads]]:
    """(the heads the picker uses, the heads per rerank.seeds seed): given heads are used as they are;
    ``weights`` (alpha, beta, lm_feature) are recorded in each head's meta."""
    r = cfg.rerank
    used_heads: Heads | None = heads
    if learned and used_heads is None:
        assert fit_feats is not None
        used_heads = fit_heads(fit_feats, r, seed=cfg.seed, device=device)
        used_heads.meta.update({"fit_split": fit_split, "protocol": r.protocol, "rerank": r.meta()})
    if used_heads is not None:
        used_heads.meta.update(weights)
    seed_heads: dict[int, Heads] = {}
    if learned and heads is None and r.seeds is not None:
        assert fit_feats is not None and used_heads is not None
        for s in r.seed_list(cfg.seed):  # the run's own seed is the heads above (the same fit)
            seed_heads[s] = used_heads if s == cfg.seed else fit_heads(fit_feats, r, seed=s, device=device)
            seed_heads[s].meta.update(weights)
    return used_heads, seed_heads


def _split_diagnostics(f: BeamFeatures, idx: Any, heads: Heads | None) -> dict[str, float]:
    """How often a split's picks differ from LM-only (and, with both heads, TriFuse's from MemAttend's)."""
    d: dict[str, float] = {"n_images": float(f.n_images), "n_failed": float(len(f.failed_ids))}
    if f.n_images:
        d["differs_from_lm"] = differs_from_lm(idx, f)
        if heads is not None and heads.trifuse is not None and heads.memattend is not None:
            pt, pm = pick(f, "trifuse", heads), pick(f, "memattend", heads)
            d["agreement_trifuse_memattend"] = agreement(pt, pm)
            d["trifuse_differs_from_lm"] = differs_from_lm(pt, f)
            d["memattend_differs_from_lm"] = differs_from_lm(pm, f)
    return d


def run_protocol(
    cfg: Config,
    tables: dict[str, pa.Table | str | Path],
    heads: Heads | None = None,
    device: str = "cpu",
) -> ProtocolResult:
    """Run ``cfg.rerank.protocol`` with ``cfg.rerank.picker`` on feature tables keyed by split.

    ``heads``: already fitted heads (e.g. from :func:`adjcap.rerank.load_heads`) to apply instead of
    fitting; hyperparameter selection of beta is then skipped. ``device``: where heads are fitted
    ("cpu", "cuda" or "auto"; see :func:`adjcap.rerank.fit_device`)."""
    r = cfg.rerank
    learned = _learned(r.protocol, r.picker)
    needs_fit = learned and heads is None
    _table_for(tables, r.apply_split, "apply_split")
    feats = {s: load_features(t, lm_feature=cfg.scorer.lm_feature, memory_tokens=r.memattend.memory_tokens)
             for s, t in tables.items()}
    fit_split = _fit_split(r)
    fit_feats = _fit_features(tables, feats, fit_split, r, needs_fit)
    alpha, beta, selection = _select_weights(cfg, fit_feats, fit_split, needs_fit, device)
    weights = {"alpha": alpha, "beta": beta, "lm_feature": cfg.scorer.lm_feature}
    used_heads, seed_heads = _fitted_heads(cfg, fit_feats, fit_split, heads, learned, weights, device)
    picks: dict[str, dict[str, Pick]] = {}
    diagnostics: dict[str, dict[str, float]] = {}
    for split, f in feats.items():
        idx = pick(f, r.picker, used_heads if learned else None, alpha=alpha, beta=beta)
        picks[split] = {iid: Pick(int(i), f.texts[k][int(i)]) for k, (iid, i) in enumerate(zip(f.image_ids, idx))}
        diagnostics[split] = _split_diagnostics(f, idx, used_heads)
    return ProtocolResult(
        protocol=r.protocol,
        picker=r.picker,
        fit_split=fit_split if needs_fit or r.select else None,
        apply_split=r.apply_split,
        alpha=alpha,
        beta=beta,
        picks=picks,
        failed={split: list(f.failed_ids) for split, f in feats.items()},
        heads=used_heads,
        losses=dict(used_heads.losses) if used_heads is not None else {},
        selection=selection,
        diagnostics=diagnostics,
        n_fit_images=fit_feats.n_images if fit_feats is not None else 0,
        seed_heads=seed_heads,
    )
