"""The one pool actor (docs/architecture.md, "Pools"): loads the model families of its stages once
(:mod:`adjcap.stage_registry`) and runs their batch functions, in order, on every batch of states.
A split pool runs one stage; the fused pool runs every stage an image needs in this one process. The
last pool's actors write each finished batch themselves (:func:`adjcap.batch_sink.write_batch`) and
return only what the driver counts (:func:`adjcap.batch_sink.done_columns`)."""

from __future__ import annotations

import functools
from typing import Any

import pyarrow as pa
import ray

from adjcap import gpu_errors, pools, stage_registry
from adjcap.stages import HalvedSizes, carrying
from adjcap.actors.progress import StageMeter
from adjcap.actors.transport import Keep, columns, pack, unpack
from adjcap.batch_sink import Sink, done_columns, write_batch
from adjcap.config import Config


class PoolActor:
    def __init__(self, cfg: Config, stages: tuple[str, ...], given: dict[str, Any] | None = None,
                 board: Any = None, last: bool = True, sink: Sink | None = None, pool: str | None = None,
                 keep: Keep | None = None, part: str | None = None):
        """``cfg`` resolved; ``stages``: the stage names this pool runs; ``given``: what the job hands the
        families instead of files (object refs are fetched here: the caption index the job put once, whose
        arrays are then read-only views of this node's object store); ``last``: this pool's states are final
        (images and intermediate encodings are dropped); ``sink``: where the last pool writes its batches
        (then only :func:`adjcap.batch_sink.done_columns` go back, never a state); ``pool``: the pool's
        name (default: its first stage's pool); ``keep``: what its output carries on for the pools after it
        (:func:`adjcap.actors.transport.kept_for`; default everything); ``part``: run only that family's part
        of the stages (:attr:`adjcap.stage_registry.Family.parts`; the verifier half of stage 4 in the
        ``lavis`` backend's environment), loading that family alone."""
        self.cfg, self.last, self.sink, self.keep = cfg, last, sink, keep
        self.cache = sink.cache() if sink is not None else None
        self.stages = [stage_registry.stage(s) for s in stages]
        given = {k: ray.get(v) if isinstance(v, ray.ObjectRef) else v for k, v in (given or {}).items()}
        self.pool = pool or self.stages[0].pool  # its name in the memory plan and in a GPU failure's line
        families = (part,) if part else stage_registry.families_of(stages)
        self.runs = [stage_registry.family(part).parts[s.name] if part else s.run for s in self.stages]
        gpu_errors.check_gpu_seen(ray.get_gpu_ids(), cfg.device, self.pool, ray.util.get_node_ip_address())
        pools.check_gpu_memory(cfg, self.pool, families)  # before any model loads: one line when they cannot fit
        self.models = stage_registry.load_families(cfg, families, given)
        self.meters = [StageMeter(f"{s.name}-{part}" if part else s.name, board) for s in self.stages]
        self.halved = HalvedSizes()  # an out-of-memory halved batch size, carried to this actor's next batches

    def __call__(self, batch: pa.Table) -> pa.Table:
        states = unpack(batch)
        for run, meter in zip(self.runs, self.meters):
            with meter.batch(states), carrying(self.halved):
                try:
                    run(states, self.models, self.cfg)
                except gpu_errors.GpuFailure as e:  # the job's end, in one line naming this pool
                    raise e.in_pool(self.pool) from None
        if self.sink is not None:
            write_batch(states, self.sink, self.cache)
            return columns(done_columns(states))
        return pack(states, drop_image=self.last, keep=self.keep)


@functools.cache
def actor_class(name: str) -> type:
    """:class:`PoolActor` under the name Ray shows for the pool (``MapBatches(CaptionerActor)``), so a
    process list tells the pools apart."""
    return type(name, (PoolActor,), {"__doc__": PoolActor.__doc__})
