"""Fitting the heads by Borda-consensus distillation, deterministically, on CPU or one GPU.

* Target: :func:`adjcap.rerank.borda.borda_targets` of the raw scorer values [LM, cosine, verifier];
  loss: :func:`adjcap.rerank.borda.listwise_loss`. No reference caption is involved anywhere.
* Gradients: autograd through the head's own ``forward`` (the stock layers), for every head alike.
  What a head needs (class, config section, inputs, chunk size) comes from its
  :class:`adjcap.rerank.heads.HeadSpec` in :data:`adjcap.rerank.heads.HEADS`.
* Optimiser: Adam (TriFuse lr 1e-2 x 100 epochs, MemAttend lr 3e-3 x 200 epochs by default).
* Batching: ``rerank.batch_images = B`` cuts each epoch into optimiser steps of B images, from a
  fresh permutation per epoch drawn from a generator seeded once with the seed; ``None`` is the
  full batch (one step per epoch, images in table order). Each step's gradient is the gradient of
  the mean loss over its images. The recorded per-epoch loss is the image-weighted mean of the
  losses computed during that epoch (before each step).
* Chunks (CPU): a step's images are cut into fixed chunks (at most the head's ``chunk_images``,
  and at least two chunks per step of 2+ images, so two cores have work on small steps); each
  chunk's gradient is computed on its own and the chunk gradients are summed in chunk order. The
  chunks run on ``threads`` worker threads (default: every CPU this process may use), each with one
  intra-op thread and denormals flushed to zero. The cut does not depend on the thread count and
  the sum is always taken in the same order, so **the weights do not depend on the thread count**.
* CUDA (``device="cuda"``): the features are moved to the GPU once; each step is one chunk.
* Determinism: ``torch.manual_seed(seed)`` before the head is built, deterministic algorithms on;
  global torch settings are restored afterwards. Same input -> byte-identical weights, losses and
  picks on CPU, on any number of threads.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from adjcap.config import Config, RerankCfg
from adjcap.rerank.borda import borda_targets, listwise_loss
from adjcap.rerank.features import BeamFeatures
from adjcap.registry import unknown
from adjcap.rerank.heads import HEADS, Heads

DEVICES = ("auto", "cpu", "cuda")
CUDA_CHUNK_IMAGES = 16384  # a GPU takes a whole step at once up to this many images


def fit_device(requested: str, gpu_available: bool) -> str:
    """Where the heads are fitted: "cpu" or "cuda", from ``rerank.device`` and whether a GPU is
    available to the fit (for a Ray job: whether the cluster has a GPU resource).

    auto -> cuda when a GPU is available, else cpu; cpu -> cpu; cuda without a GPU is an error."""
    if requested == "auto":
        return "cuda" if gpu_available else "cpu"
    if requested == "cpu":
        return "cpu"
    if requested == "cuda":
        if not gpu_available:
            raise ValueError("rerank.device = 'cuda' but no GPU is available to the fit; use 'auto' or 'cpu'")
        return "cuda"
    raise ValueError(f"rerank.device must be one of {', '.join(DEVICES)}, got {requested!r}")


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


def _device(device: str | torch.device) -> torch.device:
    d = torch.device(fit_device(device, torch.cuda.is_available()) if device == "auto" else device)
    if d.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("rerank.device = 'cuda' but torch sees no GPU in this process; use 'auto' or 'cpu'")
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"rerank.device must be one of {', '.join(DEVICES)}, got {str(device)!r}")
    return d


@contextlib.contextmanager
def deterministic(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch, switch on deterministic algorithms and use one intra-op thread; restore after."""
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    prev_threads = torch.get_num_threads()
    try:
        if device.type == "cuda":
            # cuBLAS is deterministic with a fixed workspace (read when its handle is created, so
            # this only helps a process that has not used cuBLAS yet, e.g. a fresh Ray task)
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=True)
        else:
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
    device: str = "cpu"
    extra: dict = field(default_factory=dict)


Chunk = slice | torch.Tensor


def _size(c: Chunk) -> int:
    return int(c.stop - c.start) if isinstance(c, slice) else int(c.numel())


