"""Pickers: turn per-candidate scores into one chosen caption per image. A registry (:data:`PICKERS`).

* ``lm``         argmax of the LM log-prob feature (with ``lm_feature="mean"`` this is the beam's own
  first choice, i.e. IFCap's pick).
* ``retrieval``  argmax retrieval-encoder cosine.
* ``verifier``   argmax verifier score.
* ``fixed``      argmax alpha * z(LM) + (1 - alpha) * z(cosine)  (training-free fusion, alpha = 0.48).
* ``trifuse``    argmax TriFuse(z(LM), z(cosine), z(verifier)).
* ``memattend``  argmax MemAttend(memory tokens, beam tokens).
* ``ensemble``   argmax beta * z(TriFuse) + (1 - beta) * z(MemAttend)  (beta = 0.75).

Each picker is a small function registered with what it needs (declared in
:mod:`adjcap.picker_needs`, which the configuration reads without PyTorch): the scorers whose values must be
present in the feature table (``scorers``) and the fitted heads (``heads``). A picker that needs a
head is *learned*; the others are *training-free*. :func:`applicability` says, for a feature table
and the heads at hand, which pickers can run and why the others cannot (e.g. ``verifier`` on a run
without a verifier), so a caller can skip them and report them as not applicable.

z is the per-image z-score over the valid beam (:func:`adjcap.rerank.features.zscore`). Every
picker breaks ties (equal best scores) towards the candidate with the lowest beam rank, so a picker
that cannot tell candidates apart falls back to the beam's own order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from adjcap.picker_needs import PICKER_NEEDS, SCORERS, declare_picker
from adjcap.registry import Registry
from adjcap.rerank.features import BeamFeatures, zscore
from adjcap.rerank.heads import HEADS, Heads, head_spec


@dataclass(frozen=True)
class Ctx:
    """What a picker function gets: the features, the fitted heads it declared, alpha and beta."""

    feats: BeamFeatures
    heads: dict[str, torch.nn.Module]
    alpha: float
    beta: float


@dataclass(frozen=True)
class PickerSpec:
    name: str
    score: Callable[[Ctx], torch.Tensor]  # per-candidate scores [I, N] (higher = better)
    scorers: tuple[str, ...] = ()  # raw scorer columns that must hold finite values
    heads: tuple[str, ...] = ()  # fitted heads it needs

    @property
    def learned(self) -> bool:
        return bool(self.heads)


PICKERS: Registry[PickerSpec] = Registry("picker")


def register_picker(name: str, scorers: tuple[str, ...] = (), heads: tuple[str, ...] = ()):
    """Decorator registering ``fn(ctx) -> scores [I, N]`` as picker ``name``. A picker declared in
    :mod:`adjcap.picker_needs` (the built-ins) takes its needs from there; a new name is declared there
    with ``scorers`` and ``heads``, so the configuration accepts it too."""
    if name in PICKERS:
        raise ValueError(f"picker {name!r} is already registered")
    for h in heads:
        HEADS.get(h)
    if name in PICKER_NEEDS:
        needs = PICKER_NEEDS.get(name)
        if (scorers or heads) and (tuple(scorers), tuple(heads)) != (needs.scorers, needs.heads):
            raise ValueError(f"picker {name!r} is declared in adjcap/picker_needs.py with scorers "
                             f"{needs.scorers} and heads {needs.heads}; register it without them")
    else:
        needs = declare_picker(name, scorers, heads)
    return PICKERS.register(name, lambda n, fn: PickerSpec(n, fn, needs.scorers, needs.heads))


def get_picker(name: str) -> PickerSpec:
    """The spec of picker ``name``; ValueError listing the known pickers (and a close match)."""
    return PICKERS.get(name)


def picker_names(learned: bool | None = None) -> list[str]:
    """Registered picker names (all, or only the learned / training-free ones)."""
    return [n for n, s in PICKERS.items() if learned is None or s.learned == learned]


def _col(feats: BeamFeatures, scorer: str) -> torch.Tensor:
    return feats.raw_scores[..., SCORERS[scorer][0]].to(torch.float64)


def missing(spec: PickerSpec, feats: BeamFeatures, heads: Heads | None) -> str | None:
    """Why ``spec`` cannot run on ``feats`` with ``heads`` (one line), or None when it can."""
    absent = [h for h in spec.heads if heads is None or heads.get(h) is None]
    if absent:
        return f"needs a fitted {absent[0]} head" if len(absent) == 1 else f"needs fitted {' and '.join(absent)} heads"
    if feats.n_images:
        for s in spec.scorers:
            if not bool((feats.mask & torch.isfinite(_col(feats, s))).any()):
                return f"the feature table has no finite {SCORERS[s][1]} scores"
    return None


def applicability(feats: BeamFeatures, heads: Heads | None = None) -> dict[str, str | None]:
    """Every registered picker -> None when it can run on ``feats`` with ``heads``, else the reason
    it is not applicable (e.g. ``{"verifier": "the feature table has no finite verifier scores"}``)."""
    return {name: missing(spec, feats, heads) for name, spec in PICKERS.items()}


def applicable_pickers(feats: BeamFeatures, heads: Heads | None = None) -> list[str]:
    """The pickers that can run on ``feats`` with ``heads``, in registry order."""
    return [n for n, why in applicability(feats, heads).items() if why is None]


@torch.no_grad()
def head_scores(feats: BeamFeatures, head: torch.nn.Module, chunk_images: int = 1024) -> torch.Tensor:
    """Raw head outputs [I, N] (float32) for any registered head, in eval mode, on the head's device."""
    spec = head_spec(head)
    inputs = spec.inputs(feats)
    dev = next(head.parameters()).device
    was_training = head.training
    head.eval()
    outs = []
    try:
        for s in range(0, feats.n_images, chunk_images):
            outs.append(head(*(t[s : s + chunk_images].to(dev) for t in inputs)).cpu())
    finally:
        head.train(was_training)
    if not outs:
        return torch.zeros(feats.mask.shape, dtype=torch.float32)
    return torch.cat(outs, dim=0).to(torch.float32)


