"""Fitting the heads by Borda-consensus distillation, on CPU, deterministically.

* Target: :func:`adjcap.rerank.borda.borda_targets` of the raw scorer values [LM, cosine, verifier];
  loss: :func:`adjcap.rerank.borda.listwise_loss`. No reference caption is involved anywhere.
* Optimiser: Adam (TriFuse lr 1e-2 x 100 epochs, MemAttend lr 3e-3 x 200 epochs by default).
* Batching: **full batch** by default: one Adam step per epoch, on the gradient of the mean loss
  over all images (accumulated over fixed chunks of images in table order, 1024 for TriFuse and 256
  for MemAttend, which keeps the working set in cache; chunking changes only the float summation
  order). With ``batch_images=B`` the images are cut into fixed minibatches of B images, from one
  permutation drawn once from the seed; an epoch is one pass over all minibatches. The recorded per-epoch loss
  is the image-weighted mean of the losses computed during that epoch (before each step).
* Determinism: ``torch.manual_seed(seed)`` before the head is built, deterministic algorithms on,
  ``threads`` intra-op threads (default 1) for the duration of the fit; global torch settings are
  restored afterwards. Same input -> byte-identical weights, losses and picks.
* Cost: MemAttend's 200 full passes over 5,000 images x 25 tokens are about 3 TFLOP of training
  arithmetic (~15 GFLOP per epoch); on one AVX2 core that is about 3 minutes of CPU. TriFuse's 100
  epochs take a few seconds. ``benchmarks/rerank.py`` measures both.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from adjcap.config import Config, MemAttendCfg, RerankCfg, TriFuseCfg
from adjcap.rerank.borda import borda_targets, listwise_loss
from adjcap.rerank.features import BeamFeatures
from adjcap.rerank.heads import Heads, MemAttend, TriFuse

DEFAULT_THREADS = 1


@contextlib.contextmanager
def deterministic_cpu(seed: int, threads: int | None = DEFAULT_THREADS) -> Iterator[None]:
    """Seed torch, switch on deterministic algorithms and pin the CPU thread count; restore after."""
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    try:
        torch.use_deterministic_algorithms(True)
        if threads:
            torch.set_num_threads(int(threads))
        torch.manual_seed(int(seed))
        yield
    finally:
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
        torch.set_num_threads(prev_threads)


@dataclass
class Fitted:
    """One fitted head with its per-epoch training losses."""

    head: torch.nn.Module
    losses: list[float]
    n_images: int
    seed: int
    seconds: float
    batch_images: int | None = None
    extra: dict = field(default_factory=dict)


def _check(feats: BeamFeatures, what: str) -> None:
    if feats.n_images == 0:
        raise ValueError(f"{what}: no images to fit on (every feature row failed or the table is empty)")


# images per forward/backward pass (sized so the working set stays in cache); does not change the maths
CHUNK_IMAGES = {"trifuse": 1024, "memattend": 256}


def _steps(n: int, batch_images: int | None, seed: int) -> list[torch.Tensor | None]:
    """Image index sets, one per optimiser step of an epoch; None = all images in table order."""
    if not batch_images or batch_images >= n:
        return [None]
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=g)
    return list(torch.split(perm, int(batch_images)))


def _train(
    head: torch.nn.Module,
    forward: Callable[[slice | torch.Tensor], torch.Tensor],
    target: torch.Tensor,
    mask: torch.Tensor,
    lr: float,
    epochs: int,
    batch_images: int | None,
    seed: int,
    chunk_images: int,
) -> list[float]:
    """Adam on the listwise loss. Each step's gradient is the gradient of the mean loss over its
    images, accumulated over chunks of ``chunk_images`` images (fixed order)."""
    n = mask.shape[0]
    steps = _steps(n, batch_images, seed)
    plan: list[list[slice | torch.Tensor]] = []
    for idx in steps:
        if idx is None:
            plan.append([slice(s, min(s + chunk_images, n)) for s in range(0, n, chunk_images)])
        else:
            plan.append(list(torch.split(idx, chunk_images)))
    opt = torch.optim.Adam(head.parameters(), lr=float(lr))
    head.train()
    losses: list[float] = []
    for _ in range(int(epochs)):
        total = 0.0
        for chunks in plan:
            n_step = sum(_size(c) for c in chunks)
            opt.zero_grad(set_to_none=True)
            for c in chunks:
                loss = listwise_loss(forward(c), target[c], mask[c])
                (loss * (_size(c) / n_step)).backward()
                total += float(loss.detach()) * _size(c)
            opt.step()
        losses.append(total / n)
    head.eval()
    return losses


def _size(c: slice | torch.Tensor) -> int:
    return int(c.stop - c.start) if isinstance(c, slice) else int(c.numel())


def _cfgs(cfg: Config | RerankCfg | TriFuseCfg | MemAttendCfg | None) -> tuple[TriFuseCfg, MemAttendCfg]:
    if isinstance(cfg, Config):
        cfg = cfg.rerank
    if isinstance(cfg, RerankCfg):
        return cfg.trifuse, cfg.memattend
    if isinstance(cfg, TriFuseCfg):
        return cfg, MemAttendCfg()
    if isinstance(cfg, MemAttendCfg):
        return TriFuseCfg(), cfg
    if cfg is None:
        return TriFuseCfg(), MemAttendCfg()
    raise TypeError(f"expected Config, RerankCfg, TriFuseCfg or MemAttendCfg, got {type(cfg).__name__}")


def fit_trifuse(
    feats: BeamFeatures,
    cfg: TriFuseCfg | RerankCfg | Config | None = None,
    seed: int = 42,
    batch_images: int | None = None,
    threads: int | None = DEFAULT_THREADS,
) -> Fitted:
    """Fit TriFuse on ``feats`` (its Borda targets); see the module docstring."""
    _check(feats, "fit_trifuse")
    tcfg, _ = _cfgs(cfg)
    t0 = time.perf_counter()
    _, target = borda_targets(feats.raw_scores, feats.mask)
    x, mask = feats.scores, feats.mask
    with deterministic_cpu(seed, threads):
        head = TriFuse(hidden=tcfg.hidden)
        losses = _train(
            head,
            lambda sel: head(x[sel]),
            target,
            mask,
            tcfg.lr,
            tcfg.epochs,
            batch_images,
            seed,
            CHUNK_IMAGES["trifuse"],
        )
    return Fitted(head, losses, feats.n_images, seed, time.perf_counter() - t0, batch_images)


def fit_memattend(
    feats: BeamFeatures,
    cfg: MemAttendCfg | RerankCfg | Config | None = None,
    seed: int = 42,
    batch_images: int | None = None,
    threads: int | None = DEFAULT_THREADS,
) -> Fitted:
    """Fit MemAttend on ``feats`` (its Borda targets); see the module docstring."""
    _check(feats, "fit_memattend")
    _, mcfg = _cfgs(cfg)
    if feats.memory.shape[1] != mcfg.memory_tokens:
        raise ValueError(
            f"fit_memattend: features carry {feats.memory.shape[1]} memory tokens but "
            f"rerank.memattend.memory_tokens = {mcfg.memory_tokens}; load the features with "
            f"memory_tokens={mcfg.memory_tokens}"
        )
    t0 = time.perf_counter()
    _, target = borda_targets(feats.raw_scores, feats.mask)
    b, mem, bm, mm = feats.beam, feats.memory, feats.mask, feats.memory_mask
    with deterministic_cpu(seed, threads):
        head = MemAttend(d_model=mcfg.d_model, layers=mcfg.layers, heads=mcfg.heads, ffn=mcfg.ffn)

        def forward(sel: slice | torch.Tensor) -> torch.Tensor:
            return head(b[sel], mem[sel], bm[sel], mm[sel])

        losses = _train(
            head, forward, target, bm, mcfg.lr, mcfg.epochs, batch_images, seed, CHUNK_IMAGES["memattend"]
        )
    return Fitted(head, losses, feats.n_images, seed, time.perf_counter() - t0, batch_images)


def fit_heads(
    feats: BeamFeatures,
    cfg: Config | RerankCfg | None = None,
    seed: int | None = None,
    which: tuple[str, ...] = ("trifuse", "memattend"),
    batch_images: int | None = None,
    threads: int | None = DEFAULT_THREADS,
) -> Heads:
    """Fit the requested heads (default both) and return them with their loss curves."""
    if seed is None:
        seed = cfg.seed if isinstance(cfg, Config) else 42
    unknown = [w for w in which if w not in ("trifuse", "memattend")]
    if unknown:
        raise ValueError(f"fit_heads: unknown head(s) {unknown}; known: trifuse, memattend")
    heads = Heads(meta={"seed": int(seed), "n_images": feats.n_images, "lm_feature": feats.lm_feature})
    if "trifuse" in which:
        f = fit_trifuse(feats, cfg, seed=seed, batch_images=batch_images, threads=threads)
        heads.trifuse = f.head  # type: ignore[assignment]
        heads.losses["trifuse"] = f.losses
        heads.meta["trifuse_seconds"] = f.seconds
    if "memattend" in which:
        f = fit_memattend(feats, cfg, seed=seed, batch_images=batch_images, threads=threads)
        heads.memattend = f.head  # type: ignore[assignment]
        heads.losses["memattend"] = f.losses
        heads.meta["memattend_seconds"] = f.seconds
    return heads


def fit(
    feats: BeamFeatures,
    protocol: str | Config | RerankCfg | None = None,
    cfg: Config | RerankCfg | None = None,
    seed: int | None = None,
) -> Heads:
    """``fit(features, protocol) -> heads``: fit TriFuse and MemAttend on ``feats``.

    ``protocol`` is "inductive" or "transductive" (the caller passes the fit split's features:
    val for inductive, the test split itself for transductive) or a Config / RerankCfg, whose
    protocol and head settings are used. "training-free" fits nothing and is refused."""
    if isinstance(protocol, (Config, RerankCfg)):
        cfg, protocol = protocol, (protocol.rerank if isinstance(protocol, Config) else protocol).protocol
    if protocol == "training-free":
        raise ValueError("protocol 'training-free' fits no head; pick with picker 'fixed', 'lm', 'retrieval' or 'verifier'")
    if protocol not in (None, "inductive", "transductive"):
        raise ValueError(f"unknown protocol {protocol!r}; known: inductive, transductive, training-free")
    heads = fit_heads(feats, cfg, seed=seed)
    if protocol is not None:
        heads.meta["protocol"] = protocol
    return heads
