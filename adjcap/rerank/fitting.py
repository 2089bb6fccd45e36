"""Fitting the heads by Borda-consensus distillation, on CPU, deterministically.

* Target: :func:`adjcap.rerank.borda.borda_targets` of the raw scorer values [LM, cosine, verifier];
  loss: :func:`adjcap.rerank.borda.listwise_loss`. No reference caption is involved anywhere.
* Optimiser: Adam (TriFuse lr 1e-2 x 100 epochs, MemAttend lr 3e-3 x 200 epochs by default).
* Batching: **full batch** by default: one Adam step per epoch, on the gradient of the mean loss
  over all images. The images are cut into fixed chunks in table order (2500 for TriFuse, 256 for
  MemAttend, sized so a chunk's working set stays in cache); each chunk's gradient is computed on
  its own and the chunk gradients are summed in chunk order. With ``batch_images=B`` the images
  are cut into fixed minibatches of B images, from one permutation drawn once from the seed; an
  epoch is one pass over all minibatches. The recorded per-epoch loss is the image-weighted mean
  of the losses computed during that epoch (before each step).
* Threads: chunks are independent, so they run on ``threads`` worker threads (default: every CPU
  this process may use), each with one intra-op thread and denormals flushed to zero (softmax
  tails of sharp attention otherwise hit the slow denormal path). Because the chunk gradients are
  always summed in the same order, **the result does not depend on the thread count**.
* Gradients: TriFuse through autograd; MemAttend through the explicit backward of
  :mod:`adjcap.rerank.memattend_grad` with its fused C kernels (same gradients; per core about
  1.4x faster than autograd, see BENCHMARKS.md).
* Determinism: ``torch.manual_seed(seed)`` before the head is built, deterministic algorithms on;
  global torch settings are restored afterwards. Same input -> byte-identical weights, losses and
  picks, on any number of threads.
* Cost: MemAttend's 200 full passes over 5,000 images x 25 tokens are about 3 TFLOP of training
  arithmetic (~15 GFLOP per epoch) in tiny matrices; ``benchmarks/rerank.py`` measures both heads.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from adjcap.config import Config, MemAttendCfg, RerankCfg, TriFuseCfg
from adjcap.rerank.borda import borda_targets, listwise_loss
from adjcap.rerank.features import BeamFeatures
from adjcap.rerank.heads import Heads, MemAttend, TriFuse
from adjcap.rerank.memattend_grad import MemAttendStep


def available_cpus() -> int:
    """CPUs this process may run on (the affinity mask where the platform has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _threads(threads: int | None) -> int:
    if threads is None:
        return available_cpus()
    if int(threads) < 1:
        raise ValueError(f"threads must be >= 1 (or None for every available CPU), got {threads}")
    return int(threads)


@contextlib.contextmanager
def deterministic_cpu(seed: int) -> Iterator[None]:
    """Seed torch, switch on deterministic algorithms and use one intra-op thread; restore after."""
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    try:
        torch.use_deterministic_algorithms(True)
        torch.set_num_threads(1)
        torch.manual_seed(int(seed))
        yield
    finally:
        torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
        torch.set_num_threads(prev_threads)


def _worker_init() -> None:
    # per-thread settings of the pool's own threads (the caller's thread is left untouched)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)


@dataclass
class Fitted:
    """One fitted head with its per-epoch training losses."""

    head: torch.nn.Module
    losses: list[float]
    n_images: int
    seed: int
    seconds: float
    batch_images: int | None = None
    threads: int = 1
    extra: dict = field(default_factory=dict)


def _check(feats: BeamFeatures, what: str) -> None:
    if feats.n_images == 0:
        raise ValueError(f"{what}: no images to fit on (every feature row failed or the table is empty)")


# images per chunk (sized so the working set stays in cache); does not change the maths
CHUNK_IMAGES = {"trifuse": 2500, "memattend": 256}

Chunk = slice | torch.Tensor
# (chunk, weight) -> (mean loss over the chunk's images, gradients of weight * that loss)
ChunkGrad = Callable[[Chunk, float], tuple[float, Sequence[torch.Tensor]]]


def _steps(n: int, batch_images: int | None, seed: int) -> list[torch.Tensor | None]:
    """Image index sets, one per optimiser step of an epoch; None = all images in table order."""
    if not batch_images or batch_images >= n:
        return [None]
    g = torch.Generator().manual_seed(int(seed))
    perm = torch.randperm(n, generator=g)
    return list(torch.split(perm, int(batch_images)))


def _train(
    params: list[torch.nn.Parameter],
    chunk_grad: ChunkGrad,
    n: int,
    lr: float,
    epochs: int,
    batch_images: int | None,
    seed: int,
    chunk_images: int,
    threads: int,
    after_step: Callable[[], None] | None = None,
) -> list[float]:
    """Adam on the listwise loss. Each step's gradient is the gradient of the mean loss over its
    images: the sum, in chunk order, of the chunks' gradients of (chunk images / step images) x
    (chunk mean loss)."""
    plan: list[list[Chunk]] = []
    for idx in _steps(n, batch_images, seed):
        if idx is None:
            plan.append([slice(s, min(s + chunk_images, n)) for s in range(0, n, chunk_images)])
        else:
            plan.append(list(torch.split(idx, chunk_images)))
    opt = torch.optim.Adam(params, lr=float(lr))
    losses: list[float] = []
    with ThreadPoolExecutor(max_workers=threads, initializer=_worker_init) as pool:
        for _ in range(int(epochs)):
            total = 0.0
            for chunks in plan:
                n_step = sum(_size(c) for c in chunks)
                results = list(pool.map(lambda c: chunk_grad(c, _size(c) / n_step), chunks))
                for i, p in enumerate(params):
                    g = results[0][1][i].clone()
                    for _, grads in results[1:]:
                        g.add_(grads[i])
                    p.grad = g
                total += sum(loss * _size(c) for c, (loss, _) in zip(chunks, results))
                opt.step()
                if after_step is not None:
                    after_step()
            losses.append(total / n)
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
    threads: int | None = None,
) -> Fitted:
    """Fit TriFuse on ``feats`` (its Borda targets); see the module docstring."""
    _check(feats, "fit_trifuse")
    tcfg, _ = _cfgs(cfg)
    t0 = time.perf_counter()
    _, target = borda_targets(feats.raw_scores, feats.mask)
    x, mask = feats.scores, feats.mask
    nt = _threads(threads)
    with deterministic_cpu(seed):
        head = TriFuse(hidden=tcfg.hidden)
        params = list(head.parameters())
        head.train()

        def chunk_grad(c: Chunk, w: float) -> tuple[float, Sequence[torch.Tensor]]:
            loss = listwise_loss(head(x[c]), target[c], mask[c])
            return float(loss.detach()), torch.autograd.grad(loss * w, params)

        losses = _train(
            params, chunk_grad, feats.n_images, tcfg.lr, tcfg.epochs, batch_images, seed, CHUNK_IMAGES["trifuse"], nt
        )
        head.eval()
    return Fitted(head, losses, feats.n_images, seed, time.perf_counter() - t0, batch_images, nt)


