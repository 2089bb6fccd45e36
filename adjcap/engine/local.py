"""The in-process backend of :class:`adjcap.engine.executor.Executor` (a job with ``executor = local``,
tests, notebooks, benchmarks):
each block of the stream through the decode step's batch function and each pool's
:class:`adjcap.engine.pool_batch.PoolBatch`, in this process, cut into the batches Ray Data would cut
and handed on as the same Arrow tables, the models loaded once and shared by the pools."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping, Sequence

import pyarrow as pa

from adjcap.engine.decode_task import decode_table
from adjcap.engine.executor import Executor, Stream, batches
from adjcap.engine.pool_batch import PoolBatch


class _BoardMeter:
    """A stage's batches counted on an in-process progress board (``add(stage, done, failed)``)."""

    def __init__(self, stage: str, board: Any) -> None:
        self.stage, self.board = stage, board

    @contextlib.contextmanager
    def batch(self, states: Sequence[Any]) -> Iterator[None]:
        ok_before = [s.error is None for s in states]
        yield
        self.board.add(self.stage, len(states), sum(1 for ok, s in zip(ok_before, states) if ok and s.error is not None))


class LocalExecutor(Executor):
    def __init__(self, models: Mapping[str, Any], board: Any = None):
        """``models``: every family the pools run, loaded in this process, by name
        (:func:`adjcap.engine.pipeline.load_models`); ``board``: an in-process progress board (its
        ``add(stage, done, failed)`` called after every batch of every stage, decode included), or None."""
        self.models, self.board = models, board

    def run(self, stream: Stream) -> Iterator[pa.Table]:
        pools = []
        for p in stream.layout:
            if p.options.get("runtime_env"):
                raise ValueError(f"pool '{p.pool}' ({' + '.join(p.meters)}) runs only on Ray: "
                                 "run the job with the Ray backend (executor=ray)")
            meter = (lambda stage: _BoardMeter(stage, self.board)) if self.board is not None else None
            pools.append((PoolBatch(stream.cfg, **p.kwargs, sink=stream.sink if p.kwargs.get("last") else None,
                                    models=self.models, meter=meter), stream.sizes[p.pool]))
        for block in stream.blocks():
            decoded = []
            for b in batches(block, stream.decode_size):
                table, n, failed = decode_table(b, stream.preps, stream.keep_bytes)
                decoded.append(table)
                if self.board is not None:
                    self.board.add("decode", n, failed)
            table = pa.concat_tables(decoded)
            for pool, size in pools:
                table = pa.concat_tables([pool(b) for b in batches(table, size)], promote_options="permissive")
            yield table
