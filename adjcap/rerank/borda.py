"""Borda-consensus pseudo-labels and the listwise loss (paper, TriFuse "Self-supervised training").

For image i with K_i valid candidates and each scorer s (higher = better), r_s(y) in 0..K_i-1 is the
rank of candidate y among the valid candidates, 0 = best. The Borda score is
q_y = mean_s (K_i - 1 - r_s(y)) and the target is softmax_y(q_y) over the valid candidates.

Tie rule: **average ranks**. Candidates with equal scores share the mean of the ranks they would
occupy, i.e. r(y) = #{y' : s(y') > s(y)} + (#{y' : s(y') = s(y)} - 1) / 2. The rule is symmetric in
the candidates (no candidate is favoured by its position), keeps sum_y r(y) = K(K-1)/2, and a scorer
that is constant on an image (e.g. no verifier) gives every candidate the same rank, so it does not
change the target. A non-finite score (NaN) ranks below every finite one; NaNs tie with each other.
"""

from __future__ import annotations

import numpy as np
import torch


def _as_tensor(x: torch.Tensor | np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return torch.as_tensor(np.asarray(x) if not isinstance(x, torch.Tensor) else x).to(dtype)


def average_ranks(scores: torch.Tensor | np.ndarray, mask: torch.Tensor | np.ndarray) -> torch.Tensor:
    """[I, N] or [I, N, S] scores (higher = better) -> 0-based average ranks among the valid
    candidates of each image (float64; masked entries get 0)."""
    s = _as_tensor(scores, torch.float64)
    m = torch.as_tensor(np.asarray(mask) if not isinstance(mask, torch.Tensor) else mask).to(torch.bool)
    squeeze = s.dim() == 2
    if squeeze:
        s = s.unsqueeze(-1)
    if s.dim() != 3 or m.shape != s.shape[:2]:
        raise ValueError(
            f"borda: scores must be [images, candidates(, scorers)] with a matching [images, candidates] "
            f"mask; got scores {tuple(s.shape)}, mask {tuple(m.shape)}"
        )
    s = torch.where(torch.isfinite(s), s, torch.tensor(float("-inf"), dtype=torch.float64))
    # a[i, y, y', k] compares candidate y with y' under scorer k (only valid y' count)
    a = s.unsqueeze(2)  # [I, N, 1, S]
    b = s.unsqueeze(1)  # [I, 1, N, S]
    other = m.unsqueeze(1).unsqueeze(-1)  # [I, 1, N, 1]
    greater = ((b > a) & other).sum(dim=2).to(torch.float64)
    equal = ((b == a) & other).sum(dim=2).to(torch.float64)  # includes y itself
    r = greater + (equal - 1.0) / 2.0
    r = torch.where(m.unsqueeze(-1), r, torch.zeros((), dtype=torch.float64))
    return r.squeeze(-1) if squeeze else r


def borda_targets(
    scores: torch.Tensor | np.ndarray, mask: torch.Tensor | np.ndarray
) -> tuple[torch.Tensor, torch.Tensor]:
    """Borda consensus over scorers.

    scores: [I, N, S] (higher = better), mask: [I, N] bool. Returns ``(q, target)``, both [I, N]
    float32: q = mean_s (K_i - 1 - r_s) and target = softmax of q over the valid candidates
    (0 on masked entries; rows sum to 1). Ties: average ranks (module docstring)."""
    m = torch.as_tensor(np.asarray(mask) if not isinstance(mask, torch.Tensor) else mask).to(torch.bool)
    r = average_ranks(scores, m)
    if r.dim() == 2:
        r = r.unsqueeze(-1)
    k = m.sum(dim=1, keepdim=True).to(torch.float64)  # [I, 1]
    q = ((k.unsqueeze(-1) - 1.0) - r).mean(dim=-1)
    q = torch.where(m, q, torch.zeros((), dtype=torch.float64))
    logits = torch.where(m, q, torch.tensor(float("-inf"), dtype=torch.float64))
    target = torch.softmax(logits, dim=1)
    target = torch.where(m, target, torch.zeros((), dtype=torch.float64))
    target = torch.nan_to_num(target, nan=0.0)  # an image with no valid candidate: all zeros
    return q.to(torch.float32), target.to(torch.float32)


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log-softmax over the valid entries of each row; masked entries come out as 0 (not -inf)."""
    neg = torch.finfo(logits.dtype).min
    x = logits.masked_fill(~mask, neg)
    lsm = torch.log_softmax(x, dim=-1)
    return lsm.masked_fill(~mask, 0.0)


def listwise_loss(logits: torch.Tensor, target: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """ListNet loss: mean over images of -sum_y target_y * log softmax_y(logits) (softmax over the
    valid candidates only). Images with no valid candidate are left out of the mean."""
    mask = mask.to(torch.bool)
    lsm = masked_log_softmax(logits, mask)
    per_image = -(target.to(lsm.dtype) * lsm).sum(dim=-1)
    has = mask.any(dim=-1)
    if not bool(has.all()):
        per_image = per_image[has]
    if per_image.numel() == 0:
        return logits.sum() * 0.0
    return per_image.mean()
