"""Pools as data (docs/architecture.md, "Pools"): which actors a job runs the stages in, and how much
memory each one's models take.

``ray.pools`` chooses the layout:

* ``split``: one pool per stage's ``pool`` (retriever, verifier, captioner, scorer), each loading only
  its stages' model families; images travel between them. With GPUs, slow stages get more actors;
* ``fused``: one pool, ``fused``, running every stage an image needs in one process, each model loaded
  once (the scorer reuses the retrieval encoder and the verifier); no image travels between pools;
* ``auto`` (default): fused on a cluster without GPUs (a CPU-only machine gains nothing from four
  processes per image); with GPUs split under NVIDIA MPS (``ray.mps``), else fused (:func:`is_fused`).

A family that loads in an environment of its own (the ``lavis`` verifier backend: LAVIS's) runs split, in
pools whose workers start in that environment (:func:`layout`).
Each pool's actor count, CPU / GPU share and batch size is data too: ``ray.pool.<pool>.actors`` /
``.gpus`` / ``.cpus`` / ``.batch_size``, defaulting to ``ray.workers``, ``ray.gpu_share`` (fused: the
sum of the split pools' shares), ``ray.cpu_share`` and ``ray.batch_size`` (unset: 64 images with GPUs,
16 without). Pure: reads the config and the stage registry (and whether an isolated environment is
built), never imports Ray. The job reads all of it from its run plan (:class:`adjcap.engine.cluster_plan.PoolPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from adjcap.engine import gpu_errors, stage_registry
from adjcap.config import Config, ConfigError
from adjcap.models import budget

FUSED = "fused"
ENCODER = "encoder"  # the corpus-encoder pool of `adjcap encode-corpus` (not a stage's pool)


@dataclass(frozen=True)
class Pool:
    """A pool of identical actors (``actors`` of them, ``batch_size`` images a batch), as data: the stages
    they run (in order), the families they load, the actor's class name (what Ray shows:
    ``MapWorker(MapBatches(CaptionerActor))``) and the names it reports progress under (``meters``).
    ``part``: the pool runs only that family's part of its stages (:attr:`adjcap.engine.stage_registry.Family.parts`,
    the verifier half of stage 4: meter ``score-verifier``, actor ``ScorerVerifierActor``), in the family's
    environment; ``given``: families whose part of these stages a pool before this one ran (handed None
    here); ``env``: the Ray runtime environment its workers start in (None: the job's own)."""

    name: str
    stages: tuple[str, ...]
    families: tuple[str, ...]
    actor_name: str
    meters: tuple[str, ...]
    part: str | None = None
    given: tuple[str, ...] = ()
    env: Mapping[str, Any] | None = None
    actors: int = 1
    batch_size: int = 16


def pool(name: str, stages: Iterable[str], part: str | None = None, **more: Any) -> Pool:
    """The :class:`Pool` record of pool ``name`` running ``stages`` (or ``part``'s part of them)."""
    stages = tuple(stages)
    return Pool(name, stages, (part,) if part else stage_registry.families_of(stages),
                f"{name.capitalize()}{(part or '').capitalize()}Actor",
                tuple(f"{s}-{part}" if part else s for s in stages), part, **more)


def _split(stage_names: Iterable[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for s in stage_names:
        out.setdefault(stage_registry.stage(s).pool, []).append(s)
    return out


def split_pools(stage_names: Iterable[str] | None = None) -> list[Pool]:
    """One pool per distinct stage ``pool``, in stage order (names and stages only)."""
    names = tuple(stage_names) if stage_names is not None else stage_registry.names()
    return [pool(p, st) for p, st in _split(names).items()]


def pool_names() -> tuple[str, ...]:
    """The split pools' names, in stream order."""
    return tuple(_split(stage_registry.names()))


def mps_on(cfg: Config) -> bool:
    """Whether the GPU nodes run NVIDIA MPS: ``ray.mps``, else this machine's MPS control pipe
    (:func:`adjcap.machine.accelerators.mps_status`)."""
    if cfg.ray.mps is not None:
        return bool(cfg.ray.mps)
    from adjcap.machine.accelerators import mps_status

    return mps_status()[0]


def isolated(cfg: Config, stage_names: Iterable[str] | None = None) -> dict[str, Mapping[str, Any]]:
    """{family: its Ray runtime environment} of the families of ``stage_names`` (default: every stage)
    that load in an environment of their own (:attr:`adjcap.engine.stage_registry.Family.env`: the ``lavis``
    verifier backend's); a missing environment raises its own one-line error."""
    names = tuple(stage_names) if stage_names is not None else stage_registry.names()
    envs = {f: stage_registry.family(f).env(cfg) for f in stage_registry.families_of(names)}
    return {f: e for f, e in envs.items() if e is not None}


def is_fused(cfg: Config, gpu: bool) -> bool:
    """Whether a job on a cluster with (``gpu``) or without GPUs runs one fused pool. ``auto``'s rule: without
    GPUs fused (a CPU gains nothing from four processes per image); with GPUs split only under MPS (the four
    pools' CUDA contexts then share each GPU's SMs at once), else fused, so that one CUDA context per GPU
    share never time-slices with another pool's (``ray.pool.fused.gpus`` below 1 puts several on a GPU).
    A family loading in an environment of its own (:func:`isolated`) needs pools of its own: split."""
    if isolated(cfg):
        return False
    return cfg.ray.pools == FUSED or (cfg.ray.pools == "auto" and not (gpu and mps_on(cfg)))


def layout(cfg: Config, gpu: bool, first: int = 0) -> list[Pool]:
    """The pools a job runs for images that need the stages from index ``first`` on, in order, each with
    its actors, batch size and environment. A family that loads in an environment of its own runs its
    stages' pool there, and its part of another pool's stages (:attr:`adjcap.engine.stage_registry.Family.parts`)
    in a pool of its own just before that pool (same name, actors and resources), which is handed None
    for it."""
    names = stage_registry.names()[first:]
    envs = isolated(cfg)  # every stage's: a family's part runs with a later stage although its own is done
    groups = {FUSED: list(names)} if is_fused(cfg, gpu) else _split(names)
    out: list[Pool] = []
    for name, stages in groups.items():
        common = {"actors": actors(cfg, name), "batch_size": batch_size(cfg, name, gpu)}
        fams = stage_registry.families_of(stages)
        parts = [(f, tuple(s for s in stages if s in stage_registry.family(f).parts))
                 for f in envs if f not in fams]
        parts = [(f, st) for f, st in parts if st]
        for f, st in parts:
            out.append(pool(name, st, part=f, env=envs[f], **common))
        env = next((envs[f] for f in fams if f in envs), None)
        out.append(pool(name, stages, given=tuple(f for f, _ in parts), env=env, **common))
    return out


def read(cfg: Config) -> tuple[dict[tuple[bool, int], tuple[Pool, ...]], dict[str, "Share"], dict[bool, int]]:
    """Everything a job's pool plan holds, read from the (resolved) config in one pass: the layouts by (a
    cluster with GPUs?, the first stage index some image needs), every pool's :class:`Share`, and the
    decode tasks' batch size with and without GPUs (:class:`adjcap.engine.cluster_plan.PoolPlan`)."""
    layouts = {(gpu, first): tuple(layout(cfg, gpu, first))
               for gpu in (False, True) for first in range(len(stage_registry.names()))}
    return layouts, shares(cfg), {gpu: batch_size(cfg, None, gpu) for gpu in (False, True)}


def part_actors(cfg: Config, pools: Iterable[str]) -> int:
    """Actors of the pools that run a family's part of ``pools``' stages (:func:`layout`), beyond theirs."""
    stages = _split(stage_registry.names())
    envs = isolated(cfg)
    n = 0
    for p in pools:
        st = stage_registry.names() if p == FUSED else stages.get(p, ())
        fams = stage_registry.families_of(st)
        n += actors(cfg, p) * sum(1 for f in envs if f not in fams and set(st) & set(stage_registry.family(f).parts))
    return n


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


@dataclass(frozen=True)
class Share:
    """What one actor of a pool asks of a cluster, read from the config once: its pool's ``actors``, its GPU
    share, its CPUs (None: the shared default, ``ray.cpu_share`` shrunk to fit), its models' bytes at run
    precision on a GPU and on a CPU, and the actors of the pools that run an isolated family's part of its
    stages beside it (:func:`part_actors`)."""

    actors: int
    gpus: float
    cpus: float | None
    gpu_bytes: int
    cpu_bytes: int
    part_actors: int = 0


def shares(cfg: Config) -> dict[str, Share]:
    """Every pool's :class:`Share` (the split pools, the fused pool and the corpus encoder)."""
    on_gpu, on_cpu = pool_budget(cfg, gpu=True), pool_budget(cfg, gpu=False)
    return {p: Share(actors(cfg, p), gpu_share(cfg, p), cpu_request(cfg, p), on_gpu[p]["bytes"], on_cpu[p]["bytes"],
                     part_actors(cfg, (p,))) for p in (*pool_names(), FUSED, ENCODER)}


def check_gpu_memory(cfg: Any, pool: str, families: Iterable[str] | None = None) -> None:
    """In a pool's actor, before its models load (``cfg`` resolved): on a GPU, its models (``families``,
    default the pool's in :func:`pool_budget`; at the precision they load in) must fit in the device's free
    memory, else :class:`adjcap.engine.gpu_errors.GpuFailure` in one line naming the pool and the memory."""
    import torch

    from adjcap.models.precision import pick_device

    if str(cfg.device) == "cpu" or not torch.cuda.is_available():
        return
    dev = pick_device(cfg.device)
    if dev.type != "cuda":
        return
    if families is not None:
        need = _sum_sizes(cfg, True, families)["bytes"]
    else:
        plan = pool_budget(cfg, gpu=True)
        if pool not in plan:
            return
        need = plan[pool]["bytes"]
    free, _ = torch.cuda.mem_get_info(dev)
    if need > free:
        raise gpu_errors.GpuFailure(
            f"pool {pool}: its models need {budget.human_bytes(need)} of GPU memory at the precision they load in, "
            f"before any batch; {gpu_errors.memory_line(dev)}; give the pool a GPU of its own "
            "(ray.pool.<pool>.gpus) or use precision=bf16", pool=pool)