@register_picker("lm")
def _lm(ctx: Ctx) -> torch.Tensor:
    return _col(ctx.feats, "lm")


@register_picker("retrieval")
def _retrieval(ctx: Ctx) -> torch.Tensor:
    return _col(ctx.feats, "retrieval")


@register_picker("verifier")
def _verifier(ctx: Ctx) -> torch.Tensor:
    return _col(ctx.feats, "verifier")


@register_picker("fixed")
def _fixed(ctx: Ctx) -> torch.Tensor:
    z = ctx.feats.scores.double()
    return ctx.alpha * z[..., 0] + (1.0 - ctx.alpha) * z[..., 1]


@register_picker("trifuse")
def _trifuse(ctx: Ctx) -> torch.Tensor:
    return head_scores(ctx.feats, ctx.heads["trifuse"]).double()


@register_picker("memattend")
def _memattend(ctx: Ctx) -> torch.Tensor:
    return head_scores(ctx.feats, ctx.heads["memattend"]).double()


@register_picker("ensemble")
def _ensemble(ctx: Ctx) -> torch.Tensor:
    f = ctx.feats
    t = zscore(head_scores(f, ctx.heads["trifuse"]), f.mask).double()
    m = zscore(head_scores(f, ctx.heads["memattend"]), f.mask).double()
    return ctx.beta * t + (1.0 - ctx.beta) * m


def picker_scores(
    feats: BeamFeatures,
    picker: str,
    heads: Heads | None = None,
    alpha: float = 0.48,
    beta: float = 0.75,
) -> torch.Tensor:
    """Per-candidate scores [I, N] under ``picker`` (higher = better); masked entries are -inf."""
    spec = get_picker(picker)
    why = missing(spec, feats, heads)
    if why is not None:
        hint = (
            "; fit it (protocol inductive or transductive) or load it with adjcap.rerank.load_heads"
            if spec.learned and why.startswith("needs")
            else " (was that scorer disabled, e.g. verifier.enabled=false?)"
        )
        raise ValueError(f"picker '{picker}': {why}{hint}")
    used = {h: heads.get(h) for h in spec.heads} if heads is not None else {}
    s = spec.score(Ctx(feats, used, float(alpha), float(beta))).to(torch.float64)  # type: ignore[arg-type]
    s = torch.where(torch.isnan(s), torch.tensor(float("-inf"), dtype=s.dtype), s)
    return s.masked_fill(~feats.mask, float("-inf"))


def argmax_lowest_rank(scores: torch.Tensor, mask: torch.Tensor, beam_rank: torch.Tensor) -> np.ndarray:
    """Per row: the valid entry with the highest score; ties -> lowest beam rank, then lowest index."""
    best = scores.amax(dim=1, keepdim=True)
    cand = (scores == best) & mask
    none = ~cand.any(dim=1, keepdim=True)  # every valid score -inf: fall back to the whole beam
    cand = torch.where(none, mask, cand)
    n = scores.shape[1]
    key = beam_rank.to(torch.int64) * (n + 1) + torch.arange(n, dtype=torch.int64)
    big = torch.iinfo(torch.int64).max
    key = torch.where(cand, key, torch.full_like(key, big))
    return key.argmin(dim=1).numpy().astype(np.int64)


def pick(
    feats: BeamFeatures,
    picker: str | Heads = "ensemble",
    heads: Heads | None = None,
    alpha: float = 0.48,
    beta: float = 0.75,
) -> np.ndarray:
    """Chosen candidate index [I] (index into each row's ``candidates`` list) per image of ``feats``.

    ``pick(feats, heads)`` (a :class:`Heads` in place of the picker name) uses the ensemble when both
    heads are present, else the one head present."""
    if isinstance(picker, Heads):
        heads = picker
        have = heads.available()
        picker = "ensemble" if len(have) == 2 else (have[0] if have else "ensemble")
    get_picker(picker)
    if feats.n_images == 0:
        return np.zeros(0, dtype=np.int64)
    s = picker_scores(feats, picker, heads, alpha=alpha, beta=beta)
    return argmax_lowest_rank(s, feats.mask, feats.beam_rank)


def picked_texts(feats: BeamFeatures, indices: np.ndarray | list[int]) -> list[str]:
    """The caption text of each chosen candidate."""
    return [feats.texts[i][int(j)] for i, j in enumerate(indices)]
