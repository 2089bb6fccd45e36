"""Pools as data (docs/architecture.md, "Pools"): which actors a job runs the stages in, and how much
memory each one's models take.

``ray.pools`` chooses the layout:

* ``split``: one pool per stage's ``pool`` (retriever, verifier, captioner, scorer), each loading only
  its stages' model families; images travel between them. With GPUs, slow stages get more actors;
* ``fused``: one pool, ``fused``, running every stage an image needs in one process, each model loaded
  once (the scorer reuses the retrieval encoder and the verifier); no image travels between pools;
* ``auto`` (default): fused on a cluster without GPUs (a CPU-only machine gains nothing from four
  processes per image); with GPUs split under NVIDIA MPS (``ray.mps``), else fused (:func:`is_fused`).

The ``lavis`` verifier backend always runs split: its verifier runs in LAVIS's own environment.
Each pool's actor count, CPU / GPU share and batch size is data too: ``ray.pool.<pool>.actors`` /
``.gpus`` / ``.cpus`` / ``.batch_size``, defaulting to ``ray.workers``, ``ray.gpu_share`` (fused: the
sum of the split pools' shares), ``ray.cpu_share`` and ``ray.batch_size`` (unset: 64 images with GPUs,
16 without). Pure: reads the config and the stage registry, never imports Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from adjcap import gpu_errors, stage_registry
from adjcap.config import Config, ConfigError
from adjcap.models import budget

FUSED = "fused"
ENCODER = "encoder"  # the corpus-encoder pool of `adjcap encode-corpus` (not a stage's pool)


@dataclass(frozen=True)
class Pool:
    """A pool of identical actors: the stages they run (in order) and the families they load."""

    name: str
    stages: tuple[str, ...]

    @property
    def families(self) -> tuple[str, ...]:
        return stage_registry.families_of(self.stages)

    @property
    def actor_name(self) -> str:
        """The actor's class name (what Ray shows: ``MapWorker(MapBatches(CaptionerActor))``)."""
        return f"{self.name.capitalize()}Actor"


def split_pools(stage_names: Iterable[str] | None = None) -> list[Pool]:
    """One pool per distinct stage ``pool``, in stage order."""
    names = tuple(stage_names) if stage_names is not None else stage_registry.names()
    out: dict[str, list[str]] = {}
    for s in names:
        out.setdefault(stage_registry.stage(s).pool, []).append(s)
    return [Pool(p, tuple(st)) for p, st in out.items()]


def pool_names() -> tuple[str, ...]:
    """The split pools' names, in stream order."""
    return tuple(p.name for p in split_pools())


def mps_on(cfg: Config) -> bool:
    """Whether the GPU nodes run NVIDIA MPS: ``ray.mps``, else this machine's MPS control pipe
    (:func:`adjcap.accelerators.mps_status`)."""
    if cfg.ray.mps is not None:
        return bool(cfg.ray.mps)
    from adjcap.accelerators import mps_status

    return mps_status()[0]


def is_fused(cfg: Config, gpu: bool) -> bool:
    """Whether a job on a cluster with (``gpu``) or without GPUs runs one fused pool. ``auto``'s rule: without
    GPUs fused (a CPU gains nothing from four processes per image); with GPUs split only under MPS (the four
    pools' CUDA contexts then share each GPU's SMs at once), else fused, so that one CUDA context per GPU
    share never time-slices with another pool's (``ray.pool.fused.gpus`` below 1 puts several on a GPU)."""
    if cfg.verifier.enabled and cfg.verifier.backend == "lavis":
        return False  # its verifier runs in LAVIS's environment, a pool of its own
    return cfg.ray.pools == FUSED or (cfg.ray.pools == "auto" and not (gpu and mps_on(cfg)))


def layout(cfg: Config, gpu: bool, first: int = 0) -> list[Pool]:
    """The pools a job runs for images that need the stages from index ``first`` on."""
    names = stage_registry.names()[first:]
    return [Pool(FUSED, names)] if is_fused(cfg, gpu) else split_pools(names)


@dataclass(frozen=True)
class PoolPlan:
    """The pools a job may run, decided once from the config (a job's run plan holds it): the layout on a
    cluster without GPUs and on one with them (which one runs is the connected cluster's to say), and
    each pool's actor count. ``layout(gpu, first)`` equals :func:`layout`."""

    without_gpus: tuple[Pool, ...]
    with_gpus: tuple[Pool, ...]
    actors: Mapping[str, int]

    def layout(self, gpu: bool, first: int = 0) -> list[Pool]:
        """The pools for images that need the stages from index ``first`` on."""
        keep = set(stage_registry.names()[first:])
        out = []
        for p in self.with_gpus if gpu else self.without_gpus:
            stages = tuple(s for s in p.stages if s in keep)
            if stages:
                out.append(Pool(p.name, stages))
        return out


def plan(cfg: Config) -> PoolPlan:
    """The pool plan of a (resolved) config; an unknown ``ray.pool.<name>`` is refused here."""
    lay = {gpu: tuple(layout(cfg, gpu)) for gpu in (False, True)}
    names = dict.fromkeys(p.name for ps in lay.values() for p in ps)
    return PoolPlan(lay[False], lay[True], MappingProxyType({p: actors(cfg, p) for p in names}))


def _pool_cfg(cfg: Config, name: str):
    known = (*pool_names(), FUSED, ENCODER)
    for key in cfg.ray.pool:
        if key not in known:
            raise ConfigError(f"ray.pool.{key}: no such pool (pools: {', '.join(known)})")
    return cfg.ray.pool.get(name)