def fit_memattend(
    feats: BeamFeatures,
    cfg: MemAttendCfg | RerankCfg | Config | None = None,
    seed: int = 42,
    batch_images: int | None = None,
    threads: int | None = None,
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
    nt = _threads(threads)
    with deterministic_cpu(seed):
        head = MemAttend(d_model=mcfg.d_model, layers=mcfg.layers, heads=mcfg.heads, ffn=mcfg.ffn)
        step = MemAttendStep(head)

        def chunk_grad(c: Chunk, w: float) -> tuple[float, Sequence[torch.Tensor]]:
            return step(b[c], mem[c], bm[c], mm[c], target[c], w)

        losses = _train(
            list(head.parameters()),
            chunk_grad,
            feats.n_images,
            mcfg.lr,
            mcfg.epochs,
            batch_images,
            seed,
            CHUNK_IMAGES["memattend"],
            nt,
            after_step=step.refresh,
        )
        head.eval()
    return Fitted(head, losses, feats.n_images, seed, time.perf_counter() - t0, batch_images, nt)


def fit_heads(
    feats: BeamFeatures,
    cfg: Config | RerankCfg | None = None,
    seed: int | None = None,
    which: tuple[str, ...] = ("trifuse", "memattend"),
    batch_images: int | None = None,
    threads: int | None = None,
) -> Heads:
    """Fit the requested heads (default both) and return them with their loss curves."""
    if seed is None:
        seed = cfg.seed if isinstance(cfg, Config) else 42
    unknown = [w for w in which if w not in ("trifuse", "memattend")]
    if unknown:
        raise ValueError(f"fit_heads: unknown head(s) {unknown}; known: trifuse, memattend")
    if threads is None:
        r = cfg.rerank if isinstance(cfg, Config) else cfg
        threads = r.threads if isinstance(r, RerankCfg) else None
    heads = Heads(meta={"seed": int(seed), "n_images": feats.n_images, "lm_feature": feats.lm_feature})
    if "trifuse" in which:
        f = fit_trifuse(feats, cfg, seed=seed, batch_images=batch_images, threads=threads)
        heads.trifuse = f.head  # type: ignore[assignment]
        heads.losses["trifuse"] = f.losses
        heads.meta["trifuse_seconds"] = f.seconds
        heads.meta["fit_threads"] = f.threads
    if "memattend" in which:
        f = fit_memattend(feats, cfg, seed=seed, batch_images=batch_images, threads=threads)
        heads.memattend = f.head  # type: ignore[assignment]
        heads.losses["memattend"] = f.losses
        heads.meta["memattend_seconds"] = f.seconds
        heads.meta["fit_threads"] = f.threads
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
