"""Pickers: turn per-candidate scores into one chosen caption per image.

* ``lm``         argmax of the LM log-prob feature (with ``lm_feature="mean"`` this is the beam's own
  first choice, i.e. IFCap's pick).
* ``retrieval``  argmax retrieval-encoder cosine.
* ``verifier``   argmax verifier score.
* ``fixed``      argmax alpha * z(LM) + (1 - alpha) * z(cosine)  (training-free fusion, alpha = 0.48).
* ``trifuse``    argmax TriFuse(z(LM), z(cosine), z(verifier)).
* ``memattend``  argmax MemAttend(memory tokens, beam tokens).
* ``ensemble``   argmax beta * z(TriFuse) + (1 - beta) * z(MemAttend)  (beta = 0.75).

z is the per-image z-score over the valid beam (:func:`adjcap.rerank.features.zscore`). Every
picker breaks ties (equal best scores) towards the candidate with the lowest beam rank, so a picker
that cannot tell candidates apart falls back to the beam's own order.
"""

from __future__ import annotations

import numpy as np
import torch

from adjcap.rerank.features import BeamFeatures, zscore
from adjcap.rerank.heads import Heads

PICKERS = ("lm", "retrieval", "verifier", "fixed", "trifuse", "memattend", "ensemble")
LEARNED_PICKERS = ("trifuse", "memattend", "ensemble")
TRAINING_FREE_PICKERS = ("lm", "retrieval", "verifier", "fixed")
_SINGLE = {"lm": 0, "retrieval": 1, "verifier": 2}


def _need(heads: Heads | None, name: str, picker: str) -> torch.nn.Module:
    head = getattr(heads, name, None) if heads is not None else None
    if head is None:
        raise ValueError(
            f"picker '{picker}' needs a fitted {name} head; fit one (protocol inductive or transductive) "
            f"or load it with adjcap.rerank.load_heads"
        )
    return head


@torch.no_grad()
def head_scores(feats: BeamFeatures, head: torch.nn.Module, chunk_images: int = 1024) -> torch.Tensor:
    """Raw head outputs [I, N] (float32) for a TriFuse or MemAttend head, in eval mode."""
    from adjcap.rerank.heads import MemAttend, TriFuse

    was_training = head.training
    head.eval()
    outs = []
    try:
        for s in range(0, feats.n_images, chunk_images):
            sl = slice(s, s + chunk_images)
            if isinstance(head, TriFuse):
                outs.append(head(feats.scores[sl]))
            elif isinstance(head, MemAttend):
                outs.append(head(feats.beam[sl], feats.memory[sl], feats.mask[sl], feats.memory_mask[sl]))
            else:
                raise TypeError(f"unknown head type {type(head).__name__}")
    finally:
        head.train(was_training)
    if not outs:
        return torch.zeros(feats.mask.shape, dtype=torch.float32)
    return torch.cat(outs, dim=0).to(torch.float32)


def picker_scores(
    feats: BeamFeatures,
    picker: str,
    heads: Heads | None = None,
    alpha: float = 0.48,
    beta: float = 0.75,
) -> torch.Tensor:
    """Per-candidate scores [I, N] under ``picker`` (higher = better); masked entries are -inf."""
    if picker not in PICKERS:
        raise ValueError(f"unknown picker {picker!r}; known: {', '.join(PICKERS)}")
    if picker in _SINGLE:
        col = _SINGLE[picker]
        s = feats.raw_scores[..., col].to(torch.float64)
        valid = feats.mask & torch.isfinite(s)
        if feats.n_images and not bool(valid.any()):
            raise ValueError(
                f"picker '{picker}': the feature table has no finite {('LM', 'retrieval cosine', 'verifier')[col]} "
                "scores (was that scorer disabled, e.g. verifier.enabled=false?)"
            )
    elif picker == "fixed":
        s = alpha * feats.scores[..., 0].double() + (1.0 - alpha) * feats.scores[..., 1].double()
    elif picker == "trifuse":
        s = head_scores(feats, _need(heads, "trifuse", picker)).double()
    elif picker == "memattend":
        s = head_scores(feats, _need(heads, "memattend", picker)).double()
    else:  # ensemble
        t = head_scores(feats, _need(heads, "trifuse", picker))
        m = head_scores(feats, _need(heads, "memattend", picker))
        s = beta * zscore(t, feats.mask).double() + (1.0 - beta) * zscore(m, feats.mask).double()
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
    if feats.n_images == 0:
        return np.zeros(0, dtype=np.int64)
    s = picker_scores(feats, picker, heads, alpha=alpha, beta=beta)
    return argmax_lowest_rank(s, feats.mask, feats.beam_rank)


def picked_texts(feats: BeamFeatures, indices: np.ndarray | list[int]) -> list[str]:
    """The caption text of each chosen candidate."""
    return [feats.texts[i][int(j)] for i, j in enumerate(indices)]