def _chunks(step: Chunk, chunk_images: int, min_chunks: int) -> list[Chunk]:
    """Cut one step's images into equal-as-possible chunks (fixed by the step size alone)."""
    n = _size(step)
    k = max(math.ceil(n / chunk_images), min(min_chunks, n), 1)
    size = math.ceil(n / k)
    if isinstance(step, slice):
        return [slice(s, min(s + size, step.stop)) for s in range(step.start, step.stop, size)]
    return list(torch.split(step, size))


class _Plan:
    """The steps of each epoch, each a list of chunks."""

    def __init__(self, n: int, batch_images: int | None, seed: int, chunk_images: int, min_chunks: int, device):
        self.n, self.chunk_images, self.min_chunks, self.device = n, chunk_images, min_chunks, device
        self.full = not batch_images or batch_images >= n
        self.batch = int(batch_images or n)
        self.gen = torch.Generator().manual_seed(int(seed))
        self._full_plan = [_chunks(slice(0, n), chunk_images, min_chunks)] if self.full else None

    def epoch(self) -> list[list[Chunk]]:
        if self._full_plan is not None:
            return self._full_plan
        perm = torch.randperm(self.n, generator=self.gen).to(self.device)
        return [_chunks(s, self.chunk_images, self.min_chunks) for s in torch.split(perm, self.batch)]


def _train(
    head: torch.nn.Module,
    inputs: Sequence[torch.Tensor],
    target: torch.Tensor,
    mask: torch.Tensor,
    lr: float,
    epochs: int,
    plan: _Plan,
    threads: int,
) -> list[float]:
    """Adam on the listwise loss. Each step's gradient is the gradient of the mean loss over its
    images: the sum, in chunk order, of the chunks' gradients of (chunk images / step images) x
    (chunk mean loss)."""
    params = [p for p in head.parameters() if p.requires_grad]

    def chunk_grad(c: Chunk, w: float) -> tuple[torch.Tensor, Sequence[torch.Tensor]]:
        loss = listwise_loss(head(*(t[c] for t in inputs)), target[c], mask[c])
        return loss.detach(), torch.autograd.grad(loss * w, params)

    opt = torch.optim.Adam(params, lr=float(lr))
    losses: list[float] = []
    # on CPU the chunks always run on pool threads (one or more, all with the same settings)
    pool = ThreadPoolExecutor(max_workers=threads, initializer=_worker_init) if target.device.type == "cpu" else None
    run: Callable = pool.map if pool is not None else map  # type: ignore[assignment]
    try:
        for _ in range(int(epochs)):
            total = torch.zeros((), dtype=torch.float64, device=target.device)
            for chunks in plan.epoch():
                n_step = sum(_size(c) for c in chunks)
                results = list(run(lambda c: chunk_grad(c, _size(c) / n_step), chunks))
                for i, p in enumerate(params):
                    g = results[0][1][i]
                    if len(results) > 1:
                        g = g.clone()
                        for _, grads in results[1:]:
                            g.add_(grads[i])
                    p.grad = g
                for c, (loss, _) in zip(chunks, results):
                    total += loss.double() * _size(c)
                opt.step()
            losses.append(float(total) / plan.n)
    finally:
        if pool is not None:
            pool.shutdown()
    return losses


def _rerank(cfg: Config | RerankCfg | None) -> RerankCfg:
    if isinstance(cfg, Config):
        return cfg.rerank
    if isinstance(cfg, RerankCfg):
        return cfg
    if cfg is None:
        return RerankCfg()
    raise TypeError(f"expected a RerankCfg (or Config), got {type(cfg).__name__}")


