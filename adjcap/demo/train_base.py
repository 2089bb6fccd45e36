"""The shared pieces of the tiny trainings: determinism, the optimiser and its schedule, the loss
log, and the rendered pool of training scenes."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from adjcap.data.corpus import normalize_caption
from adjcap.demo.world import iter_training_pairs

CLIP_POOL = "clip-train"
HELDOUT_POOL = "clip-heldout"


@dataclass
class TrainLog:
    """What one training did: steps, seconds (wall, and CPU of this process), mean loss over the first
    and the last tenth of steps."""

    model: str
    steps: int
    seconds: float
    loss_first: float
    loss_last: float
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LossTrace:
    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.values: list[float] = []
        self.cpu0 = time.process_time()

    def add(self, loss: torch.Tensor) -> None:
        self.values.append(float(loss.detach()))

    def log(self, model: str, seconds: float, **extra: Any) -> TrainLog:
        n = max(1, len(self.values) // 10)
        first = sum(self.values[:n]) / n if self.values else math.nan
        last = sum(self.values[-n:]) / n if self.values else math.nan
        extra = {"cpu_seconds": round(time.process_time() - self.cpu0, 3), **extra}
        return TrainLog(model, len(self.values), round(seconds, 3), first, last, extra)


# --------------------------------------------------------------------------------------------
# Determinism
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def deterministic(seed: int, threads: int = 1) -> Iterator[None]:
    """Seed torch's global RNG (restored after), switch on deterministic algorithms and fix the
    intra-op thread count for the duration; the previous state comes back on exit."""
    prev_threads = torch.get_num_threads()
    prev_det = torch.are_deterministic_algorithms_enabled()
    prev_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(max(1, int(threads)))
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(prev_det, warn_only=prev_warn)
            torch.set_num_threads(prev_threads)


class EpochSampler:
    """Batches of ``batch`` distinct indices of ``range(n)``: a permutation drawn from ``gen``, read in
    order, and drawn again when fewer than ``batch`` of it are left (every tiny model's training loop)."""

    def __init__(self, n: int, batch: int, gen: torch.Generator) -> None:
        self.n, self.batch, self.gen = n, batch, gen
        self.perm, self.pos = torch.randperm(n, generator=gen), 0

    def next(self) -> torch.Tensor:
        if self.pos + self.batch > self.n:
            self.perm, self.pos = torch.randperm(self.n, generator=self.gen), 0
        idx = self.perm[self.pos : self.pos + self.batch]
        self.pos += self.batch
        return idx


def cosine_lr(step: int, steps: int, base: float, warmup_frac: float = 0.1) -> float:
    warm = max(1, int(steps * warmup_frac))
    if step < warm:
        return base * (step + 1) / warm
    return base * 0.5 * (1.0 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr


def adamw(named: Sequence[tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, norms, embeddings, scales)."""
    decay = [p for n, p in named if p.dim() >= 2 and "embed" not in n and "wte" not in n and "wpe" not in n]
    ids = {id(p) for p in decay}
    rest = [p for _, p in named if id(p) not in ids]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.98), eps=1e-6, foreach=False,
    )


# --------------------------------------------------------------------------------------------
# The rendered training pool
# --------------------------------------------------------------------------------------------


@dataclass
class TrainingPool:
    """Rendered demo scenes (images in memory) with their 5 captions, normalised as the corpus is."""

    images: list[Any]  # PIL images
    captions: list[list[str]]
    scenes: list[dict[str, Any]]

    def __len__(self) -> int:
        return len(self.images)

    def signature(self, i: int) -> tuple:
        """The scene's content (background, sorted (colour, kind) list): equal signatures = same content."""
        sc = self.scenes[i]
        return (sc["background"], tuple(sorted((o["colour"], o["type"]) for o in sc["objects"])))


def render_pool(seed: int, n: int, pool: str = CLIP_POOL) -> TrainingPool:
    """``n`` scenes of the named pool, rendered in memory (nothing written)."""
    images, caps, scenes = [], [], []
    for pair in iter_training_pairs(seed, n, pool):
        images.append(pair.image)
        caps.append([normalize_caption(c) for c in pair.captions])
        scenes.append(pair.scene)
    return TrainingPool(images, caps, scenes)
