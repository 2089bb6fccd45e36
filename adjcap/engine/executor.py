"""One interface for driving the stages (docs/architecture.md, "Data flow of one image"): the engine
lays out a :class:`Stream` once (the records as one Arrow table of declared columns, cut into blocks
of whole batches; the decode step's pixel geometries; the pools from the run plan's layout, each with
its batch size; the batch sink) and an :class:`Executor` runs it, yielding what the last pool returns:
with a sink, the few columns per image the driver counts (:func:`adjcap.engine.batch_sink.done_columns`),
without one the final states, packed. Two backends: :class:`adjcap.engine.local.LocalExecutor` (in
process: tests, notebooks, benchmarks) and ``jobs/ray_backend.RayExecutor`` (Ray Data pools). Both
call the same decode function (:func:`adjcap.engine.decode_task.decode_table`) and the same pool batch
class (:class:`adjcap.engine.pool_batch.PoolBatch`) over the same transport
(:mod:`adjcap.engine.transport`) into the same sink (:mod:`adjcap.engine.batch_sink`)."""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa

from adjcap.engine import pools as pool_layout
from adjcap.engine import stage_registry
from adjcap.engine.batch_sink import Sink
from adjcap.config import Config
from adjcap.data.records import Record
from adjcap.engine import transport

BLOCK_BATCHES = 4  # the most batches in one block (block_rows)


@dataclass(frozen=True)
class PoolRun:
    """One pool of the stream: its actor class (the Ray backend's), its pool (resources by name), its
    actors and batch size, what its batch class gets beyond ``cfg`` (:class:`adjcap.engine.pool_batch.PoolBatch`'s
    ``stages``, ``given``, ``last``, ``pool``, ``part``, ``keep``), the stage names it reports progress
    under, and the extra map_batches options (its runtime environment, when not the job's)."""

    actor: type | None
    pool: str
    actors: int
    batch_size: int
    kwargs: dict
    meters: tuple[str, ...]
    options: dict


@dataclass(frozen=True)
class Stream:
    """What an executor runs: ``records`` (:func:`records_table`) in ``blocks`` of rows each; the decode
    step's batch size, pixel geometries and whether the image's bytes travel (:func:`decode_pixels`);
    the pools in order with their batch sizes (``sizes``, by pool name); from stage index ``first`` on;
    the last pool's ``sink`` (None: the final states come back packed)."""

    cfg: Config
    records: pa.Table
    block: int
    decode_size: int
    preps: tuple
    keep_bytes: bool
    layout: tuple[PoolRun, ...]
    sizes: Mapping[str, int]
    first: int
    sink: Sink | None

    def blocks(self) -> Iterator[pa.Table]:
        for i in range(0, self.records.num_rows, self.block):
            yield self.records.slice(i, self.block)


class Executor(abc.ABC):
    """Runs a :class:`Stream`: every record through the decode step and the pools, in order."""

    @abc.abstractmethod
    def run(self, stream: Stream) -> Iterator[pa.Table]:
        """What the last pool returns, table by table (in record order for the local backend; in any
        order for Ray)."""


def stream(cfg: Config, records: Sequence[Record], found: Mapping[str, dict], layout: Sequence[PoolRun],
           gpu: bool, first: int = 0, sink: Sink | None = None, slots: int = 1, benchmark: str | None = None,
           exif: bool | None = None, batch_size: int | None = None, decode_size: int | None = None) -> Stream:
    """The stream of ``records`` (``found``: image id -> the stage outputs the stage cache holds) through
    ``layout`` (the job's pools from stage index ``first`` on), on a cluster with (``gpu``) or without
    GPUs; ``slots``: the decode tasks or pool actors that run at once (:func:`block_rows`);
    ``batch_size``: one batch size for the decode step and every pool instead of the pools' own and
    ``decode_size`` (the decode step's; default ``ray.batch_size``'s)."""
    benchmark = benchmark or cfg.benchmark
    sizes = {p.pool: batch_size or p.batch_size for p in layout}
    bs = batch_size or decode_size or pool_layout.batch_size(cfg, None, gpu)  # the decode step's
    if exif is None:
        known = cfg.benchmarks.get(benchmark)
        exif = known.applies_exif() if known is not None else True  # an unconfigured folder: users' photos
    table = records_table(records, benchmark, exif, found)
    preps, keep_bytes = decode_pixels(cfg, layout)
    return Stream(cfg, table, block_rows(len(records), math.lcm(bs, *sizes.values()), slots), bs,
                  tuple(preps), keep_bytes, tuple(layout), sizes, first, sink)


def records_table(records: Sequence[Record], benchmark: str, exif: bool, found: Mapping[str, dict]) -> pa.Table:
    """The decode step's input: the records' columns (the image's own and ``image_path``, ``exif``) and
    the stage outputs the stage cache holds for them (:func:`adjcap.engine.transport.records`)."""
    n = len(records)
    return transport.records(
        {"image_id": [r.image_id for r in records], "benchmark": [benchmark] * n,
         "split": [r.split for r in records], "domain": [r.domain or None for r in records],
         "error": [r.error or None for r in records], "image_path": [r.image_path for r in records],
         "exif": [exif] * n},
        [found.get(r.image_id) for r in records] if found else None)


def block_rows(images: int, batch_size: int, slots: int) -> int:
    """Rows per block: a multiple of ``batch_size`` (the least common multiple of the pools' batch
    sizes: every batch full but the job's last), up to ``BLOCK_BATCHES`` of them, so the job's blocks
    number at least twice the tasks that can run at once (``slots``: decode tasks or pool actors).
    Fewer, larger blocks cost the driver's executor less per image (docs/benchmarks/pipeline.md, "The
    driver off the image path")."""
    k = max(1, min(BLOCK_BATCHES, images // (batch_size * 2 * max(slots, 1))))
    return k * batch_size


def decode_pixels(cfg: Config, layout: Sequence[PoolRun]) -> tuple[tuple, bool]:
    """(the pixel geometries the decode step prepares for the pools' models, whether the image's bytes
    travel too): bytes only where some pool's model preprocesses otherwise (a transformers captioner's
    own processor, the ``lavis`` backend's environment) or ``ray.prepare_pixels`` is off
    (docs/architecture.md, "Pixels prepared once")."""
    if not cfg.ray.prepare_pixels:
        return (), True
    stages = [s for p in layout for s in p.kwargs["stages"]]
    preps, known = stage_registry.pixel_preps(cfg, stages)
    return preps, not known


def batches(table: pa.Table, size: int) -> Iterator[pa.Table]:
    """``table`` in slices of ``size`` rows (the last one shorter), as Ray Data's map_batches cuts a block."""
    for i in range(0, table.num_rows, size):
        yield table.slice(i, size)


def fused(cfg: Config, first: int = 0, given: dict[str, Any] | None = None, batch_size: int = 0) -> list[PoolRun]:
    """One fused pool running every stage from index ``first`` on (the in-process pipeline's layout)."""
    stages = stage_registry.names()[first:]
    return [PoolRun(None, pool_layout.FUSED, 1, batch_size, {"stages": stages, "given": given or {}, "last": True,
                                              "pool": pool_layout.FUSED}, stages, {})]