def fit_head(
    name: str,
    feats: BeamFeatures,
    cfg: RerankCfg | Config | None = None,
    seed: int = 42,
    device: str | torch.device = "cpu",
) -> Fitted:
    """Fit the head registered as ``name`` on ``feats`` (its Borda targets), with its section of
    ``cfg`` (lr, epochs, architecture) and ``cfg.batch_images`` / ``cfg.threads``; see the module
    docstring. ``device``: "cpu", "cuda" or "auto" (see :func:`fit_device`)."""
    spec = HEADS.get(name)
    r = _rerank(cfg)
    section = spec.settings(r)
    if feats.n_images == 0:
        raise ValueError(f"fit_{name}: no images to fit on (every feature row failed or the table is empty)")
    if spec.check is not None:
        spec.check(feats, section)
    dev = _device(device)
    t0 = time.perf_counter()
    _, target = borda_targets(feats.raw_scores, feats.mask)
    to = dict(device=dev, non_blocking=False)
    inputs = [t.to(**to) for t in spec.inputs(feats)]
    target, mask = target.to(**to), feats.mask.to(**to)
    on_cpu = dev.type == "cpu"
    nt = _threads(r.threads) if on_cpu else 1
    plan = _Plan(
        feats.n_images,
        r.batch_images,
        seed,
        spec.chunk_images if on_cpu else CUDA_CHUNK_IMAGES,
        2 if on_cpu else 1,
        dev,
    )
    with deterministic(seed, dev):
        head = spec.build(section)  # seeded initialisation on CPU, then moved
        head.to(dev).train()
        losses = _train(head, inputs, target, mask, section.lr, section.epochs, plan, nt)
        head.eval().to("cpu")
    return Fitted(head, losses, feats.n_images, seed, time.perf_counter() - t0, r.batch_images, nt, dev.type)


def fit_trifuse(feats: BeamFeatures, cfg: RerankCfg | Config | None = None, seed: int = 42,
                device: str | torch.device = "cpu") -> Fitted:
    """Fit TriFuse (``fit_head("trifuse", ...)``)."""
    return fit_head("trifuse", feats, cfg, seed=seed, device=device)


def fit_memattend(feats: BeamFeatures, cfg: RerankCfg | Config | None = None, seed: int = 42,
                  device: str | torch.device = "cpu") -> Fitted:
    """Fit MemAttend (``fit_head("memattend", ...)``)."""
    return fit_head("memattend", feats, cfg, seed=seed, device=device)


def fit_heads(
    feats: BeamFeatures,
    cfg: Config | RerankCfg | None = None,
    seed: int | None = None,
    which: Sequence[str] | None = None,
    device: str | torch.device = "cpu",
) -> Heads:
    """Fit the requested heads (default: every registered head) and return them with their loss
    curves and fit metadata."""
    if seed is None:
        seed = cfg.seed if isinstance(cfg, Config) else 42
    names = list(HEADS) if which is None else [HEADS.get(w).name for w in which]
    heads = Heads(meta={"seed": int(seed), "n_images": feats.n_images, "lm_feature": feats.lm_feature})
    for name in names:
        f = fit_head(name, feats, cfg, seed=seed, device=device)
        setattr(heads, name, f.head)
        heads.losses[name] = f.losses
        heads.meta[f"{name}_seconds"] = f.seconds
        heads.meta["fit_threads"] = f.threads
        heads.meta["fit_device"] = f.device
        heads.meta["batch_images"] = f.batch_images
    return heads


def fit(
    feats: BeamFeatures,
    protocol: str | Config | RerankCfg | None = None,
    cfg: Config | RerankCfg | None = None,
    seed: int | None = None,
    device: str | torch.device = "cpu",
) -> Heads:
    """``fit(features, protocol) -> heads``: fit TriFuse and MemAttend on ``feats``.

    ``protocol`` is "inductive" or "transductive" (the caller passes the fit split's features:
    val for inductive, the test split itself for transductive) or a Config / RerankCfg, whose
    protocol and head settings are used. "training-free" fits nothing and is refused."""
    if isinstance(protocol, (Config, RerankCfg)):
        cfg, protocol = protocol, _rerank(protocol).protocol
    if protocol == "training-free":
        raise ValueError("protocol 'training-free' fits no head; pick with a training-free picker (e.g. 'fixed' or 'lm')")
    if protocol not in (None, "inductive", "transductive"):
        raise ValueError(unknown("protocol", protocol, ("inductive", "transductive", "training-free")))
    heads = fit_heads(feats, cfg, seed=seed, device=device)
    if protocol is not None:
        heads.meta["protocol"] = protocol
    return heads
