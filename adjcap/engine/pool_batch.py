"""The one pool's batch callable (docs/architecture.md, "Pools"), the library half of the Ray pool
actor (``actors/pool.py``; the local backend instantiates it in process): loads the model families
of its stages once (:mod:`adjcap.engine.stage_registry`), or takes them loaded, and runs their batch
functions, in order, on every batch of states. A split pool runs one stage; the fused pool runs every
stage an image needs. The last pool writes each finished batch through the sink
(:func:`adjcap.engine.batch_sink.write_batch`) and returns only what the driver counts
(:func:`adjcap.engine.batch_sink.done_columns`)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Mapping

import pyarrow as pa

from adjcap.engine import gpu_errors, stage_registry
from adjcap.engine.batch_sink import Sink, done_columns, write_batch
from adjcap.config import Config
from adjcap.engine.transport import Keep, columns, pack, unpack
from adjcap.engine.stages import HalvedSizes, carrying


def families_for(stages: tuple[str, ...], part: str | None = None) -> tuple[str, ...]:
    """The model families a pool of ``stages`` loads: their own, or the one family whose ``part`` it runs."""
    return (part,) if part else tuple(stage_registry.families_of(stages))


class _Unmetered:
    def batch(self, states):
        return contextlib.nullcontext()


class PoolBatch:
    def __init__(self, cfg: Config, stages: tuple[str, ...], given: dict[str, Any] | None = None,
                 last: bool = True, sink: Sink | None = None, pool: str | None = None, keep: Keep | None = None,
                 models: Mapping[str, Any] | None = None, meter: Callable[[str], Any] | None = None,
                 part: str | None = None):
        """``cfg`` resolved; ``stages``: the stage names this pool runs; ``given``: what the job hands the
        families instead of files (the caption index, the corpus nouns); ``last``: this pool's states are
        final (images and intermediate encodings are dropped); ``sink``: where the last pool writes its
        batches (then only :func:`adjcap.engine.batch_sink.done_columns` go back, never a state); ``pool``: the
        pool's name (default: its first stage's pool); ``keep``: what its output carries on for the pools
        after it (:func:`adjcap.engine.transport.kept_for`; default everything); ``models``: the families
        already loaded in this process, by name (then nothing loads); ``meter``: stage name -> an object
        whose ``batch(states)`` wraps each stage call (the Ray actor's progress; default none); ``part``:
        run only that family's part of the stages (:attr:`adjcap.engine.stage_registry.Family.parts`; the
        verifier half of stage 4 in the ``lavis`` backend's environment), loading that family alone."""
        self.cfg, self.last, self.sink, self.keep = cfg, last, sink, keep
        self.cache = sink.cache() if sink is not None else None
        self.stages = [stage_registry.stage(s) for s in stages]
        self.pool = pool or self.stages[0].pool  # its name in the memory plan and in a GPU failure's line
        self.families = families_for(stages, part)
        self.runs = [stage_registry.family(part).parts[s.name] if part else s.run for s in self.stages]
        if models is None:
            models = stage_registry.load_families(cfg, self.families, given or {})
        self.models = models
        self.meters = [(meter or (lambda _: _Unmetered()))(f"{s.name}-{part}" if part else s.name)
                       for s in self.stages]
        self.halved = HalvedSizes()  # an out-of-memory halved batch size, carried to this pool's next batches

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
