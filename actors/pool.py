"""The one pool actor (docs/architecture.md, "Pools"): :class:`adjcap.engine.pool_batch.PoolBatch` (the
library half, which the local backend runs in process) as a Ray actor: the object refs it is given
fetched, the GPU Ray assigned and its free memory checked before any model loads, each stage's batches
metered for the job's progress."""

from __future__ import annotations

import functools
from typing import Any

import ray

from adjcap.engine import gpu_errors, pools, stage_registry
from adjcap.actors.progress import StageMeter
from adjcap.engine.batch_sink import Sink
from adjcap.config import Config
from adjcap.engine.pool_batch import PoolBatch, families_for
from adjcap.engine.transport import Keep


class PoolActor(PoolBatch):
    def __init__(self, cfg: Config, stages: tuple[str, ...], given: dict[str, Any] | None = None,
                 board: Any = None, last: bool = True, sink: Sink | None = None, pool: str | None = None,
                 keep: Keep | None = None, part: str | None = None):
        """:class:`PoolBatch`'s arguments, and ``board``: the job's progress board. Object refs in
        ``given`` are fetched here (the caption index the job put once, whose arrays are then read-only
        views of this node's object store)."""
        given = {k: ray.get(v) if isinstance(v, ray.ObjectRef) else v for k, v in (given or {}).items()}
        name = pool or stage_registry.stage(stages[0]).pool
        gpu_errors.check_gpu_seen(ray.get_gpu_ids(), cfg.device, name, ray.util.get_node_ip_address())
        pools.check_gpu_memory(cfg, name, families_for(stages, part))  # before any model loads: one line when they cannot fit
        super().__init__(cfg, stages, given, last, sink, name, keep, meter=lambda s: StageMeter(s, board),
                         part=part)


@functools.cache
def actor_class(name: str) -> type:
    """:class:`PoolActor` under the name Ray shows for the pool (``MapBatches(CaptionerActor)``), so a
    process list tells the pools apart."""
    return type(name, (PoolActor,), {"__doc__": PoolActor.__doc__})