def actors(cfg: Config, name: str) -> int:
    """Actors of pool ``name``: ``ray.pool.<name>.actors``, else ``ray.workers``."""
    p = _pool_cfg(cfg, name)
    return p.actors if p is not None and p.actors is not None else cfg.ray.workers


def gpu_share(cfg: Config, name: str) -> float:
    """GPU per actor of pool ``name``: ``ray.pool.<name>.gpus``, else ``ray.gpu_share`` (a fused
    actor: the sum of the split pools' shares, one GPU by default)."""
    p = _pool_cfg(cfg, name)
    if p is not None and p.gpus is not None:
        return float(p.gpus)
    if name == FUSED:
        return round(sum(gpu_share(cfg, q) for q in pool_names()), 6)
    return float(cfg.ray.gpu_share)


GPU_BATCH, CPU_BATCH = 64, 16  # images per Ray Data batch when ray.batch_size is not set


def batch_size(cfg: Config, name: str | None, gpu: bool) -> int:
    """Images per Ray Data batch of pool ``name`` (None: the decode tasks): ``ray.pool.<name>.batch_size``,
    else ``ray.batch_size``, else 64 on a cluster with GPUs (``gpu``) and 16 without."""
    p = _pool_cfg(cfg, name) if name is not None else None
    if p is not None and p.batch_size is not None:
        return p.batch_size
    if cfg.ray.batch_size is not None:
        return cfg.ray.batch_size
    return GPU_BATCH if gpu else CPU_BATCH


def cpu_request(cfg: Config, name: str) -> float | None:
    """CPUs per actor of pool ``name`` when set (``ray.pool.<name>.cpus``), else None (the default)."""
    p = _pool_cfg(cfg, name)
    return None if p is None or p.cpus is None else float(p.cpus)


def _sum_sizes(cfg: Config, gpu: bool, families: Iterable[str]) -> dict[str, int]:
    holds = frozenset(families)
    sizes = [stage_registry.family(f).size(cfg, gpu, holds) for f in holds]
    return {"params": sum(n for n, _ in sizes), "bytes": sum(b for _, b in sizes)}


def pool_budget(cfg: Any, gpu: bool | None = None) -> dict[str, dict[str, int]]:
    """``{pool: {"params": n, "bytes": b}}`` of a resolved config: every split pool, the fused pool
    (each family once) and the corpus encoder.

    ``gpu``: whether the models run on a GPU (decides what precision "auto" means); default: from
    ``cfg.device`` (``cuda...`` = GPU; "auto" without a GPU known counts as the CPU, the larger)."""
    if gpu is None:
        gpu = str(cfg.device).startswith("cuda")
    out = {p.name: _sum_sizes(cfg, gpu, p.families) for p in split_pools()}
    out[FUSED] = _sum_sizes(cfg, gpu, stage_registry.families_of(stage_registry.names()))
    enc = cfg.retrieval.encoder
    text = budget.encoder_params(enc, ("text",))
    out[ENCODER] = {"params": text, "bytes": text * budget.precision_bytes(enc.precision, gpu)}
    return out


def gpu_memory_problem(cfg: Any, gpus: float, gpu_bytes: int, pools: Iterable[str]) -> str | None:
    """Why the models of ``pools`` (each pool's actors, :func:`actors`) cannot fit on ``gpus`` GPUs of
    ``gpu_bytes`` each, counted at the precision each model loads in (``cfg`` resolved), or None: one
    actor's models larger than a whole GPU, or every actor's together larger than all of them."""
    plan = pool_budget(cfg, gpu=True)
    pools = tuple(pools)
    for p in pools:
        need = plan[p]["bytes"]
        if need > gpu_bytes:
            return (f"pool {p}: one actor's models take {budget.human_bytes(need)} of GPU memory at the precision "
                    f"they load in, more than a whole GPU ({budget.human_bytes(gpu_bytes)}); use precision=bf16 "
                    "or a larger GPU")
    total = sum(actors(cfg, p) * plan[p]["bytes"] for p in pools)
    if total > gpus * gpu_bytes:
        per = " + ".join(f"{actors(cfg, p)} x {p} {budget.human_bytes(plan[p]['bytes'])}" for p in pools)
        return (f"the pools' models take {per} = {budget.human_bytes(total)} of GPU memory, the "
                f"{gpus:g} GPU(s) have {budget.human_bytes(gpus * gpu_bytes)}; use fewer actors or precision=bf16")
    return None


def check_gpu_memory(cfg: Any, pool: str) -> None:
    """In a pool's actor, before its models load (``cfg`` resolved): on a GPU, its models (at the
    precision they load in) must fit in the device's free memory, else
    :class:`adjcap.gpu_errors.GpuFailure` in one line naming the pool and the memory."""
    import torch

    from adjcap.models.precision import pick_device

    if str(cfg.device) == "cpu" or not torch.cuda.is_available():
        return
    dev = pick_device(cfg.device)
    plan = pool_budget(cfg, gpu=True)
    if dev.type != "cuda" or pool not in plan:
        return
    need = plan[pool]["bytes"]
    free, _ = torch.cuda.mem_get_info(dev)
    if need > free:
        raise gpu_errors.GpuFailure(
            f"pool {pool}: its models need {budget.human_bytes(need)} of GPU memory at the precision they load in, "
            f"before any batch; {gpu_errors.memory_line(dev)}; give the pool a GPU of its own "
            "(ray.pool.<pool>.gpus) or use precision=bf16", pool=pool)
